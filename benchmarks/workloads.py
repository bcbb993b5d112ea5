"""From the manifest to benchmark cases: which op, workload and dtype, with which inputs.

A workload names a shape per input, dtypes and param overrides; from those this module
derives the op's constructor arguments (static dims, params, dtype), the input shapes
passed to ``eval_roofline`` and random input tensors.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from codegen import rules
from codegen.model import Manifest, OpSpec, Workload

__all__ = [
    "BenchEntry", "Case", "load_entries", "select_cases", "param_values", "static_dim_values",
    "input_shapes", "input_dtype_names", "constructor_kwargs", "random_inputs", "build_inputs",
    "resolve_op_class", "split_names", "tensor_bytes",
]

logger = logging.getLogger(__name__)

Shape = Tuple[int, ...]
InputFactory = Callable[..., Sequence[Any]]


@dataclass(frozen=True)
class BenchEntry:
    """One ``benchmarks/ops/<module>.py``: the op it covers and its optional input factory."""

    op: str
    module: str
    make_inputs: Optional[InputFactory] = None


@dataclass(frozen=True)
class Case:
    """One op on one workload in one dtype."""

    spec: OpSpec
    workload: Workload
    dtype: str
    entry: Optional[BenchEntry] = None

    @property
    def label(self) -> str:
        return f"{self.spec.name}/{self.workload.label}/{self.dtype}"


def load_entries(package: str = "benchmarks.ops") -> Dict[str, BenchEntry]:
    """Every entry module of ``package``, keyed by its ``OP``."""
    found: Dict[str, BenchEntry] = {}
    root = importlib.import_module(package)
    for info in pkgutil.iter_modules(root.__path__):
        module = importlib.import_module(f"{package}.{info.name}")
        op = getattr(module, "OP", None)
        if not isinstance(op, str):
            logger.warning("%s defines no OP name; ignored", module.__name__)
            continue
        factory = getattr(module, "make_inputs", None)
        if factory is not None and not callable(factory):
            raise TypeError(f"{module.__name__}.make_inputs must be a function or None")
        found[op] = BenchEntry(op, module.__name__, factory)
    return found


def split_names(values: Optional[Sequence[str]]) -> List[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]`` (the Makefile passes one word per flag)."""
    return [part for value in values or () for part in value.replace(",", " ").split()]


def select_cases(manifest: Manifest, entries: Mapping[str, BenchEntry],
                 ops: Optional[Sequence[str]] = None, workloads: Optional[Sequence[str]] = None,
                 dtypes: Optional[Sequence[str]] = None) -> List[Case]:
    """Implemented ops x their workloads x dtypes, narrowed by the filters (None: all)."""
    wanted_ops, wanted_workloads, wanted_dtypes = split_names(ops), split_names(workloads), split_names(dtypes)
    known = {spec.name for spec in manifest.ops}
    for name in wanted_ops:
        if name not in known:
            raise ValueError(f"no op named {name!r} in the manifest (known: {sorted(known)})")
    for name in entries:
        if name not in known:
            logger.warning("benchmark entry for %s, which is not in the manifest", name)
    cases = []
    for spec in manifest.ops:
        if wanted_ops and spec.name not in wanted_ops:
            continue
        if spec.status != "implemented":
            if wanted_ops:
                logger.warning("%s is %s: no kernel to benchmark", spec.name, spec.status)
            continue
        for workload in spec.workloads:
            if wanted_workloads and workload.label not in wanted_workloads:
                continue
            for dtype in workload.dtypes:
                if wanted_dtypes and dtype not in wanted_dtypes:
                    continue
                cases.append(Case(spec, workload, dtype, entries.get(spec.name)))
    unmatched = set(wanted_workloads) - {case.workload.label for case in cases}
    if unmatched:
        logger.warning("no selected op has workload(s) %s", sorted(unmatched))
    return cases


def resolve_op_class(spec: OpSpec) -> type:
    """The generated class of ``spec`` from its family package."""
    module = importlib.import_module(spec.package)
    return getattr(module, spec.name)


# ---- constructor arguments -----------------------------------------------------------------
def param_values(spec: OpSpec, workload: Workload) -> Dict[str, Any]:
    """Every param's value: the manifest default, overridden by the workload."""
    values = {p.name: p.default for p in spec.params if p.has_default}
    values.update(dict(workload.params))
    missing = [p.name for p in spec.params if p.name not in values]
    if missing:
        raise ValueError(f"{spec.name} workload {workload.label!r} gives no value for {missing}")
    return values


