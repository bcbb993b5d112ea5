"""Deterministic shape cases for an op, and what the manifest says each must do.

``generate_cases`` enumerates ranks (0 up to one past the largest usual rank
for inputs of free rank, the declared rank otherwise), every value of every
int param that could be an axis at that rank (valid and one past each end),
both values of bools, every choice, sizes of 1, odd sizes (3, 5, 7, 127),
random ones and empty axes (size 0), then adds probes: one axis of one input resized or a rank
changed, and a static dim committed with a size the input does not have.

``expect`` interprets the manifest over a case exactly in the order the
generated ``forward`` checks it (shape rules in manifest order, then static
dims, then output rules), so the validator knows which error, if any, the op
must raise and which shapes it must report.  The random source is seeded
from the op name: the same manifest always yields the same cases.
"""

from __future__ import annotations

import itertools
import random
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from codegen import rules
from codegen.model import OpSpec, ParamSpec, ShapeRule, StaticDim, Workload
from tileops._shape_rules import axis_size

from .context import torch_dtype

__all__ = ["Case", "Expectation", "generate_cases", "expect", "expected_roofline", "workload_case", "meta_inputs",
           "dtype_row", "primary_dtypes", "describe"]

Shape = Tuple[int, ...]

MAX_RANK = 4
ODD_SIZES = (3, 5, 127, 7, 1, 31)
RANDOM_SIZES = (1, 2, 3, 4, 5, 7, 8, 16, 31, 64, 127, 128)
# Static dims are committed with this size when the case gives them none (the
# rule that rejects such a case is checked before static dims are compared).
FALLBACK_SIZE = 1
MAX_PARAM_COMBOS = 48

ACCEPT = "accept"
RULE = "rule"
STATIC_DIM = "static_dim"
UNEVALUABLE = "unevaluable"


@dataclass(frozen=True)
class Case:
    """Input shapes (``None``: an optional input left out), params, committed static dims, dtype."""

    shapes: Tuple[Optional[Shape], ...]
    params: Tuple[Tuple[str, Any], ...]
    committed: Tuple[Tuple[str, int], ...]
    dtype: str

    @property
    def values(self) -> Dict[str, Any]:
        """Names a rule may read besides tensors: params and static dims."""
        return {**dict(self.params), **dict(self.committed)}


@dataclass(frozen=True)
class Expectation:
    """What the manifest says a case must do."""

    kind: str  # ACCEPT, RULE (a shape rule rejects), STATIC_DIM (mismatch), UNEVALUABLE
    rule: Optional[ShapeRule] = None
    static_dim: Optional[StaticDim] = None
    outputs: Dict[str, Shape] = field(default_factory=dict)
    problem: str = ""  # for UNEVALUABLE: which expression failed and how


def shape_map(op: OpSpec, case: Case) -> Dict[str, Shape]:
    return {name: shape for name, shape in zip(op.input_names, case.shapes) if shape is not None}


def describe(op: OpSpec, case: Case) -> str:
    """``x=(3, 5), weight=(5,), eps=1e-06, N=5, bfloat16`` for messages."""
    parts = [f"{n}={s}" for n, s in zip(op.input_names, case.shapes)]
    parts += [f"{k}={v!r}" for k, v in case.params]
    parts += [f"{k}={v}" for k, v in case.committed]
    return ", ".join(parts + [case.dtype])


# ---- expectation ----------------------------------------------------------------------
def _reads_absent_tensor(op: OpSpec, expr: rules.Expr, shapes: Dict[str, Shape]) -> bool:
    """A rule over an optional input that was left out is skipped, as in ``forward``."""
    read = rules.tensors_in(expr, frozenset(op.input_names))
    return any(name not in shapes for name in read)


def static_dim_size(dim: StaticDim, shapes: Dict[str, Shape], values: Dict[str, Any]) -> int:
    """``tensor.shape[axis]`` as the ops read it (``axis_size``: 1 along axis 0 or -1 of a
    0-d tensor); raises when the axis does not exist."""
    axis = rules.evaluate(dim.axis, shapes, values)
    size = axis_size(shapes[dim.tensor], axis)
    if size < 0:
        raise IndexError(f"{dim.tensor} of shape {tuple(shapes[dim.tensor])} has no axis {axis!r}")
    return size


