"""What is timed for a case: our op, and the PyTorch baselines it is compared with.

A ``Variant`` binds one ``InputSet`` to a zero-argument call, so that the timer can
rotate input sets without knowing what a variant needs (an autograd baseline builds
its graph once per input set at bind time and replays only the backward).

* Fwd ops: ``tileops`` (the op on CUDA), ``eager`` (its manifest ``reference``) and
  ``compile`` (that reference under ``torch.compile``).
* Bwd ops: ``tileops`` against autograd of the paired Fwd op's reference, eager and
  compiled: the backward a PyTorch user gets today. The Bwd op's tensors are matched
  to the Fwd op's by name: a Fwd input or output by its own name (an output is a saved
  tensor, e.g. softmax's ``y``), the gradient of a Fwd output ``y`` as ``grad_y``, and
  each Bwd output ``grad_x`` to the Fwd input ``x`` (the manifest's naming rule). Inputs are made by running the Fwd reference on random Fwd inputs (from
  the Fwd workload of the same label, or the Fwd inputs the Bwd op takes by name), so
  saved tensors are the real ones. When the tensors cannot be matched, the Bwd op's own
  reference stands in (logged, and noted in the report).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from codegen.model import Manifest, OpSpec, Workload

from .checking import as_outputs
from .workloads import input_shapes, param_values, random_inputs

__all__ = [
    "InputSet", "Variant", "Compiler", "default_compiler", "forward_variants", "AutogradPlan",
    "plan_autograd", "autograd_variants", "backward_inputs", "gradient_of",
]

logger = logging.getLogger(__name__)

Call = Callable[[], Any]
Compiler = Callable[[Callable[..., Any]], Callable[..., Any]]
OURS, EAGER, COMPILE = "tileops", "eager", "compile"

GRAD_PREFIX = "grad_"  # the manifest's convention: grad_<output> in, grad_<input> out


@dataclass
class InputSet:
    """The inputs of the op under test, in forward order.

    ``forward_args`` (Bwd cases) are the Fwd op's inputs they were derived from: the
    autograd baselines differentiate the Fwd reference at exactly those values.
    """

    args: List[Any]
    forward_args: Optional[List[Any]] = None


@dataclass(frozen=True)
class Variant:
    name: str
    bind: Callable[[InputSet], Call]
    note: str = ""


def default_compiler(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile`` with dynamo's caches cleared first.

    Every case compiles a fresh reference; without the reset, recompilations pile up on
    one code object until dynamo's cache limit silently falls back to eager.
    """
    import torch

    torch._dynamo.reset()
    return torch.compile(fn)


def _bind_call(fn: Callable[..., Any]) -> Callable[[InputSet], Call]:
    return lambda inputs: functools.partial(fn, *inputs.args)


def forward_variants(op: Any, compiler: Optional[Compiler]) -> List[Variant]:
    """Our op, its reference eager, and (when a compiler is given) compiled."""
    variants = [Variant(OURS, _bind_call(op)), Variant(EAGER, _bind_call(op.reference))]
    if compiler is not None:
        variants.append(Variant(COMPILE, _bind_call(compiler(op.reference))))
    return variants


# ---- Bwd ops: autograd of the Fwd reference --------------------------------------------------
def gradient_of(name: str, candidates: Sequence[str]) -> Optional[str]:
    """The tensor among ``candidates`` whose gradient ``name`` is (``grad_y`` -> ``y``), or None."""
    if name.startswith(GRAD_PREFIX) and name[len(GRAD_PREFIX):] in candidates:
        return name[len(GRAD_PREFIX):]
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

    @property
    def carries_forward_inputs(self) -> bool:
        """Whether the Bwd op takes every required Fwd input by name."""
        carried = {fwd for fwd, _ in self.fwd_inputs}
        return all(t.optional or t.name in carried for t in self.forward.inputs)

    def forward_workload(self, workload: Workload) -> Workload:
        """The Fwd workload a Bwd workload stands for.

        The Fwd workload of the same label when there is one (its shapes are the Fwd
        inputs'), else the Fwd inputs the Bwd op takes by name; params the two ops share
        take the Bwd workload's values.
        """
        bwd_params = param_values(self.backward, workload)
        fwd_param_names = {p.name for p in self.forward.params}
        shared = {k: v for k, v in bwd_params.items() if k in fwd_param_names}
        same_label = next((w for w in self.forward.workloads if w.label == workload.label), None)
        if same_label is not None:
            return Workload(same_label.label, same_label.shapes, workload.dtypes,
                            tuple({**dict(same_label.params), **shared}.items()), same_label.location)
        if not self.carries_forward_inputs:
            raise ValueError(f"{self.forward.name} has no workload {workload.label!r} and "
                             f"{self.backward.name} does not take all of its inputs")
        shapes = dict(workload.shapes)
        fwd_shapes = tuple((fwd, tuple(shapes[bwd])) for fwd, bwd in self.fwd_inputs if bwd in shapes)
        # A gradient the Bwd op returns of a Fwd input it does not take (LayerNorm's bias) needs
        # that input in the autograd baseline, and only a Fwd workload gives its shape.
        absent = sorted({fwd for _, fwd in self.wrt} - {fwd for fwd, _ in fwd_shapes})
        if absent:
            raise ValueError(f"{self.forward.name} has no workload {workload.label!r} and "
                             f"{self.backward.name} returns the gradient of its {absent} but does not take them")
        return Workload(workload.label, fwd_shapes, workload.dtypes, tuple(shared.items()), workload.location)


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


