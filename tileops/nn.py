"""Drop-in ``torch.nn`` layers backed by tileops, and a helper that swaps them into a model.

``RMSNorm`` and ``LayerNorm`` take the constructor arguments of their ``torch.nn``
namesakes, hold the same parameters under the same ``state_dict`` keys and compute the
same result; on CUDA they run TileLang kernels, elsewhere the PyTorch reference.
``RMSNorm`` also takes the residual stream, as inference engines' norms do:
``norm(x, residual)`` returns ``(norm(x + residual), x + residual)`` in one fused op.
``GatedMLP`` replaces a Llama-style MLP (``gate_proj``, ``up_proj``, ``down_proj``, SiLU
or GELU) and keeps its projections.  ``CrossEntropyLoss`` is ``torch.nn.CrossEntropyLoss``
(class indices or probabilities, class weights), with cross-entropy's ``inplace_backward`` as an option.
``swap_modules`` replaces matching layers of an existing model in place, reusing their
parameters, so an optimizer built before the swap keeps working.

Autocast: tileops ops run in the dtype of their input (they are not on autocast's
lists); under ``torch.autocast`` a norm receives whatever dtype the preceding op
produced, and its parameters are cast to that dtype, as ``torch.nn``'s norms do.
Devices: ops run on the device of their inputs, any CUDA index.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import torch

from tileops import functional
from tileops.ops import CrossEntropyFwdOp
from tileops.ops.op_base import SHARED_INSTANCE

__all__ = ["RMSNorm", "LayerNorm", "GatedMLP", "CrossEntropyLoss", "class_weighted_cross_entropy",
           "probability_cross_entropy", "swap_modules", "SWAPS"]

logger = logging.getLogger(__name__)

_Shape = Union[int, Sequence[int]]


def _as_shape(normalized_shape: _Shape) -> Tuple[int, ...]:
    return (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)


class RMSNorm(torch.nn.Module):
    """``torch.nn.RMSNorm`` computed by ``tileops.functional.rms_norm``."""

    def __init__(self, normalized_shape: _Shape, eps: Optional[float] = None, elementwise_affine: bool = True,
                 device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.normalized_shape = _as_shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """``rms_norm(x)``; with ``residual`` (shaped like ``x``), the add before the norm fused
        in: ``(rms_norm(x + residual), x + residual)``, the second being the next residual."""
        rows, hidden = _fold_trailing(x, self.normalized_shape, "RMSNorm")
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        weight = (torch.ones(hidden, device=x.device, dtype=x.dtype) if self.weight is None
                  else _as_row(self.weight, hidden, x.dtype))
        if residual is None:
            y = functional.rms_norm(rows, weight, eps=eps)
            return y if rows is x else y.reshape(x.shape)
        if residual.shape != x.shape:
            raise ValueError(f"RMSNorm: residual must be shaped like x {tuple(x.shape)}, got {tuple(residual.shape)}")
        if rows is x:
            return functional.fused_add_rms_norm(x, residual, weight, eps=eps)
        y, total = functional.fused_add_rms_norm(rows, residual.reshape(rows.shape), weight, eps=eps)
        return y.reshape(x.shape), total.reshape(x.shape)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> "RMSNorm":
        """An ``RMSNorm`` sharing ``module``'s weight: ``torch.nn.RMSNorm`` or a Llama-style norm
        (``weight`` plus ``variance_epsilon`` or ``eps``)."""
        weight = getattr(module, "weight", None)
        shape = getattr(module, "normalized_shape", None) or tuple(weight.shape)
        eps = getattr(module, "eps", None)
        if eps is None:
            eps = getattr(module, "variance_epsilon", None)
        new = cls(shape, eps=eps, elementwise_affine=weight is not None, device="meta")
        new.weight = weight  # the same Parameter: optimizers and ties keep working
        return new


class LayerNorm(torch.nn.Module):
    """``torch.nn.LayerNorm`` computed by ``tileops.functional.layer_norm``."""

    def __init__(self, normalized_shape: _Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.normalized_shape = _as_shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        if elementwise_affine and bias:
            self.bias = torch.nn.Parameter(torch.zeros(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, hidden = _fold_trailing(x, self.normalized_shape, "LayerNorm")
        weight = None if self.weight is None else _as_row(self.weight, hidden, x.dtype)
        bias = None if self.bias is None else _as_row(self.bias, hidden, x.dtype)
        y = functional.layer_norm(rows, weight, bias, eps=self.eps)
        return y if rows is x else y.reshape(x.shape)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"

    @classmethod
    def from_module(cls, module: torch.nn.LayerNorm) -> "LayerNorm":
        """A ``LayerNorm`` sharing ``module``'s parameters."""
        new = cls(module.normalized_shape, eps=module.eps, elementwise_affine=False)
        new.elementwise_affine = module.elementwise_affine
        new.weight, new.bias = module.weight, module.bias
        return new