def expect(op: OpSpec, case: Case) -> Expectation:
    shapes = shape_map(op, case)
    values = case.values
    for rule in op.shape_rules:
        if _reads_absent_tensor(op, rule.expr, shapes):
            continue
        try:
            holds = rules.evaluate(rule.expr, shapes, values)
        except Exception as exc:  # the rule itself needs a guard: a manifest defect
            return Expectation(UNEVALUABLE, rule=rule, problem=f"`{rule.text}` raises {type(exc).__name__}: {exc}")
        if not holds:
            return Expectation(RULE, rule=rule)
    committed = dict(case.committed)
    for dim in op.static_dims:
        if dim.tensor not in shapes:
            continue
        try:
            size = static_dim_size(dim, shapes, values)
        except Exception as exc:
            return Expectation(UNEVALUABLE, static_dim=dim,
                               problem=f"static dim {dim.name} = {dim.text} raises {type(exc).__name__}: {exc}; "
                                       f"no shape rule rejects this case first")
        if size != committed[dim.name]:
            return Expectation(STATIC_DIM, static_dim=dim)
    outputs = {}
    for output_rule in op.output_rules:
        try:
            outputs[output_rule.output] = tuple(rules.evaluate(output_rule.shape, shapes, values))
        except Exception as exc:
            return Expectation(UNEVALUABLE, problem=f"`{output_rule.text}` raises {type(exc).__name__}: {exc}")
    return Expectation(ACCEPT, outputs=outputs)


def workload_case(op: OpSpec, workload: Workload, dtype: str) -> Case:
    """The workload as an L2 case: defaults overridden by its params, static dims from its shapes."""
    params = {p.name: p.default for p in op.params if p.has_default}
    params.update(dict(workload.params))
    shapes = {name: tuple(shape) for name, shape in workload.shapes}
    committed = []
    for dim in op.static_dims:
        try:
            committed.append((dim.name, static_dim_size(dim, shapes, params)))
        except Exception:
            committed.append((dim.name, FALLBACK_SIZE))
    return Case(tuple(shapes.get(name) for name in op.input_names),
                tuple((p.name, params.get(p.name)) for p in op.params), tuple(committed), dtype)


def expected_roofline(op: OpSpec, case: Case, elem_bytes: int) -> Tuple[Any, Any]:
    """Flops and bytes of the manifest formulas, vars evaluated in order."""
    shapes = {n: s for n, s in zip(op.input_names, case.shapes) if s is not None}
    values: Dict[str, Any] = {**case.values, "elem_bytes": elem_bytes, "out_elem_bytes": elem_bytes}
    given = next((values.get(name) for name in op.dtype_params), None)
    if given is not None:  # a torch.dtype, or its name in a workload
        values["out_elem_bytes"] = torch_dtype(given).itemsize if isinstance(given, str) else given.itemsize
    for name, expr, _ in op.roofline.vars:
        values[name] = rules.evaluate(expr, shapes, values)
    return (rules.evaluate(op.roofline.flops, shapes, values),
            rules.evaluate(op.roofline.bytes, shapes, values))


# ---- dtypes and tensors -----------------------------------------------------------------
def primary_dtypes(op: OpSpec) -> Tuple[str, ...]:
    """The dtypes the op's ``dtype`` argument may take."""
    names = op.resolved_dtype_names(op.primary_input.name)
    if op.dtype_combos:
        in_combos = [dict(row).get(op.primary_input.name) for row in op.dtype_combos]
        names = tuple(n for n in names if n in in_combos) or names
    return names


def dtype_row(op: OpSpec, primary: str) -> Dict[str, str]:
    """A valid dtype for every input when the primary input has ``primary``."""
    row: Dict[str, str] = {}
    if op.dtype_combos:
        rows = [dict(r) for r in op.dtype_combos]
        matching = [r for r in rows if r.get(op.primary_input.name, primary) == primary]
        row.update((matching or rows)[0])
    row[op.primary_input.name] = primary
    for tensor in op.inputs:
        if tensor.name in row:
            continue
        spec = tensor.dtype
        if spec.same_as is None:
            row[tensor.name] = primary if primary in spec.names else spec.names[0]
    for tensor in op.inputs:  # same_as links last: their targets are set by now
        if tensor.dtype.same_as is not None:
            target = tensor.dtype.same_as
            while target not in row and op.tensor(target).dtype.same_as is not None:
                target = op.tensor(target).dtype.same_as
            row[tensor.name] = row.get(target, primary)
    return row


