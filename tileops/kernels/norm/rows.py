"""Shared parts of the norm family's row programs: layouts, TileLang macros, the kernel base.

Every program normalises the rows of an ``(M, N)`` tensor; ``N`` is fixed at
construction and ``M`` is a TileLang symbolic dimension.  Threads are placed
explicitly: a row belongs to ``row_threads`` consecutive threads, and lane
``l`` of a row owns the ``vector``-wide column groups ``(j * row_threads + l)
* vector`` for ``j = 0, 1, ...``.  Because a thread always touches the same
columns, per-column accumulators (the partial sums of a weight gradient) stay
private to it, in registers or in its own slots of shared or global memory,
and need no barrier.

Two ways to walk a row:

* **resident**: the whole row sits in registers (``per_thread`` elements per
  thread); it is read once and written once.
* **streamed**: rows too long for registers are walked twice in chunks of
  ``threads * vector * unroll`` elements, once to reduce and once (in
  reverse, so the chunks read last are still in L2) to write.

Inputs are read in place when their rows lie apart by any multiple of the
access width (a slice of a wider tensor, such as a head of a fused projection):
``strided_rows`` declares them with a symbolic int64 row stride, and each
program assumes that stride divides into its accesses.  Outputs are contiguous.

Sums accumulate in float32 whatever the input dtype.  Global offsets are
64-bit (TileLang widens them), and hosts split launches into slices of at
most ``MAX_EXTENT`` rows, since ``M`` is an int32 extent.
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, Iterator, List, Optional, Tuple

import torch

from tileops.kernels.cache_hints import CACHE_HINT_PRELUDE, EVICT_LAST, hinted_min_bytes, takes_hint, vector_load
from tileops.kernels.kernel_base import SM90_BUILD_TARGET, Kernel, torch_dtype_to_tl
from tileops.kernels.launch import direct_launcher
from tileops.kernels.sizes import (
    ACCUM,
    MAX_EXTENT,
    MAX_THREADS,
    MIN_BLOCK_THREADS,
    SUPPORTED_DTYPES,
    WARP,
    check_kernel_args,
    largest_pow2_divisor,
    max_vector,
    next_pow2,
    row_vector,
)

__all__ = [
    "ACCUM",
    "MAX_EXTENT",
    "SUPPORTED_DTYPES",
    "RowLayout",
    "StreamLayout",
    "RowNormKernel",
    "RowNormFwdKernel",
    "resident_layout",
    "stream_layout",
    "row_sum_macro",
    "row_moments_macro",
    "scratch_shape",
    "resident_macros",
    "stream_macros",
    "column_sum_program",
    "row_slices",
]


# Column-sum program: 32 vectors of columns (one warp wide) by 32 row lanes per
# block, each lane keeping COLUMN_UNROLL independent loads in flight.
COLUMN_UNROLL = 4
COLUMN_VECTOR = 4
COLUMN_MIN_BLOCKS = 64


@dataclass(frozen=True)
class RowLayout:
    """Threads of a resident row program."""

    N: int
    vector: int
    row_threads: int
    block_threads: int

    @property
    def rows_per_block(self) -> int:
        return self.block_threads // self.row_threads

    @property
    def full_vecs(self) -> int:
        """Column groups every lane owns."""
        return self.N // (self.row_threads * self.vector)

    @property
    def has_tail(self) -> bool:
        """Whether a last, partial column group exists (owned by the first lanes only)."""
        return self.N % (self.row_threads * self.vector) > 0

    @property
    def vecs(self) -> int:
        return self.full_vecs + int(self.has_tail)

    @property
    def per_thread(self) -> int:
        return self.vecs * self.vector


def resident_layout(N: int, dtype: torch.dtype, per_thread: int, vector: Optional[int] = None) -> RowLayout:
    """Enough lanes for a row at about ``per_thread`` elements each (at most 1024 lanes)."""
    vector = row_vector(N, dtype) if vector is None else vector
    per_thread = max(per_thread, vector)
    row_threads = min(MAX_THREADS, next_pow2(-(-N // per_thread)))
    return RowLayout(N, vector, row_threads, max(row_threads, MIN_BLOCK_THREADS))


@dataclass(frozen=True)
class StreamLayout:
    """Threads of a streamed row program: one row per block, walked in steps."""

    N: int
    vector: int
    threads: int
    unroll: int

    @property
    def chunk(self) -> int:
        return self.threads * self.vector

    @property
    def chunks(self) -> int:
        return -(-self.N // self.chunk)

    @property
    def steps(self) -> int:
        return -(-self.chunks // self.unroll)


def stream_layout(N: int, dtype: torch.dtype, threads: int, unroll: int) -> StreamLayout:
    return StreamLayout(N, row_vector(N, dtype), threads, unroll)


# ---- TileLang macros -------------------------------------------------------------------------


def scratch_shape(block_threads: int, count: int) -> Tuple[int, int, int]:
    """Shared scratch of ``row_sum`` macros reducing up to ``count`` values at once."""
    return (2, count, max(1, block_threads // WARP))


def _warp_exchange(T: Any, row_threads: int, name: str) -> Tuple[int, int, int, Callable[..., Any], Callable[..., Any]]:
    """What a reduction over the lanes of each row needs: its shuffle steps within a warp, the
    warps a row spans and the shuffle steps over them, a macro ``publish(st, base, count, scratch,
    slot, tx)`` putting each warp's values ``st[base:base + count]`` in ``scratch[slot, value,
    warp]`` (then a block barrier), and ``warp_value(scratch, slot, v, tx)``, the value ``v`` of
    the row's warp that lane ``tx`` reads back (each lane one warp's, which the warp then combines
    with shuffles: one shared-memory read per thread instead of one per warp of the row)."""
    if row_threads & (row_threads - 1):
        raise ValueError(f"{name}: {row_threads} threads a row is not a power of two")
    shuffle_steps = min(row_threads, WARP).bit_length() - 1
    warps_per_row = max(1, row_threads // WARP)
    warp_steps = warps_per_row.bit_length() - 1

    @T.macro
    def publish(st, base, count, scratch, slot, tx):
        if tx % WARP == 0:
            for v in T.unroll(count):
                scratch[slot, v, tx // WARP] = st[base + v]
        T.sync_threads()

    def warp_value(scratch, slot, v, tx):
        return scratch[slot, v, (tx // row_threads) * warps_per_row + tx % warps_per_row]

    return shuffle_steps, warps_per_row, warp_steps, publish, warp_value


def row_sum_macro(T: Any, row_threads: int, count: int) -> Callable[..., Any]:
    """Macro summing ``st[base:base + count]`` over the lanes of each row.

    Lanes of a row combine with xor shuffles, then (rows wider than a warp)
    through ``scratch[slot, value, warp]`` (see ``scratch_shape``).  Every
    lane ends with the row's sums, the same bits in every lane.  Callers alternate
    ``slot`` between consecutive reductions, so a reduction never overwrites scratch
    that a slower thread is still reading from the one before (the barrier of the
    reduction in between orders them).  Every thread of the block must call it.

    Four or more sums (a power of two) over rows of whole warps are split among the lanes
    rather than each shuffled over all of them (``_scattered_row_sum``): shuffles share the SM's
    shared-memory pipe with the loads of a staged row and of partial sums.  Two are not: that made
    RMSNorm's backward over rows of 4096 slower (see docs/performance.md, "The norm backwards'
    exchange from registers").
    """
    if count > 2 and count & (count - 1) == 0 and row_threads >= WARP:
        return _scattered_row_sum(T, row_threads, count)
    shuffle_steps, warps_per_row, warp_steps, publish, warp_value = _warp_exchange(T, row_threads, "row_sum")
    combine_warps = _combine_warps(T, count, warp_steps, warp_value)

    @T.macro
    def row_sum(st, base, scratch, slot, tx):
        if shuffle_steps > 0:
            for v in T.unroll(count):
                for step in T.unroll(shuffle_steps):
                    st[base + v] = st[base + v] + T.shfl_xor(st[base + v], 1 << step)
        if warps_per_row > 1:
            publish(st, base, count, scratch, slot, tx)
            combine_warps(st, base, scratch, slot, tx)

    return row_sum


def _combine_warps(T: Any, count: int, warp_steps: int, warp_value: Callable[..., Any]) -> Callable[..., Any]:
    """Macro giving every lane the row's ``count`` sums from its warps' published ones: each lane
    reads one warp's (``warp_value``), and xor shuffles over ``warp_steps`` steps add them."""

    @T.macro
    def combine_warps(st, base, scratch, slot, tx):
        for v in T.unroll(count):
            st[base + v] = warp_value(scratch, slot, v, tx)
            for step in T.unroll(warp_steps):
                st[base + v] = st[base + v] + T.shfl_xor(st[base + v], 1 << step)

    return combine_warps