def _fold_trailing(x: torch.Tensor, normalized_shape: Tuple[int, ...], layer: str) -> Tuple[torch.Tensor, int]:
    """``x`` with its normalized trailing dims folded into one axis (the kernels normalize one):
    ``x`` itself where there is one, the usual case, as the ops take any rank."""
    trailing = len(normalized_shape)
    if tuple(x.shape[x.ndim - trailing:]) != normalized_shape:
        raise ValueError(f"{layer}: input's last dims {tuple(x.shape[x.ndim - trailing:])} do not match "
                         f"normalized_shape {normalized_shape}")
    if trailing == 1:
        return x, normalized_shape[0]
    hidden = math.prod(normalized_shape)
    return x.reshape(*x.shape[: x.ndim - trailing], hidden), hidden


def _as_row(parameter: torch.Tensor, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """A norm's weight or bias as the ops take it, ``[hidden]`` in the input's dtype (itself where it is)."""
    row = parameter if parameter.dim() == 1 else parameter.reshape(hidden)
    return row if row.dtype == dtype else row.to(dtype)


class GatedMLP(torch.nn.Module):
    """``down(act(gate(x)) * up(x))`` with the gated activation computed by tileops.

    Holds the three projections of a Llama-style MLP as they are (same modules, same
    ``state_dict`` keys).  The gated activation reads ``gate(x)`` and ``up(x)`` side by side,
    ``[..., 2H]``, which the forward builds by the cheapest route the call allows:

    * over fewer rows than features (decoding, small batches): the two products stacked, a
      copy of ``rows x 2H`` elements, in the few host calls that such steps are bound by;
    * over more rows, with no gradient to record (eager inference): each product written
      into its half of one buffer, so nothing is copied;
    * over more rows otherwise (training batches): one product with the two weights
      stacked, a copy of ``2H x features`` elements, whose gradient autograd splits back
      without a copy.
    """

    def __init__(self, gate_proj: torch.nn.Linear, up_proj: torch.nn.Linear, down_proj: torch.nn.Linear,
                 activation: str = "silu") -> None:
        super().__init__()
        if activation not in ("silu", "gelu"):
            raise ValueError(f"GatedMLP: activation must be 'silu' or 'gelu', got {activation!r}")
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self._gate_up(x)
        gated = functional.silu_and_mul(gate_up) if self.activation == "silu" else functional.gelu_and_mul(gate_up)
        return self.down_proj(gated)

    def _gate_up(self, x: torch.Tensor) -> torch.Tensor:
        """``cat([gate(x), up(x)], -1)``, by the cheapest of the three routes in the class docstring."""
        gate, up = self.gate_proj, self.up_proj
        if x.numel() < x.shape[-1] ** 2:  # fewer rows than features
            return torch.cat([gate(x), up(x)], dim=-1)
        if _products_may_share_a_buffer(x, gate, up):
            return _products_side_by_side(x, gate, up)
        weight = torch.cat([gate.weight, up.weight])
        bias = None
        if gate.bias is not None or up.bias is not None:
            bias = torch.cat([_bias_or_zeros(gate), _bias_or_zeros(up)])
        return torch.nn.functional.linear(x, weight, bias)

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> "GatedMLP":
        """A ``GatedMLP`` sharing a Llama-style MLP's projections."""
        return cls(module.gate_proj, module.up_proj, module.down_proj, _activation_name(module))


# PyTorch's default ``ignore_index``, the only value it accepts with class-probability targets.
_DEFAULT_IGNORE_INDEX = -100


class CrossEntropyLoss(torch.nn.Module):
    """``torch.nn.CrossEntropyLoss``, computed by the cross-entropy op.

    Takes logits ``[N, C]``, ``[C]`` (one sample) or ``[N, C, d1, ...]`` (classes on axis 1),
    and returns what PyTorch's loss returns for either kind of target: int64 class indices
    shaped like the logits without their class axis, or class probabilities shaped like the
    logits (see ``probability_cross_entropy``).  Logits with trailing axes are moved to
    ``[N * d1 * ..., C]`` first (a copy, which an ``inplace_backward`` then overwrites instead
    of the logits).  Class weights (``weight``, a buffer as in PyTorch) are applied to the op's
    per-row losses (see ``class_weighted_cross_entropy``).  ``inplace_backward`` (see
    ``CrossEntropyFwdOp``): an eager backward writes the gradient over the logits.
    """

    weight: Optional[torch.Tensor]

    def __init__(self, weight: Optional[torch.Tensor] = None, ignore_index: int = _DEFAULT_IGNORE_INDEX,
                 reduction: str = "mean", label_smoothing: float = 0.0, inplace_backward: bool = False) -> None:
        super().__init__()
        if weight is not None and weight.dim() != 1:
            raise ValueError(f"CrossEntropyLoss: weight must be 1-D, one weight per class, "
                             f"got shape {tuple(weight.shape)}")
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.inplace_backward = inplace_backward

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if logits.ndim == 1:  # one sample: PyTorch's loss of it is a scalar for every reduction
            return self(logits.unsqueeze(0), target.unsqueeze(0)).reshape(())
        rows, probabilities = _class_rows(logits), target.is_floating_point()
        if probabilities:
            if self.ignore_index != _DEFAULT_IGNORE_INDEX:
                # As PyTorch: a probability target has no class to ignore, and the setting is a mistake.
                raise ValueError(f"CrossEntropyLoss: ignore_index is not supported for class-probability "
                                 f"targets, got ignore_index={self.ignore_index}")
            loss = probability_cross_entropy(rows, _class_rows(target), self.weight, self.label_smoothing,
                                             self.reduction, self.inplace_backward)
        elif self.weight is None:
            loss = functional.cross_entropy(rows, target.reshape(-1), self.ignore_index, self.label_smoothing,
                                            self.reduction, self.inplace_backward)
        else:
            loss = class_weighted_cross_entropy(rows, target.reshape(-1), self.weight, self.ignore_index,
                                                self.label_smoothing, self.reduction, self.inplace_backward)
        if self.reduction != "none":
            return loss
        return loss.reshape(target.shape[:1] + target.shape[2:] if probabilities else target.shape)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, inplace_backward={self.inplace_backward}")


def class_weighted_cross_entropy(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor,
                                 ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
                                 inplace_backward: bool = False) -> torch.Tensor:
    """``torch.nn.functional.cross_entropy(logits, target, weight)`` over ``[N, C]`` logits, from
    the op's per-row losses and log-sum-exps (computed in float32, returned in the logits' dtype).

    With ``w`` the class weights and ``s`` the label smoothing, row ``n`` loses
    ``(1 - s) * w[t_n] * (lse_n - x[n, t_n]) + (s / C) * (lse_n * sum(w) - x[n] @ w)``, nothing
    where ``t_n`` is ``ignore_index``; the mean divides the sum by the kept rows' ``w[t_n]``, as
    PyTorch does (NaN when no row is kept, with a gradient of 0).  Without smoothing the logits
    are read once, by the op, and the backward is the op's.  With it, ``x[n] @ w`` is a float32
    matrix-vector product: one more read of the logits, and in the backward an ``[N, C]`` term
    added to the op's gradient.
    """
    _check_reduction(reduction)
    classes = logits.shape[1]
    class_weight = _class_weight(weight, logits)
    kept = target != ignore_index
    # The weights are read at clamped indices: an ignored row's weight is then replaced by 0, and
    # a target outside the classes keeps the op's NaN loss (an index out of range would stop the
    # process on a GPU).
    row_weight = torch.where(kept, class_weight[target.clamp(0, classes - 1)], 0.0)
    nll, lse = _per_row_cross_entropy(logits, target, ignore_index, inplace_backward)
    loss = row_weight * nll.float()
    if label_smoothing:
        smooth = lse * class_weight.sum() - torch.mv(logits.float(), class_weight)
        loss = (1 - label_smoothing) * loss + (label_smoothing / classes) * torch.where(kept, smooth, 0.0)
    if reduction == "mean":
        # No kept row: PyTorch's loss is NaN and its gradient 0.  Dividing by 1 there keeps the
        # gradient 0 (0 / 0 would make it NaN); kept rows of weight 0 still divide by 0, as PyTorch.
        any_kept = kept.any()
        mean = loss.sum() / torch.where(any_kept, row_weight.sum(), 1.0)
        return torch.where(any_kept, mean, torch.nan).to(logits.dtype)
    return (loss.sum() if reduction == "sum" else loss).to(logits.dtype)


def probability_cross_entropy(logits: torch.Tensor, probabilities: torch.Tensor,
                              weight: Optional[torch.Tensor] = None, label_smoothing: float = 0.0,
                              reduction: str = "mean", inplace_backward: bool = False) -> torch.Tensor:
    """``torch.nn.functional.cross_entropy(logits, probabilities, weight)`` over ``[N, C]`` logits
    and ``[N, C]`` class probabilities (soft labels, distillation), computed in float32 and
    returned, as PyTorch's, in the dtype the two promote to.

    ``SoftCrossEntropyFwdOp`` computes it in one read of the logits and the targets, and its
    backward in one more, writing the gradient (over the logits with ``inplace_backward``, see
    ``CrossEntropyFwdOp``).  The op does not differentiate the targets or the weights: where
    either requires grad, PyTorch's own loss runs instead, which does.
    """
    _check_reduction(reduction)
    if probabilities.shape != logits.shape:
        raise ValueError(f"cross_entropy: probability targets must have the logits' shape {tuple(logits.shape)}, "
                         f"got {tuple(probabilities.shape)}")
    dtype = torch.promote_types(logits.dtype, probabilities.dtype)
    if torch.is_grad_enabled() and (probabilities.requires_grad or (weight is not None and weight.requires_grad)):
        return torch.nn.functional.cross_entropy(logits, probabilities, weight, reduction=reduction,
                                                 label_smoothing=label_smoothing).to(dtype)
    class_weight = None if weight is None else _class_weight(weight, logits)
    return functional.soft_cross_entropy(logits, probabilities, class_weight, float(label_smoothing),
                                         reduction, inplace_backward).to(dtype)


def _check_reduction(reduction: str) -> None:
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"cross_entropy: reduction must be one of 'none', 'mean', 'sum', got {reduction!r}")


