"""Seeded random cases of every op, drawn from what its manifest entry accepts.

The hand-written cases test each rule one at a time: odd sizes on one axis, every ``dim``, one
layout for every input.  A random case combines them: a rank from 0 to 4, sizes mixing
primes, powers of two and their neighbours on the axis the op works along, params drawn from
their declared choices and bounds (tuples of dims in any order, negative or not), broadcast
operands, optional inputs left out, and each input in its own memory layout
(``op_checks.laid_out``: strided, misaligned, transposed, padded rows, stride 0).  A case is
kept only when the manifest's shape rules accept it, so the generator needs nothing per op.

``random_cases(op, count, seed)`` returns the same cases for the same arguments in every
process (pytest's workers each collect them).
"""

from __future__ import annotations

import math
import random
from typing import Any, Dict, List, Optional, Tuple

import torch

from codegen.model import OpSpec, ParamSpec
from tests.op_checks import DTYPES, Case, Shape, _sized_axis, _spec, _values, accepted

__all__ = ["random_cases"]

# Sizes of the axis the op works along (its ``dim``, else the last).
MAIN_SIZES = (1, 2, 3, 31, 64, 100, 127, 128, 255, 257, 1000, 1024, 2047, 4096, 4097, 8191, 12289, 16385,
              33000, 65537)
# Sizes of the other axes, and how often one is empty.
SIDE_SIZES = (1, 2, 3, 5, 7, 16, 33)
EMPTY_AXIS = 0.03
# Sizes of the other symbols of declared shapes (a loss's rows).
ROW_COUNTS = (1, 2, 3, 7, 33, 100, 1000, 4097)
RANKS = (0, 1, 1, 2, 2, 2, 3, 3, 4)
# Values of int params without bounds, by name; others keep their default.
INT_PARAM_VALUES = {"correction": (0, 1, 2), "ignore_index": (-100, 0, 1)}
# Draws of one case before the generator gives up on it (the shape rules reject most draws of
# ops with few valid shapes, such as cross-entropy's [N, V] and [N]).
ATTEMPTS = 400


def random_cases(op_name: str, count: int, seed: int = 0, max_numel: int = 1 << 21) -> List[Case]:
    """``count`` distinct random cases of ``op_name`` whose inputs each hold at most ``max_numel``
    elements (fewer where the manifest accepts fewer distinct draws)."""
    op = _spec(op_name)
    rng = random.Random(f"{seed}/{op_name}")  # a str seed: the same in every process
    cases: List[Case] = []
    for _ in range(count * ATTEMPTS):
        if len(cases) == count:
            break
        case = _draw(op, rng, max_numel)
        if case is not None and case not in cases:
            cases.append(case)
    return cases


def _draw(op: OpSpec, rng: random.Random, max_numel: int) -> Optional[Case]:
    rank = rng.choice(RANKS)
    params = _draw_params(op, rank, rng)
    shapes = _draw_shapes(op, rank, params, rng)
    if shapes is None or max(math.prod(s) for s in shapes.values()) > max_numel:
        return None
    names = [d for d in op.resolved_dtype_names(op.primary_input.name) if d in DTYPES]
    layouts = tuple((t.name, _draw_layout(t.optional, shapes[t.name], rng)) for t in op.inputs)
    # Inputs with a dtype union of their own (soft targets) draw theirs independently.
    free_dtypes = tuple((t.name, DTYPES[rng.choice([d for d in t.dtype.names if d in DTYPES])]) for t in op.inputs
                        if t.dtype.is_union and t.name != op.primary_input.name)
    return Case(op.name, tuple(shapes.items()), DTYPES[rng.choice(names)], tuple(params.items()),
                label="random", input_layouts=layouts, input_dtypes=free_dtypes)


