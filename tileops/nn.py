"""Drop-in ``torch.nn`` layers backed by tileops, and a helper that swaps them into a model.

``RMSNorm`` takes the constructor arguments of ``torch.nn.RMSNorm``, holds the same
parameters under the same ``state_dict`` keys and computes the same result; on CUDA
it runs the TileLang kernel, elsewhere the PyTorch reference.  ``swap_modules``
replaces matching layers of an existing model in place, reusing their parameters, so
an optimizer built before the swap keeps working.

Autocast: tileops ops run in the dtype of their input (they are not on autocast's
lists); under ``torch.autocast`` a norm receives whatever dtype the preceding op
produced, and its weight is cast to that dtype, as ``torch.nn.RMSNorm`` would do.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import torch

from tileops import functional

__all__ = ["RMSNorm", "swap_modules", "SWAPS"]

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        trailing = len(self.normalized_shape)
        if tuple(x.shape[x.ndim - trailing:]) != self.normalized_shape:
            raise ValueError(f"RMSNorm: input's last dims {tuple(x.shape[x.ndim - trailing:])} do not match "
                             f"normalized_shape {self.normalized_shape}")
        hidden = math.prod(self.normalized_shape)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        weight = (torch.ones(hidden, device=x.device, dtype=x.dtype) if self.weight is None
                  else self.weight.reshape(hidden).to(x.dtype))
        # The kernel normalizes one axis; several trailing dims fold into it.
        rows = x.reshape(*x.shape[: x.ndim - trailing], hidden)
        return functional.rms_norm(rows, weight, eps=eps).reshape(x.shape)

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


def _is_llama_style_rms_norm(module: torch.nn.Module) -> bool:
    return (type(module).__name__.endswith("RMSNorm") and not isinstance(module, RMSNorm)
            and isinstance(getattr(module, "weight", None), torch.nn.Parameter)
            and (hasattr(module, "variance_epsilon") or hasattr(module, "eps")))


# Which modules ``swap_modules`` replaces, and how: (matches, build replacement).
SWAPS: Dict[str, Tuple[Callable[[torch.nn.Module], bool], Callable[[torch.nn.Module], torch.nn.Module]]] = {
    "rms_norm": (lambda m: type(m) is torch.nn.RMSNorm or _is_llama_style_rms_norm(m), RMSNorm.from_module),
}


def swap_modules(model: torch.nn.Module, kinds: Optional[Sequence[str]] = None) -> Dict[str, int]:
    """Replace matching submodules of ``model`` in place with tileops layers; return counts per kind.

    ``kinds`` selects entries of ``SWAPS`` (default: all).  Parameters are reused, not copied.
    """
    chosen: Dict[str, Tuple[Callable, Callable]] = {k: SWAPS[k] for k in (kinds or SWAPS)}
    counts = {kind: 0 for kind in chosen}
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            for kind, (matches, build) in chosen.items():
                if matches(child):
                    setattr(parent, child_name, build(child))
                    counts[kind] += 1
                    logger.debug("swapped %s.%s (%s)", parent_name, child_name, type(child).__name__)
                    break
    return counts
