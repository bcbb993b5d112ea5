"""What is timed for a case: our op, and the PyTorch baselines it is compared with.

A ``Variant`` binds one input set to a zero-argument call, so that the timer can
rotate input sets without knowing what a variant needs (an autograd baseline builds
its graph once per input set at bind time and replays only the backward).

* Fwd ops: ``tileops`` (the op on CUDA), ``eager`` (its manifest ``reference``) and
  ``compile`` (that reference under ``torch.compile``).
* Bwd ops: ``tileops`` against autograd of the paired Fwd op's reference, eager and
  compiled: the backward a PyTorch user gets today. The Bwd op's inputs are matched to
  the Fwd op's by name: a Fwd input by its own name, the gradient of a Fwd output ``y``
  as ``grad_y``/``dy``/``y_grad``/``g_y``, and each Bwd output to the Fwd input it is
  the gradient of. When they cannot be matched, the Bwd op's own reference stands in
  (logged, and noted in the report).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from codegen.model import Manifest, OpSpec, Workload

from .checking import as_outputs
from .workloads import param_values

__all__ = [
    "Variant", "Compiler", "default_compiler", "forward_variants", "AutogradPlan",
    "plan_autograd", "autograd_variants", "consistent_inputs", "gradient_of",
]

logger = logging.getLogger(__name__)

Call = Callable[[], Any]
Compiler = Callable[[Callable[..., Any]], Callable[..., Any]]
OURS, EAGER, COMPILE = "tileops", "eager", "compile"

_GRAD_PREFIXES = ("grad_", "d_", "g_", "d", "g")
_GRAD_SUFFIXES = ("_grad",)


@dataclass(frozen=True)
class Variant:
    name: str
    bind: Callable[[Sequence[Any]], Call]
    note: str = ""


def default_compiler(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile`` with dynamo's caches cleared first.

    Every case compiles a fresh reference; without the reset, recompilations pile up on
    one code object until dynamo's cache limit silently falls back to eager.
    """
    import torch

    torch._dynamo.reset()
    return torch.compile(fn)


def _bind_call(fn: Callable[..., Any]) -> Callable[[Sequence[Any]], Call]:
    return lambda inputs: functools.partial(fn, *inputs)


def forward_variants(op: Any, compiler: Optional[Compiler]) -> List[Variant]:
    """Our op, its reference eager, and (when a compiler is given) compiled."""
    variants = [Variant(OURS, _bind_call(op)), Variant(EAGER, _bind_call(op.reference))]
    if compiler is not None:
        variants.append(Variant(COMPILE, _bind_call(compiler(op.reference))))
    return variants


# ---- Bwd ops: autograd of the Fwd reference --------------------------------------------------
def gradient_of(name: str, candidates: Sequence[str]) -> Optional[str]:
    """The tensor among ``candidates`` whose gradient ``name`` is (``dy`` -> ``y``), or None."""
    for prefix in _GRAD_PREFIXES:
        if name.startswith(prefix) and name[len(prefix):] in candidates:
            return name[len(prefix):]
    for suffix in _GRAD_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in candidates:
            return name[: -len(suffix)]
    return None


@dataclass(frozen=True)
class AutogradPlan:
    """How a Bwd op's inputs and outputs correspond to its Fwd op's tensors."""

    forward: OpSpec
    backward: OpSpec
    fwd_inputs: Tuple[Tuple[str, str], ...]  # (fwd input, bwd input carrying it)
    grad_outputs: Tuple[Tuple[str, str], ...]  # (fwd output, bwd input carrying its gradient)
    saved_outputs: Tuple[Tuple[str, str], ...]  # (fwd output, bwd input carrying its value)
    wrt: Tuple[Tuple[str, str], ...]  # (bwd output, fwd input it is the gradient of)

    def forward_workload(self, workload: Workload) -> Workload:
        """The Fwd op's workload implied by a Bwd workload (shapes and shared params)."""
        shapes = dict(workload.shapes)
        fwd_shapes = tuple((fwd, tuple(shapes[bwd])) for fwd, bwd in self.fwd_inputs if bwd in shapes)
        fwd_params = {p.name for p in self.forward.params}
        params = tuple((k, v) for k, v in param_values(self.backward, workload).items() if k in fwd_params)
        return Workload(workload.label, fwd_shapes, workload.dtypes, params, workload.location)