def _class_weight(weight: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``weight`` as float32 on the logits' device, after checking it has one entry per class."""
    classes = logits.shape[1]
    if weight.shape != (classes,):
        raise ValueError(f"cross_entropy: weight must have one entry per class ({classes}), "
                         f"got shape {tuple(weight.shape)}")
    return weight.to(device=logits.device, dtype=torch.float32)


def _class_rows(tensor: torch.Tensor) -> torch.Tensor:
    """``[N, C]`` as it is; ``[N, C, d1, ...]`` as ``[N * d1 * ..., C]`` (classes last)."""
    return tensor if tensor.ndim == 2 else tensor.movedim(1, -1).reshape(-1, tensor.shape[1])


def _per_row_cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int,
                           inplace_backward: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """The op's per-row losses ``lse - x[n, t_n]`` (no smoothing, no reduction) and its log-sum-exps.

    The functional form returns the loss alone; the lse output carries a gradient too."""
    if torch.compiler.is_compiling():
        return torch.ops.tileops.cross_entropy_fwd(logits, target, ignore_index, 0.0, "none", inplace_backward,
                                                   SHARED_INSTANCE)
    op = CrossEntropyFwdOp._shared_for(logits, target, ignore_index, 0.0, "none", inplace_backward)
    return op.forward(logits, target)


def _products_may_share_a_buffer(x: torch.Tensor, *linears: torch.nn.Linear) -> bool:
    """Whether ``_products_side_by_side`` computes what the linears would: a plain eager call that
    records no gradient (``out=`` products are not differentiable, traced or transformed), in
    the weights' dtype with autocast off (autocast does not cast ``out=`` products)."""
    if (torch.compiler.is_compiling() or torch._C._is_tracing() or torch._C._are_functorch_transforms_active()
            or torch.is_autocast_enabled(x.device.type) or type(x) is not torch.Tensor):
        return False
    parameters = [p for linear in linears for p in linear.parameters()]
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in parameters)):
        return False
    return all(p.dtype == x.dtype and p.device == x.device and type(p) in (torch.Tensor, torch.nn.Parameter)
               for p in parameters)


