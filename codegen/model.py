"""The typed, immutable manifest model.

The loader turns validated YAML into these frozen dataclasses; every later
stage (rendering, the validator, tests, benchmarks) reads only this model.
Each object keeps the ``Location`` it came from so that errors point at the
manifest line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from . import rules
from .errors import Location

__all__ = [
    "DTYPE_NAMES", "FLOATING_DTYPES", "DtypeSpec", "TensorSpec", "ParamSpec", "StaticDim", "ShapeRule", "OutputRule",
    "Roofline", "KernelRef", "Backward", "ReferenceBackward", "FormulaBackward", "FORMULA_HELPERS",
    "SHAPE_ONLY_ATTRIBUTES", "Workload", "OpSpec", "Manifest", "snake_case",
]

# Every dtype name the manifest may use, in a fixed order (used for exhaustive checks).
DTYPE_NAMES: Tuple[str, ...] = (
    "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
)
FLOATING_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def snake_case(name: str) -> str:
    """``RMSNormFwd`` -> ``rms_norm_fwd``; acronyms stay one word."""
    words = re.findall(r"[A-Z]+(?=[A-Z][a-z0-9]|$)|[A-Z]?[a-z0-9]+|[A-Z]+", name)
    return "_".join(w.lower() for w in words)


@dataclass(frozen=True)
class DtypeSpec:
    """A tensor's allowed dtypes: a union of names, or ``same_as`` another tensor."""

    names: Tuple[str, ...] = ()
    same_as: Optional[str] = None

    @property
    def is_union(self) -> bool:
        return self.same_as is None and len(self.names) > 1

    def text(self) -> str:
        return f"same_as({self.same_as})" if self.same_as else " | ".join(self.names)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: DtypeSpec
    shape: Optional[Tuple[Any, ...]]
    optional: bool
    description: str
    location: Location
    saved: bool = False  # an output kept for the backward, not returned by the functional form
    constant: bool = False  # an input the op does not differentiate: refused when it requires grad
    cast_by_dtype: bool = False  # an input the functional form's `dtype` keyword casts first
    dtype_param: Optional[str] = None  # an output's Optional[dtype] param: its dtype where given


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: str
    has_default: bool
    default: Any
    choices: Optional[Tuple[Any, ...]]
    description: str
    location: Location
    # Inclusive bounds of a number (None: unbounded on that side).
    minimum: Optional[float] = None
    maximum: Optional[float] = None


@dataclass(frozen=True)
class StaticDim:
    """``name`` is committed at construction as ``tensor.shape[axis]``."""

    name: str
    tensor: str
    axis: rules.Expr  # an integer constant or a param name
    text: str
    location: Location

    @property
    def axis_param(self) -> Optional[str]:
        return self.axis.id if isinstance(self.axis, rules.Name) else None

    @property
    def axis_literal(self) -> Optional[int]:
        if isinstance(self.axis, rules.Const):
            return self.axis.value
        if isinstance(self.axis, rules.UnaryOp) and isinstance(self.axis.operand, rules.Const):
            return -self.axis.operand.value
        return None


@dataclass(frozen=True)
class ShapeRule:
    """A precondition on inputs and params, checked in ``forward``."""

    text: str
    expr: rules.Expr
    location: Location
    implied: bool = False  # derived from a tensor's declared ``shape`` rather than written
    why: str = ""  # what the rule asks, in words, for the error of a call that breaks it


@dataclass(frozen=True)
class OutputRule:
    """``output.shape == shape``."""

    output: str
    text: str
    shape: rules.Expr
    location: Location


@dataclass(frozen=True)
class Roofline:
    vars: Tuple[Tuple[str, rules.Expr, str], ...]  # (name, expression, text)
    flops: rules.Expr
    flops_text: str
    bytes: rules.Expr
    bytes_text: str
    location: Location


@dataclass(frozen=True)
class KernelRef:
    key: str
    class_name: str
    module: str  # absolute, e.g. tileops.kernels.norm.rms_norm
    location: Location

    @property
    def path(self) -> str:
        return self.module.replace(".", "/") + ".py"