def meta_inputs(op: OpSpec, case: Case) -> List[Optional[torch.Tensor]]:
    """Meta tensors (no storage) for the case's shapes: ``forward`` routes them to the reference."""
    row = dtype_row(op, case.dtype)
    return [None if shape is None else torch.empty(shape, dtype=torch_dtype(row[name]), device="meta")
            for name, shape in zip(op.input_names, case.shapes)]


# ---- generation -------------------------------------------------------------------------
def _int_candidates(rank: Optional[int]) -> List[int]:
    # A 0-d input still takes dims 0 and -1, and refuses one past them.
    bound = MAX_RANK if rank is None else max(rank, 1)
    return list(range(-bound - 1, bound + 1))


def param_candidates(param: ParamSpec, rank: Optional[int]) -> List[Any]:
    """Values of one param worth trying at this rank, the default first."""
    if param.choices:
        values: List[Any] = list(param.choices)
    elif param.type in ("int", "Optional[int]"):
        values = _int_candidates(rank)
    elif param.type == "bool":
        values = [False, True]
    elif param.type in ("float", "Optional[float]"):
        values = [0.5]
    elif param.type == "Optional[dtype]":  # a widening the kernels fuse, and a narrowing cast first
        values = [torch.float32, torch.float16]
    elif param.type in ("Sequence[int]", "Optional[Sequence[int]]"):
        last = (rank or 1) - 1
        values = [(), (0,), (-1,), (last,), (0, last), (0, 0), (last + 1,)]
    else:  # str without choices: only the default means anything
        values = []
    if param.minimum is not None or param.maximum is not None:  # only values the op accepts
        values = [v for v in values + [param.minimum, param.maximum] if v is not None
                  and (param.minimum is None or v >= param.minimum) and (param.maximum is None or v <= param.maximum)]
    if param.type.startswith("Optional"):
        values.append(None)
    if param.has_default:
        values.insert(0, param.default)
    unique: List[Any] = []
    for value in values:
        if not any(value == u and type(value) is type(u) for u in unique):
            unique.append(value)
    return unique or [""]


def param_grid(op: OpSpec, rank: Optional[int], rng: random.Random) -> List[Tuple[Tuple[str, Any], ...]]:
    """Param combinations at this rank: all of them, or a fixed sample that keeps the defaults."""
    names = op.param_names
    grid = [tuple(zip(names, values)) for values in itertools.product(
        *(param_candidates(p, rank) for p in op.params))]
    if len(grid) > MAX_PARAM_COMBOS:
        grid = [grid[0]] + rng.sample(grid[1:], MAX_PARAM_COMBOS - 1)
    return grid


def _sizes(count: int, style: int, rng: random.Random) -> List[int]:
    """Sizes for ``count`` axes: all 1 (style 0), odd (1), random with one empty axis (2), random (3+)."""
    if style == 0:
        return [1] * count
    if style == 1:
        return [rng.choice(ODD_SIZES) for _ in range(count)]
    sizes = [rng.choice(RANDOM_SIZES) for _ in range(count)]
    if style == 2 and sizes:
        sizes[rng.randrange(count)] = 0  # empty tensors are valid input: the op must handle them
    return sizes


def _free_rank_inputs(op: OpSpec) -> List[str]:
    return [t.name for t in op.inputs if t.shape is None]