def _forward_of(manifest: Manifest, backward: OpSpec) -> Optional[OpSpec]:
    return next((op for op in manifest.ops if op.backward and op.backward.op == backward.name), None)


def plan_autograd(manifest: Manifest, backward: OpSpec) -> Tuple[Optional[AutogradPlan], str]:
    """Match a Bwd op to its Fwd op's reference; ``(None, why)`` when that is impossible."""
    forward = _forward_of(manifest, backward)
    if forward is None:
        return None, f"no Fwd op names {backward.name} as its backward"
    fwd_inputs, grad_outputs, saved_outputs = [], [], []
    for name in backward.input_names:
        if name in forward.input_names:
            fwd_inputs.append((name, name))
        elif name in forward.output_names:
            saved_outputs.append((name, name))
        elif gradient_of(name, forward.output_names):
            grad_outputs.append((gradient_of(name, forward.output_names), name))
        else:
            return None, f"{backward.name} input {name!r} matches no tensor of {forward.name}"
    carried = {fwd for fwd, _ in fwd_inputs}
    missing = [t.name for t in forward.inputs if not t.optional and t.name not in carried]
    if missing:
        return None, f"{backward.name} does not take {forward.name}'s inputs {missing}"
    if not grad_outputs:
        return None, f"{backward.name} takes no gradient of {forward.name}'s outputs"
    wrt = []
    for name in backward.output_names:
        target = gradient_of(name, forward.input_names)
        if target is None:
            return None, f"{backward.name} output {name!r} is the gradient of no input of {forward.name}"
        wrt.append((name, target))
    return AutogradPlan(forward, backward, tuple(fwd_inputs), tuple(grad_outputs),
                        tuple(saved_outputs), tuple(wrt)), ""


def _forward_leaves(plan: AutogradPlan, named: Dict[str, Any]) -> Dict[str, Any]:
    """Fwd inputs as fresh leaves; those we differentiate by require grad."""
    wanted = {fwd for _, fwd in plan.wrt}
    leaves = {}
    for fwd, bwd in plan.fwd_inputs:
        tensor = named[bwd]
        if tensor is not None:
            tensor = tensor.detach().requires_grad_(fwd in wanted)
        leaves[fwd] = tensor
    return leaves


def _autograd_bind(plan: AutogradPlan, reference: Callable[..., Any]) -> Callable[[Sequence[Any]], Call]:
    import torch

    def bind(inputs: Sequence[Any]) -> Call:
        named = dict(zip(plan.backward.input_names, inputs))
        leaves = _forward_leaves(plan, named)
        ordered = [leaves.get(t.name) for t in plan.forward.inputs]
        outputs = dict(zip(plan.forward.output_names, as_outputs(reference(*ordered))))
        roots = [outputs[fwd] for fwd, _ in plan.grad_outputs]
        seeds = [named[bwd] for _, bwd in plan.grad_outputs]
        targets = [leaves[fwd] for _, fwd in plan.wrt]

        def backward() -> Tuple[Any, ...]:
            # retain_graph: each timed call replays the backward of the same graph.
            return torch.autograd.grad(roots, targets, seeds, retain_graph=True)

        return backward

    return bind


def consistent_inputs(plan: AutogradPlan, forward_op: Any, inputs: Sequence[Any]) -> List[Any]:
    """Replace random values of saved Fwd outputs with what the Fwd reference computes."""
    if not plan.saved_outputs:
        return list(inputs)
    import torch

    named = dict(zip(plan.backward.input_names, inputs))
    ordered = [named.get(bwd) for fwd, bwd in plan.fwd_inputs]
    with torch.no_grad():
        outputs = dict(zip(plan.forward.output_names, as_outputs(forward_op.reference(*ordered))))
    for fwd, bwd in plan.saved_outputs:
        named[bwd] = outputs[fwd]
    return [named[name] for name in plan.backward.input_names]


def autograd_variants(op: Any, plan: AutogradPlan, forward_op: Any,
                      compiler: Optional[Compiler]) -> List[Variant]:
    """Our Bwd op, and autograd through the Fwd reference, eager and compiled."""
    note = f"baseline: autograd of {plan.forward.name}.reference"
    variants = [Variant(OURS, _bind_call(op)),
                Variant(EAGER, _autograd_bind(plan, forward_op.reference), note)]
    if compiler is not None:
        variants.append(Variant(COMPILE, _autograd_bind(plan, compiler(forward_op.reference)), note))
    return variants
