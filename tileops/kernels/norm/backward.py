"""Backward programs of RMSNorm and LayerNorm over the last axis of an ``(M, N)`` tensor.

With ``g = grad_y`` and ``gw = g * weight`` (``g`` when there is no weight):

* RMSNorm, ``r = rsqrt(mean(x**2) + eps)``::

      grad_x = r * (gw - x * r**2 * mean(gw * x))      grad_weight = sum over rows of g * x * r

* LayerNorm, ``xhat = (x - mean(x)) * rstd``::

      grad_x = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))
      grad_weight = sum over rows of g * xhat          grad_bias = sum over rows of g

The row statistics are recomputed from ``x``.  Two launches per call:

1. **rows** (persistent): ``Q`` row groups (about as many as fit on the GPU at
   once) each walk rows ``q, q + Q, q + 2Q, ...``, write ``grad_x`` and add
   their rows' terms of the weight (and bias) gradients to float32 per-column
   partial sums, which end in row ``q`` of a ``(Q, N)`` partials buffer (resident
   groups that share a block and keep their sums in shared memory add them up
   first: a row per block).
   Rows that fit in registers are read once (*resident*); longer rows are
   walked twice (*streamed*, the second walk hitting L2).  The partial sums
   sit in registers for short resident rows; otherwise in the row group's own
   shared memory as far as it holds them, and the rest in registers (streamed
   rows of a few steps, e.g. LayerNorm's bias sums of a 32768-wide row) or in
   the group's own row of the partials buffer, which then stays in L2.
2. **column sum**: the partials rows summed per column into the gradients (one launch).

A single row is one launch when its partial sums stay in registers or shared
memory: the row launch writes them as the gradients (``writes_directly``).

Calls of a few rows too long for a block's registers would leave most SMs idle
under the streamed program (a row group per row); they take a third program
instead, which splits every row over a cluster of blocks (``_cluster_bwd_program``).
Calls of many such half-precision rows take it too, with slices as wide as a block
holds: each row is then read once, and its sums cross the cluster once.  Where memory is
fast, blocks too large to hold the next row's slices in registers copy them into shared
memory while they work on the current row (``cluster_stage``).

No atomics: every partial sum has one owner and a fixed summation order, so
results are reproducible.
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
import functools
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from tileops.kernels.bulk_copy import BULK_COPY_PRELUDE, CLUSTER_SEND_PRELUDE, arrive_expecting, bulk_load, send
from tileops.kernels.device_traits import has_fast_memory
from tileops.kernels.kernel_base import PASS_CONFIGS, strided_rows, torch_dtype_to_tl
from tileops.kernels.norm.rows import (
    MAX_EXTENT,
    RowLayout,
    RowNormKernel,
    StreamLayout,
    column_sum_program,
    resident_layout,
    resident_macros,
    row_slices,
    row_sum_macro,
    scratch_shape,
    stream_layout,
    stream_macros,
)
from tileops.kernels.sizes import ACCUM, MAX_THREADS, THREADS_PER_SM, WARP, max_vector
from tileops.kernels.widening import float32_of, widening_prelude

__all__ = ["NormBwdKernel", "norm_bwd_default_config", "RESIDENT", "STREAMED", "CLUSTER", "COLUMN_SUM"]

RESIDENT = "norm_bwd_resident"
STREAMED = "norm_bwd_streamed"
CLUSTER = "norm_bwd_cluster"
COLUMN_SUM = "column_sum"
# Shared memory a block may give to per-column partial sums (an H100 block may
# have 227 KiB; the rest is left to the row-sum scratch), and what an SM offers
# blocks in all (for the number of blocks that fit at once).
SMEM_ACC_BUDGET = 212 * 1024
SMEM_PER_SM = 220 * 1024
# Float32 partial sums a streamed thread may hold in registers when shared memory
# is full (a 512-thread block has 128 registers a thread), and the most steps of a
# streamed row that are unrolled so that each register is named.
MAX_REGISTER_PARTIALS = 32
MAX_UNROLLED_STEPS = 4


# Bytes of each row tensor a thread may hold in registers when the partial sums live in memory
# (at 64, 1024-thread rows of 32768 half-precision elements spill registers).
RESIDENT_ROW_BYTES = 32


# Threads of a block of resident row groups that fold their partial sums together (see
# ``norm_bwd_default_config``).
FOLD_THREADS = 512
# Calls of at most CLUSTER_ROWS rows too long for one block's registers split each row
# over a cluster of CLUSTER_CTAS blocks (see ``_cluster_bwd_program``).
CLUSTER_CTAS = 8
CLUSTER_ROWS = 1024
# Threads an SM holds of a cluster program whose partial sums live in registers (128 registers
# each: a slice's elements of two tensors and the next row's, and up to 32 partial sums).
CLUSTER_REGISTER_THREADS = 512
# Floats of a partial-sum access to shared memory (16 bytes; see ``_accumulator_macros``).
SMEM_PIECE = 4
# Floats of a block's slot in a peer's exchange buffer: its row sums (two or four), stored with one
# vector store (``bulk_copy.send``).
EXCHANGE_SLOTS = 4
# Floats of a row's state: its sums, and what ``_one_pass_sums``'s ``row_state`` makes of them.
ROW_STATE = 10


def resident_cap(dtype: torch.dtype, layer: bool) -> int:
    """Row elements per thread that fit in registers next to their float32 partial sums."""
    return 4 if layer and dtype == torch.float32 else 8


def norm_bwd_default_config(N: int, dtype: torch.dtype, layer: bool = False,
                            fast_memory: bool = False, residual: bool = False) -> Dict[str, int]:
    """Two 16-byte vectors of each tensor per thread (one for rows under 2048 elements, which then
    keep their partial sums in registers); streamed rows: 512 threads, four vectors in flight.

    (Measured on H100, bf16: 32768x4096 RMSNorm backward 90% of copy bandwidth
    with two vectors against 84% with one; 8192x32768 streamed 82% with 512
    threads and four vectors against 80% with 1024 and two.)

    ``resident_row_bytes``: the most bytes of each row tensor a thread holds in
    registers when the partial sums live in memory (longer rows are streamed).
    ``sm_threads``: threads of the row program an SM must hold at once; it caps
    the registers of a thread (1024 threads: 64 each), and the persistent grid
    is sized to it.

    ``fold_threads``: resident rows whose partial sums live in shared memory share a block of
    up to this many threads, several row groups, whose partial sums the block adds up into one
    partials row (see ``_resident_bwd_program``); 0 keeps a block per row group.  (Measured on
    H100, bf16 N = 4096, 256 threads a row, µs for a block per group / two groups of 512
    threads / four of 1024: LayerNorm 16384 rows 170.6 / 160.3 / 176.5, 32768 rows
    309.7 / 304.5 / 333.2, one row 8.0 / 6.8 / 8.6; RMSNorm 16384 rows 151.5 / 141.4 / 143.9,
    one row 6.3 / 5.7 / 6.5.  Half the partials rows halve the column sum's reads, and a
    block writes its sums as whole vectors.)  With ``fast_memory`` (``device_traits``), LayerNorm
    keeps a block per row group: four 256-thread blocks an SM rather than two of 512 overlap one
    group's row sum with the others' loads (H200, 32768 x 4096, median of 7 rounds in turns, µs,
    two groups a block / one: bf16 235.6 / 226.3, fp16 228.6 / 217.2; 768 threads an SM, more
    registers, 234.2 and 225.1).  The fused add's backward in float16 keeps a block per row group
    too: folded, its rows of 2048 and 4096 took 64 registers a thread and spilled 32 bytes
    (bfloat16's fold does not spill; float16's widening keeps more values live).  (H200, 32768 x
    4096, µs folded / a block a group: float16 295.6 / 254.1, bfloat16 256.9 / 259.2.)  Rows whose
    last column group leaves lanes idle (``RowLayout.has_tail``) keep a block per row group too
    where memory is fast: folded, they ran far slower.  (H200, bf16, 16384 rows, µs folded / a
    block a group, median of 7 rounds in turns: RMSNorm 2880 113.0 / 80.6, 3584 121.9 / 91.6,
    the fused add 2880 117.2 / 103.4, 3584 129.5 / 120.0; whole column groups keep folding:
    RMSNorm 2048 54.4 / 54.1, 32768 x 4096 196.3 / 199.1 (float16 197.2 / 198.4), the fused add
    32768 x 4096 257.6 / 258.3.)

    ``cluster_ctas``, ``cluster_rows``: calls of at most ``cluster_rows`` streamed rows split
    each row over a cluster of ``cluster_ctas`` blocks (see ``_cluster_bwd_program``).  (Measured
    on H100, bf16 N = 32768, µs streamed / 4 blocks a row / 8: LayerNorm 1 row 38.1 / 9.1 / 8.4,
    64 rows 79.6 / 36.7 / 33.9, 264 rows 133.6 / 67.4 / 64.9; RMSNorm 264 rows 71.6 / 46.8 /
    44.1.  Streamed / 8 blocks a row, 1024 rows: LayerNorm 195.1 / 176.8, RMSNorm 120.6 /
    117.3, float32 LayerNorm N = 16384 119.7 / 104.8, LayerNorm N = 65536 643.2 / 405.4; 2048
    rows: 282.2 / 330.4, 190.2 / 214.7, 214.2 / 196.7, 1107.0 / 780.6.  With 8192 rows the
    streamed program beats these 8-block clusters (not the wider ones of ``many_rows_ctas``):
    LayerNorm 842 µs against 1247, RMSNorm 641 against 813; each row step of a cluster waits on
    a block-wide sum and the exchange, a few microseconds that its slice's traffic does not
    cover.  The exception is float32 RMSNorm N = 32768, 5-9% slower split at every count from
    256 rows on.)

    ``many_rows_ctas``: calls of more than ``cluster_rows`` streamed rows split each row over
    a cluster of this many blocks (0: they are streamed); see ``many_rows_ctas``.

    ``cluster_stage``: blocks of a cluster of at least this many threads bulk-copy the next row's
    slices into shared memory, where that fits next to their partial sums, which then live there
    too (see ``_cluster_bwd_program``); 0: none.  ``MAX_THREADS`` with ``fast_memory``, else 0.
    ``cluster_stage_early``: such a block starts the next row's copies as soon as every thread
    has read its share of the stage, rather than after the row sum; RMSNorm only.  (H200, bf16
    8192x32768, bench: RMSNorm 409.6 -> 397.2 us; LayerNorm 472.4 -> 504.8, its 1024-thread
    blocks then spilling 12 bytes a thread; an earlier form, a block barrier with no proxy fence,
    which raced, put the fused add at 529.4 -> 605.1 in a sweep.)

    ``residual``: the backward of the fused residual add.

    ``widen_by_word``: bfloat16 elements widen by their whole 32-bit word (``widening``); 0 here,
    the kernel's ``default_config`` sets it where ``NormBwdKernel.widening_pays``.

    ``stream_overlap`` (streamed rows): sum the next row during the walk that writes
    this one (see ``_streamed_bwd_program``); on for LayerNorm only.  (Measured on
    H100, bf16 8192x32768: LayerNorm 854 us against 908 with the two walks apart;
    RMSNorm 775 against 645, its second reads of a row then missing L2 more often.)"""
    vector_elems = max_vector(dtype)
    per_thread = max(2 * vector_elems if N >= 2048 else vector_elems, -(-N // MAX_THREADS))
    ragged = resident_layout(N, dtype, per_thread).has_tail
    folds = not (fast_memory and (layer or ragged)) and not (residual and dtype == torch.float16)
    return {"per_thread": per_thread, "stream_threads": 512, "stream_unroll": 4,
            "resident_row_bytes": RESIDENT_ROW_BYTES, "sm_threads": 1024, "stream_overlap": int(layer),
            "fold_threads": FOLD_THREADS if folds else 0,
            "cluster_ctas": CLUSTER_CTAS, "cluster_rows": CLUSTER_ROWS,
            "many_rows_ctas": many_rows_ctas(N, dtype), "cluster_stage": MAX_THREADS if fast_memory else 0,
            "cluster_stage_early": int(not layer and not residual), "widen_by_word": 0}


def many_rows_ctas(N: int, dtype: torch.dtype) -> int:
    """Blocks a half-precision row splits over in calls of many streamed rows: the fewest (a
    power of two, at most ``CLUSTER_CTAS``) whose slices a block of ``MAX_THREADS`` threads holds
    at ``RESIDENT_ROW_BYTES`` a thread; 0 for float32 (see below) and for rows too long for that.

    Each row is read once, against twice by the streamed program (the second time from L2), and
    a block of that size keeps its SM's memory busy while the slices' sums cross the cluster.
    (Measured on H100, bf16, µs streamed / split: LayerNorm 8192x32768 841.1 / 631.9 (2 blocks a
    row), 2048x32768 285.7 / 186.2, 4096x65536 2031.1 / 1209.4 (4 blocks); RMSNorm 8192x32768
    647.1 / 566.3.  Measured while each block still held the next row's slice in registers
    (see ``_cluster_bwd_program``), RMSNorm: 2048x32768 191.6 / 154.8, 16384x32768 1261.5 /
    1164.1, 4096x24576 303.1 / 217.8 (slices of 12288 ending in a half group), 4096x131072
    2996.7 / 1982.4 (8 blocks), fp16 1100x65536 404.2 / 244.3.  Narrower slices lose:
    8192x32768 over 4 blocks of 512 threads 913.1, of 1024 threads with 8 elements each
    1024.4.  Float32 slices gained little or lost: RMSNorm 8192x32768 1523.6 / 1496.3,
    1100x20000 145.1 / 193.0.)"""
    if dtype.itemsize != 2:
        return 0
    width = MAX_THREADS * (RESIDENT_ROW_BYTES // dtype.itemsize)
    ctas = 2
    while ctas * width < N:
        ctas *= 2
    return ctas if ctas <= CLUSTER_CTAS else 0


def group_columns(layout: Any) -> int:
    """Columns of one column group (see ``_accumulator_macros``): ``vector`` columns for each
    thread sharing a row, a row's lanes (resident) or the whole block (streamed)."""
    threads = layout.row_threads if isinstance(layout, RowLayout) else layout.threads
    return threads * layout.vector