@dataclass(frozen=True)
class Backward:
    """The Bwd op of a Fwd op, resolved against the Bwd entry when the manifest is loaded."""

    op: str
    saves: Tuple[str, ...]
    location: Location
    bwd_inputs: Tuple[str, ...] = ()   # in the Bwd op's forward order: grad_<output> or saved names
    bwd_outputs: Tuple[str, ...] = ()  # grad_<input> names
    bwd_import: str = ""               # import statement of the Bwd class, from the Fwd module
    bwd_primary: str = ""              # the Bwd op's primary input: its dtype is the Bwd op's
    bwd_static_dims: Tuple[str, ...] = ()
    bwd_params: Tuple[str, ...] = ()
    # (input, other input): inputs whose gradient is another's (``same_gradient``), in input order.
    same_gradient: Tuple[Tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ReferenceBackward:
    """``backward: reference``: gradients by autograd of the reference, recomputed in the backward
    from the inputs (all saved)."""

    location: Location


# Helpers a gradient formula may call: ``tileops.ops.gradient_formulas.__all__`` less ``ShapeOf``.
FORMULA_HELPERS = frozenset({"unreduce", "reduced_count", "extremum_gradient", "variance_gradient",
                             "cumprod_gradient"})
# What a formula may read of an input it does not save: a ``ShapeOf`` has only these.
SHAPE_ONLY_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device"})


@dataclass(frozen=True)
class FormulaBackward:
    """``backward: {saves: [...], gradients: {input: formula}}``: each floating-point input's
    gradient by a PyTorch expression of the saved tensors, ``grad_<output>`` and the params
    (see ``tileops.ops.gradient_formulas``).  An input that is not saved is seen by its shape only."""

    saves: Tuple[str, ...]
    gradients: Tuple[Tuple[str, str], ...]  # (input, formula), in input order
    location: Location


@dataclass(frozen=True)
class Workload:
    label: str
    shapes: Tuple[Tuple[str, Tuple[int, ...]], ...]
    dtypes: Tuple[str, ...]
    params: Tuple[Tuple[str, Any], ...]
    location: Location

    def shape_of(self, tensor: str) -> Optional[Tuple[int, ...]]:
        return dict(self.shapes).get(tensor)


@dataclass(frozen=True)
class OpSpec:
    """One manifest entry, validated and resolved."""

    name: str
    family: str
    status: str
    summary: str
    ref_api: str
    op_base: str
    module: str
    inputs: Tuple[TensorSpec, ...]
    outputs: Tuple[TensorSpec, ...]
    params: Tuple[ParamSpec, ...]
    static_dims: Tuple[StaticDim, ...]
    shape_rules: Tuple[ShapeRule, ...]
    output_rules: Tuple[OutputRule, ...]
    dtype_combos: Tuple[Tuple[Tuple[str, str], ...], ...]
    reference: str
    roofline: Roofline
    kernels: Tuple[KernelRef, ...]
    backward: Optional[Backward]
    workloads: Tuple[Workload, ...]
    location: Location
    source_text: str = field(compare=False, default="")
    # ``backward: reference``: gradients by PyTorch's autograd of ``reference`` (no Bwd op); every
    # Bwd op's (a gradient of a gradient) too.
    reference_backward: Optional[ReferenceBackward] = None
    # ``backward: {gradients: ...}``: gradients by the manifest's formulas (no Bwd op).
    formula_backward: Optional[FormulaBackward] = None

    @property
    def backward_by_reference(self) -> bool:
        return self.reference_backward is not None

    @property
    def backward_by_formulas(self) -> bool:
        return self.formula_backward is not None

    @property
    def differentiable(self) -> bool:
        """Whether the manifest says how autograd differentiates the op (a Bwd op, the reference
        or formulas)."""
        return self.backward is not None or self.backward_by_reference or self.backward_by_formulas

    # ---- derived names -------------------------------------------------------------
    @property
    def stem(self) -> str:
        """Class name without the ``Op`` suffix, e.g. ``RMSNormFwd``."""
        return self.name[: -len("Op")]

    @property
    def direction(self) -> str:
        return self.stem[-3:]

    @property
    def base_name(self) -> str:
        """Class name without direction and ``Op``, e.g. ``RMSNorm``."""
        return self.stem[:-3]

    @property
    def package(self) -> str:
        return f"tileops.ops.{self.family}"

    @property
    def path(self) -> str:
        """Repository path of the generated op file."""
        return f"tileops/ops/{self.family}/{self.module}.py"

    @property
    def custom_op_name(self) -> str:
        return f"tileops::{snake_case(self.stem)}"

    @property
    def input_names(self) -> Tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> Tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    @property
    def param_names(self) -> Tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def static_dim_names(self) -> Tuple[str, ...]:
        return tuple(d.name for d in self.static_dims)

    @property
    def primary_input(self) -> TensorSpec:
        """The input whose dtype is the op's ``dtype`` (first with a union or explicit list)."""
        for tensor in self.inputs:
            if tensor.dtype.same_as is None and len(tensor.dtype.names) > 1:
                return tensor
        return self.inputs[0]

    def tensor(self, name: str) -> TensorSpec:
        for tensor in self.inputs + self.outputs:
            if tensor.name == name:
                return tensor
        raise KeyError(name)

    def input_index(self, name: str) -> int:
        return self.input_names.index(name)

    def resolved_dtype_names(self, tensor: str) -> Tuple[str, ...]:
        """The dtype names a tensor may take, following ``same_as`` links."""
        spec = self.tensor(tensor).dtype
        seen = {tensor}
        while spec.same_as is not None and spec.same_as not in seen:
            seen.add(spec.same_as)
            spec = self.tensor(spec.same_as).dtype
        return spec.names

    @property
    def dtype_params(self) -> Tuple[str, ...]:
        """The params that give outputs their dtype (``dtype_param``), in output order."""
        return tuple(t.dtype_param for t in self.outputs if t.dtype_param is not None)

    def may_be_floating(self, tensor: str) -> bool:
        """Whether ``tensor`` may take a floating-point dtype."""
        return any(name in FLOATING_DTYPES for name in self.resolved_dtype_names(tensor))

    @property
    def differentiated_inputs(self) -> Tuple[str, ...]:
        """The inputs the op differentiates: those that may be floating-point and are not ``constant``."""
        return tuple(t.name for t in self.inputs if not t.constant and self.may_be_floating(t.name))


@dataclass(frozen=True)
class Manifest:
    """Every op of every manifest file, in file order then entry order."""

    ops: Tuple[OpSpec, ...]
    files: Tuple[str, ...]

    def op(self, name: str) -> OpSpec:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"no op named {name!r} in the manifest")

    def family(self, family: str) -> Tuple[OpSpec, ...]:
        return tuple(op for op in self.ops if op.family == family)

    @property
    def families(self) -> Tuple[str, ...]:
        return tuple(sorted({op.family for op in self.ops}))

    def by_name(self) -> Dict[str, OpSpec]:
        return {op.name: op for op in self.ops}
