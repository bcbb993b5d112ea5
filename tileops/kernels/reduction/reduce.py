"""One generic reduction, parameterised by its reducer (``reducers.py``).

Inputs are seen as ``(rows, N)`` when the reduced extent is innermost, else
as ``(outer, N, inner)``; both may be strided (a row stride, or outer and axis
strides) as long as the innermost extent has unit stride.  Every extent and
stride is a TileLang symbolic value (``N`` and strides 64-bit), so one
compiled program per shape parameters serves every input shape.

Programs (``S`` segments split the reduced extent when the other extents
give too few blocks to fill the GPU):

* **row**: block ``(row, seg)`` walks its segment of a row (every ``S``-th
  group of ``unroll`` chunks, from group ``seg`` on) with 16-byte loads,
  ``unroll`` vectors in flight per thread, then merges its threads'
  states with warp shuffles (one shared-memory exchange between warps).
  With one segment it writes the output (fused), else a float64 partial
  state ``P[row, seg, 0, :]``.  Rows of exactly 1, 2 or 4 chunks
  (``exact``) are walked in straight-line code with no bounds checks; fused
  rows of ``long_row_unroll`` chunks or more take ``long_row_threads``
  threads a block.  Rows no 16-byte access can start (an odd length or
  stride) are read in aligned 16-byte windows (``windowed``).
* **column**: block ``(outer, inner tile, seg)``: ``col_threads`` threads
  cover ``col_threads * cvec`` neighbouring inner positions, the other
  ``lanes`` walk the axis; states merge across lanes.  Fused or partial, as
  rows.  When the tiles alone give the GPU enough blocks, one fused pass
  walks the whole axis instead, with the kernel's ``one_pass_*`` config:
  no partials and no combine launch.  Its tiles are 512 bytes wide, halved
  while too few down to 256; failing that, long axes take the 512-byte
  tiles over a few long segments (about two blocks an SM), and the rest
  narrower tiles in one pass, down to a 128-byte line, or to a 32-byte
  sector over short axes (``_one_pass_plan``).
* **combine**: ``P[o, :, i, :]`` merged into ``out[o, i]``; ``group`` threads
  share one output (many segments) or one thread serves one (few).
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
from typing import Any, Dict, List, Optional, Tuple

import torch

from tileops.kernels.device_traits import has_fast_memory
from tileops.kernels.kernel_base import SM90_BUILD_TARGET, Kernel, column_placement, strided_rows, torch_dtype_to_tl
from tileops.kernels.launch import ALIGNMENT, direct_launcher, widest_access
from tileops.kernels.reduction.reducers import REDUCERS, ReducerSpec, reducer_macros
from tileops.kernels.sizes import (
    ACCUM,
    MAX_THREADS,
    SECTOR_BYTES,
    WARP,
    check_kernel_args,
    check_out_dtype,
    is_pow2,
    largest_pow2_divisor,
    max_vector,
    next_pow2,
)

__all__ = [
    "ReductionKernel",
    "SumKernel",
    "MeanKernel",
    "AmaxKernel",
    "AminKernel",
    "VarKernel",
    "LogSumExpKernel",
    "ArgmaxKernel",
    "L2NormKernel",
    "build_program",
    "ROW",
    "COLUMN",
    "COMBINE",
]


PARTIAL = "float64"
MAX_COL_THREADS = 32
NARROW_COL_THREADS = 8
# Blocks per SM the split programs aim for when choosing the segment count.  Column
# programs split finer: their blocks cover narrow strips, and more of them even out the
# SMs' shares of a wide axis (16 measured faster than 4 or 8 on 16384 x 16384 columns).
ROW_BLOCKS_PER_SM = 4
COLUMN_BLOCKS_PER_SM = 16
# The one-pass column program needs this many blocks per SM, in eighths (1.5): below it,
# splitting the axis keeps more loads in flight (32768 x 8192 bf16 column sums: 128
# one-pass blocks took 243 us, the split program 210).  Narrower tiles reach it on
# shapes with few columns (64 x 4096 x 64 bf16 over the middle axis, 32-byte tiles
# against the split program: sum 18.4 against 24.4 us, variance 22.8 against 27.7,
# log-sum-exp 30.4 against 35.3; 16 x 4096 x 256: sum 19.3 against 24.2), as long as a
# block's strip stays short: narrower tiles over long axes measured slower (16384 x
# 16384: 64-byte tiles 225 us, 128-byte ones 191).  (These figures predate the column
# walk's single bounds check; with it, 64 x 4096 x 64 takes sum 17.5, variance 22.5 and
# log-sum-exp 20.4 us in the H100 benchmark.)
NARROW_ONE_PASS_BYTES = 128 * 1024
# One-pass tiles narrower than an L2 line (four sectors) take short strips only (above).
LINE_BYTES = 128
# Chunk counts (``row_threads * vector`` elements) of rows the fused row program walks
# straight through, unchecked: a program each, for the common power-of-two widths.
EXACT_ROW_CHUNKS = (1, 2, 4)
ONE_PASS_EIGHTHS_PER_SM = 12

ROW = "row"
COLUMN = "column"
COMBINE = "combine"

# A program's shape parameters: ((name, value), ...), e.g. (("vector", 8), ("fused", 1)).
ProgramParams = Tuple[Tuple[str, int], ...]


# ---- shared building blocks -------------------------------------------------------------------


def _tree_merge(T: Any, spec: ReducerSpec, macros: Dict[str, Any], W: int, count: int, spacing: int) -> Any:
    """Macro: merge the states of ``count`` threads ``spacing`` apart (a group) into the group's first.

    Each level halves the live threads; ``sh``/``shi`` hold every thread's
    state (``[slot * W + k, tx]``), read by the partner one level up.
    """
    levels = max(0, count.bit_length() - 1)
    merge = macros["merge"]

    @T.macro
    def tree(st, sti, ot, oti, sh, shi, tx):
        for k in T.unroll(W):
            for j in T.unroll(spec.slots):
                sh[j * W + k, tx] = st[j * W + k]
            if spec.index:
                shi[k, tx] = sti[k]
        for level in T.unroll(levels):
            T.sync_threads()
            if (tx // spacing) % count < (count >> (level + 1)):
                for k in T.unroll(W):
                    for j in T.unroll(spec.slots):
                        ot[j] = sh[j * W + k, tx + (count >> (level + 1)) * spacing]
                    if spec.index:
                        oti[0] = shi[k, tx + (count >> (level + 1)) * spacing]
                    merge(st, sti, k, ot, oti)
                    for j in T.unroll(spec.slots):
                        sh[j * W + k, tx] = st[j * W + k]
                    if spec.index:
                        shi[k, tx] = sti[k]

    return tree


def _shuffle_merge(T: Any, spec: ReducerSpec, macros: Dict[str, Any], count: int, merge_hook: str = "merge") -> Any:
    """Macro: merge the states of each group of ``count`` consecutive threads with the reducer's
    ``merge_hook``; every thread of the group ends with the group's state (``_tree_merge`` for
    ``W = 1``, ``spacing = 1``).

    Lanes merge with xor shuffles; groups wider than a warp then pass each warp's state through
    ``sh``/``shi`` (``[slot, warp]``), and every lane loads one warp's and shuffles again: one
    barrier, against one per halving level of the shared-memory tree.  (Measured on H100, bf16
    8 x 4096 rows of 256 threads, µs with the tree / with shuffles: LogSumExp 5.82 / 5.47, Var
    6.14 / 6.02, Argmax 5.63 / 5.50.)
    """
    if not is_pow2(count):
        raise ValueError(f"reduction tree: groups of {count} threads are not a power of two")
    in_warp = min(count, WARP)
    warps = max(1, count // WARP)
    merge = macros[merge_hook]

    @T.macro
    def exchange(st, sti, ot, oti, steps):
        for step in T.unroll(steps):
            for j in T.unroll(spec.slots):
                ot[j] = T.shfl_xor(st[j], 1 << step)
            if spec.index:
                oti[0] = T.shfl_xor(sti[0], 1 << step)
            merge(st, sti, 0, ot, oti)

    @T.macro
    def tree(st, sti, ot, oti, sh, shi, tx):
        exchange(st, sti, ot, oti, in_warp.bit_length() - 1)
        if warps > 1:
            if tx % WARP == 0:
                for j in T.unroll(spec.slots):
                    sh[j, tx // WARP] = st[j]
                if spec.index:
                    shi[0, tx // WARP] = sti[0]
            T.sync_threads()
            # Each lane takes one warp of its group (lanes past the group's warps repeat them,
            # and the shuffles below only pair lanes less than ``warps`` apart).
            for j in T.unroll(spec.slots):
                st[j] = sh[j, (tx // count) * warps + tx % warps]
            if spec.index:
                sti[0] = shi[0, (tx // count) * warps + tx % warps]
            exchange(st, sti, ot, oti, warps.bit_length() - 1)

    return tree


def _fold_reducer(reducer: str, fused: int, counted_segments: bool = False) -> str:
    """The reducer a program folds with.  A fused mean's count is the extent ``N``, which every
    thread knows, so it folds as a sum (one state slot, half the merge traffic) and its final
    store divides by ``N`` (``_store_macros``).  Where a program stores the counts of its
    partial means itself (``counted_segments``: the row program, whose segments together
    cover the extent ``N``), they fold as sums too."""
    return "sum" if (fused or counted_segments) and reducer == "mean" else reducer


def _store_macros(T: Any, spec: ReducerSpec, macros: Dict[str, Any], out_dtype: str,
                  divisor: Any = None) -> Dict[str, Any]:
    """Partial stores and loads, and ``final``: the finished state (over ``divisor`` if given) in ``out_dtype``."""
    finish = macros["finish"]

    @T.macro
    def store_partial(P, st, sti, k, W, o, seg, i):
        for j in T.unroll(spec.slots):
            P[o, seg, i, j] = T.cast(st[j * W + k], PARTIAL)
        if spec.index:
            P[o, seg, i, spec.slots] = T.cast(sti[k], PARTIAL)

    @T.macro
    def load_partial(P, ot, oti, o, seg, i):
        for j in T.unroll(spec.slots):
            ot[j] = T.cast(P[o, seg, i, j], ACCUM)
        if spec.index:
            oti[0] = T.cast(P[o, seg, i, spec.slots], "int64")

    def final(st, sti, k):
        if divisor is not None:
            return T.cast(finish(st, sti, k) / T.cast(divisor, ACCUM), out_dtype)
        return T.cast(finish(st, sti, k), out_dtype)

    return {"store_partial": store_partial, "load_partial": load_partial, "final": final}


# ---- row program --------------------------------------------------------------------------------


def row_program(reducer: str, dtype: str, out_dtype: str, correction: float, *, vector: int, threads: int,
                unroll: int, fused: int, exact: int = 0, windowed: int = 0) -> Any:
    """Reduce every row of ``(G, N)``: into ``Y[G]`` (fused) or into partials ``P[G, S, 1, width]``.

    ``exact``: every row is exactly ``unroll`` chunks (``N == threads * vector * unroll``, fused
    only), so the walk is straight-line code with no bounds checks.  Short rows gain twice: a
    loop with a run-time trip count delays their loads, and checked loads let the compiler
    issue some of them only after folding the others, a memory latency each time (H100, fp32
    amax of 8 x 4096 rows: the loop 5.15 us, one checked step 5.57, exact 4.86-4.96).

    ``windowed``: rows whose starts or length no ``vector``-element access fits (``N`` or the
    row stride not a multiple of it; the tensor's start must be) are walked in aligned windows
    of one vector, as if each row began ``skew`` elements earlier, at the window its first
    element lies in.  Each window is one ``vector``-wide load, those at the row's ends too, and
    only the row's elements are folded (a 32-bit check an element).  Reading past the row is
    safe: an aligned window that holds one of the tensor's elements lies in that element's page,
    and in its block of PyTorch's allocator (512-byte multiples).  Without windows such rows
    take one-element accesses, whose few bytes in flight a thread leave the memory idle (H200,
    bf16 argmax of 256 x 50257: 30.5 us, 20 % of copy bandwidth; in windows 23.7).  The end
    windows read element by element, each under its own check, took 127 registers a thread
    where the plain program takes 34, and summed rows of 16384 x 4100 bf16 3x slower than
    8-byte accesses (107.7 against 35.0 us).
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    if exact and not fused:
        raise ValueError("reduction row program: exact rows need the fused program (a segment per row)")
    if exact and windowed:
        raise ValueError("reduction row program: exact rows are whole vectors, never windows")
    # A mean folds as a sum: its count is the row's extent (see the partial store below).
    folded = _fold_reducer(reducer, fused, counted_segments=True)
    spec = REDUCERS[folded]
    prelude = spec.prelude or None  # outside the programs: TVMScript would parse the `or`
    macros = reducer_macros(T, folded, 1, correction)
    init, fold, prepare = macros["init"], macros["fold"], macros["prepare"]
    tally, chunk_init, chunk_fold, rebase = (macros.get(hook)
                                             for hook in ("tally", "chunk_init", "chunk_fold", "rebase"))
    exact_init, needs_exact, exact_fold = (macros.get(hook) for hook in ("exact_init", "needs_exact", "exact_fold"))
    # A block's threads fold its segment about one shift: a shifted reducer's raw sums merge
    # as they are, and the block prepares once, with no division at each of the merge levels.
    # (H100, Var of 8 x 4096 rows: bf16 5.89 -> 5.31 us, float32 5.79 -> 5.31.)
    same_shift = "merge_same_shift" in macros
    tree = _shuffle_merge(T, spec, macros, threads, "merge_same_shift" if same_shift else "merge")
    chunk = threads * vector
    G = T.dynamic("G")
    N = T.dynamic("N", "int64")
    stores = _store_macros(T, spec, macros, out_dtype, N if folded != reducer else None)
    XT, LDX = strided_rows(T, G, N, dtype, "LDX")
    S = T.dynamic("S")

    # A block walks every ``bounds[1]``-th group of ``unroll`` chunks from group ``bounds[0]``
    # on: its segment's groups interleave with the other segments' (see ``reduce_segment``).
    # Windowed, positions count from the row's first window: ``bounds[2]`` is that window's
    # index in the flat memory, ``bounds[3]`` the row's skew into it.
    def window(bounds, step, u, tx):
        return ((bounds[0] + step * bounds[1]) * unroll + u) * threads + tx

    def position(bounds, step, u, tx):
        return window(bounds, step, u, tx) * vector

    def column(bounds, step, u, tx):
        """The row's column of the access's first element (windowed: negative in a skewed first window)."""
        return position(bounds, step, u, tx) - bounds[3] if windowed else position(bounds, step, u, tx)

    def loaded(bounds, step, u, tx):
        return True if exact else column(bounds, step, u, tx) < N

    def window_span(bounds, step, u, tx):
        """Windowed: ``(first, last)``, the window's elements that lie in the row (int32)."""
        c0 = column(bounds, step, u, tx)
        return T.cast(T.max(-c0, 0), "int32"), T.cast(T.min(N - c0, vector), "int32")

    def for_row_elements(action: Any) -> Any:
        """Macro: ``action(e, u, ...)`` for each element ``e`` of access ``u`` that lies in the row."""

        @T.macro
        def each(bounds, step, u, tx, st, sti, buf, shift, cm, nv):
            if loaded(bounds, step, u, tx):
                if windowed:
                    # One check an element, in 32 bits, whole windows or not: a branch to an
                    # unchecked path for whole windows, or 64-bit checks, took more registers
                    # (bf16 sums: 48 and 51 registers a thread against 42).
                    first, last = window_span(bounds, step, u, tx)
                    for e in T.unroll(vector):
                        if T.And(e >= first, e < last):
                            action(e, u, bounds, step, tx, st, sti, buf, shift, cm, nv)
                else:
                    for e in T.unroll(vector):
                        action(e, u, bounds, step, tx, st, sti, buf, shift, cm, nv)

        return each

    @T.macro
    def load_access(X, XF, buf, bounds, row, step, u, tx):
        if loaded(bounds, step, u, tx):
            if windowed:  # the whole window, even where it runs past the row (see the docstring)
                for e in T.vectorized(vector):
                    buf[u * vector + e] = XF[(bounds[2] + window(bounds, step, u, tx)) * vector + e]
            else:
                for e in T.vectorized(vector):
                    buf[u * vector + e] = X[row, position(bounds, step, u, tx) + e]

    @T.macro
    def chunk_action(e, u, bounds, step, tx, st, sti, buf, shift, cm, nv):
        chunk_fold(cm, 0, T.cast(buf[u * vector + e], ACCUM))

    chunk_elements = for_row_elements(chunk_action) if chunk_fold is not None else None

    def segment_walk(fold_element: Any) -> Any:
        """Macro: fold every element of the segment ``bounds`` (first group, stride) of ``row``
        with ``fold_element``."""

        @T.macro
        def fold_action(e, u, bounds, step, tx, st, sti, buf, shift, cm, nv):
            fold_element(st, sti, 0, T.cast(buf[u * vector + e], ACCUM), column(bounds, step, u, tx) + e, shift[0],
                         cm)

        fold_elements = for_row_elements(fold_action)

        @T.macro
        def walk_step(X, XF, st, sti, buf, cm, nv, bounds, shift, row, tx, step):
            for u in T.unroll(unroll):
                load_access(X, XF, buf, bounds, row, step, u, tx)
            if spec.shifted:
                # The shift is the segment's first element, read after the step's loads are
                # issued: read before the walk, its conversion lands ahead of the loop and the
                # loads wait a whole memory latency for it (H100, bf16 variance of 8 x 4096
                # rows: 5.31 -> 5.0 us).
                if step == 0:
                    first = T.max(column(bounds, 0, 0, 0), 0) if windowed else position(bounds, 0, 0, 0)
                    shift[0] = T.cast(X[row, T.min(first, N - 1)], ACCUM)
            if tally is not None:
                nv[0] = 0
                for u in T.unroll(unroll):
                    if loaded(bounds, step, u, tx):
                        if windowed:
                            first, last = window_span(bounds, step, u, tx)
                            nv[0] = nv[0] + last - first
                        else:
                            nv[0] = nv[0] + vector
                tally(st, 0, nv[0])
            if chunk_init is not None:
                chunk_init(cm, 0)
                for u in T.unroll(unroll):
                    chunk_elements(bounds, step, u, tx, st, sti, buf, shift, cm, nv)
                rebase(st, 0, cm)
            for u in T.unroll(unroll):
                fold_elements(bounds, step, u, tx, st, sti, buf, shift, cm, nv)

        @T.macro
        def walk(X, XF, st, sti, buf, cm, nv, bounds, shift, row, tx):
            if exact:
                walk_step(X, XF, st, sti, buf, cm, nv, bounds, shift, row, tx, 0)
            else:
                # Windowed, the row's elements and its skew before them.
                groups = T.ceildiv(T.ceildiv(N + bounds[3] if windowed else N, chunk), unroll)
                for step in T.serial(T.ceildiv(T.max(groups - bounds[0], 0), bounds[1])):
                    walk_step(X, XF, st, sti, buf, cm, nv, bounds, shift, row, tx, step)

        return walk

    walk = segment_walk(fold)
    walk_exact = segment_walk(exact_fold) if exact_fold is not None else None

    @T.macro
    def reduce_segment(X, XF, st, sti, ot, oti, sh, shi, buf, cm, nv, bounds, shift, row, seg, segments, tx):
        # The segment's first group of chunks, and the stride between its groups.  Segments
        # interleave rather than each taking a contiguous slice: the blocks running at once
        # then read neighbouring memory, as the blocks of many short rows do.  (H100, sum of
        # 2^28 bf16: 182.8 us with 528 contiguous slices, 173.7 as 16384 rows of 16384.)
        bounds[0] = T.cast(seg, "int64")
        bounds[1] = T.cast(segments, "int64")
        init(st, sti, 0)
        if exact_init is not None:
            exact_init(cm)
        walk(X, XF, st, sti, buf, cm, nv, bounds, shift, row, tx)
        if walk_exact is not None:
            if needs_exact(cm):
                init(st, sti, 0)
                walk_exact(X, XF, st, sti, buf, cm, nv, bounds, shift, row, tx)
        if same_shift:
            tree(st, sti, ot, oti, sh, shi, tx)
            prepare(st, sti, 0, shift[0])
        else:
            prepare(st, sti, 0, shift[0])
            tree(st, sti, ot, oti, sh, shi, tx)

    # The partials' layout is the reducer's, whatever the program folds with.
    width = REDUCERS[reducer].partial_width

    @T.macro
    def row_block(X, out, row, seg, segments):
        """Block ``(row, seg)``: fold its segment of the row, then store the output (fused) or a partial."""
        tx = T.get_thread_binding()
        buf = T.alloc_local((unroll * vector,), dtype)
        cm = T.alloc_local((spec.chunk_locals(1),), ACCUM)
        nv = T.alloc_local((1,), "int32")
        st = T.alloc_local((spec.slots,), ACCUM)
        sti = T.alloc_local((1,), "int64")
        ot = T.alloc_local((spec.slots,), ACCUM)
        oti = T.alloc_local((1,), "int64")
        shift = T.alloc_local((1,), ACCUM)
        bounds = T.alloc_local((4,), "int64") if windowed else T.alloc_local((2,), "int64")
        sh = T.alloc_shared((spec.slots, threads), ACCUM)
        shi = T.alloc_shared((1, threads), "int64")
        XF = None
        if windowed:
            # The rows as one flat run of memory, for loads whose alignment the compiler can see.
            XF = T.Tensor((G * LDX,), dtype, X.data)
            bounds[2] = T.cast(row, "int64") * LDX // vector
            bounds[3] = T.cast(row, "int64") * LDX - bounds[2] * vector
        else:
            T.assume(LDX % vector == 0)
            T.assume(N % vector == 0)
        shift[0] = T.cast(0, ACCUM)
        reduce_segment(X, XF, st, sti, ot, oti, sh, shi, buf, cm, nv, bounds, shift, row, seg, segments, tx)
        if tx == 0:
            if fused:
                out[row] = stores["final"](st, sti, 0)
            else:
                stores["store_partial"](out, st, sti, 0, 1, row, seg, 0)
                if folded != reducer:
                    # A mean's partial: the segment's sum, then a count.  The combine adds the
                    # counts, so the first segment carries the whole row's and the others none.
                    out[row, seg, 0, spec.slots] = T.cast(T.if_then_else(seg == 0, N, T.int64(0)), PARTIAL)

    if fused:

        @T.prim_func
        def reduce_rows(X: XT, Y: T.Tensor((G,), out_dtype)):
            with T.Kernel(G, threads=threads, prelude=prelude) as row:
                row_block(X, Y, row, 0, 1)

        return reduce_rows

    @T.prim_func
    def reduce_row_segments(X: XT, P: T.Tensor((G, S, 1, width), PARTIAL)):
        with T.Kernel(G, S, threads=threads, prelude=prelude) as (row, seg):
            T.pdl_trigger()  # the next launch may start early (see kernel_base)
            row_block(X, P, row, seg, S)

    return reduce_row_segments


# ---- column program ---------------------------------------------------------------------------


def column_program(reducer: str, dtype: str, out_dtype: str, correction: float, *, cvec: int, col_threads: int,
                   threads: int, unroll: int, fused: int) -> Any:
    """Reduce the axis of ``(O, N, I)``: into ``Y[O, I]`` (fused) or into partials ``P[O, S, I, width]``."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    if not (is_pow2(cvec) and is_pow2(col_threads) and col_threads <= MAX_COL_THREADS and threads % col_threads == 0):
        raise ValueError(f"reduction column program: bad tile cvec={cvec} col_threads={col_threads}")
    folded = _fold_reducer(reducer, fused)
    spec = REDUCERS[folded]
    prelude = spec.prelude or None  # outside the programs: TVMScript would parse the `or`
    W = cvec
    macros = reducer_macros(T, folded, W, correction)
    init, fold, prepare = macros["init"], macros["fold"], macros["prepare"]
    tally, chunk_init, chunk_fold, rebase = (macros.get(hook)
                                             for hook in ("tally", "chunk_init", "chunk_fold", "rebase"))
    exact_init, needs_exact, exact_fold = (macros.get(hook) for hook in ("exact_init", "needs_exact", "exact_fold"))
    lanes = threads // col_threads
    tile = col_threads * cvec
    # Two blocks an SM: one merging its lanes' states leaves the other loading.  At 512 threads
    # this caps a thread at 64 registers, which the log-sum-exp fold fits (16384 x 16384 bf16
    # columns: 187 us, against 200 with the 94 registers it takes uncapped and one block an SM).
    min_blocks = 2 if threads <= MAX_THREADS // 2 else 1
    tree = _tree_merge(T, spec, macros, W, lanes, col_threads)
    O = T.dynamic("O")
    I = T.dynamic("I")
    N = T.dynamic("N", "int64")
    stores = _store_macros(T, spec, macros, out_dtype, N if folded != reducer else None)
    SXO = T.dynamic("SXO", "int64")
    SXN = T.dynamic("SXN", "int64")
    S = T.dynamic("S")

    def position(bounds, step, u, lane):
        return bounds[0] + (step * unroll + u) * lanes + lane

    def step_macro(fold_element: Any, last: bool) -> Any:
        """Macro: fold the ``unroll`` positions of ``step`` in the thread's columns with ``fold_element``.

        Only the ``last`` step of a segment checks its positions against the
        segment's end: guards on every step cost as many instructions as the
        arithmetic of the cheap reducers' folds.
        """

        def in_segment(bounds, step, u, lane):
            return position(bounds, step, u, lane) < bounds[1] if last else True

        @T.macro
        def walk_step(X, st, sti, buf, cm, bounds, shift, o, i0, lane, step):
            for u in T.unroll(unroll):
                if in_segment(bounds, step, u, lane):
                    for e in T.vectorized(cvec):
                        buf[u * cvec + e] = X[o, position(bounds, step, u, lane), i0 + e]
            if chunk_init is not None:
                for k in T.unroll(W):
                    chunk_init(cm, k)
                for u in T.unroll(unroll):
                    if in_segment(bounds, step, u, lane):
                        for k in T.unroll(W):
                            chunk_fold(cm, k, T.cast(buf[u * cvec + k], ACCUM))
                for k in T.unroll(W):
                    rebase(st, k, cm)
            for u in T.unroll(unroll):
                if in_segment(bounds, step, u, lane):
                    for k in T.unroll(W):
                        fold_element(st, sti, k, T.cast(buf[u * cvec + k], ACCUM), position(bounds, step, u, lane),
                                     shift[k], cm)

        return walk_step

    def segment_walk(fold_element: Any) -> Any:
        """Macro: fold every element of the thread's columns in the segment ``bounds`` with ``fold_element``.

        Threads past the last column skip the walk, keeping their initial states.
        """
        full_step, last_step = step_macro(fold_element, False), step_macro(fold_element, True)

        @T.macro
        def walk(X, st, sti, buf, cm, bounds, shift, o, i0, lane):
            if i0 < I:
                for step in T.serial(T.truncdiv(bounds[1] - bounds[0], lanes * unroll)):
                    full_step(X, st, sti, buf, cm, bounds, shift, o, i0, lane, step)
                if T.truncmod(bounds[1] - bounds[0], lanes * unroll) > 0:
                    last_step(X, st, sti, buf, cm, bounds, shift, o, i0, lane,
                              T.truncdiv(bounds[1] - bounds[0], lanes * unroll))

        return walk

    walk = segment_walk(fold)
    walk_exact = segment_walk(exact_fold) if exact_fold is not None else None

    @T.macro
    def reduce_segment(X, st, sti, ot, oti, sh, shi, buf, cm, bounds, shift, o, i0, seg, segments, tx):
        lane = tx // col_threads
        bounds[0] = T.cast(seg, "int64") * T.ceildiv(N, T.cast(segments, "int64"))
        bounds[1] = T.min(bounds[0] + T.ceildiv(N, T.cast(segments, "int64")), N)
        for k in T.unroll(W):
            init(st, sti, k)
            shift[k] = T.cast(0, ACCUM)
        if spec.shifted:
            if i0 < I:
                for k in T.unroll(W):
                    shift[k] = T.cast(X[o, T.min(bounds[0], N - 1), i0 + k], ACCUM)
        if exact_init is not None:
            exact_init(cm)
        walk(X, st, sti, buf, cm, bounds, shift, o, i0, lane)
        if walk_exact is not None:
            if needs_exact(cm):
                for k in T.unroll(W):
                    init(st, sti, k)
                walk_exact(X, st, sti, buf, cm, bounds, shift, o, i0, lane)
        if tally is not None:
            # A lane folds every lanes-th position of its segment from its own on: counted once, here.
            for k in T.unroll(W):
                tally(st, k, T.truncdiv(T.max(bounds[1] - bounds[0] - lane, 0) + lanes - 1, lanes))
        for k in T.unroll(W):
            prepare(st, sti, k, shift[k])
        tree(st, sti, ot, oti, sh, shi, tx)

    place_thread = column_placement(T, tile, col_threads, cvec)

    width = spec.partial_width

    @T.macro
    def column_block(X, out, bx, seg, segments):
        """Block ``(bx, seg)``: fold its columns' segment, then store the outputs (fused) or partials."""
        T.annotate_min_blocks_per_sm(min_blocks)
        tx = T.get_thread_binding()
        buf = T.alloc_local((unroll * cvec,), dtype)
        cm = T.alloc_local((spec.chunk_locals(W),), ACCUM)
        st = T.alloc_local((spec.slots * W,), ACCUM)
        sti = T.alloc_local((W,), "int64")
        ot = T.alloc_local((spec.slots,), ACCUM)
        oti = T.alloc_local((1,), "int64")
        shift = T.alloc_local((W,), ACCUM)
        bounds = T.alloc_local((2,), "int64")
        sh = T.alloc_shared((spec.slots * W, threads), ACCUM)
        shi = T.alloc_shared((W, threads), "int64")
        T.assume(SXO % cvec == 0)
        T.assume(SXN % cvec == 0)
        T.assume(I % cvec == 0)
        o, i0 = place_thread(bx, tx, I)
        reduce_segment(X, st, sti, ot, oti, sh, shi, buf, cm, bounds, shift, o, i0, seg, segments, tx)
        if T.And(tx < col_threads, i0 < I):
            for k in T.unroll(W):
                if fused:
                    out[o, i0 + k] = stores["final"](st, sti, k)
                else:
                    stores["store_partial"](out, st, sti, k, W, o, seg, i0 + k)

    if fused:

        @T.prim_func
        def reduce_columns(X: T.StridedTensor((O, N, I), (SXO, SXN, 1), dtype), Y: T.Tensor((O, I), out_dtype)):
            with T.Kernel(O * T.ceildiv(I, tile), threads=threads, prelude=prelude) as bx:
                column_block(X, Y, bx, 0, 1)

        return reduce_columns

    @T.prim_func
    def reduce_column_segments(X: T.StridedTensor((O, N, I), (SXO, SXN, 1), dtype),
                               P: T.Tensor((O, S, I, width), PARTIAL)):
        with T.Kernel(O * T.ceildiv(I, tile), S, threads=threads, prelude=prelude) as (bx, seg):
            T.pdl_trigger()  # the next launch may start early (see kernel_base)
            column_block(X, P, bx, seg, S)

    return reduce_column_segments


# ---- combine program --------------------------------------------------------------------------


def combine_program(reducer: str, dtype: str, out_dtype: str, correction: float, *, threads: int,
                    group: int) -> Any:
    """Merge the ``S`` partials ``P[o, :, i]`` of every output into ``Y[o, i]``; ``group`` threads per output."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    if not (is_pow2(group) and group <= threads):
        raise ValueError(f"reduction combine program: bad group {group} for {threads} threads")
    spec = REDUCERS[reducer]
    prelude = spec.prelude or None  # outside the programs: TVMScript would parse the `or`
    macros = reducer_macros(T, reducer, 1, correction)
    init, merge = macros["init"], macros["merge"]
    tree = _shuffle_merge(T, spec, macros, group)
    stores = _store_macros(T, spec, macros, out_dtype)
    per_block = threads // group
    width = spec.partial_width
    O = T.dynamic("O")
    I = T.dynamic("I")
    S = T.dynamic("S")

    @T.prim_func
    def combine_partials(P: T.Tensor((O, S, I, width), PARTIAL), Y: T.Tensor((O, I), out_dtype)):
        with T.Kernel(T.ceildiv(O * I, per_block), threads=threads, prelude=prelude) as bx:
            T.pdl_sync()  # wait for the launch before (see kernel_base)
            tx = T.get_thread_binding()
            st = T.alloc_local((spec.slots,), ACCUM)
            sti = T.alloc_local((1,), "int64")
            ot = T.alloc_local((spec.slots,), ACCUM)
            oti = T.alloc_local((1,), "int64")
            sh = T.alloc_shared((spec.slots, threads), ACCUM)
            shi = T.alloc_shared((1, threads), "int64")
            # The output's (outer, inner) position, divided out once (64-bit: outputs may number
            # 2^31 or more) rather than at every partial read.
            place = T.alloc_local((2,), "int64")
            g = T.cast(bx, "int64") * per_block + tx // group
            place[0] = T.truncdiv(g, I)
            place[1] = g - place[0] * I
            init(st, sti, 0)
            for step in T.serial(T.ceildiv(S, group)):
                if T.And(g < O * I, step * group + tx % group < S):
                    stores["load_partial"](P, ot, oti, place[0], step * group + tx % group, place[1])
                    merge(st, sti, 0, ot, oti)
            tree(st, sti, ot, oti, sh, shi, tx)
            if T.And(tx % group == 0, g < O * I):
                Y[place[0], place[1]] = stores["final"](st, sti, 0)

    return combine_partials


_BUILDERS = {ROW: row_program, COLUMN: column_program, COMBINE: combine_program}


def build_program(name: str, reducer: str, dtype: torch.dtype, out_dtype: torch.dtype, correction: float,
                  params: ProgramParams) -> Any:
    """The TileLang ``prim_func`` of program ``name`` for one reducer, dtype pair and shape parameters."""
    if name not in _BUILDERS:
        raise ValueError(f"reduction kernels: unknown program {name!r}; expected one of {list(_BUILDERS)}")
    return _BUILDERS[name](reducer, torch_dtype_to_tl(dtype), torch_dtype_to_tl(out_dtype), float(correction),
                           **dict(params))


# ---- kernel ---------------------------------------------------------------------------------------


def reduction_default_config(dtype: torch.dtype, one_pass: Tuple[int, int, int] = (0, 0, 0),
                             long_row_threads: int = 512, split_row_threads: int = 256,
                             windowed_fused_rows: bool = True) -> Dict[str, int]:
    """Heuristic config: 256-thread blocks, four 16-byte vectors in flight per thread; eight
    (``long_row_unroll``) over rows a block reduces alone that take that many.

    Eight over long rows, H100, bf16 16384 x 16384 rows, µs with four / eight (torch.compile):
    sum 174.5 / 172.6 (171.2), variance 173.6 / 173.0 (172.8), amax 175.0 / 172.9 (172.1),
    argmax 175.5 / 174.0 (286.5).  Everywhere else eight lost: rows of 8 x 4096, which take one
    step either way, 2-7% (sum bf16 4.80 -> 4.90 us, variance 5.28 -> 5.54), and the row
    segments of a whole-tensor reduction up to 18% (argmax of 2^28 bf16 180 -> 213 us).

    Rows of eight 256-thread chunks or more take ``long_row_threads``-thread blocks: 512, which
    keep more loads in flight an SM, but for argmax and log-sum-exp (below).  H100, µs with
    256 / 512 / 1024 threads (torch.compile), bf16 sum: 16384 x 16384 172.2 / 171.9 / 171.8
    (171.7), 8192 x 32768 173.5 / 172.3 / 172.0 (173.2), 16384 x 24576 256.7 / 256.6 / 255.1
    (256.5); amax 16384 x 16384 172.7 / 172.1 / 172.1 (172.1), 8192 x 32768 174.3 / 172.8 /
    171.9 (174.2); fp32 sum 16384 x 12288 256.5 / 255.2 / 257.5 (256.5); variance 16384 x 16384
    173.4 / 172.7 / 173.6 (172.9).  1024 gained on some and lost on the variance and the fp32
    sum.  In the bench (bf16 16384 x 16384, µs with 256 / 512 threads): argmax 173.9 / 296.3
    and log-sum-exp 173.8 / 174.6, so those two keep 256.

    Row segments (a row cut across blocks, as in a whole-tensor reduction) take
    ``split_row_threads``-thread blocks (``ReductionKernel.fast_memory_split_row_threads``).

    Rows whose accesses would be narrower than ``windowed_below_bytes`` (8: 8-byte accesses
    stay, H200, bf16 sum of 16384 x 4100, 35.0 µs against 43.5 in windows) are read in 16-byte
    windows (``row_program``), when cut across blocks always, when a block reduces a row alone
    where ``windowed_fused_rows`` (``ReductionKernel.windowed_fused_rows``).

    ``one_pass`` is the one-pass column program's (col_threads, threads,
    unroll); col_threads 0 never takes it.  ``one_pass_min_tile_bytes`` (the
    narrowest tile a long axis takes in one pass), ``one_pass_split_blocks_per_sm``
    (the blocks an SM of its split over segments; 0: no such split) and
    ``one_pass_split_min_strip_kib`` (the shortest strip a block of that split
    walks) steer it (``ReductionKernel._one_pass_plan``).  Below that strip, the
    partials and the combine launch cost more than wide tiles gain (bf16 column
    sums, 512-byte tiles split against 128-byte tiles in one pass, µs: 16384 x
    16384, 2 MiB strips, 177.4 against 179.5; 32768 x 8192, 2 MiB, 176.9 against
    183.3 for the split program; 2048 x 16384, 256 KiB, 28.9 against 26.7; 4096 x
    4096, 128 KiB, 18.2 against 17.8 in 32-byte tiles).

    Tile width and segments, H100, bf16 column sums, median of 7 rounds in turns, µs as
    (col_threads, segments) (torch.compile in brackets): 16384 x 16384 128-byte tiles in one
    pass (8, 1) 180.0-180.7, (16, 2) 177.2, (32, 4) 177.2-177.8, (64, 8) 177.4-178.2, (128,
    16) 179.3, (256, 32) 181.3, (32, 2) and (64, 4), half the blocks, 182.2 (178.8-179.2);
    8192 x 32768 (8, 1) 181.4-181.5, (16, 1) 175.9, (32, 2) 178.8, (64, 4) 178.2 (184.5);
    4096 x 65536 (8, 1) 179.5, (32, 1) 176.0, (32, 2) 179.4, (64, 2) 178.5 (178.0).  Four rows
    a lane instead of eight, (32, 4): 180.9; 512 threads, (32, 4): 179.5.  Against the 128-byte
    one-pass tiles (the split program's shape where those are too few), these plans gained on
    every reducer (16384 x 16384 bf16 columns, µs, new / old (torch.compile)): sum 177.4 / 179.5
    (178.7), mean 179.1 / 180.6 (179.1), 2-norm 177.5 / 180.4 (178.9), amax 178.0 / 180.4
    (180.4), variance 186.0 / 187.7 (223.0), argmax 185.1 / 188.0 (314.4), log-sum-exp 185.5 /
    186.8 (380.0); sums over 32768 x 8192 176.9 / 183.3 (183.6), 8192 x 32768 176.1 / 180.6
    (184.5), the middle axis of 8 x 2048 x 16384 175.0 / 177.7 (181.0), and its variance 180.4 /
    187.9 (194.5).
    """
    col_threads, threads, unroll = one_pass
    return {"row_threads": 256, "row_unroll": 4, "long_row_unroll": 8, "long_row_threads": long_row_threads,
            "split_row_threads": split_row_threads, "windowed_below_bytes": 8,
            "windowed_fused_rows": int(windowed_fused_rows),
            "column_threads": 256, "column_unroll": 4,
            "combine_threads": 256, "one_pass_col_threads": col_threads, "one_pass_threads": threads,
            "one_pass_unroll": unroll, "one_pass_min_tile_bytes": 256, "one_pass_split_blocks_per_sm": 2,
            "one_pass_split_min_strip_kib": 2048}


class ReductionKernel(Kernel):
    """One reduction (``reducer``) of ``(rows, N)`` or ``(outer, N, inner)`` views into a preallocated output.

    ``forward(x, out)``: ``x`` is ``(G, N)`` with unit-stride rows, or
    ``(O, N, I)`` with a unit-stride innermost axis; ``out`` is contiguous,
    ``(G,)`` or ``(O, I)``.  ``N`` must be at least 1 (the op handles empty
    reductions).  The access width follows each call's alignment.

    Args:
        dtype: input dtype (float16, bfloat16, float32).
        correction: the variance's degrees-of-freedom correction (ignored by the others).
        config: explicit config (keys of ``default_config``; may be partial).
        tune: accepted for the op contract; the heuristic config is used.
    """

    reducer: str = "sum"
    # The one-pass column program's (col_threads, threads, unroll): tiles of up to 512 bytes,
    # 256 threads, 8 rows in flight a lane (reduction_default_config); col_threads 0: always the
    # split program.
    one_pass: Tuple[int, int, int] = (32, 256, 8)
    # The fewest load steps a split column block takes.  Reducers with wide states (the
    # variance, log-sum-exp, argmax) take 8: each block's merge and stored partials cost
    # several steps' worth (64 x 4096 x 64 bf16 over the middle axis: variance 51 -> 31 us,
    # argmax 54 -> 38), while the sums measured fastest with single-step blocks.
    min_column_steps: int = 1
    # Threads a block over rows of long_row_unroll chunks or more (reduction_default_config).
    long_row_threads: int = 512
    # ``long_row_threads`` of half-precision inputs on devices with fast memory
    # (``device_traits``), where it differs (0: it does not).
    fast_memory_long_row_threads: int = 0
    # Threads a block over row segments for half-precision inputs on devices with fast
    # memory (0: ``row_threads``, as elsewhere).  H200, bf16 2^28 elements reduced whole (one
    # row over 528 segments, four blocks an SM), partials and combine, median of 7 rounds in
    # turns, µs with 256 / 512 / 1024 threads (4 vectors in flight a thread): sum 123.7 /
    # 121.8 / 123.0, amax 124.6 / 123.1 / 125.0 (over 264 segments 129.9 / 123.2 / 121.7 and
    # 143.5 / 124.5 / 123.8; eight vectors in flight at 256 threads 122.9 and 123.9; the same
    # tensor as 16384 rows of 16384, 118.8 and 119.4).  The segment programs of the sum and
    # amax take 30-34 registers a thread at any of these counts, so four 512-thread blocks fill
    # an SM's 2048 threads where four of 256 held half (the mean's too, now that its segments
    # fold as sums: when each thread also counted, it took 38 registers, three blocks fit an
    # SM and the 528 segments ran past one wave, 132.1 µs against 122.1 for the sum).
    # Narrower accesses keep ``row_threads``: their programs take 47 registers at 512 threads.
    # The variance, log-sum-exp and argmax, whose merges carry wider states, were not timed
    # with it and keep ``row_threads``.
    fast_memory_split_row_threads: int = 512
    # Whether rows a block reduces alone are read in windows (``row_program``); rows cut across
    # blocks always may be.  H200, rows of 4097 bf16 a block each, µs windowed / one element at a
    # time (torch.compile), median of 7 rounds in turns: 16384 rows sum 43.6 / 75.9 (46.0),
    # variance 63.7 / 113.8 (98.1), float32 variance of 8192 rows 42.5 / 90.1 (52.6); but argmax
    # 116.4 / 61.1 (187.7) and log-sum-exp 78.4 / 61.2 (105.0), whose folds, each element checked,
    # hold more registers (argmax's segments 63 a thread, log-sum-exp's rows 48).  Cut across
    # blocks, windows gained: 256 x 50257, argmax 23.7 / 29.1 (25.7), sum 14.9 / 22.5 (20.9).
    windowed_fused_rows: bool = True
    # "5": wide one-pass column tiles and their few-segment split; "6": row segments take
    # ``split_row_threads`` (before, ``row_threads``).
    version = "6"

    def __init__(self, dtype: torch.dtype, *, correction: float = 0.0, config: Optional[Dict[str, Any]] = None,
                 tune: bool = False, out_dtype: Optional[torch.dtype] = None) -> None:
        check_kernel_args(type(self).__name__, dtype)
        check_out_dtype(type(self).__name__, dtype, out_dtype)
        self.correction = float(correction)
        self._max_vector = max_vector(dtype)
        super().__init__(dtype, config=config, tune=tune, out_dtype=out_dtype)

    @property
    def default_config(self) -> Dict[str, Any]:
        long_row_threads, split_row_threads = self.long_row_threads, 256
        if self.dtype.itemsize == 2 and has_fast_memory():
            long_row_threads = self.fast_memory_long_row_threads or long_row_threads
            split_row_threads = self.fast_memory_split_row_threads or split_row_threads
        return reduction_default_config(self.dtype, self.one_pass, long_row_threads, split_row_threads,
                                        self.windowed_fused_rows)

    # ---- programs ----------------------------------------------------------------------------
    def program(self, **config: Any) -> Any:
        """The fused row program of aligned, contiguous rows."""
        config = {**self.default_config, **config}
        return build_program(ROW, self.reducer, self.dtype, self.result_dtype, self.correction,
                             self._row_params(self._max_vector, True, config))

    def _row_params(self, vector: int, fused: bool, config: Optional[Dict[str, Any]] = None,
                    long_rows: bool = False, exact_unroll: int = 0, threads: int = 0,
                    windowed: bool = False) -> ProgramParams:
        config = self.config if config is None else config
        unroll = exact_unroll or (config["long_row_unroll"] if long_rows else config["row_unroll"])
        threads = threads or (config["row_threads"] if fused else self._segment_threads(vector, config, windowed))
        params = (("vector", vector), ("threads", threads), ("unroll", unroll), ("fused", int(fused)))
        return params + ((("exact", 1),) if exact_unroll else ()) + ((("windowed", 1),) if windowed else ())

    def row_access(self, x: torch.Tensor, windows: bool = True) -> Tuple[int, bool]:
        """(access width in elements, windowed) of the rows of ``x`` (2-D, unit-stride rows).

        Rows whose length or stride no wider access fits are read in windows of the widest
        access the tensor's start allows (``row_program``) while the plain access would be
        narrower than ``windowed_below_bytes``, and ``windows`` allows them."""
        plain = widest_access(x, x.stride(0) | x.shape[1], self._max_vector)
        aligned = widest_access(x, 0, self._max_vector)
        if windows and aligned > plain and plain * self.dtype.itemsize < self.config["windowed_below_bytes"]:
            return aligned, True
        return plain, False

    def _row_segments(self, x: torch.Tensor, vector: int, windowed: bool, sm_count: int) -> int:
        """Blocks a row of ``x`` is cut across: enough for ``ROW_BLOCKS_PER_SM`` an SM, at most one
        a group of ``row_unroll`` chunks."""
        threads, unroll = self._segment_threads(vector, self.config, windowed), self.config["row_unroll"]
        most = max(1, -(-x.shape[1] // (threads * vector * unroll)))
        return max(1, min(-(-ROW_BLOCKS_PER_SM * sm_count // x.shape[0]), most))

    def _segment_threads(self, vector: int, config: Dict[str, Any], windowed: bool = False) -> int:
        """Threads a block over row segments: ``split_row_threads`` with 16-byte accesses, else
        ``row_threads``.  Windows take ``row_threads`` too: their checks take more registers than
        four blocks of 512 threads an SM leave (42 a thread in a bf16 sum)."""
        wide = vector == self._max_vector and not windowed
        return config["split_row_threads"] if wide else config["row_threads"]

    def _fused_row_threads(self, N: int, vector: int) -> int:
        """``long_row_threads`` for rows of ``long_row_unroll`` chunks of ``row_threads`` or more,
        else ``row_threads``."""
        config = self.config
        long_rows = N >= config["row_threads"] * vector * config["long_row_unroll"]
        return config["long_row_threads"] if long_rows else config["row_threads"]

    def _fused_row_params(self, N: int, vector: int, windowed: bool = False) -> ProgramParams:
        """The fused row program for rows of ``N`` (``_fused_row_threads`` threads a row): straight-line
        when a row is exactly 1, 2 or 4 chunks (up to ``row_unroll``), more vectors in flight when it
        takes ``long_row_unroll`` or more."""
        config = self.config
        threads = self._fused_row_threads(N, vector)
        chunk = threads * vector
        chunks = N // chunk
        if N % chunk == 0 and chunks in EXACT_ROW_CHUNKS and chunks <= config["row_unroll"] and not windowed:
            return self._row_params(vector, True, exact_unroll=chunks, threads=threads)
        return self._row_params(vector, True, long_rows=N >= chunk * config["long_row_unroll"], threads=threads,
                                windowed=windowed)

    def _fused_row_variants(self, vector: int) -> List[ProgramParams]:
        """Every fused row program some row length takes, in the order first reached.

        The choice changes only at whole chunks of either thread count, so
        lengths of whole chunks, and a vector past each, up to twice the last
        threshold (the most chunks of the larger count a choice counts) meet them all.
        """
        config = self.config
        small, large = sorted((config["row_threads"], config["long_row_threads"]))
        unit = small * vector
        last = 2 * max(config["long_row_unroll"], *EXACT_ROW_CHUNKS) * large * vector
        variants: List[ProgramParams] = []
        for N in sorted({length for k in range(1, last // unit + 1) for length in (k * unit, k * unit + vector)}):
            params = self._fused_row_params(N, vector)
            if params not in variants:
                variants.append(params)
        return variants

    def _column_params(self, inner: int, cvec: int, fused: bool) -> ProgramParams:
        # Two tile widths only (each is a separate program): 8 threads for narrow inner extents, else 32.
        col_threads = NARROW_COL_THREADS if -(-inner // cvec) <= NARROW_COL_THREADS else MAX_COL_THREADS
        return (("cvec", cvec), ("col_threads", col_threads), ("threads", self.config["column_threads"]),
                ("unroll", self.config["column_unroll"]), ("fused", int(fused)))

    def _one_pass_params(self) -> Optional[ProgramParams]:
        """The one-pass column program (16-byte accesses), or None when this kernel never takes it."""
        if not self.config["one_pass_col_threads"]:
            return None
        return (("cvec", self._max_vector), ("col_threads", self.config["one_pass_col_threads"]),
                ("threads", self.config["one_pass_threads"]), ("unroll", self.config["one_pass_unroll"]),
                ("fused", 1))

    def _one_pass_plan(self, x: torch.Tensor, cvec: int, sm_count: int) -> Optional[Tuple[ProgramParams, int]]:
        """(shape parameters, segments) of the one-pass column program for ``(O, N, I)``, or None
        (accesses narrower than 16 bytes, or too few tiles and rows for any of the three below).

        Tiles start at the configured width, or the narrowest that spans ``I``.  In turn:
        * one pass, the tiles halved until they are enough (``ONE_PASS_EIGHTHS_PER_SM``) while at
          least ``one_pass_min_tile_bytes`` wide (or spanning ``I``);
        * the widest tile, if that wide, over segments of the axis: one pass of
          ``one_pass_split_blocks_per_sm`` blocks an SM in all, then the combine, when each
          block's strip holds ``one_pass_split_min_strip_kib`` or more.  Narrower tiles over a
          long axis cost more than the partials do; over a short one, less
          (``reduction_default_config``);
        * one pass, the tiles halved further down to one cache line (``LINE_BYTES``), or down to
          one sector while a block's strip holds at most ``NARROW_ONE_PASS_BYTES``.
        """
        params = self._one_pass_params()
        if params is None or cvec != self._max_vector:
            return None
        config, shape, itemsize = self.config, dict(params), self.dtype.itemsize
        outer, N, inner = x.shape
        widest = min(shape["col_threads"], next_pow2(-(-inner // cvec)))

        def tiles(col_threads: int) -> int:
            return outer * -(-inner // (col_threads * cvec))

        def full_step(col_threads: int) -> int:
            return shape["threads"] // col_threads * shape["unroll"]

        def wide(col_threads: int) -> bool:
            return col_threads * cvec * itemsize >= config["one_pass_min_tile_bytes"]

        def fills(col_threads: int) -> bool:
            return N >= full_step(col_threads) and 8 * tiles(col_threads) >= ONE_PASS_EIGHTHS_PER_SM * sm_count

        widths = [widest >> k for k in range(widest.bit_length()) if (widest >> k) * cvec * itemsize >= SECTOR_BYTES]
        for col_threads in widths:
            if (col_threads == widest or wide(col_threads)) and fills(col_threads):
                return self._with_col_threads(params, col_threads), 1
        segments = config["one_pass_split_blocks_per_sm"] * sm_count // tiles(widest)
        strip_bytes = N // max(segments, 1) * widest * cvec * itemsize
        if (wide(widest) and segments >= 2 and strip_bytes >= config["one_pass_split_min_strip_kib"] << 10
                and N >= segments * full_step(widest) * self.min_column_steps):
            return self._with_col_threads(params, widest, fused=0), segments
        for col_threads in widths:
            narrow_bytes = col_threads * cvec * itemsize
            if (narrow_bytes >= LINE_BYTES or N * narrow_bytes <= NARROW_ONE_PASS_BYTES) and fills(col_threads):
                return self._with_col_threads(params, col_threads), 1
        return None

    @staticmethod
    def _with_col_threads(params: ProgramParams, col_threads: int, fused: int = 1) -> ProgramParams:
        changed = {"col_threads": col_threads, "fused": fused}
        return tuple((key, changed.get(key, value)) for key, value in params)

    def _combine_params(self, segments: int) -> ProgramParams:
        # Many segments: a block's threads share one output; few: a thread per output.
        group = 1 if segments <= 16 else (32 if segments <= 256 else self.config["combine_threads"])
        return (("threads", self.config["combine_threads"]), ("group", group))

    def program_specs(self, inner: int = 8) -> List[Tuple[str, ProgramParams]]:
        """Every program a call may launch on aligned tensors (rows, and columns of ``inner`` positions)."""
        cvec = largest_pow2_divisor(inner, self._max_vector)
        specs = [(ROW, self._row_params(self._max_vector, fused)) for fused in (True, False)]
        specs += [(ROW, params) for params in self._fused_row_variants(self._max_vector) if (ROW, params) not in specs]
        # Windowed rows: the segments, and where allowed, fused rows of every thread count and
        # unroll (never exact): lengths past each threshold, and the shortest.
        specs += [(ROW, self._row_params(self._max_vector, False, windowed=True))]
        if self.config["windowed_fused_rows"]:
            lengths = {self.config[key] * self._max_vector * self.config["long_row_unroll"] + 1
                       for key in ("row_threads", "long_row_threads")} | {1}
            specs += list(dict.fromkeys((ROW, self._fused_row_params(N, self._max_vector, windowed=True))
                                        for N in sorted(lengths)))
        specs += [(COLUMN, self._column_params(inner, cvec, fused)) for fused in (True, False)]
        one_pass = self._one_pass_params()
        if one_pass is not None:
            specs += [(COLUMN, one_pass), (COLUMN, self._with_col_threads(one_pass, dict(one_pass)["col_threads"], 0))]
        specs += [(COMBINE, self._combine_params(s)) for s in (1, 64, 1024)]
        return specs

    def compile_program(self, name: str, params: ProgramParams, target: Any = "auto") -> Any:
        """The compiled program ``name`` with shape ``params`` (cached)."""
        return self.compile_once(
            (name, params, repr(target)),
            lambda: build_program(name, self.reducer, self.dtype, self.result_dtype, self.correction, params),
            target, (name, params))

    def build_all_for_sm90(self, inner: int = 8) -> Dict[str, Any]:
        """Compile every row, column and combine program for sm_90, without a GPU."""
        return {f"{name}{dict(params)}": self.compile_program(name, params, target=SM90_BUILD_TARGET)
                for name, params in self.program_specs(inner)}

    def _launcher(self, name: str, params: ProgramParams) -> Any:
        return self._launch_plans.get((name, params), lambda: direct_launcher(self.compile_program(name, params)))

    # ---- launch ------------------------------------------------------------------------------
    def launch_plan(self, x: torch.Tensor, sm_count: int) -> Tuple[str, ProgramParams, int]:
        """(program, shape parameters, segments) for ``x`` on ``sm_count`` SMs; one segment: the fused program."""
        N = x.shape[1]
        if x.dim() == 2:
            vector, windowed = self.row_access(x)
            segments = self._row_segments(x, vector, windowed, sm_count)
            if segments == 1 and windowed and not self.config["windowed_fused_rows"]:
                vector, windowed = self.row_access(x, windows=False)
                segments = self._row_segments(x, vector, windowed, sm_count)
            if segments == 1:
                return ROW, self._fused_row_params(N, vector, windowed), 1
            return ROW, self._row_params(vector, False, windowed=windowed), segments
        inner = x.shape[2]
        cvec = widest_access(x, x.stride(0) | x.stride(1), largest_pow2_divisor(inner, self._max_vector))
        one_pass = self._one_pass_plan(x, cvec, sm_count)
        if one_pass is not None:
            return (COLUMN, *one_pass)
        params = self._column_params(inner, cvec, True)
        shape = dict(params)
        lanes = shape["threads"] // shape["col_threads"]
        blocks = x.shape[0] * -(-inner // (shape["col_threads"] * cvec))
        most = max(1, -(-N // (lanes * shape["unroll"] * self.min_column_steps)))
        segments = max(1, min(-(-COLUMN_BLOCKS_PER_SM * sm_count // blocks), most))
        return COLUMN, self._column_params(inner, cvec, segments == 1), segments

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the reduction of ``x`` into ``out`` and return it."""
        device = x.device
        key = (x.shape, x.stride(), x.data_ptr() % ALIGNMENT, device.index)
        launch, combine, partials_shape = self._launch_plans.get(key, lambda: self._planned_launch(x))
        if combine is None:
            launch(x, out)
            return out
        partials = torch.empty(partials_shape, dtype=torch.float64, device=device)
        launch(x, partials)
        combine(partials, out.view(partials_shape[0], partials_shape[2]))
        return out

    def _planned_launch(self, x: torch.Tensor) -> Tuple[Any, Optional[Any], Tuple[int, ...]]:
        """(launcher, combine launcher or None, partials shape) of every call with ``x``'s geometry and alignment."""
        name, params, segments = self.launch_plan(x, self.sm_count(x.device))
        if segments == 1:
            return self._launcher(name, params), None, ()
        inner = 1 if x.dim() == 2 else x.shape[2]
        shape = (x.shape[0], segments, inner, REDUCERS[self.reducer].partial_width)
        return self._launcher(name, params), self._launcher(COMBINE, self._combine_params(segments)), shape


class SumKernel(ReductionKernel):
    """``y = sum(x)`` along the reduced extent."""

    reducer = "sum"


class MeanKernel(ReductionKernel):
    """``y = mean(x)`` along the reduced extent."""

    reducer = "mean"


class AmaxKernel(ReductionKernel):
    """``y = max(x)`` along the reduced extent (NaN if any element is NaN)."""

    reducer = "amax"


class AminKernel(ReductionKernel):
    """``y = min(x)`` along the reduced extent (NaN if any element is NaN)."""

    reducer = "amin"


class VarKernel(ReductionKernel):
    """``y = sum((x - mean)^2) / max(n - correction, 0)`` along the reduced extent."""

    reducer = "var"
    min_column_steps = 8
    fast_memory_split_row_threads = 0
    # Four rows a lane between merges, not eight: the variance keeps three sums a column, and at
    # eight the one-pass column program ran 1.9 % behind torch.compile over a middle axis.  H100,
    # bf16 columns, median of 9 rounds in turns, µs with 8 / 6 / 4 (torch.compile): 16384 x 16384
    # 185.7 / 183.7 / 187.7 (222.4), 8192 x 32768 188.1 / 193.9 / 184.8 (234.4), 4096 x 65536
    # 195.0 / 191.0 / 187.0 (213.2), 8 x 2048 x 16384 over the middle axis 198.6 / 192.6 / 188.4
    # (195.0), 2048 x 16384 31.0 / 31.2 / 31.5 (30.2).  Log-sum-exp measured fastest at eight on
    # all five.
    one_pass = (32, 256, 4)


class LogSumExpKernel(ReductionKernel):
    """``y = log(sum(exp(x)))`` along the reduced extent, computed stably."""

    reducer = "logsumexp"
    min_column_steps = 8
    windowed_fused_rows = False
    fast_memory_split_row_threads = 0
    long_row_threads = 256
    # H200, bf16 16384 x 16384 rows, median of 7 rounds in turns, µs with 64 / 128 / 256 / 512
    # threads: 123.3 / 121.6 / 126.8-127.4 / 134.2 (torch.compile 210.1).
    fast_memory_long_row_threads = 128


class ArgmaxKernel(ReductionKernel):
    """``y = index of the first maximum`` along the reduced extent (int64; NaN counts as the maximum)."""

    reducer = "argmax"
    min_column_steps = 8
    windowed_fused_rows = False
    fast_memory_split_row_threads = 0
    long_row_threads = 256
    # Fewer threads a row: more blocks an SM, and a shorter closing merge of (value, index)
    # pairs for each block's loads (timed, not profiled).  H200, bf16 16384 x 16384 rows,
    # median of 7 rounds in turns, µs with 32 / 64 / 128 / 256 / 512 threads: 126.8 / 126.0 /
    # 130.6-130.9 / 145.1 / 294.0 (torch.compile 289.0); 64 threads and four vectors in flight
    # 127.8.
    fast_memory_long_row_threads = 64
    out_dtype = torch.int64


class L2NormKernel(ReductionKernel):
    """``y = sqrt(sum(x^2))`` along the reduced extent."""

    reducer = "l2_norm"