def smem_offsets(smem_slots: Tuple[int, ...]) -> Tuple[int, ...]:
    """Where each partial sum's slots start in the flat shared-memory buffer."""
    return tuple(sum(smem_slots[:index]) for index in range(len(smem_slots)))


def _accumulator_macros(T: Any, smem_slots: Tuple[int, ...], N: int, vector: int, group_threads: int,
                        register_groups: Tuple[int, ...] = (0, 0),
                        out: Callable[[Any], Any] = lambda value: value,
                        groups_per_block: int = 1, piece: int = SMEM_PIECE) -> Tuple[Any, Any, Any, Callable[..., Any]]:
    """Macros on partial sum ``index`` (0: weight, 1: bias) of row group ``group``.

    A thread owns column groups ``g``: columns ``(g * group_threads + lane) * vector + k``
    for ``k < vector``; the macros take ``(g, lane)`` (and ``k``).  In shared memory a
    thread's ``vector`` sums of a group are split into pieces of ``min(vector, piece)``
    floats, and column ``k`` sits at slot
    ``g * group_threads * vector + (k // piece * group_threads + lane) * piece + k % piece``:
    a thread updates a piece with one access, and the threads of a warp touch consecutive
    pieces, free of bank conflicts.  (16-byte pieces issue a quarter of the shared-memory
    instructions of single words: H100, bf16 LayerNorm backward 32768x4096 290.5 us against
    305.2, 16384x4096 152.2 against 161.3.  Whole 32-byte vectors would conflict two ways.)

    Partial sum ``index`` keeps its first ``smem_slots[index]`` slots (whole column
    groups, or every column) in shared memory.  The weight's and the bias's float32
    sums of a 32768-wide row do not both fit there, so the bias's spill over: into the
    thread's registers (``accr``) when ``register_groups[index]`` says how many groups
    (the loop over groups must then be unrolled), else into the row group's own row of
    the partials buffer, which stays in L2.  Only the thread that owns a column touches it.
    ``out`` converts a finished partial sum for the partials buffer (see ``_partials_out``).

    With ``groups_per_block`` row groups in a block, group ``group`` (numbered across the
    grid) keeps its slots at ``(group % groups_per_block) * sum(smem_slots)``.  The fourth
    macro returned gives a slot's index: ``slot(index, group, g, lane, k)``.
    """
    offsets = smem_offsets(smem_slots)
    group_stride = sum(smem_slots)
    group_columns = group_threads * vector
    piece = min(vector, piece)
    first_spilled = tuple(slots // group_columns for slots in smem_slots)
    register_offsets = tuple(sum(register_groups[:index]) * vector for index in range(len(register_groups)))

    def column(g, lane, k):
        return (g * group_threads + lane) * vector + k

    def slot(index, group, g, lane, k):
        own = offsets[index] + g * group_columns + (k // piece * group_threads + lane) * piece + k % piece
        return own if groups_per_block == 1 else (group % groups_per_block) * group_stride + own

    def register(index, g, k):
        return register_offsets[index] + (g - first_spilled[index]) * vector + k

    def in_registers(index, g):
        """Whether the column group is in registers: a Python bool when the answer is the same for all."""
        if register_groups[index] == 0 or smem_slots[index] >= N:
            return False
        if first_spilled[index] == 0:
            return True
        return g >= first_spilled[index]

    def in_smem(index, g):
        """Whether the column group is in shared memory: a Python bool when the answer is the same for all."""
        if smem_slots[index] >= N:
            return True
        if first_spilled[index] == 0:
            return False
        return g < first_spilled[index]

    @T.macro
    def acc_store(acc_smem, accr, PW, PB, index, group, g, lane, k, value):
        if in_registers(index, g):
            accr[register(index, g, k)] = value
        elif in_smem(index, g):
            acc_smem[slot(index, group, g, lane, k)] = value
        elif index == 0:
            PW[group, column(g, lane, k)] = value
        else:
            PB[group, column(g, lane, k)] = value

    @T.macro
    def add_in_memory(P, group, g, lane, term, gb, xb, st, base, tmp):
        for k in T.vectorized(vector):
            tmp[k] = P[group, column(g, lane, k)]
        for k in T.unroll(vector):
            tmp[k] = tmp[k] + term(gb, xb, st, base + k)
        for k in T.vectorized(vector):
            P[group, column(g, lane, k)] = tmp[k]

    @T.macro
    def acc_add_group(acc_smem, accr, PW, PB, index, group, g, lane, term, gb, xb, st, base, tmp):
        """Add ``term(gb, xb, st, base + k)`` to partial sum ``index`` of column group ``(g, lane)``.

        All loads come before all stores, so they are in flight together rather
        than each waiting for the store before it.
        """
        if in_registers(index, g):
            for k in T.unroll(vector):
                accr[register(index, g, k)] = accr[register(index, g, k)] + term(gb, xb, st, base + k)
        elif in_smem(index, g):
            for h in T.unroll(vector // piece):
                for k in T.vectorized(piece):
                    tmp[h * piece + k] = acc_smem[slot(index, group, g, lane, h * piece + k)]
            for h in T.unroll(vector // piece):
                for k in T.vectorized(piece):
                    acc_smem[slot(index, group, g, lane, h * piece + k)] = (
                        tmp[h * piece + k] + term(gb, xb, st, base + h * piece + k))
        else:
            add_in_memory(PW if index == 0 else PB, group, g, lane, term, gb, xb, st, base, tmp)

    @T.macro
    def acc_flush(acc_smem, accr, PW, PB, index, group, g, lane, k):
        """Copy a partial sum kept in shared memory or registers to the group's row of the partials buffer."""
        if in_registers(index, g):
            if index == 0:
                PW[group, column(g, lane, k)] = out(accr[register(index, g, k)])
            else:
                PB[group, column(g, lane, k)] = out(accr[register(index, g, k)])
        elif in_smem(index, g):
            if index == 0:
                PW[group, column(g, lane, k)] = out(acc_smem[slot(index, group, g, lane, k)])
            else:
                PB[group, column(g, lane, k)] = out(acc_smem[slot(index, group, g, lane, k)])

    return acc_store, acc_add_group, acc_flush, slot


def _partials_out(T: Any, dtype: str, direct: bool) -> Tuple[str, Callable[[Any], Any]]:
    """The partials buffers' dtype and what converts a finished partial sum for them.

    ``direct``: the launch has one row group, whose partial sums are the gradients
    themselves; they go straight to the ``(1, N)`` gradient views in ``dtype``, and
    the column-sum launch is skipped.
    """
    if not direct:
        return ACCUM, lambda value: value
    return dtype, lambda value: T.cast(value, dtype)


def _row_inputs(T: Any, M: Any, N: int, dtype: str, strided: bool, residual: bool) -> Tuple[Tuple[Any, ...], Any]:
    """The TileLang types of the row inputs ``grad_y``, ``x`` and, with ``residual``, of the
    gradient added to ``grad_x`` (see ``_added_gradient``; else None), and a macro that tells
    TileLang their strides keep the programs' vector accesses aligned (see ``strided_rows``)."""
    GT, LDG = strided_rows(T, M, N, dtype, "LDG", strided)
    XT, LDX = strided_rows(T, M, N, dtype, "LDX", strided)
    RT, LDR = strided_rows(T, M, N, dtype, "LDR", strided) if residual else (None, None)

    @T.macro
    def assume_aligned(vector):
        if strided:
            T.assume(LDG % vector == 0)
            T.assume(LDX % vector == 0)
            if residual:
                T.assume(LDR % vector == 0)

    return (GT, XT, RT), assume_aligned


def _added_gradient(residual: bool) -> Callable[[Any, Any], Any]:
    """``added(buffer, index)``: the gradient that reaches ``x`` by another path, for ``rms_grad``.

    A fused residual add (``h = x + residual``, normalized and also returned) gives ``h`` the
    gradient of the returned sum besides the normalization's: the programs with ``residual``
    read it (``R``) and add it to ``grad_x``, so ``grad_x`` is the gradient of both addends."""

    def added(buffer, index):
        return buffer[index] if residual else None

    return added


def _element_math(T: Any, dtype: str, has_weight: bool, mean: int, rstd: int,
                  widen: bool = False) -> Dict[str, Callable[..., Any]]:
    """Per-element expressions of both backward programs, reading the row state ``st``.

    RMSNorm rows leave ``r`` in ``st[0]`` and ``mean(g * w * x) * r^2`` in ``st[1]``;
    LayerNorm rows leave their mean and rstd in ``st[mean]`` and ``st[rstd]``,
    ``mean(g * w)`` in ``st[2]``, ``mean(g * w * xhat)`` in ``st[3]``, their shift ``s`` in
    ``st[4]`` and, for the ``widened_`` expressions, the constants ``st[7..9]``.
    ``widen``: bfloat16 elements of local buffers widen by their whole word (``widening``; the
    program's kernel must take ``widening_prelude``).
    """

    f32 = float32_of(T, widen)

    def scaled(g, w):
        """``g * w`` in float32 (``g`` without a weight)."""
        return f32(g) * f32(w) if has_weight else f32(g)

    def rms_grad(g, x, w, st, added=None):
        """``added``: a gradient that reaches ``x`` by another path (see ``_added_gradient``)."""
        value = st[0] * (scaled(g, w) - f32(x) * st[1])
        return T.cast(value if added is None else value + f32(added), dtype)

    def layer_grad(g, x, w, st, added=None):
        assert added is None, "LayerNorm's backward adds no other gradient"
        return T.cast(st[rstd] * (scaled(g, w) - st[2] - (f32(x) - st[mean]) * st[rstd] * st[3]), dtype)

    # Terms of the weight and bias partial sums for element i of a thread's buffers.
    def rms_weight_term(gb, xb, st, i):
        return f32(gb[i]) * f32(xb[i]) * st[0]

    def layer_weight_term(gb, xb, st, i):
        return f32(gb[i]) * (f32(xb[i]) - st[mean]) * st[rstd]

    def bias_term(gb, xb, st, i):
        return f32(gb[i])

    # LayerNorm over widened rows (see ``_one_pass_sums``): ``xs`` holds ``x - s`` and ``gw``
    # holds ``g * w`` in float32; ``st[7]`` is ``(mean - s) * rstd``, and ``layer_grad``'s
    # formula is ``rstd * (gw - mean(gw)) + st[8] * xs + st[9]``, a subtraction and two fused
    # multiply-adds an element.  ``gw - mean(gw)`` stays a subtraction: a row whose ``gw`` is
    # its mean (any row of one element) then gets exactly 0, where ``rstd * gw`` less a
    # rounded ``rstd * mean(gw)`` would leave that product's rounding error (1/sqrt(eps) times
    # ``gw``'s).
    def widened_grad(g, xs, gw, st, added=None):
        assert added is None, "LayerNorm's backward adds no other gradient"
        return T.cast(st[rstd] * (gw - st[2]) + (st[8] * xs + st[9]), dtype)

    def widened_weight_term(gb, xs, st, i):
        return f32(gb[i]) * (xs[i] * st[rstd] - st[7])

    return {"f32": f32, "scaled": scaled, "rms_grad": rms_grad, "layer_grad": layer_grad,
            "rms_weight_term": rms_weight_term, "layer_weight_term": layer_weight_term, "bias_term": bias_term,
            "widened_grad": widened_grad, "widened_weight_term": widened_weight_term}


def _one_pass_sums(T: Any, element: Dict[str, Callable[..., Any]], layer: bool, N: int, eps: float,
                   vector: int) -> Dict[str, Any]:
    """Macros of the row sums taken in one pass (every backward program), and of the row state
    ``_element_math`` reads (``mean`` 5, ``rstd`` 6) made from them.

    RMSNorm sums ``x**2`` and ``g * w * x``; LayerNorm sums ``x - s``, ``(x - s)**2``, ``g * w``
    and ``g * w * (x - s)`` with the shift ``s = st[4]``, the row's first element, which is
    close enough to the mean to keep the variance from cancelling."""
    f32, scaled = element["f32"], element["scaled"]
    inv_n = 1.0 / N

    @T.macro
    def add_shifted(gb, xb, wb, st, base):
        """LayerNorm: elements ``base .. base + vector`` of the buffers (the shifted terms of a
        missing element are not zero: callers skip vectors outside the row)."""
        for k in T.unroll(vector):
            st[0] = st[0] + (f32(xb[base + k]) - st[4])
            st[1] = st[1] + (f32(xb[base + k]) - st[4]) * (f32(xb[base + k]) - st[4])
            st[2] = st[2] + scaled(gb[base + k], wb[base + k])
            st[3] = st[3] + scaled(gb[base + k], wb[base + k]) * (f32(xb[base + k]) - st[4])

    @T.macro
    def widen(gb, xb, wb, xs, gw, st, count):
        """LayerNorm: the first ``count`` elements' ``x - s`` into ``xs`` and ``g * w`` into ``gw``,
        in float32.  Each half-precision element is then converted once, where the row's two
        passes converted ``x`` three times and ``g`` four: the resident sm_90 row loop (bf16,
        N = 4096) took 744 instructions for a thread's 16 elements, 192 of them conversions, and
        takes 624 in as many registers; H200, 32768 x 4096: 272.1 -> 236.9 µs."""
        for i in T.unroll(count):
            xs[i] = f32(xb[i]) - st[4]
            gw[i] = scaled(gb[i], wb[i])

    @T.macro
    def add_widened(xs, gw, st, base):
        """LayerNorm: the shifted sums of elements ``base .. base + vector`` of widened buffers."""
        for k in T.unroll(vector):
            st[0] = st[0] + xs[base + k]
            st[1] = st[1] + xs[base + k] * xs[base + k]
            st[2] = st[2] + gw[base + k]
            st[3] = st[3] + gw[base + k] * xs[base + k]

    @T.macro
    def add_rms(gb, xb, wb, st, count):
        """RMSNorm: the first ``count`` elements of the buffers (missing elements are zeros)."""
        for i in T.unroll(count):
            st[0] = st[0] + f32(xb[i]) * f32(xb[i])
            st[1] = st[1] + scaled(gb[i], wb[i]) * f32(xb[i])

    @T.macro
    def row_state(st):
        """The row's sums, once added over the row, become the state ``_element_math`` reads."""
        if layer:
            st[5] = st[4] + st[0] * inv_n  # mean
            st[6] = T.rsqrt(T.max(st[1] * inv_n - st[0] * inv_n * st[0] * inv_n, T.cast(0, ACCUM)) + eps)
            st[3] = st[6] * (st[3] - (st[5] - st[4]) * st[2]) * inv_n  # mean(gw * xhat)
            st[2] = st[2] * inv_n  # mean(gw)
            st[7] = (st[5] - st[4]) * st[6]  # xhat = (x - s) * rstd - st[7]
            st[8] = -st[6] * st[6] * st[3]
            st[9] = st[6] * st[3] * st[7]
        else:
            st[0] = T.rsqrt(st[0] * inv_n + eps)
            st[1] = st[1] * st[0] * st[0] * inv_n

    return {"add_shifted": add_shifted, "widen": widen, "add_widened": add_widened, "add_rms": add_rms,
            "row_state": row_state}


# ---- resident rows ------------------------------------------------------------------------------


def _resident_bwd_program(N: int, dtype: str, eps: float, layout: RowLayout, layer: bool, has_weight: bool,
                          smem_slots: Optional[Tuple[int, ...]], blocks_per_sm: int, direct: bool = False,
                          fold: bool = False, strided: bool = False, residual: bool = False,
                          widen: bool = False) -> Any:
    """``smem_slots`` None: partial sums in registers, a partials row per row group; else the
    shared-memory slots of each partial sum of a row group (see ``_accumulator_macros``), the
    rest being in the partials buffer.
    ``fold``: the block's row groups (``rows_per_block``, one or more) each keep every partial
    sum in shared memory, and at the end the block adds them up, in group order, into one
    partials row, each thread writing whole vectors: the partials buffer has a row per block,
    and the grid is its row count.  (Else a thread writes the columns it owns, ``vector``
    apart.  Measured on H100, bf16, µs that way / folded, one group a block: LayerNorm
    16384x8192 355.9 / 310.6, 8192x16384 378.9 / 348.7, 1x16384 18.4 / 10.2; RMSNorm
    8192x16384 297.6 / 285.2, 1x8192 8.2 / 6.2.)
    ``blocks_per_sm``: blocks that must fit on an SM at once (it caps registers per thread).
    ``direct``: a launch over one row (see ``_partials_out``), whose terms are written as the
    gradients, with no partial sums (see ``NormBwdKernel.writes_directly``).
    ``residual``: RMSNorm whose ``grad_x`` adds another gradient (see ``_added_gradient``)."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    M = T.dynamic("M")
    Q = T.dynamic("Q")
    row_types, assume_aligned = _row_inputs(T, M, N, dtype, strided, residual)
    added = _added_gradient(residual)
    per_thread, vector, row_threads = layout.per_thread, layout.vector, layout.row_threads
    rows_per_block = layout.rows_per_block
    loads = resident_macros(T, layout, M)
    column, each_vector = loads["column"], loads["each_vector"]
    sum2 = row_sum_macro(T, row_threads, 2)
    sum4 = row_sum_macro(T, row_threads, 4)
    in_registers = smem_slots is None
    slots = (0, 0) if in_registers else smem_slots
    partial_dtype, out = _partials_out(T, dtype, direct)
    groups_per_block = rows_per_block if fold else 1
    acc_store, acc_add_group, acc_flush, slot = _accumulator_macros(T, slots, N, vector, row_threads, out=out,
                                                                    groups_per_block=groups_per_block)
    accr = None  # no partial sums spill into registers here
    accumulators = 2 if layer else 1
    smem_size = max(groups_per_block * sum(slots), 1)
    block_threads = layout.block_threads
    group_vectors = layout.vecs * row_threads  # (column group, lane) pairs of a row group

    element = _element_math(T, dtype, has_weight, 5, 6, widen)
    f32, rms_grad = element["f32"], element["rms_grad"]
    # LayerNorm rows are widened once (see ``_one_pass_sums``): its terms read ``x - s`` where
    # RMSNorm's read ``x``.
    weight_term = element["widened_weight_term"] if layer else element["rms_weight_term"]
    bias_term = element["bias_term"]
    one_pass = _one_pass_sums(T, element, layer, N, eps, vector)

    @T.macro
    def add_widened_vector(xs, gw, st, j):
        one_pass["add_widened"](xs, gw, st, j * vector)

    @T.macro
    def store_dx(DX, row, lane, value, gb, xb, wb, rb, st, j):
        for k in T.vectorized(vector):
            DX[row, column(j, lane) + k] = value(gb[j * vector + k], xb[j * vector + k], wb[j * vector + k],
                                                 st, added(rb, j * vector + k))

    @T.macro
    def store_row(DX, row, lane, value, gb, xb, wb, rb, st):
        if row < M:
            each_vector(lane, store_dx, DX, row, lane, value, gb, xb, wb, rb, st)

    @T.macro
    def add_group_terms(acc_smem, PW, PB, gb, xb, st, group, lane, tmp, j):
        """Add the terms of column group ``j`` to partial sums kept in memory."""
        acc_add_group(acc_smem, accr, PW, PB, 0, group, j, lane, weight_term, gb, xb, st, j * vector, tmp)
        if layer:
            acc_add_group(acc_smem, accr, PW, PB, 1, group, j, lane, bias_term, gb, xb, st, j * vector, tmp)

    @T.macro
    def store_group_terms(PW, PB, lane, gb, xb, st, j):
        for k in T.vectorized(vector):
            PW[0, column(j, lane) + k] = out(weight_term(gb, xb, st, j * vector + k))
            if layer:
                PB[0, column(j, lane) + k] = out(bias_term(gb, xb, st, j * vector + k))

    @T.macro
    def store_terms(PW, PB, row, lane, gb, xb, st):
        """The only row's terms of the weight (and bias) gradients: the gradients themselves."""
        if row < M:
            each_vector(lane, store_group_terms, PW, PB, lane, gb, xb, st)

    @T.macro
    def add_terms(accw, accb, acc_smem, PW, PB, gb, xb, st, group, lane, tmp):
        """This row's terms of the weight (and bias) gradients, added to the partial sums."""
        if in_registers:
            for i in T.unroll(per_thread):  # missing elements have g = 0 and add nothing
                accw[i] = accw[i] + weight_term(gb, xb, st, i)
                if layer:
                    accb[i] = accb[i] + bias_term(gb, xb, st, i)
        else:
            each_vector(lane, add_group_terms, acc_smem, PW, PB, gb, xb, st, group, lane, tmp)

    @T.macro
    def rms_row(gb, xb, wb, rb, accw, accb, acc_smem, PW, PB, st, scratch, slot, row, group, lane, tx, DX, tmp):
        st[0] = T.cast(0, ACCUM)
        st[1] = T.cast(0, ACCUM)
        one_pass["add_rms"](gb, xb, wb, st, per_thread)
        sum2(st, 0, scratch, slot, tx)
        one_pass["row_state"](st)
        store_row(DX, row, lane, rms_grad, gb, xb, wb, rb, st)
        if direct:
            store_terms(PW, PB, row, lane, gb, xb, st)
        else:
            add_terms(accw, accb, acc_smem, PW, PB, gb, xb, st, group, lane, tmp)

    @T.macro
    def layer_row(gb, xb, wb, xs, gw, accw, accb, acc_smem, PW, PB, st, first, scratch, slot, row, group, lane, tx,
                  X, DX, tmp):
        # One block-wide sum of the shifted terms (see ``_one_pass_sums``) rather than the mean's
        # and then the centred terms': a row waits on one reduction instead of two.
        for k in T.vectorized(vector):
            first[k] = X[T.min(row, M - 1), k]
        st[4] = f32(first[0])
        for v in T.unroll(4):
            st[v] = T.cast(0, ACCUM)
        one_pass["widen"](gb, xb, wb, xs, gw, st, per_thread)  # missing elements: finite, and skipped
        each_vector(lane, add_widened_vector, xs, gw, st)
        sum4(st, 0, scratch, slot, tx)
        one_pass["row_state"](st)
        store_row(DX, row, lane, element["widened_grad"], gb, xs, gw, None, st)
        if direct:
            store_terms(PW, PB, row, lane, gb, xs, st)
        else:
            add_terms(accw, accb, acc_smem, PW, PB, gb, xs, st, group, lane, tmp)

    @T.macro
    def reset_group(acc_smem, PW, PB, group, lane, j):
        for k in T.unroll(vector):
            acc_store(acc_smem, accr, PW, PB, 0, group, j, lane, k, T.cast(0, ACCUM))
            if accumulators > 1:
                acc_store(acc_smem, accr, PW, PB, 1, group, j, lane, k, T.cast(0, ACCUM))

    @T.macro
    def reset_memory_partials(acc_smem, PW, PB, group, lane):
        each_vector(lane, reset_group, acc_smem, PW, PB, group, lane)

    @T.macro
    def store_partial_vector(P, acc, acc_smem, PW, PB, index, group, lane, j):
        for k in T.unroll(vector):
            if in_registers:
                P[group, column(j, lane) + k] = out(acc[j * vector + k])
            else:
                acc_flush(acc_smem, accr, PW, PB, index, group, j, lane, k)

    @T.macro
    def store_partials(P, acc, acc_smem, PW, PB, index, group, lane):
        """Partial sums ``index`` to row ``group`` of ``P``: from registers, or from shared memory."""
        each_vector(lane, store_partial_vector, P, acc, acc_smem, PW, PB, index, group, lane)

    @T.macro
    def fold_partials(P, acc_smem, index, bx, tx, tmp):
        """Row ``bx`` of ``P``: partial sum ``index`` of the block's row groups, added in group
        order; each thread takes whole vectors of columns (lanes consecutive, as stored)."""
        for i in T.unroll(-(-group_vectors // block_threads)):
            if i * block_threads + tx < group_vectors:
                j = (i * block_threads + tx) // row_threads
                owner = (i * block_threads + tx) % row_threads
                if column(j, owner) < N:
                    for k in T.unroll(vector):
                        tmp[k] = acc_smem[slot(index, 0, j, owner, k)]
                        for r in T.unroll(1, groups_per_block):
                            tmp[k] = tmp[k] + acc_smem[slot(index, r, j, owner, k)]
                    for k in T.vectorized(vector):
                        P[bx, column(j, owner) + k] = out(tmp[k])

    @T.macro
    def start_partials(accw, accb, acc_smem, PW, PB, group, lane):
        if in_registers:
            for i in T.unroll(per_thread):
                accw[i] = T.cast(0, ACCUM)
                accb[i] = T.cast(0, ACCUM)
        else:
            reset_memory_partials(acc_smem, PW, PB, group, lane)

    @T.macro
    def finish_partials(accw, accb, acc_smem, PW, PB, bx, group, lane, tx, tmp):
        """The partial sums to the partials buffer: folded over the block's groups, or a row per group."""
        if fold:
            T.sync_threads()
            fold_partials(PW, acc_smem, 0, bx, tx, tmp)
            if layer:
                fold_partials(PB, acc_smem, 1, bx, tx, tmp)
        else:
            if in_registers or slots[0] > 0:
                store_partials(PW, accw, acc_smem, PW, PB, 0, group, lane)
            if layer and (in_registers or slots[1] > 0):
                store_partials(PB, accb, acc_smem, PW, PB, 1, group, lane)

    @T.macro
    def body(G, X, W, DX, PW, PB, R):
        # ``Q``: the partials rows; the row groups striding over the rows are ``groups``.
        groups = Q * rows_per_block if fold else Q
        with T.Kernel(Q if fold else T.ceildiv(Q, rows_per_block), threads=block_threads,
                      prelude=widening_prelude(widen)) as bx:
            T.pdl_trigger()  # the next launch may start early (see kernel_base)
            assume_aligned(vector)
            T.annotate_min_blocks_per_sm(blocks_per_sm)
            tx = T.get_thread_binding()
            gb = T.alloc_local((per_thread,), dtype)
            xb = T.alloc_local((per_thread,), dtype)
            wb = T.alloc_local((per_thread,), dtype)
            rb = T.alloc_local((per_thread if residual else 1,), dtype)
            xs = T.alloc_local((per_thread if layer else 1,), ACCUM)
            gw = T.alloc_local((per_thread if layer else 1,), ACCUM)
            accw = T.alloc_local((per_thread,), ACCUM)
            accb = T.alloc_local((per_thread,), ACCUM)
            st = T.alloc_local((ROW_STATE,), ACCUM)
            first = T.alloc_local((vector,), dtype)
            tmp = T.alloc_local((vector,), ACCUM)
            scratch = T.alloc_shared(scratch_shape(layout.block_threads, 4), ACCUM)
            acc_smem = T.alloc_shared((smem_size,), ACCUM)
            group = bx * rows_per_block + tx // row_threads
            lane = tx % row_threads
            if has_weight and in_registers:
                loads["load_vector"](W, wb, lane)
            if not direct:  # one row writes its terms as the gradients, with no partial sums
                start_partials(accw, accb, acc_smem, PW, PB, group, lane)
            # One row (direct): a single step, not a loop whose trip count, a division by the
            # symbolic group count, precedes the loads (H100 bench, bf16 1x4096 backward: RMSNorm
            # 5.44 -> 5.23 us, torch.compile 5.18; LayerNorm 6.05 -> 5.92, compile 5.83).
            for it in T.serial(1 if direct else T.ceildiv(M, groups)):
                loads["load_row"](G, gb, it * groups + group, lane)
                loads["load_row"](X, xb, it * groups + group, lane)
                if residual:
                    loads["load_row"](R, rb, it * groups + group, lane)
                if has_weight and not in_registers:
                    # Long rows: the weight is reloaded per row (L1 hits) rather than held in registers.
                    loads["load_vector"](W, wb, lane)
                if layer:
                    layer_row(gb, xb, wb, xs, gw, accw, accb, acc_smem, PW, PB, st, first, scratch, it % 2,
                              it * groups + group, group, lane, tx, X, DX, tmp)
                else:
                    rms_row(gb, xb, wb, rb, accw, accb, acc_smem, PW, PB, st, scratch, it % 2, it * groups + group,
                            group, lane, tx, DX, tmp)
            if not direct:
                finish_partials(accw, accb, acc_smem, PW, PB, bx, group, lane, tx, tmp)

    return _signature_variants(T, M, Q, N, dtype, row_types, layer, has_weight, body, partial_dtype)


# ---- streamed rows ------------------------------------------------------------------------------


def _streamed_bwd_program(N: int, dtype: str, eps: float, layout: StreamLayout, layer: bool, has_weight: bool,
                          smem_slots: Tuple[int, ...], register_groups: Tuple[int, ...], blocks_per_sm: int,
                          overlap: bool, direct: bool = False, strided: bool = False, residual: bool = False,
                          widen: bool = False) -> Any:
    """A row group walks each of its rows twice: once for the row sums, then again (mostly from L2)
    to write the gradient and add the partial-sum terms.

    ``overlap``: the first walk of the next row rides along the second walk of this one, so the
    next row's loads from memory are in flight while this row is written, and a block-wide sum
    parts the rows only once.  Else each row is summed, then written, in turn (its second walk
    in reverse order, the chunks read last being the likeliest L2 hits).
    ``register_groups``: column groups of each partial sum held in registers (see ``_accumulator_macros``).
    ``direct``: see ``_partials_out``; ``residual``: see ``_added_gradient`` (read on the second walk)."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    M = T.dynamic("M")
    Q = T.dynamic("Q")
    row_types, assume_aligned = _row_inputs(T, M, N, dtype, strided, residual)
    added = _added_gradient(residual)
    vector, unroll, threads, steps = layout.vector, layout.unroll, layout.threads, layout.steps
    walk = stream_macros(T, layout)
    column, valid = walk["column"], walk["valid"]
    sums = 4 if layer else 2
    row_sum = row_sum_macro(T, threads, sums)
    accumulators = 2 if layer else 1

    element = _element_math(T, dtype, has_weight, 5, 6, widen)
    f32, rms_grad, layer_grad = element["f32"], element["rms_grad"], element["layer_grad"]
    rms_weight_term, layer_weight_term, bias_term = (
        element["rms_weight_term"], element["layer_weight_term"], element["bias_term"])
    one_pass = _one_pass_sums(T, element, layer, N, eps, vector)

    partial_dtype, out = _partials_out(T, dtype, direct)
    # One word a shared-memory access: the streamed walk's updates are latency-bound, and
    # 16-byte pieces made them slower (see ``_accumulator_macros``).
    acc_store, acc_add_group, acc_flush, _ = _accumulator_macros(T, smem_slots, N, vector, threads,
                                                                 register_groups, out, piece=1)
    # Partial sums in registers need every column group's index known after unrolling.
    steps_loop = functools.partial(T.unroll, explicit=True) if sum(register_groups) else T.serial

    @T.macro
    def reset_partials(acc_smem, accr, PW, PB, block, tx):
        for step in steps_loop(steps):
            for u in T.unroll(unroll):
                if valid(step, u, tx):
                    for k in T.unroll(vector):
                        acc_store(acc_smem, accr, PW, PB, 0, block, step * unroll + u, tx, k, T.cast(0, ACCUM))
                        if accumulators > 1:
                            acc_store(acc_smem, accr, PW, PB, 1, block, step * unroll + u, tx, k, T.cast(0, ACCUM))

    @T.macro
    def flush_partials(acc_smem, accr, PW, PB, block, tx):
        """Copy the partial sums kept in shared memory or registers to the block's partials rows."""
        if sum(smem_slots) + sum(register_groups) > 0:
            for step in steps_loop(steps):
                for u in T.unroll(unroll):
                    if valid(step, u, tx):
                        for k in T.unroll(vector):
                            acc_flush(acc_smem, accr, PW, PB, 0, block, step * unroll + u, tx, k)
                            if accumulators > 1:
                                acc_flush(acc_smem, accr, PW, PB, 1, block, step * unroll + u, tx, k)

    @T.macro
    def load_all(G, X, W, gb, xb, wb, row, step, tx):
        walk["load_step"](G, gb, row, step, tx)
        walk["load_step"](X, xb, row, step, tx)
        if has_weight:
            walk["load_step_vector"](W, wb, step, tx)

    @T.macro
    def start_sums(X, first, st, row):
        if layer:
            # Sums of x - shift: the row's first element is close enough to the mean to
            # keep the variance from cancelling.  (A vector load: a scalar access at a row
            # start trips TileLang's pointer-type rewrite for N = 2**15.)
            for k in T.vectorized(vector):
                first[k] = X[row, k]
            st[4] = f32(first[0])
        for v in T.unroll(sums):
            st[v] = T.cast(0, ACCUM)

    @T.macro
    def add_sums(gb, xb, wb, st, step, tx):
        """Add one step of a row to its sums."""
        if layer:
            for u in T.unroll(unroll):
                if valid(step, u, tx):
                    one_pass["add_shifted"](gb, xb, wb, st, u * vector)
        else:
            one_pass["add_rms"](gb, xb, wb, st, unroll * vector)

    @T.macro
    def finish_sums(st, scratch, slot, tx):
        """Sum the row's terms over the block and leave the state ``_element_math`` reads."""
        row_sum(st, 0, scratch, slot, tx)
        one_pass["row_state"](st)

    @T.macro
    def reduce_row(G, X, W, gb, xb, wb, first, st, scratch, slot, row, tx):
        start_sums(X, first, st, row)
        for step in T.serial(steps):
            load_all(G, X, W, gb, xb, wb, row, step, tx)
            add_sums(gb, xb, wb, st, step, tx)
        finish_sums(st, scratch, slot, tx)

    @T.macro
    def load_added(R, rb, row, step, tx):
        if residual:
            walk["load_step"](R, rb, row, step, tx)

    @T.macro
    def write_step(DX, PW, PB, acc_smem, accr, gb, xb, wb, rb, st, row, step, block, tx, tmp):
        """Write one step of the row's gradient and add its terms to the partial sums."""
        for u in T.unroll(unroll):
            if valid(step, u, tx):
                if layer:
                    for k in T.vectorized(vector):
                        DX[row, column(step, u, tx) + k] = layer_grad(
                            gb[u * vector + k], xb[u * vector + k], wb[u * vector + k], st)
                else:
                    for k in T.vectorized(vector):
                        DX[row, column(step, u, tx) + k] = rms_grad(
                            gb[u * vector + k], xb[u * vector + k], wb[u * vector + k], st, added(rb, u * vector + k))
                g = step * unroll + u
                if layer:
                    acc_add_group(acc_smem, accr, PW, PB, 0, block, g, tx, layer_weight_term, gb, xb, st, u * vector, tmp)
                    acc_add_group(acc_smem, accr, PW, PB, 1, block, g, tx, bias_term, gb, xb, st, u * vector, tmp)
                else:
                    acc_add_group(acc_smem, accr, PW, PB, 0, block, g, tx, rms_weight_term, gb, xb, st, u * vector, tmp)

    @T.macro
    def write_row(G, X, W, R, DX, PW, PB, acc_smem, accr, gb, xb, wb, rb, st, row, block, tx, tmp):
        for back in steps_loop(steps):
            load_all(G, X, W, gb, xb, wb, row, steps - 1 - back, tx)
            load_added(R, rb, row, steps - 1 - back, tx)
            write_step(DX, PW, PB, acc_smem, accr, gb, xb, wb, rb, st, row, steps - 1 - back, block, tx, tmp)

    @T.macro
    def write_row_sum_next(G, X, W, R, DX, PW, PB, acc_smem, accr, gb, xb, wb, rb, gn, xn, first, st, sn, row,
                           next_row, block, tx, tmp):
        start_sums(X, first, sn, next_row)
        for step in steps_loop(steps):
            load_all(G, X, W, gb, xb, wb, row, step, tx)
            load_added(R, rb, row, step, tx)
            walk["load_step"](G, gn, next_row, step, tx)
            walk["load_step"](X, xn, next_row, step, tx)
            write_step(DX, PW, PB, acc_smem, accr, gb, xb, wb, rb, st, row, step, block, tx, tmp)
            add_sums(gn, xn, wb, sn, step, tx)

    @T.macro
    def body(G, X, W, DX, PW, PB, R):
        with T.Kernel(Q, threads=threads, prelude=widening_prelude(widen)) as block:
            T.pdl_trigger()  # the next launch may start early (see kernel_base)
            assume_aligned(vector)
            T.annotate_min_blocks_per_sm(blocks_per_sm)
            tx = T.get_thread_binding()
            gb = T.alloc_local((unroll * vector,), dtype)
            xb = T.alloc_local((unroll * vector,), dtype)
            wb = T.alloc_local((unroll * vector,), dtype)
            rb = T.alloc_local((unroll * vector if residual else 1,), dtype)
            first = T.alloc_local((vector,), dtype)
            tmp = T.alloc_local((vector,), ACCUM)
            st = T.alloc_local((ROW_STATE,), ACCUM)
            scratch = T.alloc_shared(scratch_shape(threads, sums), ACCUM)
            acc_smem = T.alloc_shared((max(sum(smem_slots), 1),), ACCUM)
            accr = T.alloc_local((max(sum(register_groups), 1) * vector,), ACCUM)
            reset_partials(acc_smem, accr, PW, PB, block, tx)
            if overlap:
                gn = T.alloc_local((unroll * vector,), dtype)
                xn = T.alloc_local((unroll * vector,), dtype)
                sn = T.alloc_local((ROW_STATE,), ACCUM)
                if block < M:  # the same for the whole block
                    reduce_row(G, X, W, gb, xb, wb, first, st, scratch, 0, block, tx)
                for it in T.serial(T.ceildiv(M, Q)):
                    if it * Q + block < M:
                        # After its last row the group sums that row again (L2 hits) and drops the sums.
                        write_row_sum_next(G, X, W, R, DX, PW, PB, acc_smem, accr, gb, xb, wb, rb, gn, xn, first, st,
                                           sn, it * Q + block, T.min(it * Q + block + Q, M - 1), block, tx, tmp)
                        finish_sums(sn, scratch, (it + 1) % 2, tx)
                        for v in T.unroll(8):
                            st[v] = sn[v]
            else:
                for it in T.serial(T.ceildiv(M, Q)):
                    if it * Q + block < M:
                        reduce_row(G, X, W, gb, xb, wb, first, st, scratch, it % 2, it * Q + block, tx)
                        write_row(G, X, W, R, DX, PW, PB, acc_smem, accr, gb, xb, wb, rb, st, it * Q + block, block,
                                  tx, tmp)
            flush_partials(acc_smem, accr, PW, PB, block, tx)

    return _signature_variants(T, M, Q, N, dtype, row_types, layer, has_weight, body, partial_dtype)


# ---- rows split over a cluster -------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterLayout:
    """A row split into ``ctas`` equal slices, one per block of a thread-block cluster; each
    block holds its slice in registers as a resident row of ``slice.N`` columns."""

    N: int
    ctas: int
    slice: RowLayout

    @property
    def threads(self) -> int:
        return self.slice.block_threads


def _cluster_bwd_program(N: int, dtype: str, eps: float, layout: ClusterLayout, layer: bool, has_weight: bool,
                         smem_slots: Tuple[int, ...], register_partials: bool, blocks_per_sm: int,
                         direct: bool = False, strided: bool = False, residual: bool = False,
                         staged: bool = False, early: bool = False, widen: bool = False) -> Any:
    """Rows too long for one block's registers, read once: a cluster of ``layout.ctas`` blocks
    (on as many SMs) takes each row, every block its slice of columns, and the blocks swap their
    slices' row sums through distributed shared memory.

    Cluster ``q`` walks rows ``q, q + Q, ...``; blocks of few threads load each row's slice
    while the one before is summed and written.  A block sums its slice, and one thread sends
    the sums from its registers to every block's exchange slots (by its rank) with asynchronous
    stores that count on the receiver's barrier; each block waits on its own barrier alone,
    then adds the slots in rank order: all blocks get the same row statistics, in a fixed
    order, and no block waits for the whole cluster.  The slots and barriers alternate between
    two sets row by row.  A block sends into a set again only after receiving every block's
    sums of the row in between, which each block sends only after reading the set.  LayerNorm sums
    ``x - x[row, 0]`` (as the streamed program does) so that one exchange gives both the mean
    and the variance.  A block keeps its slice's partial sums in registers
    (``register_partials``) or shared memory and writes them to row ``q`` of the partials
    buffer at the end.
    ``staged``: the next row's slices of ``grad_y`` and ``x`` are bulk-copied into shared memory
    (``bulk_copy``) while the block sums, exchanges and writes the current one, rather than held in
    registers (blocks of few threads) or loaded when the block reaches the row; the block's memory
    traffic then never waits on the exchange, and the registers stay free for a second block.
    ``early`` (staged only): thread 0 starts the next row's copies once every thread has read
    its share of the stage (each arrives on a ``consumed`` barrier that thread 0 waits on),
    rather than after the row sum's block barrier.
    ``direct``: see ``_partials_out``; ``residual``: see ``_added_gradient`` (read as the slice is written)."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    M = T.dynamic("M")
    Q = T.dynamic("Q")
    row_types, assume_aligned = _row_inputs(T, M, N, dtype, strided, residual)
    ctas, part = layout.ctas, layout.slice
    width, vector, threads = part.N, part.vector, part.row_threads
    full_vecs, has_tail, per_thread = part.full_vecs, part.has_tail, part.per_thread
    sums = 4 if layer else 2
    row_sum = row_sum_macro(T, threads, sums)
    accumulators = 2 if layer else 1
    partial_dtype, out = _partials_out(T, dtype, direct)
    register_groups = (part.vecs if register_partials else 0,) * accumulators
    acc_store, acc_add_group, _, slot = _accumulator_macros(T, smem_slots, width, vector, threads, register_groups,
                                                            out)
    element = _element_math(T, dtype, has_weight, 5, 6, widen)
    f32, rms_grad, widened_grad = element["f32"], element["rms_grad"], element["widened_grad"]
    # LayerNorm slices are widened once (see ``_one_pass_sums``): its terms read ``x - s``.
    weight_term = element["widened_weight_term"] if layer else element["rms_weight_term"]
    bias_term = element["bias_term"]
    one_pass = _one_pass_sums(T, element, layer, N, eps, vector)

    loads = resident_macros(T, part, M)  # loads of a slice: the row's columns from ``base`` on
    column = loads["column"]  # a column of the slice
    # Blocks of few threads hold the weight's slice and the next row's slices in registers; larger
    # ones reload the weight each row and load a row's slices when they reach it.  (At 1024
    # threads, 64 registers each, holding the next row spills: H100, bf16 8192x32768 over 2
    # blocks a row, LayerNorm 1032.3 us against 631.9, RMSNorm 587.5 against 566.3.)
    hold = threads <= CLUSTER_REGISTER_THREADS and not staged
    # Staged RMSNorm blocks keep the weight's slice in registers too (their write reads it anyway).
    # LayerNorm's is spent once ``g * w`` is taken, and holding it would spill; so would the fused
    # add's, whose write also reads the added gradient: two bf16 values a thread went to local memory
    # across the exchange, and reloading them cost more than reloading the weight (see "The norm
    # backwards' exchange from registers" in docs/performance.md).
    keep_weight = hold or (staged and not layer and not residual)
    if staged and (register_partials or threads <= WARP):
        # The row sum's block barrier is what orders every thread's reads of a stage before the
        # copy of the next row into it; staging frees registers for a second block an SM.
        raise ValueError(f"norm backward: cluster slices of {threads} threads a row "
                         f"{'with partial sums in registers ' if register_partials else ''}are not staged")
    itemsize = getattr(torch, dtype).itemsize
    stage_bytes, shift_bytes = width * itemsize, vector * itemsize
    # Column groups of a lane, unrolled so that each partial sum kept in registers is named.
    groups = functools.partial(T.unroll, explicit=True) if register_partials else T.unroll

    @T.macro
    def load_slice(G, X, gb, xb, first, row, base, tx):
        loads["load_row"](G, gb, row, tx, base)
        loads["load_row"](X, xb, row, tx, base)
        if layer:
            # The shift of the row's sums (a vector load: see the streamed program's ``start_sums``).
            for k in T.vectorized(vector):
                first[k] = X[T.min(row, M - 1), k]

    @T.macro
    def stage(G, X, staged_g, staged_x, staged_first, loaded, row, base, tx):
        """One thread starts the copies of row ``row``'s slices into the stage, and LayerNorm's of
        the row's first vector (its shift: no block then waits on a global load to start its sums).
        Rows past the last are never staged, so that no copy is left in flight at exit."""
        if tx == 0:
            if row < M:
                arrive_expecting(T, loaded[0], 2 * stage_bytes + (shift_bytes if layer else 0))
                bulk_load(T, staged_g[0], G[row, base], loaded[0], stage_bytes)
                bulk_load(T, staged_x[0], X[row, base], loaded[0], stage_bytes)
                if layer:
                    # The row's start, reached from the slice's (see ``bulk_load``).
                    bulk_load(T, staged_first[0], X[row, base], loaded[0], shift_bytes, -base * itemsize)

    @T.macro
    def unstage(staged_g, staged_x, staged_first, loaded, gb, xb, first, row, it, tx):
        """This lane's share of the staged slices, and the shift (zeros past the last row: their
        terms of the partial sums must be zeros, not products of a stale stage)."""
        if row < M:
            T.mbarrier_wait_parity(loaded[0], it % 2)
            loads["load_vector"](staged_g, gb, tx)
            loads["load_vector"](staged_x, xb, tx)
            if layer:
                for k in T.vectorized(vector):
                    first[k] = staged_first[k]
        else:
            loads["zero"](gb)
            loads["zero"](xb)
            if layer:
                for k in T.vectorized(vector):
                    first[k] = T.cast(0, dtype)

    @T.macro
    def slice_sums(gb, xb, wb, xs, gw, first, st, lane):
        """This block's share of the row sums (missing elements are zeros)."""
        for v in T.unroll(sums):
            st[v] = T.cast(0, ACCUM)
        if layer:
            st[4] = f32(first[0])
            one_pass["widen"](gb, xb, wb, xs, gw, st, per_thread)
            for j in T.unroll(full_vecs):
                one_pass["add_widened"](xs, gw, st, j * vector)
            if has_tail:
                if column(full_vecs, lane) < width:
                    one_pass["add_widened"](xs, gw, st, full_vecs * vector)
        else:
            one_pass["add_rms"](gb, xb, wb, st, per_thread)

    @T.macro
    def send_sums(st, swap, arrived, rank, it, tx):
        """This block's sums of row step ``it``, from thread 0's registers into every block's
        exchange slots of the step's set (``bulk_copy.send``).  A block sends into a set again only two
        steps on, after receiving every block's sums of the step in between, which each block sends
        only after its threads have read this step's slots (the row sum's barrier orders them)."""
        if tx == 0:
            for peer in T.unroll(ctas):
                send(T, swap[it % 2, rank, 0], arrived[it % 2], peer, [st[v] for v in range(sums)])

    @T.macro
    def receive(st, swap, arrived, it):
        """The row sums of all slices, added in rank order."""
        T.mbarrier_wait_parity(arrived[it % 2], (it // 2) % 2)
        for v in T.unroll(sums):
            st[v] = swap[it % 2, 0, v]
            for r in T.unroll(1, ctas):
                st[v] = st[v] + swap[it % 2, r, v]

    def added_at(R, row, col):
        """The added gradient (see ``_added_gradient``), read from memory as the slice is written."""
        return R[row, col] if residual else None

    @T.macro
    def write_group(DX, R, gb, xb, wb, xs, gw, st, acc_smem, accr, row, base, lane, j, tmp):
        """LayerNorm reads the widened ``xs`` and ``gw`` where RMSNorm reads ``xb`` and ``wb``."""
        if row < M:
            for k in T.vectorized(vector):
                if layer:
                    DX[row, base + column(j, lane) + k] = widened_grad(
                        gb[j * vector + k], xs[j * vector + k], gw[j * vector + k], st)
                else:
                    DX[row, base + column(j, lane) + k] = rms_grad(
                        gb[j * vector + k], xb[j * vector + k], wb[j * vector + k], st,
                        added_at(R, row, base + column(j, lane) + k))
        acc_add_group(acc_smem, accr, None, None, 0, 0, j, lane, weight_term, gb, xs if layer else xb, st,
                      j * vector, tmp)
        if layer:
            acc_add_group(acc_smem, accr, None, None, 1, 0, j, lane, bias_term, gb, xs, st, j * vector, tmp)

    @T.macro
    def write_slice(DX, R, gb, xb, wb, xs, gw, st, acc_smem, accr, row, base, lane, tmp):
        for j in groups(full_vecs):
            write_group(DX, R, gb, xb, wb, xs, gw, st, acc_smem, accr, row, base, lane, j, tmp)
        if has_tail:
            if column(full_vecs, lane) < width:
                write_group(DX, R, gb, xb, wb, xs, gw, st, acc_smem, accr, row, base, lane, full_vecs, tmp)

    @T.macro
    def flush_group(P, acc_smem, accr, index, q, base, lane, j, tmp):
        for k in T.unroll(vector):
            if register_partials:
                tmp[k] = accr[index * per_thread + j * vector + k]
            else:
                tmp[k] = acc_smem[slot(index, 0, j, lane, k)]
        for k in T.vectorized(vector):
            P[q, base + column(j, lane) + k] = out(tmp[k])

    @T.macro
    def flush(P, acc_smem, accr, index, q, base, lane, tmp):
        for j in groups(full_vecs):
            flush_group(P, acc_smem, accr, index, q, base, lane, j, tmp)
        if has_tail:
            if column(full_vecs, lane) < width:
                flush_group(P, acc_smem, accr, index, q, base, lane, full_vecs, tmp)

    @T.macro
    def reset_group(acc_smem, accr, lane, j):
        for k in T.unroll(vector):
            acc_store(acc_smem, accr, None, None, 0, 0, j, lane, k, T.cast(0, ACCUM))
            if accumulators > 1:
                acc_store(acc_smem, accr, None, None, 1, 0, j, lane, k, T.cast(0, ACCUM))

    @T.macro
    def body(G, X, W, DX, PW, PB, R):
        with T.Kernel(Q * ctas, threads=threads, cluster_dims=ctas,
                      prelude=widening_prelude(widen, CLUSTER_SEND_PRELUDE
                                               + (BULK_COPY_PRELUDE if staged else ""))) as bx:
            T.pdl_trigger()  # the next launch may start early (see kernel_base)
            assume_aligned(vector)
            T.annotate_min_blocks_per_sm(blocks_per_sm)
            tx = T.get_thread_binding()
            rank = T.block_rank_in_cluster()
            q = bx // ctas
            base = rank * width
            gb = T.alloc_local((per_thread,), dtype)
            xb = T.alloc_local((per_thread,), dtype)
            gn = T.alloc_local((per_thread,), dtype)
            xn = T.alloc_local((per_thread,), dtype)
            wb = T.alloc_local((per_thread,), dtype)
            xs = T.alloc_local((per_thread if layer else 1,), ACCUM)
            gw = T.alloc_local((per_thread if layer else 1,), ACCUM)
            first = T.alloc_local((vector,), dtype)
            fn = T.alloc_local((vector,), dtype)
            tmp = T.alloc_local((vector,), ACCUM)
            st = T.alloc_local((ROW_STATE,), ACCUM)
            accr = T.alloc_local((max(sum(register_groups), 1) * vector,), ACCUM)
            scratch = T.alloc_shared(scratch_shape(threads, sums), ACCUM)
            swap = T.alloc_shared((2, ctas, EXCHANGE_SLOTS), ACCUM)
            acc_smem = T.alloc_shared((max(sum(smem_slots), 1),), ACCUM)
            # Set up (with a cluster barrier) before any block sends: one arrival a block.
            arrived = T.alloc_cluster_barrier([ctas, ctas])
            staged_g = staged_x = staged_first = loaded = consumed = None
            if staged:
                staged_g = T.alloc_shared((width,), dtype)
                staged_x = T.alloc_shared((width,), dtype)
                staged_first = T.alloc_shared((vector,), dtype)
                loaded = T.alloc_barrier(1)
                if early:
                    consumed = T.alloc_barrier(threads)
            for j in groups(full_vecs):
                reset_group(acc_smem, accr, tx, j)
            if has_tail:
                if column(full_vecs, tx) < width:
                    reset_group(acc_smem, accr, tx, full_vecs)
            if has_weight and keep_weight:
                loads["load_vector"](W, wb, tx, base)
            if hold:
                load_slice(G, X, gb, xb, first, q, base, tx)
            if staged:
                stage(G, X, staged_g, staged_x, staged_first, loaded, q, base, tx)
            for it in T.serial(T.ceildiv(M, Q)):
                if has_weight and not keep_weight:
                    loads["load_vector"](W, wb, tx, base)
                if hold:
                    load_slice(G, X, gn, xn, fn, (it + 1) * Q + q, base, tx)
                elif staged:
                    unstage(staged_g, staged_x, staged_first, loaded, gb, xb, first, it * Q + q, it, tx)
                    if early:
                        # The copies overwrite what the generic proxy read: thread 0 waits for
                        # every thread's reads, then orders them before its bulk copies.
                        T.mbarrier_arrive(consumed[0])
                        if tx == 0:
                            T.mbarrier_wait_parity(consumed[0], it % 2)
                            T.fence_proxy_async()
                        stage(G, X, staged_g, staged_x, staged_first, loaded, (it + 1) * Q + q, base, tx)
                else:
                    load_slice(G, X, gb, xb, first, it * Q + q, base, tx)
                slice_sums(gb, xb, wb, xs, gw, first, st, tx)
                row_sum(st, 0, scratch, it % 2, tx)
                if staged and not early:  # every thread has its share of the stage: the next row may land
                    stage(G, X, staged_g, staged_x, staged_first, loaded, (it + 1) * Q + q, base, tx)
                send_sums(st, swap, arrived, rank, it, tx)
                receive(st, swap, arrived, it)
                one_pass["row_state"](st)
                write_slice(DX, R, gb, xb, wb, xs, gw, st, acc_smem, accr, it * Q + q, base, tx, tmp)
                if hold:
                    for i in T.unroll(per_thread):
                        gb[i] = gn[i]
                        xb[i] = xn[i]
                    if layer:
                        for k in T.unroll(vector):
                            first[k] = fn[k]
            flush(PW, acc_smem, accr, 0, q, base, tx, tmp)
            if layer:
                flush(PB, acc_smem, accr, 1, q, base, tx, tmp)
            # No block leaves while a copy it sent may still read its shared memory.
            T.cluster_sync()

    # Every block barrier the program needs is its own (the row sum's): each thread reads back only
    # the partial sums it wrote, and the stage and the exchange slots are ordered by mbarriers.
    # TileLang's barrier pass would add one a row before the writes, stalling all 32 warps.
    return _signature_variants(T, M, Q, N, dtype, row_types, layer, has_weight, body, partial_dtype).with_attr(
        "tilelang_pass_configs", {**PASS_CONFIGS, "tl.disable_thread_storage_sync": True})


def _signature_variants(T: Any, M: Any, Q: Any, N: int, dtype: str, row_types: Tuple[Any, ...], layer: bool,
                        has_weight: bool, body: Any, partial_dtype: str) -> Any:
    """The program whose signature takes the weight only when present, a bias partials buffer for
    LayerNorm, and the added gradient when there is one; ``row_types`` are the types of ``grad_y``,
    ``x`` and the added gradient (``_row_inputs``), the partials buffers are ``partial_dtype`` (see
    ``_partials_out``)."""
    GT, XT, RT = row_types
    if RT is not None:

        @T.prim_func
        def fused_add_rms_norm_bwd(G: GT, R: RT, X: XT, W: T.Tensor((N,), dtype),
                                   DX: T.Tensor((M, N), dtype), PW: T.Tensor((Q, N), partial_dtype)):
            body(G, X, W, DX, PW, None, R)

        return fused_add_rms_norm_bwd
    if not layer:

        @T.prim_func
        def rms_norm_bwd(G: GT, X: XT, W: T.Tensor((N,), dtype),
                         DX: T.Tensor((M, N), dtype), PW: T.Tensor((Q, N), partial_dtype)):
            body(G, X, W, DX, PW, None, None)

        return rms_norm_bwd
    if has_weight:

        @T.prim_func
        def layer_norm_bwd(G: GT, X: XT, W: T.Tensor((N,), dtype),
                           DX: T.Tensor((M, N), dtype), PW: T.Tensor((Q, N), partial_dtype),
                           PB: T.Tensor((Q, N), partial_dtype)):
            body(G, X, W, DX, PW, PB, None)

        return layer_norm_bwd

    @T.prim_func
    def layer_norm_bwd_plain(G: GT, X: XT, DX: T.Tensor((M, N), dtype),
                             PW: T.Tensor((Q, N), partial_dtype), PB: T.Tensor((Q, N), partial_dtype)):
        body(G, X, None, DX, PW, PB, None)

    return layer_norm_bwd_plain


# ---- kernel ---------------------------------------------------------------------------------------


class NormBwdKernel(RowNormKernel):
    """Shared host side of the RMSNorm and LayerNorm backward kernels (``layer`` picks the formula).

    ``forward(grad_y, x, weight, grad_x, grad_weight[, grad_bias])`` takes
    16-byte aligned ``(rows, N)`` row tensors (``grad_x`` contiguous; ``grad_y`` and
    ``x`` with unit-stride rows a multiple of ``row_vector(N)`` elements apart, which
    take the programs' ``strided`` variants unless both are contiguous) and ``(N,)``
    vectors on one GPU, and fills the preallocated gradients.
    """

    # "2": ``cluster_stage``; "3": cluster sums sent from registers, four row sums scattered over
    # lanes (configs tuned on "2" were timed on other programs); "4": ``cluster_stage_early``;
    # "5": ``widen_by_word``.
    version = "5"
    layer: bool = False
    # Per-column gradients summed over rows: the weight's, and the bias's for LayerNorm.
    accumulators: int = 1
    # RMSNorm of a fused residual add: ``grad_x`` adds the gradient of the returned sum (see
    # ``_added_gradient``), an input after ``grad_y``.
    residual: bool = False

    @property
    def default_config(self) -> Dict[str, Any]:
        config = norm_bwd_default_config(self.N, self.dtype, self.layer, has_fast_memory(), self.residual)
        return {**config, "widen_by_word": int(self.widening_pays(config))}

    def widening_pays(self, config: Dict[str, Any]) -> bool:
        """Whether bfloat16 rows under ``config`` widen by whole words (``widening``): everywhere but
        the fused add's resident rows and rows split over clusters that stage the next row early.

        Widening by word drops the ``PRMT`` and shift of every high half (RMSNorm's resident sm_90
        program: 544 -> 392 instructions, LayerNorm's 560 -> 504), and both passes over a row then
        share the widened values, which keeps more of them live: the fused add's resident program
        (a third row tensor) spills 24 bytes with it, RMSNorm's early-staging cluster blocks (64
        registers a thread) 32.  (H200, bf16, µs, by cast / by word: RMSNorm 32768 x 4096 205.9 /
        195.8, 8192 x 32768 396.5 / 506.0; LayerNorm 218.6 / 211.1, 473.4 / 457.8 (its
        cluster blocks spilling 16 bytes rather than 2; its few-row blocks of 8 a cluster, 1024 x
        32768, lose a little: 108.1 / 110.1, spilling 60 bytes rather than 36); the fused add 257.4 /
        277.2 (264.8 a block a row group), 528.8 / 523.7.)"""
        if self.dtype != torch.bfloat16:
            return False
        layout = self.layout(config)
        if isinstance(layout, RowLayout):
            return not self.residual
        many = config["many_rows_ctas"]
        split = self.split_layout(config, many) if many else None
        return not (split is not None and self.stages(split, config) and config["cluster_stage_early"])

    @property
    def autotune_configs(self) -> List[Dict[str, Any]]:
        vector_elems = max_vector(self.dtype)
        streams = tuple({"stream_threads": threads, "stream_unroll": unroll}
                        for threads, unroll in ((512, 2), (512, 4), (1024, 1), (1024, 4)))
        default = self.default_config
        if isinstance(self.layout(), StreamLayout):  # the other schedule of the default streamed layout
            streams += ({"stream_overlap": 1 - default["stream_overlap"]},)
        split = self.split_layout(default, default["many_rows_ctas"]) if default["many_rows_ctas"] else None
        if split is not None:
            # The tuning rows split over clusters: the streamed shapes compete only where taken, and
            # the clusters' blocks with and without staged rows, staged early and after the row sum.
            if self.stages(split, default):
                staging = ({"cluster_stage": 0}, {"cluster_stage_early": 1 - default["cluster_stage_early"]})
            else:
                staging = tuple({"cluster_stage": split.threads, "cluster_stage_early": early} for early in (0, 1))
            streams = ({"many_rows_ctas": 0},) + tuple({**stream, "many_rows_ctas": 0} for stream in streams) + staging
        # A block per row group, two groups a block, and the largest folding blocks: each layout once.
        layouts = {self.layout()}
        for threads in (0, FOLD_THREADS, MAX_THREADS):
            layout = self.layout({**default, "fold_threads": threads})
            if layout not in layouts:
                layouts.add(layout)
                streams += ({"fold_threads": threads},)
        if self.dtype == torch.bfloat16:
            streams += ({"widen_by_word": 1 - default["widen_by_word"]},)
        return self._autotune_candidates((vector_elems // 2, vector_elems, 2 * vector_elems), streams)

    def layout(self, config: Optional[Dict[str, Any]] = None) -> Any:
        """The resident layout when a row fits in registers under ``config``, else the streamed one.

        Short rows keep their partial sums in registers too; rows of up to 64
        bytes per thread and tensor (one row per block) keep them in memory.
        """
        if config is None:
            return self.cached("layout", lambda: self.layout(self.config))
        resident = resident_layout(self.N, self.dtype, config["per_thread"])
        if resident.per_thread <= resident_cap(self.dtype, self.layer):
            return resident
        if resident.per_thread * self.dtype.itemsize <= config["resident_row_bytes"] and resident.rows_per_block == 1:
            return self._folded(resident, config["fold_threads"])
        return stream_layout(self.N, self.dtype, config["stream_threads"], config["stream_unroll"])

    def split_layout(self, config: Optional[Dict[str, Any]] = None,
                     ctas: Optional[int] = None) -> Optional[ClusterLayout]:
        """The layout of streamed rows split over a cluster of ``ctas`` blocks (default: the
        ``cluster_ctas`` of calls of few rows), when the slices are whole vectors, fit a block's
        registers as resident rows, and their partial sums fit its shared memory (else None)."""
        if config is None:
            ctas = self.config["cluster_ctas"] if ctas is None else ctas
            return self.cached(f"split_layout:{ctas}", lambda: self.split_layout(self.config, ctas))
        if not isinstance(self.layout(config), StreamLayout):
            return None
        ctas = config["cluster_ctas"] if ctas is None else ctas
        vector = max_vector(self.dtype)
        if ctas < 2 or self.N % (ctas * vector):
            return None
        # A slice takes the width a resident row of its size would (the row's own is for streaming).
        width = self.N // ctas
        part = resident_layout(width, self.dtype, norm_bwd_default_config(width, self.dtype)["per_thread"], vector)
        if part.rows_per_block != 1 or part.per_thread * self.dtype.itemsize > config["resident_row_bytes"]:
            return None
        if self.accumulators * 4 * part.row_threads * part.per_thread > SMEM_ACC_BUDGET:
            return None
        return ClusterLayout(self.N, ctas, part)

    def _folded(self, layout: RowLayout, fold_threads: int) -> RowLayout:
        """``layout`` with as many row groups a block as ``fold_threads`` and the shared-memory
        budget allow, when every group's partial sums fit there whole (else unchanged)."""
        slots = self.smem_slots(layout)
        if any(held < self.N for held in slots):
            return layout
        groups = min(fold_threads // layout.row_threads, SMEM_ACC_BUDGET // (4 * sum(slots)))
        if groups < 2:
            return layout
        return RowLayout(layout.N, layout.vector, layout.row_threads, groups * layout.row_threads)

    def folds(self, layout: Any) -> bool:
        """Whether the row groups of a block (one or more) keep all their partial sums in shared
        memory and add them up into one partials row, written as whole vectors."""
        return (isinstance(layout, RowLayout) and not self.partials_in_registers(layout)
                and all(held >= self.N for held in self.smem_slots(layout)))

    def partials_in_registers(self, layout: Any, config: Optional[Dict[str, Any]] = None) -> bool:
        """Short resident rows, and cluster slices of few elements a thread in blocks of at most
        ``CLUSTER_REGISTER_THREADS`` threads that do not stage their rows under ``config`` (default:
        the current one; see ``blocks_per_sm``)."""
        if isinstance(layout, ClusterLayout):
            return (layout.slice.per_thread * self.accumulators <= MAX_REGISTER_PARTIALS
                    and layout.threads <= CLUSTER_REGISTER_THREADS and not self.stages(layout, config))
        return isinstance(layout, RowLayout) and layout.per_thread <= resident_cap(self.dtype, self.layer)

    def stages(self, layout: Any, config: Optional[Dict[str, Any]] = None) -> bool:
        """Whether the cluster program over ``layout`` stages the next row's slices in shared memory:
        blocks of ``cluster_stage`` threads or more, where both slices fit next to the whole slice's
        partial sums."""
        config = self.config if config is None else config
        if not isinstance(layout, ClusterLayout) or not 0 < config["cluster_stage"] <= layout.threads:
            return False
        partials = self.accumulators * 4 * layout.slice.row_threads * layout.slice.per_thread
        return partials + self.stage_bytes(layout) <= SMEM_ACC_BUDGET

    def stage_bytes(self, layout: ClusterLayout) -> int:
        """Shared memory of a staged row: its slices of ``grad_y`` and ``x``."""
        return 2 * layout.slice.N * self.dtype.itemsize

    def smem_slots(self, layout: Any, config: Optional[Dict[str, Any]] = None) -> Tuple[int, ...]:
        """Shared-memory slots of each partial sum (see ``_accumulator_macros``), in whole column
        groups: the weight's first, then the bias's, as many as the budget holds (the rest live in
        registers or the partials buffer).  A cluster's block holds its slice's, all of them (unless
        they live in registers under ``config``, default the current one)."""
        if self.partials_in_registers(layout, config):
            return (0,) * self.accumulators
        if isinstance(layout, ClusterLayout):
            return (layout.slice.row_threads * layout.slice.per_thread,) * self.accumulators
        group = group_columns(layout)
        every_column = -(-self.N // group) * group
        room = SMEM_ACC_BUDGET // 4
        slots = []
        for _ in range(self.accumulators):
            held = every_column if every_column <= room else room // group * group
            slots.append(held)
            room -= held
        return tuple(slots)

    def register_groups(self, layout: Any) -> Tuple[int, ...]:
        """Column groups of each partial sum a streamed thread keeps in registers: those past the
        shared-memory ones, when they are few enough (else they live in the partials buffer)."""
        none = (0,) * self.accumulators
        if not isinstance(layout, StreamLayout) or layout.steps > MAX_UNROLLED_STEPS:
            return none
        group = group_columns(layout)
        groups = layout.steps * layout.unroll
        spilled = tuple(0 if slots >= self.N else groups - slots // group for slots in self.smem_slots(layout))
        return spilled if 0 < sum(spilled) * layout.vector <= MAX_REGISTER_PARTIALS else none

    def partials_on_chip(self, layout: Any) -> bool:
        """Whether every partial sum stays in registers or shared memory until the end (none in the
        partials buffer), so that a launch of one row group can write the gradients directly."""
        if self.partials_in_registers(layout) or isinstance(layout, ClusterLayout):
            return True
        registers = self.register_groups(layout) if isinstance(layout, StreamLayout) else (0,) * self.accumulators
        return all(slots >= self.N or groups > 0 for slots, groups in zip(self.smem_slots(layout), registers))

    def main_program(self) -> str:
        return self.cached("program", lambda: RESIDENT if isinstance(self.layout(), RowLayout) else STREAMED)

    def split_ctas(self, rows: int) -> int:
        """The blocks each row of a call over ``rows`` streamed rows splits over (0: none): few
        rows, which the streamed program would give one block each, the rest of the GPU idle,
        split over ``cluster_ctas``; more, over ``many_rows_ctas``.  Only where ``split_layout``
        allows it."""
        config = self.config
        ctas = config["cluster_ctas"] if rows <= config["cluster_rows"] else config["many_rows_ctas"]
        return ctas if ctas and self.split_layout(ctas=ctas) is not None else 0

    def build_program(self, name: str, config: Dict[str, Any], *, has_weight: bool = True,
                      direct: bool = False, ctas: Optional[int] = None, strided: bool = False) -> Any:
        """Program ``name``; ``strided``: ``grad_y`` and ``x`` rows at any stride (``strided_rows``),
        else contiguous (the persistent row walks pay a few percent for a symbolic stride)."""
        dtype = torch_dtype_to_tl(self.dtype)
        if name == COLUMN_SUM:
            return column_sum_program(self.N, dtype, self.accumulators)
        if name == CLUSTER:
            split = self.split_layout(config, ctas)
            staged = self.stages(split, config)
            return _cluster_bwd_program(self.N, dtype, self.eps, split, self.layer, has_weight,
                                        self.smem_slots(split, config), self.partials_in_registers(split, config),
                                        self.blocks_per_sm(split, config), direct, strided, self.residual,
                                        staged, staged and bool(config["cluster_stage_early"]),
                                        self.widens(config, direct))
        layout = self._direct_layout(config) if direct else self.layout(config)
        if isinstance(layout, RowLayout):
            smem = None if self.partials_in_registers(layout) else self.smem_slots(layout)
            return _resident_bwd_program(self.N, dtype, self.eps, layout, self.layer, has_weight, smem,
                                         self.blocks_per_sm(layout, config), direct, self.folds(layout), strided,
                                         self.residual, self.widens(config, direct))
        return _streamed_bwd_program(self.N, dtype, self.eps, layout, self.layer, has_weight,
                                     self.smem_slots(layout), self.register_groups(layout),
                                     self.blocks_per_sm(layout, config), bool(config["stream_overlap"]), direct,
                                     strided, self.residual, self.widens(config, direct))

    def widens(self, config: Dict[str, Any], direct: bool = False) -> bool:
        """Whether the programs under ``config`` widen bfloat16 by whole words (``widen_by_word``);
        never a single row's one launch (``direct``), whose time is latency rather than instructions,
        and whose LayerNorm program then lost its vector stores of the weight's and bias's gradients
        (an extern call in a vectorized loop scalarizes it: over rows of 4096, 8 ``STG.E.64`` a
        thread became 32 ``STG.E.U16``; H200, one row, 5.66 µs by cast against 7.62 widened)."""
        return self.dtype == torch.bfloat16 and bool(config["widen_by_word"]) and not direct

    def program_keys(self) -> List[Tuple[str, Tuple[Tuple[str, Any], ...]]]:
        """The programs contiguous calls launch (strided ones take the ``strided`` variants on demand)."""
        rows, plain = (("direct", False), ("has_weight", True), ("strided", False)), ("strided", False)
        keys = [(self.main_program(), rows), (COLUMN_SUM, ())]
        if self.writes_directly(1):
            keys.append((self.main_program(), (("direct", True), ("has_weight", True), plain)))
        few, many = self.config["cluster_ctas"], self.config["many_rows_ctas"]
        if self.split_layout(ctas=few) is not None:  # a single row of them is one launch
            keys += [(CLUSTER, (("ctas", few), ("direct", direct), ("has_weight", True), plain))
                     for direct in (False, True)]
        if many != few and many and self.split_layout(ctas=many) is not None:
            keys.append((CLUSTER, (("ctas", many), ("direct", False), ("has_weight", True), plain)))
        return keys

    def writes_directly(self, rows: int) -> bool:
        """Whether a call over ``rows`` rows is one launch: a single row (one row group, see
        ``partial_rows``) whose partial sums never leave the chip writes the gradients itself.

        (H100, bf16 1x4096: the row launch and the column sum took 10.4 us for RMSNorm and
        14.8 for LayerNorm, the one launch 6.5 and 8.3; torch.compile's fused kernel 5.1 and 5.8.
        A resident row's launch then writes its terms as the gradients, with no partial sums in
        shared memory: 5.73 -> 5.54 and 6.88 -> 6.37.)"""
        return rows == 1 and self.cached("single_row_direct", self._single_row_direct)

    def _single_row_direct(self) -> bool:
        layout = self._direct_layout(self.config)
        one_row_a_block = not isinstance(layout, RowLayout) or layout.rows_per_block == 1
        return one_row_a_block and self.partials_on_chip(layout)

    def _direct_layout(self, config: Dict[str, Any]) -> Any:
        """The layout of a single row's one launch: a block of one row group where calls of many rows
        fold several into a block, which a single row would leave idle.  (H100, bf16 1x4096, µs
        folded / one group: RMSNorm 5.44 / 5.31, LayerNorm 6.30 / 5.95.)"""
        layout = self.layout(config)
        if isinstance(layout, RowLayout) and self.folds(layout) and layout.rows_per_block > 1:
            return self.layout({**config, "fold_threads": 0})
        return layout

    def blocks_per_sm(self, layout: Any, config: Optional[Dict[str, Any]] = None) -> int:
        """Blocks of the row program that run on an SM at once (shared memory and the config's cap);
        without ``config``, under the current one."""
        if config is None:
            return self.cached(("blocks_per_sm", layout), lambda: self.blocks_per_sm(layout, self.config))
        threads = layout.block_threads if isinstance(layout, RowLayout) else layout.threads
        smem = 4 * sum(self.smem_slots(layout, config)) * (layout.rows_per_block if self.folds(layout) else 1)
        if self.stages(layout, config):
            smem += self.stage_bytes(layout)
        fit = min(THREADS_PER_SM // threads, SMEM_PER_SM // smem if smem else THREADS_PER_SM)
        sm_threads = config["sm_threads"]
        if isinstance(layout, ClusterLayout) and self.partials_in_registers(layout, config):
            sm_threads = min(sm_threads, CLUSTER_REGISTER_THREADS)
        return max(1, min(fit, sm_threads // threads))

    def partial_rows(self, rows: int, device: torch.device, layout: Any = None) -> int:
        """Row groups of one launch over ``rows`` rows: at most as many as run at once, and no
        more than the fewest that still give each group the same number of row steps.

        Group ``q`` takes rows ``q, q + Q, q + 2Q, ...``.  With every slot filled, 16384
        rows over 528 groups leave 16 groups a 32nd step that the other 512 wait for;
        512 groups take 32 rows each and finish together (H100, bf16 16384x4096
        LayerNorm backward: 167.2 us against 176.9, and a smaller partials buffer).
        """
        layout = self.layout() if layout is None else layout
        rows_per_block = layout.rows_per_block if isinstance(layout, RowLayout) else 1
        slots = self.blocks_per_sm(layout) * self.sm_count(device) * rows_per_block
        if isinstance(layout, ClusterLayout):  # a cluster of blocks takes a row
            slots = max(1, slots // layout.ctas)
        steps = -(-rows // slots)
        blocks = -(-(-(-rows // steps)) // rows_per_block)
        return blocks * rows_per_block

    def buffer_rows(self, rows: int, device: torch.device) -> int:
        """Rows of the partials buffer of a launch over ``rows`` rows: one per row group, or
        one per block when the block's groups fold their sums together."""
        groups = self.partial_rows(rows, device)
        folds = self.cached("folds", lambda: self.folds(self.layout()))
        return groups // self.layout().rows_per_block if folds else groups

    def tuning_inputs(self, rows: Optional[int] = None) -> Tuple[torch.Tensor, ...]:
        rows = self.tuning_rows if rows is None else rows
        row_inputs = (torch.randn(rows, self.N, device="cuda", dtype=self.dtype)
                      for _ in range(3 if self.residual else 2))
        weight = torch.randn(self.N, device="cuda", dtype=self.dtype)
        grads = [torch.empty(self.N, device="cuda", dtype=self.dtype) for _ in range(self.accumulators)]
        return (*row_inputs, weight, torch.empty(rows, self.N, device="cuda", dtype=self.dtype), *grads)

    def forward(self, grad_y: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], grad_x: torch.Tensor,
                grad_weight: torch.Tensor, grad_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Fill ``grad_x``, ``grad_weight`` (and ``grad_bias``); return ``grad_x``."""
        return self._launch_rows((grad_y, x), weight, grad_x, [grad_weight] + ([grad_bias] if self.layer else []))

    def _launch_rows(self, row_inputs: Tuple[torch.Tensor, ...], weight: Optional[torch.Tensor],
                     grad_x: torch.Tensor, grads: List[torch.Tensor]) -> torch.Tensor:
        """The launches over ``row_inputs`` (``grad_y``, the added gradient when there is one, and
        ``x``, as the programs take them) that fill ``grad_x`` and ``grads``."""
        x = row_inputs[-1]
        rows = x.shape[0]
        if rows == 0:
            for grad in grads:
                grad.zero_()
            return grad_x
        affine = [] if weight is None else [weight]
        strided = any(tensor.stride(0) != self.N for tensor in row_inputs)
        ctas = self.split_ctas(rows)
        if ctas:
            return self._split_rows(ctas, row_inputs, affine, grad_x, grads, strided)
        if self.writes_directly(rows):
            launch = self.launcher(self.main_program(), (("direct", True), ("has_weight", weight is not None),
                                                         ("strided", strided)))
            launch(*row_inputs, *affine, grad_x, *(grad.view(1, self.N) for grad in grads))
            return grad_x
        slices = [(0, rows)] if rows <= MAX_EXTENT else list(row_slices(rows))
        groups = [self.buffer_rows(stop - start, x.device) for start, stop in slices]
        partials = torch.empty((self.accumulators, sum(groups), self.N), dtype=torch.float32, device=x.device)
        launch = self.launcher(self.main_program(), (("direct", False), ("has_weight", weight is not None),
                                                     ("strided", strided)))
        if len(slices) == 1:  # the usual case: no slicing on the host path
            launch(*row_inputs, *affine, grad_x, *(partials[a] for a in range(self.accumulators)))
        else:
            first = 0
            for (start, stop), count in zip(slices, groups):
                launch(*(tensor[start:stop] for tensor in row_inputs), *affine, grad_x[start:stop],
                       *(partials[a, first:first + count] for a in range(self.accumulators)))
                first += count
        self.launcher(COLUMN_SUM)(partials, *grads)
        return grad_x

    def _split_rows(self, ctas: int, row_inputs: Tuple[torch.Tensor, ...], affine: List[torch.Tensor],
                    grad_x: torch.Tensor, grads: List[torch.Tensor], strided: bool) -> torch.Tensor:
        """The cluster program over clusters of ``ctas`` blocks: one launch for a single row, else
        a partials row per cluster and the column sum."""
        has_weight = bool(affine)
        x = row_inputs[-1]
        if x.shape[0] == 1:
            launch = self.launcher(CLUSTER, (("ctas", ctas), ("direct", True), ("has_weight", has_weight),
                                             ("strided", strided)))
            launch(*row_inputs, *affine, grad_x, *(grad.view(1, self.N) for grad in grads))
            return grad_x
        groups = self.partial_rows(x.shape[0], x.device, self.split_layout(ctas=ctas))
        partials = torch.empty((self.accumulators, groups, self.N), dtype=torch.float32, device=x.device)
        launch = self.launcher(CLUSTER, (("ctas", ctas), ("direct", False), ("has_weight", has_weight),
                                         ("strided", strided)))
        launch(*row_inputs, *affine, grad_x, *(partials[a] for a in range(self.accumulators)))
        self.launcher(COLUMN_SUM)(partials, *grads)
        return grad_x