def input_shapes(spec: OpSpec, workload: Workload) -> List[Optional[Shape]]:
    """Shapes in forward order; None for an optional input the workload leaves out."""
    shapes = dict(workload.shapes)
    out: List[Optional[Shape]] = []
    for tensor in spec.inputs:
        if tensor.name not in shapes and not tensor.optional:
            raise ValueError(f"{spec.name} workload {workload.label!r} gives no shape for {tensor.name}")
        out.append(tuple(shapes[tensor.name]) if tensor.name in shapes else None)
    return out


def static_dim_values(spec: OpSpec, workload: Workload, params: Mapping[str, Any]) -> Dict[str, int]:
    """Each static dim read off the workload shapes, e.g. ``N = x.shape[dim]``."""
    shapes = dict(workload.shapes)
    values = {}
    for dim in spec.static_dims:
        axis = rules.evaluate(dim.axis, shapes, params)
        values[dim.name] = int(shapes[dim.tensor][axis])
    return values


def constructor_kwargs(spec: OpSpec, workload: Workload, dtype: Any) -> Dict[str, Any]:
    """``Op(**static_dims, dtype=dtype, **params)`` as a dict."""
    params = param_values(spec, workload)
    return {**static_dim_values(spec, workload, params), "dtype": dtype, **params}


# ---- inputs --------------------------------------------------------------------------------
def _dtype_root(spec: OpSpec, tensor: str) -> str:
    """The tensor at the end of a ``same_as`` chain."""
    seen = {tensor}
    current = spec.tensor(tensor)
    while current.dtype.same_as is not None and current.dtype.same_as not in seen:
        seen.add(current.dtype.same_as)
        current = spec.tensor(current.dtype.same_as)
    return current.name


def input_dtype_names(spec: OpSpec, dtype: str) -> Dict[str, str]:
    """Each input's dtype name when the op runs in ``dtype``.

    The primary input (and everything ``same_as`` it) takes ``dtype``; a fixed dtype stays;
    another union takes ``dtype`` when allowed, else its first member. A ``dtype_combos``
    row whose primary entry is ``dtype`` wins over all of that.
    """
    primary = spec.primary_input.name
    combo = next((dict(row) for row in spec.dtype_combos if dict(row).get(primary) == dtype), {})
    names = {}
    for tensor in spec.inputs:
        root = _dtype_root(spec, tensor.name)
        allowed = spec.tensor(root).dtype.names
        if tensor.name in combo:
            names[tensor.name] = combo[tensor.name]
        elif root in combo:
            names[tensor.name] = combo[root]
        elif root == primary or dtype in allowed:
            names[tensor.name] = dtype
        else:
            names[tensor.name] = allowed[0]
    return names


def random_inputs(spec: OpSpec, workload: Workload, dtype: str, device: Any,
                  generator: Any = None) -> List[Any]:
    """Random inputs: normal floats, integers in [1, 16), random booleans; never all zeros."""
    import torch

    dtypes = input_dtype_names(spec, dtype)
    tensors: List[Any] = []
    for tensor, shape in zip(spec.inputs, input_shapes(spec, workload)):
        if shape is None:
            tensors.append(None)
            continue
        torch_dtype = getattr(torch, dtypes[tensor.name])
        if torch_dtype.is_floating_point:
            value = torch.randn(shape, device=device, dtype=torch_dtype, generator=generator)
        elif torch_dtype == torch.bool:
            value = torch.randint(0, 2, shape, device=device, generator=generator).bool()
        else:
            value = torch.randint(1, 16, shape, device=device, dtype=torch_dtype, generator=generator)
        tensors.append(value)
    return tensors


def build_inputs(case: Case, device: Any, generator: Any = None) -> List[Any]:
    """One input set: the entry's ``make_inputs`` when it has one, else random."""
    import torch

    if case.entry is not None and case.entry.make_inputs is not None:
        made = case.entry.make_inputs(shapes=dict(case.workload.shapes), dtype=getattr(torch, case.dtype),
                                      device=device, params=param_values(case.spec, case.workload))
        made = list(made)
        if len(made) != len(case.spec.inputs):
            raise ValueError(f"{case.entry.module}.make_inputs returned {len(made)} tensors; "
                             f"{case.spec.name} takes {len(case.spec.inputs)}")
        return made
    return random_inputs(case.spec, case.workload, case.dtype, device, generator)


def tensor_bytes(tensors: Sequence[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