def _draw_shapes(op: OpSpec, rank: int, params: Dict[str, Any], rng: random.Random) -> Optional[Dict[str, Shape]]:
    """Inputs without a declared shape take one random shape of ``rank``; declared shapes take
    random sizes for their symbols.  Then, half the time (or whenever that is rejected), one input
    without a declared shape takes another shape the rules accept: broadcast against the others,
    its last axis halved or doubled (a gated activation's gradient), or one of the declared shapes
    (a loss's gradient per row)."""
    free_shape = [0 if rng.random() < EMPTY_AXIS else rng.choice(SIDE_SIZES) for _ in range(rank)]
    if rank:
        free_shape[_sized_axis(params, rank)] = rng.choice(MAIN_SIZES)
    free = [t.name for t in op.inputs if t.shape is None]
    shapes: Dict[str, Shape] = {name: tuple(free_shape) for name in free}
    symbols = _bind_symbols(op, shapes, params, rng)
    for t in op.inputs:
        if t.shape is not None:
            shapes[t.name] = tuple(d if isinstance(d, int) else symbols[d] for d in t.shape)
    # One input alone keeps its shape: its params (the axes of ``dim``) were drawn for its rank.
    variants = [dict(shapes, **{name: other}) for name in free if len(shapes) > 1
                for other in _other_shapes(shapes[name], shapes, rng)]
    accepted_variants = [v for v in variants if accepted(op, v, params)]
    if accepted(op, shapes, params) and (not accepted_variants or rng.random() < 0.5):
        return shapes
    return rng.choice(accepted_variants) if accepted_variants else None


def _bind_symbols(op: OpSpec, free: Dict[str, Shape], params: Dict[str, Any], rng: random.Random) -> Dict[str, int]:
    """Sizes of the symbols of declared shapes (``N``, ``V``): static dims the free inputs fix,
    else random, the op's static dims from ``MAIN_SIZES`` and the rest from ``ROW_COUNTS``."""
    try:
        values = _values(op, free, params)
    except (IndexError, KeyError):  # a static dim of a declared shape: drawn below
        values = dict(params)
    static = set(op.static_dim_names)
    for t in op.inputs:
        for d in t.shape or ():
            if isinstance(d, str) and d not in values:
                values[d] = rng.choice(MAIN_SIZES if d in static else ROW_COUNTS)
    return values


def _other_shapes(shape: Shape, shapes: Dict[str, Shape], rng: random.Random) -> List[Shape]:
    out = [s for s in shapes.values() if s != shape] + [()]
    if shape:
        out += [shape[:-1] + (shape[-1] // 2,), shape[:-1] + (2 * shape[-1],)]
        kept = shape[rng.randint(0, len(shape)):] if rng.random() < 0.5 else shape
        out.append(tuple(1 if rng.random() < 0.4 else size for size in kept))
    return out


def _draw_params(op: OpSpec, rank: int, rng: random.Random) -> Dict[str, Any]:
    params: Dict[str, Any] = {}
    for p in op.params:
        value = _draw_param(p, rank, rng)
        if value is not _DEFAULT:
            params[p.name] = value
    return params


_DEFAULT = object()


def _draw_param(p: ParamSpec, rank: int, rng: random.Random) -> Any:
    if p.name == "dim":
        return _draw_dim(p.type, rank, rng)
    if p.choices:
        return rng.choice(p.choices)
    if p.type == "bool":
        return rng.random() < 0.5
    if p.type == "float" and p.minimum is not None and p.maximum is not None:
        return rng.choice((p.default, p.minimum, p.maximum, round(rng.uniform(p.minimum, p.maximum), 3)))
    if p.type == "int" and p.name in INT_PARAM_VALUES:
        return rng.choice(INT_PARAM_VALUES[p.name])
    if p.type == "Optional[dtype]":  # half the time the input's own; a widening, a narrowing
        return rng.choice((_DEFAULT, _DEFAULT, torch.float32, torch.float16))
    return _DEFAULT


def _draw_dim(kind: str, rank: int, rng: random.Random) -> Any:
    """An axis (``int``), maybe None (``Optional[int]``), or None or a tuple of distinct axes in
    any order, each maybe negative (``Optional[Sequence[int]]``)."""
    extent = max(rank, 1)
    if kind == "int":
        return rng.randrange(-extent, extent)
    if kind == "Optional[int]":
        return None if rng.random() < 0.25 else rng.randrange(-extent, extent)
    if rng.random() < 0.25 or rank == 0:
        return None
    axes = rng.sample(range(rank), rng.randint(1, rank))
    return tuple(a - rank if rng.random() < 0.5 else a for a in axes)


def _draw_layout(optional: bool, shape: Tuple[int, ...], rng: random.Random) -> str:
    if optional and rng.random() < 0.2:
        return "absent"
    layouts = ["contiguous", "contiguous", "offset"]
    if shape:
        layouts += ["strided", "padded"]
    if len(shape) >= 2:
        layouts.append("transposed")
    if shape and shape[0] > 1:
        layouts.append("expanded")
    return rng.choice(layouts)