class _CaseBuilder:
    """Builds one consistent case from a rank, params and a size style."""

    def __init__(self, op: OpSpec, rng: random.Random) -> None:
        self.op = op
        self.rng = rng

    def build(self, rank: Optional[int], params: Tuple[Tuple[str, Any], ...], style: int,
              dtype: str, drop_optional: bool) -> Case:
        op, rng = self.op, self.rng
        values: Dict[str, Any] = dict(params)
        shapes: Dict[str, Optional[Shape]] = {}
        # Inputs of free rank share one shape, so rules relating them hold unless a probe breaks them.
        free_shape = tuple(_sizes(rank or 0, style, rng))
        for name in _free_rank_inputs(op):
            shapes[name] = free_shape
        committed = self._static_dims({k: v for k, v in shapes.items() if v is not None}, values)
        sizes = dict(committed)
        for tensor in op.inputs:
            if tensor.shape is None:
                continue
            shape = []
            for entry in tensor.shape:
                if isinstance(entry, int):
                    shape.append(entry)
                elif isinstance(values.get(entry), int) and not isinstance(values.get(entry), bool):
                    shape.append(values[entry])
                else:
                    if entry not in sizes:
                        sizes[entry] = _sizes(1, style, rng)[0]
                    shape.append(sizes[entry])
            shapes[tensor.name] = tuple(shape)
        for tensor in op.inputs:
            if tensor.optional and drop_optional:
                shapes[tensor.name] = None
        present = {k: v for k, v in shapes.items() if v is not None}
        committed.update({k: v for k, v in self._static_dims(present, values).items() if k not in committed})
        return Case(tuple(shapes[t.name] for t in op.inputs), params,
                    tuple((d.name, committed.get(d.name, FALLBACK_SIZE)) for d in op.static_dims), dtype)

    def _static_dims(self, shapes: Dict[str, Shape], values: Dict[str, Any]) -> Dict[str, int]:
        found = {}
        for dim in self.op.static_dims:
            if dim.tensor not in shapes:
                continue
            try:
                found[dim.name] = static_dim_size(dim, shapes, values)
            except Exception:
                found[dim.name] = FALLBACK_SIZE
        return found


def _resized_probe(op: OpSpec, case: Case, rng: random.Random) -> Optional[Case]:
    """One axis of one input grows by one, or one input gains or loses a trailing axis."""
    present = [i for i, s in enumerate(case.shapes) if s is not None]
    if not present:
        return None
    index = rng.choice(present)
    shape = list(case.shapes[index])
    choice = rng.randrange(4) if shape else 3
    if choice < 2:
        shape[rng.randrange(len(shape))] += 1
    elif choice == 2:
        shape.pop()
    else:
        shape.append(2)
    shapes = list(case.shapes)
    shapes[index] = tuple(shape)
    return Case(tuple(shapes), case.params, case.committed, case.dtype)


def _committed_probe(case: Case, index: int) -> Optional[Case]:
    """A static dim committed one larger than the input has."""
    if not case.committed:
        return None
    committed = list(case.committed)
    name, size = committed[index % len(committed)]
    committed[index % len(committed)] = (name, size + 1)
    return Case(case.shapes, case.params, tuple(committed), case.dtype)


def generate_cases(op: OpSpec, minimum: int = 200) -> List[Case]:
    """At least ``minimum`` distinct cases, the same ones on every run."""
    rng = random.Random(zlib.crc32(op.name.encode()))
    ranks: Sequence[Optional[int]] = list(range(0, MAX_RANK + 2)) if _free_rank_inputs(op) else [None]
    combos = [(rank, params) for rank in ranks for params in param_grid(op, rank, rng)]
    dtypes = primary_dtypes(op)
    has_optional = any(t.optional for t in op.inputs)
    builder = _CaseBuilder(op, rng)
    cases: List[Case] = []
    seen = set()

    def add(case: Optional[Case]) -> None:
        if case is not None and case not in seen:
            seen.add(case)
            cases.append(case)

    step = 0
    # Every rank/param combination at least once, and at least ``minimum`` cases.
    while (len(cases) < minimum or step < len(combos)) and step < 50 * max(minimum, len(combos)):
        rank, params = combos[step % len(combos)]
        style = step // len(combos)
        drop_optional = has_optional and step % 3 == 1  # a third of the cases, probes included
        base = builder.build(rank, params, style, dtypes[step % len(dtypes)], drop_optional)
        add(base)
        if step % 4 == 3:
            add(_resized_probe(op, base, rng))
        if step % 8 == 5:
            add(_committed_probe(base, step))
        step += 1
    return cases