def backward_inputs(plan: AutogradPlan, forward_op: Any, workload: Workload, dtype: str,
                    device: Any, generator: Any = None) -> InputSet:
    """Bwd inputs made by running the Fwd reference: random Fwd inputs, their saved
    outputs, and random gradients shaped like the outputs."""
    import torch

    fwd_workload = plan.forward_workload(workload)
    fwd_args = random_inputs(plan.forward, fwd_workload, dtype, device, generator)
    with torch.no_grad():
        outputs = dict(zip(plan.forward.output_names, as_outputs(forward_op.reference(*fwd_args))))
    named: Dict[str, Any] = {}
    fwd_named = dict(zip(plan.forward.input_names, fwd_args))
    for fwd, bwd in plan.fwd_inputs:
        named[bwd] = fwd_named[fwd]
    for fwd, bwd in plan.saved_outputs:
        named[bwd] = outputs[fwd]
    for fwd, bwd in plan.grad_outputs:
        out = outputs[fwd]
        named[bwd] = torch.randn(out.shape, dtype=out.dtype, device=out.device, generator=generator)
    args = [named[name] for name in plan.backward.input_names]
    expected = input_shapes(plan.backward, workload)
    got = [None if t is None else tuple(t.shape) for t in args]
    if got != expected:
        raise ValueError(f"{plan.forward.name} workload {fwd_workload.label!r} yields {plan.backward.name} "
                         f"inputs of shapes {got}, but its workload says {expected}")
    return InputSet(args, fwd_args)


def _forward_leaves(plan: AutogradPlan, inputs: InputSet) -> List[Any]:
    """Fwd inputs as fresh leaves, in Fwd order; those we differentiate require grad."""
    if inputs.forward_args is not None:
        values = list(inputs.forward_args)
    else:
        named = dict(zip(plan.backward.input_names, inputs.args))
        carried = dict(plan.fwd_inputs)
        values = [named.get(carried.get(t.name, ""), None) for t in plan.forward.inputs]
    wanted = {fwd for _, fwd in plan.wrt}
    return [None if value is None else value.detach().requires_grad_(t.name in wanted)
            for t, value in zip(plan.forward.inputs, values)]


def _autograd_bind(plan: AutogradPlan, reference: Callable[..., Any]) -> Callable[[InputSet], Call]:
    import torch

    def bind(inputs: InputSet) -> Call:
        leaves = _forward_leaves(plan, inputs)
        by_name = dict(zip(plan.forward.input_names, leaves))
        outputs = dict(zip(plan.forward.output_names, as_outputs(reference(*leaves))))
        named = dict(zip(plan.backward.input_names, inputs.args))
        # An absent gradient (an optional input left None) is an output nothing used:
        # it is no root of the backward, as in a model that ignores it.
        pairs = [(outputs[fwd], named[bwd]) for fwd, bwd in plan.grad_outputs if named[bwd] is not None]
        roots = [root for root, _ in pairs]
        seeds = [seed for _, seed in pairs]
        targets = [by_name[fwd] for _, fwd in plan.wrt]

        def backward() -> Tuple[Any, ...]:
            # retain_graph: each timed call replays the backward of the same graph.
            return torch.autograd.grad(roots, targets, seeds, retain_graph=True)

        return backward

    return bind


def autograd_variants(op: Any, plan: AutogradPlan, forward_op: Any,
                      compiler: Optional[Compiler]) -> List[Variant]:
    """Our Bwd op, and autograd through the Fwd reference, eager and compiled."""
    note = f"baseline: autograd of {plan.forward.name}.reference"
    variants = [Variant(OURS, _bind_call(op)),
                Variant(EAGER, _autograd_bind(plan, forward_op.reference), note)]
    if compiler is not None:
        variants.append(Variant(COMPILE, _autograd_bind(plan, compiler(forward_op.reference)), note))
    return variants