def _scattered_row_sum(T: Any, row_threads: int, count: int) -> Callable[..., Any]:
    """``row_sum`` of ``count`` (a power of two) sums over rows of whole warps, in a few shuffles.

    Each xor step between lanes ``WARP / 2``, ``WARP / 4``, ... apart first halves the values a
    lane holds (it keeps one half, adds its partner's copy of it, and sends the other), until
    a lane holds one: the warp's total of value ``lane // group`` once the remaining steps within
    groups of ``group = WARP / count`` lanes have run (4 sums: 6 shuffles, not 20).  Rows of
    several warps publish those totals and read them back as runs of ``per_lane`` consecutive
    warps' values, one run a lane, summed and shuffled within the group; a broadcast from each
    group's first lane then gives every lane all the sums.  Float addition commutes, so the
    partners of every step compute the same bits.
    """
    _, warps_per_row, warp_steps, _, warp_value = _warp_exchange(T, row_threads, "row_sum")
    combine_warps = _combine_warps(T, count, warp_steps, warp_value)
    group = WARP // count
    halvings = count.bit_length() - 1
    per_lane = count * warps_per_row // WARP  # warps' values a lane reads back (0: fewer than lanes)

    @T.macro
    def butterfly(st, base, width):
        for step in T.unroll(width.bit_length() - 1):
            st[base] = st[base] + T.shfl_xor(st[base], width >> (step + 1))

    @T.macro
    def broadcast(st, base):
        # st[base] is read by the last broadcast, so it is overwritten last.
        for u in T.unroll(count):
            st[base + count - 1 - u] = T.shfl_sync(st[base], (count - 1 - u) * group)

    @T.macro
    def scatter(st, base, tx):
        for h in T.unroll(halvings):
            half = count >> (h + 1)
            upper = (tx & (WARP >> (h + 1))) != 0  # this lane keeps the upper half
            for i in T.unroll(half):
                st[base + i] = T.if_then_else(upper, st[base + half + i], st[base + i]) + T.shfl_xor(
                    T.if_then_else(upper, st[base + i], st[base + half + i]), WARP >> (h + 1))
        butterfly(st, base, group)

    @T.macro
    def row_sum(st, base, scratch, slot, tx):
        scatter(st, base, tx)
        if warps_per_row == 1:
            broadcast(st, base)
        else:
            if tx % group == 0:
                scratch[slot, (tx % WARP) // group, tx // WARP] = st[base]
            T.sync_threads()
            if per_lane > 0:
                run = (tx // row_threads) * warps_per_row + (tx % group) * per_lane
                st[base] = scratch[slot, (tx % WARP) // group, run]
                for p in T.unroll(1, per_lane):
                    st[base] = st[base] + scratch[slot, (tx % WARP) // group, run + p]
                butterfly(st, base, group)
                broadcast(st, base)
            else:
                combine_warps(st, base, scratch, slot, tx)

    return row_sum


def row_moments_macro(T: Any, layout: RowLayout) -> Callable[..., Any]:
    """Macro reducing each lane's ``st = [mean, m2]`` (the mean of its elements and the sum of
    their squared deviations from it) to the row's, over the lanes of each row of ``layout``.

    One reduction for both moments (Chan's pairwise merge), where the two-pass mean, then
    variance, takes a second round of shuffles and a second barrier.  A merge adds the pair's
    squared mean difference weighted by their counts, so it never cancels as sums of squares
    do, and both partners compute it from the same operands, so every lane ends with the same
    bits.  Lanes must hold equal shares of the row (a layout without a tail): the counts are
    then compile-time constants.  ``other`` is a local buffer of 3; uses ``scratch[0, 0:2,
    warp]`` (``scratch_shape(block_threads, 2)``); every thread of the block must call it, once.
    """
    if layout.has_tail:
        raise ValueError(f"row_moments: lanes of a row of {layout.N} hold unequal shares (a tail)")
    shuffle_steps, warps_per_row, warp_steps, publish, warp_value = _warp_exchange(T, layout.row_threads,
                                                                                    "row_moments")
    lane_count = layout.full_vecs * layout.vector

    @T.macro
    def merge(st, other, side_count):
        """``st`` merged with the partner's ``other[0:2]`` (``other[2]`` is scratch), each side
        holding ``side_count`` elements."""
        other[2] = other[0] - st[0]
        st[0] = (st[0] + other[0]) * T.cast(0.5, ACCUM)
        st[1] = (st[1] + other[1]) + other[2] * other[2] * (T.cast(side_count, ACCUM) * T.cast(0.5, ACCUM))

    @T.macro
    def shuffle_merge(st, other, steps, side_unit):
        for step in T.unroll(steps):
            for v in T.unroll(2):
                other[v] = T.shfl_xor(st[v], 1 << step)
            merge(st, other, side_unit << step)

    @T.macro
    def row_moments(st, other, scratch, tx):
        shuffle_merge(st, other, shuffle_steps, lane_count)
        if warps_per_row > 1:
            publish(st, 0, 2, scratch, 0, tx)
            for v in T.unroll(2):
                st[v] = warp_value(scratch, 0, v, tx)
            shuffle_merge(st, other, warp_steps, lane_count * WARP)

    return row_moments


def resident_macros(T: Any, layout: RowLayout, M: Any, policy: Optional[str] = None,
                    dtype: str = "float32") -> Dict[str, Callable[..., Any]]:
    """Loads of a resident row (``per_thread`` elements per lane), zero where there is no data;
    ``policy``: the L2 eviction hint of a row's whole 16-byte vectors of ``dtype`` (TileLang's name; see
    ``cache_hints``); ``prelude`` is what the program's kernel needs for those loads (None: nothing).

    Element ``j * vector + k`` of a lane's buffer is column ``column(j, lane) + k``.
    """
    N, vector, row_threads = layout.N, layout.vector, layout.row_threads
    full_vecs, has_tail = layout.full_vecs, layout.has_tail

    def column(j: int, lane: Any) -> Any:
        return (j * row_threads + lane) * vector

    @T.macro
    def zero(buf):
        for i in T.unroll(layout.per_thread):
            buf[i] = T.cast(0, buf.dtype)

    load = vector_load(T, policy, vector, dtype)

    @T.macro
    def load_row(src, buf, row, lane, base=0):
        """Row ``row`` of ``src``, from column ``base`` on (a slice of a longer row)."""
        zero(buf)
        if row < M:
            for j in T.unroll(full_vecs):
                load(buf, j * vector, src, row, base + column(j, lane))
            if has_tail:
                if column(full_vecs, lane) < N:
                    for k in T.vectorized(vector):
                        buf[full_vecs * vector + k] = src[row, base + column(full_vecs, lane) + k]

    @T.macro
    def each_vector(lane, step, *args):
        """``step(*args, j)`` for each vector ``j`` of the lane's share of a row: the tail vector
        only where it lies inside the row."""
        for j in T.unroll(full_vecs):
            step(*args, j)
        if has_tail:
            if column(full_vecs, lane) < N:
                step(*args, full_vecs)

    @T.macro
    def copy_vector(src, buf, lane, base, j):
        for k in T.vectorized(vector):
            buf[j * vector + k] = src[base + column(j, lane) + k]

    @T.macro
    def load_vector(src, buf, lane, base=0):
        """The lane's share of the 1-D ``src`` from element ``base`` on (a weight, or its slice)."""
        zero(buf)
        each_vector(lane, copy_vector, src, buf, lane, base)

    prelude = CACHE_HINT_PRELUDE if policy else None
    return {"zero": zero, "load_row": load_row, "load_vector": load_vector, "column": column,
            "each_vector": each_vector, "prelude": prelude}


def stream_macros(T: Any, layout: StreamLayout, dtype: str = "float32") -> Dict[str, Any]:
    """Loads of one step of a streamed row walk: ``unroll`` chunks of ``threads * vector`` elements.

    Element ``u * vector + k`` of a thread's buffer is column ``column(step, u, tx) + k``;
    ``valid(step, u, tx)`` says whether that vector lies inside the row.  ``load_step`` loads
    plainly; ``hinted_load_step(policy)`` is the same macro whose 16-byte loads of ``dtype``
    (TileLang's name) carry L2 eviction ``policy`` (``cache_hints``: the program's kernel then
    needs ``CACHE_HINT_PRELUDE``).
    """
    N, vector, threads, unroll, chunks = layout.N, layout.vector, layout.threads, layout.unroll, layout.chunks

    def column(step: Any, u: int, tx: Any) -> Any:
        return ((step * unroll + u) * threads + tx) * vector

    def valid(step: Any, u: int, tx: Any) -> Any:
        return T.And(step * unroll + u < chunks, column(step, u, tx) < N)

    def hinted_load_step(policy: Optional[str]) -> Any:
        load = vector_load(T, policy, vector, dtype)

        @T.macro
        def load_step(src, buf, row, step, tx):
            for i in T.unroll(unroll * vector):
                buf[i] = T.cast(0, buf.dtype)
            for u in T.unroll(unroll):
                if valid(step, u, tx):
                    load(buf, u * vector, src, row, column(step, u, tx))

        return load_step

    load_step = hinted_load_step(None)

    @T.macro
    def load_step_vector(src, buf, step, tx):
        for i in T.unroll(unroll * vector):
            buf[i] = T.cast(0, buf.dtype)
        for u in T.unroll(unroll):
            if valid(step, u, tx):
                for k in T.vectorized(vector):
                    buf[u * vector + k] = src[column(step, u, tx) + k]

    return {"column": column, "valid": valid, "load_step": load_step, "load_step_vector": load_step_vector,
            "hinted_load_step": hinted_load_step}


def column_sum_program(N: int, dtype: str, count: int = 1) -> Any:
    """``out_a[j] = sum_q P[a, q, j]`` for each of ``count`` (1 or 2) partial sums: float32 partial
    sums of ``Q`` rows reduced to one row of ``dtype`` each, in one launch.

    A block covers ``32 * vector`` columns of one partial sum with 32 row lanes;
    each thread loads ``vector`` adjacent columns at once (see ``column_vector``).
    The summation order is fixed, so results are reproducible run to run.  (One
    launch for both of LayerNorm's sums rather than one each: the grid of a
    4096-wide row has 128 blocks per sum, too few to keep the GPU's loads in
    flight, and the second launch waited on the first.)
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    if count not in (1, 2):
        raise ValueError(f"column_sum: {count} partial sums (1 or 2 are built)")
    Q = T.dynamic("Q")
    lanes = WARP
    vector = column_vector(N, count)
    width = WARP * vector  # columns of a block
    step_rows = lanes * COLUMN_UNROLL

    @T.macro
    def body(P, out_first, out_second):
        with T.Kernel(T.ceildiv(N, width), count, threads=WARP * lanes) as (bx, a):
            T.pdl_sync()  # wait for the launch before (see kernel_base)
            tx = T.get_thread_binding()
            acc = T.alloc_local((COLUMN_UNROLL * vector,), ACCUM)
            tmp = T.alloc_local((vector,), ACCUM)
            total = T.alloc_local((1,), ACCUM)
            # Padded by one word a row: the final pass reads it column-wise.
            scratch = T.alloc_shared((lanes, width + 1), ACCUM)
            first = bx * width + (tx % WARP) * vector
            lane = tx // WARP
            for i in T.unroll(COLUMN_UNROLL * vector):
                acc[i] = T.cast(0, ACCUM)
            if first < N:  # N is a multiple of ``vector``: a vector is wholly in or out
                for s in T.serial(T.ceildiv(Q, step_rows)):
                    for u in T.unroll(COLUMN_UNROLL):
                        if s * step_rows + u * lanes + lane < Q:
                            for k in T.vectorized(vector):
                                tmp[k] = P[a, s * step_rows + u * lanes + lane, first + k]
                            for k in T.unroll(vector):
                                acc[u * vector + k] = acc[u * vector + k] + tmp[k]
            for k in T.unroll(vector):
                for u in T.unroll(1, COLUMN_UNROLL):
                    acc[k] = acc[k] + acc[u * vector + k]
                scratch[lane, (tx % WARP) * vector + k] = acc[k]
            T.sync_threads()
            # One thread a column sums the 32 lanes in order.
            if tx < width and bx * width + tx < N:
                total[0] = scratch[0, tx]
                for r in T.unroll(1, lanes):
                    total[0] = total[0] + scratch[r, tx]
                if count == 1:
                    out_first[bx * width + tx] = T.cast(total[0], dtype)
                elif a == 0:
                    out_first[bx * width + tx] = T.cast(total[0], dtype)
                else:
                    out_second[bx * width + tx] = T.cast(total[0], dtype)

    if count == 1:

        @T.prim_func
        def norm_column_sum(P: T.Tensor((1, Q, N), ACCUM), Out: T.Tensor((N,), dtype)):
            body(P, Out, None)

        return norm_column_sum

    @T.prim_func
    def norm_column_sums(P: T.Tensor((2, Q, N), ACCUM), OutFirst: T.Tensor((N,), dtype),
                         OutSecond: T.Tensor((N,), dtype)):
        body(P, OutFirst, OutSecond)

    return norm_column_sums


def column_vector(N: int, count: int) -> int:
    """Adjacent float32 columns a thread of the column-sum program loads at once: up to
    ``COLUMN_VECTOR``, dividing ``N``, and halved while the grid would be under ``COLUMN_MIN_BLOCKS``."""
    vector = largest_pow2_divisor(N, COLUMN_VECTOR)
    while vector > 1 and -(-N // (WARP * vector)) * count < COLUMN_MIN_BLOCKS:
        vector //= 2
    return vector


# ---- kernel base -----------------------------------------------------------------------------


def row_slices(rows: int) -> Iterator[Tuple[int, int]]:
    """``[start, stop)`` row ranges small enough for a launch."""
    for start in range(0, rows, MAX_EXTENT):
        yield start, min(rows, start + MAX_EXTENT)


ProgramKey = Tuple[str, Tuple[Tuple[str, Any], ...]]


class RowNormKernel(Kernel):
    """Base of the norm family's multi-program kernels.

    A subclass builds named programs (``build_program(name, config, **shape)``),
    each compiled once per config and shape parameters and launched through
    a cached direct launcher.

    Args:
        N: hidden size (length of the normalised axis), fixed at construction.
        dtype: dtype of the row tensors (float16, bfloat16, float32).
        eps: added to the variance (or mean square) before the reciprocal square root.
        config: explicit config (keys of ``default_config``; may be partial).
        tune: pick the fastest of ``autotune_configs`` on the current GPU.
    """

    def __init__(
        self,
        N: int,
        dtype: torch.dtype,
        *,
        eps: float = 1e-6,
        config: Optional[Dict[str, Any]] = None,
        tune: bool = False,
    ) -> None:
        name = type(self).__name__
        check_kernel_args(name, dtype, N=N)
        self.N = int(N)
        self.eps = float(eps)
        super().__init__(dtype, config=config, tune=tune)

    # The resident program whose row loads carry L2's evict_last, taken by calls whose inputs
    # take ``hinted_min_mib`` or more (a config key of the kernels that name one).
    hinted_name: Optional[str] = None

    # ---- what subclasses supply ----------------------------------------------------------
    def build_program(self, name: str, config: Dict[str, Any], **shape: Any) -> Any:
        """The TileLang ``prim_func`` of program ``name``."""
        raise NotImplementedError(f"{type(self).__name__}.build_program")

    def program_keys(self) -> List[ProgramKey]:
        """The programs a call may launch under the current config (all compiled by ``build_all_for_sm90``)."""
        raise NotImplementedError(f"{type(self).__name__}.program_keys")

    def program(self, **config: Any) -> Any:
        name, shape = self.program_keys()[0]
        return self.build_program(name, {**self.default_config, **config}, **dict(shape))

    def _autotune_candidates(self, per_thread: Tuple[int, ...], streams: Tuple[Dict[str, int], ...]) -> List[Dict[str, Any]]:
        """The default config, then one layout change each, without repeats.

        A change is a resident width (raised to what ``MAX_THREADS`` threads
        need for a row) or a streamed shape.
        """
        default = self.default_config
        candidates = [default]
        candidates += [{**default, "per_thread": max(width, 1, -(-self.N // MAX_THREADS))} for width in per_thread]
        candidates += [{**default, **stream} for stream in streams]
        unique: List[Dict[str, Any]] = []
        for config in candidates:
            if config not in unique:
                unique.append(config)
        return unique

    def hinted_program(self) -> Optional[str]:
        """``hinted_name`` where the current config's rows are resident (``layout``) and their 16-byte
        loads can carry the hint; else None (streamed rows, narrower accesses)."""
        def hinted() -> Optional[str]:
            layout = self.layout()
            if (self.hinted_name is not None and isinstance(layout, RowLayout)
                    and takes_hint(EVICT_LAST, layout.vector, torch_dtype_to_tl(self.dtype))):
                return self.hinted_name
            return None

        return self.cached("hinted", hinted)

    def row_program(self, input_bytes: int) -> str:
        """The program of a call whose inputs take ``input_bytes``: the hinted one from
        ``hinted_min_mib`` on, else ``main_program``."""
        # One plan lookup a launch: this runs on every call, and three lookups and the
        # threshold's arithmetic were a tenth of a small call's host path.
        hinted, threshold, main = self.cached("row_programs", self._row_programs)
        return hinted if input_bytes >= threshold else main

    def _row_programs(self) -> Tuple[str, float, str]:
        """``(hinted program, input bytes from which it is taken, main program)``; the threshold
        is infinite where there is no hinted program."""
        hinted = self.hinted_program()
        main = self.main_program()
        if hinted is None:
            return main, float("inf"), main
        return hinted, hinted_min_bytes(self.config["hinted_min_mib"]), main

    def row_program_names(self) -> List[str]:
        """Every program ``row_program`` may name under the current config."""
        hinted = self.hinted_program()
        return [self.main_program()] + ([hinted] if hinted is not None else [])

    # ---- compilation and launch ----------------------------------------------------------
    def compile_program(self, name: str, shape: Tuple[Tuple[str, Any], ...] = (),
                        config: Optional[Dict[str, Any]] = None, target: Any = "auto") -> Any:
        """Program ``name`` with shape parameters ``shape``, compiled for ``config`` (default: current), cached."""
        config = dict(self.config if config is None else config)
        key: Tuple[Hashable, ...] = (name, shape, repr(target)) + tuple(sorted(config.items()))
        return self.compile_once(key, lambda: self.build_program(name, config, **dict(shape)), target,
                                 (name, shape, config))

    def build_all_for_sm90(self) -> Dict[str, Any]:
        """Compile every program of the current config for sm_90, without a GPU."""
        return {f"{name}{dict(shape)}": self.compile_program(name, shape, target=SM90_BUILD_TARGET)
                for name, shape in self.program_keys()}

    def launcher(self, name: str, shape: Tuple[Tuple[str, Any], ...] = ()) -> Any:
        """The direct launcher of program ``name`` (shape items sorted by name) under the current config."""
        return self._launch_plans.get(("launcher", name, shape),
                                      lambda: direct_launcher(self.compile_program(name, shape)))

    def cached(self, name: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per config (layouts and launchers are asked for on every launch,
        and recomputing them would cost microseconds)."""
        return self._launch_plans.get(name, compute)


class RowNormFwdKernel(RowNormKernel):
    """Base of the forward norm kernels: rows resident in registers where ``resident_fits``
    (``resident_name``, or ``hinted_name`` for calls of ``hinted_min_mib`` or more), else
    streamed (``streamed_name``).  Config keys ``per_thread``, ``stream_threads``,
    ``stream_unroll`` and ``hinted_min_mib``."""

    resident_name: str = ""
    streamed_name: str = ""

    def resident_fits(self, layout: RowLayout) -> bool:
        """Whether a thread holds its share of ``layout``'s rows in registers."""
        raise NotImplementedError(f"{type(self).__name__}.resident_fits")

    @property
    def autotune_configs(self) -> List[Dict[str, Any]]:
        vector_elems = max_vector(self.dtype)
        return self._autotune_candidates((vector_elems, 2 * vector_elems, 4 * vector_elems),
                                         tuple({"stream_threads": threads} for threads in (256, 512, 1024)))

    def layout(self, config: Optional[Dict[str, Any]] = None) -> Any:
        """The resident layout when a row fits in registers under ``config``, else the streamed one."""
        if config is None:
            return self.cached("layout", lambda: self.layout(self.config))
        resident = resident_layout(self.N, self.dtype, config["per_thread"])
        if self.resident_fits(resident):
            return resident
        return stream_layout(self.N, self.dtype, config["stream_threads"], config["stream_unroll"])

    def main_program(self) -> str:
        return self.cached("program", lambda: self.resident_name if isinstance(self.layout(), RowLayout)
                           else self.streamed_name)

    def program_keys(self) -> List[ProgramKey]:
        return [(name, ()) for name in self.row_program_names()]