def _products_side_by_side(x: torch.Tensor, *linears: torch.nn.Linear) -> torch.Tensor:
    """``cat([linear(x) for linear in linears], -1)``, each product written into its columns of
    one buffer (a strided ``out=`` that the matrix product takes as it is)."""
    rows = x.reshape(-1, x.shape[-1])
    widths = [linear.out_features for linear in linears]
    out = rows.new_empty(rows.shape[0], sum(widths))
    for linear, columns in zip(linears, out.split(widths, dim=1)):
        if linear.bias is None:
            torch.mm(rows, linear.weight.t(), out=columns)
        else:
            torch.addmm(linear.bias, rows, linear.weight.t(), out=columns)
    return out.view(*x.shape[:-1], out.shape[-1])


def _bias_or_zeros(linear: torch.nn.Linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias
    return torch.zeros(linear.out_features, device=linear.weight.device, dtype=linear.weight.dtype)


def _activation_name(module: torch.nn.Module) -> Optional[str]:
    act = getattr(module, "act_fn", None)
    if isinstance(act, torch.nn.SiLU):
        return "silu"
    if isinstance(act, torch.nn.GELU) and act.approximate == "none":
        return "gelu"
    return None


def _is_llama_style_mlp(module: torch.nn.Module) -> bool:
    return (not isinstance(module, GatedMLP) and _activation_name(module) is not None
            and all(isinstance(getattr(module, name, None), torch.nn.Linear)
                    for name in ("gate_proj", "up_proj", "down_proj")))


def _is_llama_style_rms_norm(module: torch.nn.Module) -> bool:
    return (type(module).__name__.endswith("RMSNorm") and not isinstance(module, RMSNorm)
            and isinstance(getattr(module, "weight", None), torch.nn.Parameter)
            and (hasattr(module, "variance_epsilon") or hasattr(module, "eps")))


# Which modules ``swap_modules`` replaces, and how: (matches, build replacement).
SWAPS: Dict[str, Tuple[Callable[[torch.nn.Module], bool], Callable[[torch.nn.Module], torch.nn.Module]]] = {
    "rms_norm": (lambda m: type(m) is torch.nn.RMSNorm or _is_llama_style_rms_norm(m), RMSNorm.from_module),
    "layer_norm": (lambda m: type(m) is torch.nn.LayerNorm, LayerNorm.from_module),
    "gated_mlp": (_is_llama_style_mlp, GatedMLP.from_module),
}


def swap_modules(model: torch.nn.Module, kinds: Optional[Sequence[str]] = None) -> Dict[str, int]:
    """Replace matching submodules of ``model`` in place with tileops layers; return counts per kind.

    ``kinds`` selects entries of ``SWAPS`` (default: all).  Parameters are reused, not copied.
    A module matched by its names rather than its type (a Llama-style norm or MLP) is swapped
    only once its replacement has given its output on a probe input: a norm of the same shape
    that computes something else, such as Gemma's ``x * (1 + weight)``, is left in place and
    logged as a warning, as is one whose parameters hold no values yet (the ``meta`` device).
    """
    chosen: Dict[str, Tuple[Callable, Callable]] = {k: SWAPS[k] for k in (kinds or SWAPS)}
    counts = {kind: 0 for kind in chosen}
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            for kind, (matches, build) in chosen.items():
                if matches(child):
                    replacement = build(child)
                    where = f"{parent_name}.{child_name}" if parent_name else child_name
                    if type(child) not in _KNOWN_SEMANTICS and not _computes_the_same(child, replacement):
                        logger.warning("swap_modules: %s (%s) left in place: its output on a probe input differs "
                                       "from the tileops %s's, or it has no values to compare (meta device)",
                                       where, type(child).__name__, kind)
                        break
                    setattr(parent, child_name, replacement)
                    counts[kind] += 1
                    logger.debug("swapped %s (%s)", where, type(child).__name__)
                    break
    return counts


# Modules whose computation their type fixes: swapped without a probe.
_KNOWN_SEMANTICS = (torch.nn.RMSNorm, torch.nn.LayerNorm)
# How far a replacement's output on the probe may stray from the module's: one rounding in the
# parameters' dtype, where the module may round in between (Llama's norm rounds before the weight).
_PROBE_TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5, torch.float64: 1e-10}


def _computes_the_same(module: torch.nn.Module, replacement: torch.nn.Module) -> bool:
    """Whether ``replacement`` gives ``module``'s output on three rows of seeded random features
    in the module's dtype and device (features: the first parameter's last axis, or a linear's
    input width)."""
    parameter = next(module.parameters(), None)
    if parameter is None or parameter.is_meta:
        return False
    gate = getattr(module, "gate_proj", None)
    width = gate.in_features if isinstance(gate, torch.nn.Linear) else parameter.shape[-1]
    probe = torch.randn(3, width, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    probe = probe.to(device=parameter.device, dtype=parameter.dtype)
    try:
        with torch.no_grad():
            expected, got = module(probe), replacement(probe)
    except Exception as error:  # noqa: BLE001 - a module that takes no such input is not what it seemed
        logger.debug("swap_modules: probing %s raised %r", type(module).__name__, error)
        return False
    if not isinstance(expected, torch.Tensor) or expected.shape != got.shape:
        return False
    tolerance = _PROBE_TOLERANCE.get(parameter.dtype, 1e-5)
    return torch.allclose(got.float(), expected.float(), rtol=tolerance, atol=tolerance)
