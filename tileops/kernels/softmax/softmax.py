"""Softmax and log-softmax along one axis of length ``N``, forward and backward.

Every program reduces along the axis in float32 whatever the input dtype, then
applies an elementwise formula that uses the reduced values:

=================  ============================  ======================================
kernel             reduction per slice           output
=================  ============================  ======================================
softmax fwd        ``M = max x``, ``S = sum e``  ``exp(x - M) / S``
log-softmax fwd    ``M = max x``, ``S = sum e``  ``x - M - log S``
softmax bwd        ``D = sum(g * y)``            ``y * (g - D)``
log-softmax bwd    ``G = sum g``                 ``g - exp(y) * G``
=================  ============================  ======================================

(``e = exp(x - M)``.)  Inputs are seen as ``(rows, N)`` when the axis is the
innermost one, else as ``(outer, N, inner)``; both may be strided views (a
row stride, or outer and axis strides) as long as the innermost extent has
unit stride, so slices of a larger tensor need no copy.  Outputs are
contiguous.  ``N`` is fixed at construction; rows, outer, inner, the strides
and the number of segments are TileLang symbolic values, so the programs of
one kernel serve every input shape.  Global offsets are 64-bit.

Programs:

* **row fused** (rows that fit in registers: up to 48K half-precision or
  32K float32 elements for the forward, 32K and 16K for the backward): a row
  is read once into registers by ``row_threads`` threads, reduced with warp
  shuffles and shared memory, and written once.  Short rows share a block.
* **row staged** (forward rows of a whole block, where the config asks for it: devices with
  fast memory): the fused program's rows, taken in turn by a wave of resident blocks that
  copy their next rows into shared memory while they reduce and write the current one.
* **row cluster** (rows up to ``max_cluster`` blocks' registers long, enough
  of them to give every SM a block): a cluster of blocks holds a row in registers;
  each block reduces its share, the blocks exchange their partial results
  through distributed shared memory (sm_90 thread block clusters), and
  each writes its share.  One read, one write, as the fused program.
* **row cluster staged** (forward rows two 1024-thread blocks hold, on devices with fast
  memory, where the rows give each cluster of a resident wave at least two): the row cluster
  program's rows taken in turn by a wave of clusters, each block copying its share of the next
  rows into shared memory while the cluster reduces and writes the current one.
* **windowed rows** (fused or row cluster rows that no 16-byte access can start: ``N`` not a
  multiple of one, as GPT-2's 50257 or a row of 127): the same programs read and write the
  rows in aligned 16-byte windows of the flat tensor (``tileops.kernels.windows``), where
  every tensor's rows start as far into their windows and the windows fit the threads'
  registers; else such rows take accesses of as many elements as divide ``N``.
* **row held** (forward rows too long for one block, too few for row clusters, that a wave of
  blocks holds: up to ``held_threads`` blocks of ``held_threads`` threads, ``held_elements``
  elements a thread): a row is held in the registers of several blocks, which exchange their
  partial results through status words in global memory (``tileops.kernels.exchange``) and each
  write their share: one read, one write, one launch.
* **row stats + row apply** (longer or fewer rows): a row is cut into ``S`` segments,
  one block each.  The first program writes each segment's partial
  reduction (for the forward, a running max and a sum of exponentials
  rescaled on the fly, i.e. online softmax); the second combines the ``S``
  partials of its row and re-reads its segment to write the output.
* **column fused** (``inner > 1``, whole columns enough to fill the GPU):
  a block owns ``tile`` neighbouring columns over the whole axis, reduces
  them, merges its threads' states and writes the output, reading its
  columns a second time from L2 (or not at all, when one step of the block
  covers the axis).  Where that gives too few blocks, a cluster of blocks
  owns the columns, each over a segment of the axis, and the blocks
  exchange their merged states through distributed shared memory.
* **column stats + column apply** (other ``inner > 1``): the same two steps
  as for long rows with the axis split into ``S`` segments.

In every column program ``col_threads`` threads cover ``col_threads * cvec``
neighbouring inner positions (16-byte accesses when alignment allows) and the
rest of the block walks the axis.

A slice whose maximum is ``-inf`` (all ``-inf``) gives NaN, as PyTorch does.
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from tileops.kernels.cache_hints import (
    CACHE_HINT_PRELUDE,
    EVICT_FIRST,
    EVICT_LAST,
    HINTED_MIN_MIB,
    hinted_min_bytes,
    takes_hint,
    vector_load,
)
from tileops.kernels.device_traits import has_fast_memory
from tileops.kernels.exchange import BACKOFF_NS, CONTROL_WORDS, SIDE, ExchangeWorkspaces, exchange_macros
from tileops.kernels.fast_math import FAST_EXP2_PRELUDE, fast_exp2
from tileops.kernels.kernel_base import (
    SM90_BUILD_TARGET,
    Kernel,
    column_placement,
    strided_rows,
    torch_dtype_to_tl,
)
from tileops.kernels.launch import access_alignment, direct_launcher, widest_access
from tileops.kernels.sizes import (
    ACCUM,
    MAX_THREADS,
    MIN_BLOCK_THREADS,
    SECTOR_BYTES,
    WARP,
    check_kernel_args,
    check_out_dtype,
    is_pow2,
    largest_pow2_divisor,
    max_vector,
    next_pow2,
    prev_pow2,
    row_vector,
)
from tileops.kernels.widening import (
    BF16_PAIR_MAX_PRELUDE,
    float32_of,
    larger_of_pair,
    pair_max,
    pair_max_init,
    widening_prelude,
)
from tileops.kernels.windows import window_count, window_macros

__all__ = [
    "SoftmaxFwdKernel",
    "SoftmaxBwdKernel",
    "SoftmaxVariant",
    "SoftmaxFamilyKernel",
    "softmax_default_config",
    "softmax_autotune_configs",
    "build_program",
    "ROW_FUSED",
    "ROW_STAGED",
    "ROW_STATS",
    "ROW_APPLY",
    "ROW_CLUSTER",
    "ROW_CLUSTER_STAGED",
    "ROW_HELD",
    "COLUMN_STATS",
    "COLUMN_APPLY",
    "COLUMN_FUSED",
]


# Input bytes a thread of the fused program keeps in registers (32 registers):
# with 1024 threads a block may use at most 64 registers per thread.
FUSED_REGISTER_BYTES = 128
# Elements a thread of the fused program holds at most: the half-precision forward spilled
# past 48 (sm_90 ptxas: 72 bytes at 48, 212 at 56, 516 at 64; on an H100, 1024 x 65536
# bf16 rows at 64 a thread took 208.7 us, in clusters of two blocks 112.5).
FUSED_MAX_ELEMENTS = 48
# float32 exponentials a thread of the fused softmax forward may keep in registers.
CACHED_EXP_ELEMENTS = 32
# Shared memory a block of the row staged program may take for its rows in flight (an sm_90
# block may have 227 KiB; the reduction scratch takes a little more).
STAGED_MAX_BYTES = 192 * 1024
# Blocks per SM the two-step programs aim for when sizing their segments.
BLOCKS_PER_SM = 4
# Threads of the row held program's blocks and the blocks an SM must fit: 1024 threads, 64
# registers each (see ``softmax_default_config``).
HELD_THREADS, HELD_MIN_BLOCKS = 256, 4
# Blocks a row cluster may have: the largest cluster every sm_90 GPU launches.
MAX_CLUSTER = 8
# Threads of a row cluster's blocks and the blocks an SM must fit (launch bounds), forward and
# backward (see ``softmax_default_config``).
FORWARD_CLUSTER_THREADS, FORWARD_CLUSTER_MIN_BLOCKS = 512, 2
BACKWARD_CLUSTER_THREADS, BACKWARD_CLUSTER_MIN_BLOCKS = 1024, 1
# Row cluster layouts, (threads, blocks an SM), narrowest first: every one runs 1024 threads an SM.
# On fast memory the backward takes the narrowest whose cluster holds a row (``backward_cluster_layout``).
CLUSTER_LAYOUTS = ((256, 4), (512, 2), (1024, 1))
# Row clusters serve rows too long for one block's registers when the rows' clusters give every SM
# at least as many threads as one block of the widest default layout (the backward's or the
# forward's); fewer rows take the two-step programs, which split a row finer.
CLUSTER_MIN_THREADS_PER_SM = {True: BACKWARD_CLUSTER_THREADS, False: FORWARD_CLUSTER_THREADS}
# The row cluster staged program: clusters of two 1024-thread blocks, one an SM, a wave of 66 on
# 132 SMs.  Four-block clusters, a wave of 33, lost by far (H200, softmax 256 x 131072 bf16 75.1
# us against 51.2 for one row a cluster), as if some clusters ran after the rest: a cluster's
# blocks must share a GPC, and GPCs need not have a multiple of four SMs.  It serves calls of at
# least this many rows a cluster of the wave (fewer leave no next row to stage).
STAGED_CLUSTER = 2
STAGED_CLUSTER_MIN_TURNS = 2
# Windows a thread of a fused forward row holds at least, where rows are read in windows
# (``_windowed_row_config``); shorter rows read their elements one at a time.
WINDOWED_ROW_WINDOWS = 4
# Elements a thread of a short row read one element at a time holds, forward and backward.
ONE_ELEMENT_ROW_ELEMENTS = {False: 8, True: 4}
# 16-byte vectors of each input a fused column thread has in flight, on fast memory
# (``device_traits``) and elsewhere (see ``softmax_default_config``).
FUSED_COLUMN_UNROLL = {True: 8, False: 4}
# The forward's fused column calls whose input takes at most this many MiB load it with L2's
# ``evict_last`` on fast memory (``column_hinted_max_mib``): its second walk then reads from L2.
COLUMN_HINTED_MAX_MIB = 32
# Column tiles span at most this many threads across the inner extent.
MAX_COL_THREADS = 32
LOG2E = 1.4426950408889634

# Fused column blocks (whole columns, no partials; see ``fused_column_params``): at most
# this many bytes of each input a block, this many threads across the inner extent, and
# at least one block for every this many SMs.
FUSED_COLUMN_BYTES = 512 * 1024
FUSED_COLUMN_MAX_COL_THREADS = 8
FUSED_COLUMN_SMS_PER_BLOCK = 4
# Blocks a fused column cluster takes beyond what its bytes need, to give the GPU more blocks.
COLUMN_CLUSTER_SPREAD = 4
# SMs assumed when planning launches for tensors that are not on a GPU (an H100's).
PLANNING_SM_COUNT = 132

# A program's shape parameters besides the config: ((name, value), ...), e.g.
# (("vector", 8),) for row programs or (("col_threads", 8), ("cvec", 8)) for columns.
ProgramParams = Tuple[Tuple[str, int], ...]

ROW_FUSED = "row_fused"
ROW_STAGED = "row_staged"
ROW_STATS = "row_stats"
ROW_APPLY = "row_apply"
ROW_CLUSTER = "row_cluster"
ROW_CLUSTER_STAGED = "row_cluster_staged"
ROW_HELD = "row_held"
COLUMN_STATS = "column_stats"
COLUMN_APPLY = "column_apply"
COLUMN_FUSED = "column_fused"
PROGRAMS = (ROW_FUSED, ROW_STAGED, ROW_STATS, ROW_APPLY, ROW_CLUSTER, ROW_CLUSTER_STAGED, ROW_HELD, COLUMN_STATS,
            COLUMN_APPLY, COLUMN_FUSED)


@dataclass(frozen=True)
class SoftmaxVariant:
    """Which member of the family a kernel computes."""

    backward: bool
    log: bool

    @property
    def inputs(self) -> int:
        """Tensor inputs of the kernel: ``x``, or ``grad_y`` and ``y``."""
        return 2 if self.backward else 1

    @property
    def partials(self) -> int:
        """float32 values a segment's partial reduction holds (forward: max and sum)."""
        return 1 if self.backward else 2

    @property
    def name(self) -> str:
        return ("log_softmax" if self.log else "softmax") + ("_bwd" if self.backward else "_fwd")


# ---- sizes and configs ------------------------------------------------------------------------


def fused_elements_cap(dtype: torch.dtype, backward: bool) -> int:
    """Row elements one thread may hold in registers in the fused program."""
    return min(FUSED_REGISTER_BYTES // (dtype.itemsize * (2 if backward else 1)), FUSED_MAX_ELEMENTS)


def _fused_row_config(N: int, per_thread: int, cap: int) -> Dict[str, int]:
    """Threads of a fused row (a power of two, at most 1024).

    Rows that share a block (at most ``MIN_BLOCK_THREADS`` threads at ``per_thread`` elements
    or fewer each) take the fewest threads that hold no more than that.  Longer rows take the
    most threads whose every thread holds at least ``per_thread`` elements (at least
    ``MIN_BLOCK_THREADS``), doubled while a thread would hold more than ``cap``: rounding the
    count up there leaves most threads of a row just past a power of two holding less, and an
    SM with fewer bytes in flight.  Short rows went the other way (see ``softmax_default_config``)."""
    fewest = min(MAX_THREADS, next_pow2(-(-N // per_thread)))
    if fewest <= MIN_BLOCK_THREADS:
        row_threads = fewest
    else:
        row_threads = min(MAX_THREADS, max(MIN_BLOCK_THREADS, prev_pow2(N // per_thread)))
        while row_threads < MAX_THREADS and -(-N // row_threads) > cap:
            row_threads *= 2
    return {"row_threads": row_threads, "block_threads": max(row_threads, MIN_BLOCK_THREADS)}


def _windowed_row_config(N: int, dtype: torch.dtype, cap: int) -> Optional[Dict[str, int]]:
    """Threads of a fused forward row read in 16-byte windows, or None where the row is too short
    for windows to pay: each thread takes at least ``WINDOWED_ROW_WINDOWS`` windows, in blocks of
    at least ``MIN_BLOCK_THREADS`` threads, doubled while it would hold more than ``cap`` elements."""
    vector = max_vector(dtype)
    windows = window_count(N, vector)
    threads = min(MAX_THREADS, prev_pow2(max(1, windows // WINDOWED_ROW_WINDOWS)))
    while -(-windows // threads) * vector > cap:
        if threads == MAX_THREADS:
            return None
        threads *= 2
    if threads < MIN_BLOCK_THREADS:
        return None
    return {"row_threads": threads, "block_threads": threads}


def softmax_default_config(N: int, dtype: torch.dtype, backward: bool = False,
                           fast_memory: bool = False, log: bool = False) -> Dict[str, int]:
    """Heuristic config for axis length ``N`` and ``dtype``.

    ``row_stages`` (forward rows of 16-byte accesses that take the fused program with
    ``row_threads == block_threads``): rows each block copies into shared memory ahead of the
    one it reduces (the row staged program; 0: none, rows take the fused program).  With
    ``fast_memory`` (``device_traits``), rows that take a whole 1024-thread block, which runs
    alone on its SM, are staged one row ahead (``log``: two), so the next row's loads overlap
    this row's math and stores.  (H200, bf16, median of 7 rounds in turns, µs, fused / one row
    ahead / two / torch.compile: softmax 8192 x 32768 330.5 / 274.7 / 281.0 / 542.2, 16384 x
    16384 454.1 / 307.3 / - / 567.7; log-softmax 8192 x 32768 340.5 / 283.0 / 277.4 / 413.9.
    One row ahead, the log-softmax spills 32 bytes a thread; two, none.)

    Fused rows: two 16-byte vectors per thread, or more for long rows (a row
    gets at most 1024 threads), so a 4096-wide half-precision row takes 256
    threads.  A row of a block or more just past a power of two takes the most
    threads that hold the target each (``_fused_row_config``), not twice as
    many, most holding one vector.  H200, median of 7 rounds in turns, µs,
    halved / previous layout (torch.compile): bf16 softmax 8192 x 4104 33.9 /
    48.6 (124.9), x 6000 46.7 / 59.9, x 8000 62.2 / 69.9, x 12288 120.2 / 144.2
    (staged, 1024 threads), 32768 x 2100 65.3 / 74.3, odd 8192 x 4097 41.4 /
    49.1; log-softmax 8192 x 4104 36.2 / 50.2; float32 softmax 8192 x 4104 85.4
    / 94.9; the bf16 backward 8192 x 4104 50.1 / 97.4 (51.3), x 6000 68.1 /
    117.6 (72.8), log-softmax 51.0 / 98.7 (62.9).  Rows that share a block keep
    the fewest threads: 65536 x 100 bf16 took 14.4 µs in half of them against
    10.8, 65536 x 127 (one-element loads) 43.7 against 24.3 (16 threads: 14.0,
    torch.compile 20.6); 16384 x 1000 18.5 against 18.8.
    The half-precision backward takes one vector of each input
    (512 threads for 4096): on H100s, 32768 x 4096 bf16, median of 5 rounds
    taken in turns, 259.7 -> 258.5 µs for softmax (torch.compile 256.7) and
    259.6 -> 258.5 for log-softmax (260.7); 128 threads a row ran 259.8 and
    260.8, and raising the blocks per SM (fewer registers) changed nothing.
    The softmax forward keeps its exponentials in registers (a
    1024-thread block runs alone on its SM, so its compute does not overlap
    another block's loads: on an H100 one exponential per element instead of
    two took 8192 x 32768 bfloat16 rows from 86% to 96% of copy bandwidth).
    Rows too long for one block's registers take row clusters (at most
    ``max_cluster`` blocks) where the rows give every SM a block (of the
    backward's 1024 threads, of the forward's 512); longer or
    fewer rows take the two-step programs with 512 threads and four vectors
    in flight per thread.  The backward's clusters have 1024-thread blocks
    (on fast memory, narrower where they hold a row: ``backward_cluster_layout``),
    the forward's 512-thread blocks built to fit two an SM, so one block
    loads or stores while the other waits on its cluster.  On an H100,
    bf16, in µs, row clusters against the two steps: softmax backward 64 x
    262144 43.0 against 56.1, 256 x 262144 142.6 against 223.8, 1024 x
    65536 136.1 against 220.3 (in 512-thread blocks 150.8), float32 4096 x
    32768 523.3 against 873.9; log-softmax backward 64 x 262144 42.2
    against 43.9.  Forward, 512-thread clusters against 1024-thread ones
    against the two steps: 1024 x 65536 104.2 / 111.8 / 139.9 (log-softmax
    108.8 / 115.2 / 139.8), 64 x 65536 12.6 / - / 14.6, 256 x 131072 58.8
    / 64.8 / 71.9 (log-softmax 59.6 / 68.3 / 72.4), float32 64 x 131072
    28.3 / 30.5 / 34.9, float16 4096 x 65536 408.3 / 430.4.  A 262144-wide
    forward row would need sixteen 512-thread blocks, and eight 1024-thread
    blocks lost at 64 x 262144 (39.1 against 36.4; the two steps' second
    read mostly hits L2), so it takes the two steps.  With fewer blocks than
    SMs (16 x 262144) clusters lost too (17.0 against 16.5, log-softmax
    16.8 against 14.7).  Splitting rows that one block holds did not pay:
    8192 x 32768 in clusters of two 512-thread blocks, forward 401.2
    against 367.5 fused, backward 569.0 against 525.9; 4096 x 40000 forward
    (two 1024-thread blocks) 432.8 against 241.6.  The forward's two steps
    load with L2 eviction hints (``split_cache_hints``): the stats program
    keeps the row's lines, the apply program lets them go first, so its
    read comes from L2 (bf16 64 x 262144 34.8 against 37.3 µs without,
    float32 67.3 against 70.0, 256 x 262144 139.8 against 141.2; 1024 x
    262144, four times L2, 563.8 against 560.7).  The backward's apply
    program took 85 registers instead of 61 with them and lost (4 x 1048576
    16.5 against 14.8, 16 x 262144 15.6 against 15.4).  The column programs'
    hints (``column_cache_hints``) went the other way: over the middle axis
    of 64 x 4096 x 64, backward 54.6 against 56.5 µs without (log-softmax
    45.3 against 47.5), forward 55.5 against 54.0 (log-softmax 64.6 against
    58.4).  Two-step columns: 256 threads;
    fused columns: 512 threads and four 16-byte vectors of each input in
    flight per thread, the axis cut among a cluster of up to
    ``column_cluster`` blocks where the columns alone give too few
    (``column_cluster_size``).  The forward took eight vectors until its
    clusters came; with them, four took 64 registers instead of 110-128 and
    measured faster (H100, bf16, in turns, four against eight: 64 x 4096 x
    64 in clusters of two 42.7 against 44.8 µs, log-softmax 42.7 against
    48.0; 256 x 512 x 64, one block a column group, 23.2 against 31.9;
    8 x 8192 x 256 in clusters of four 69.3 against 68.7, log-softmax 69.7
    against 72.3; 1 x 4096 x 1024 23.2 against 23.4).  On fast memory eight won again, forward
    and backward (H200, bf16, median of 7 rounds in turns, µs, four / eight vectors
    (torch.compile)): 64 x 4096 x 64 forward 36.2 / 33.0 (53.4), log-softmax 36.0 / 32.1 (58.9),
    backward 40.4 / 37.8 (47.5), log-softmax backward 30.8 / 30.6 (40.9); 8 x 8192 x 256 forward
    61.2 / 54.2 (51.8), backward 53.9 / 50.0 (46.5); 16 x 32768 x 64 forward 112.4 / 98.8
    (83.6), backward 104.8 / 97.5 (82.4); 1 x 4096 x 1024 forward 21.4 / 19.8 (29.2), backward
    15.7 / 15.6 (22.4).  There 256 and 1024 threads lost to 512 (64 x 4096 x 64 forward 43.9
    and 39.7 against 36.4), and the forward's column hints helped where the input fits well in
    L2 (32 MiB: 64 x 4096 x 64 30.8 against 33.0 with eight vectors, 8 x 8192 x 256 52.2 against
    54.2) and lost where it does not (64 MiB, 16 x 32768 x 64: 101.3 against 98.8).  So on fast
    memory the forward's fused column calls whose input takes at most ``column_hinted_max_mib``
    MiB (``COLUMN_HINTED_MAX_MIB``; 0: none) take them; the rest, and every call elsewhere, keep
    plain loads.  Below 32 MiB they changed nothing (µs, plain / hinted: 48 x 4096 x 64, 24 MiB,
    29.2 / 29.1; 24 x 8192 x 64 30.2 / 30.0; 2 x 8192 x 256, 8 MiB, 21.2 / 21.2; 1 x 4096 x 1024
    19.8 / 19.9); at 32 MiB, 64 x 4096 x 64, 33.1 / 30.8; at 64 MiB 98.2 / 100.2.  The backward
    keeps them on every call: without, 64 x 4096 x 64 took 41.0 against 38.2.
    ``cluster_stages`` (forward, fast memory): rows each block of the row cluster staged program
    copies ahead (``stages_clusters``; 0: rows too long for a block take the row cluster
    program).  H200, bf16 1024 x 65536, median of 7 rounds in turns, µs: softmax one row a
    cluster of four 512-thread blocks (the row cluster program) 87.2, of two 1024-thread blocks
    100.2, staged in clusters of two 1024-thread blocks one row ahead 88.4, two rows 85.6,
    in clusters of four 512-thread blocks 111.5 / 109.3, torch.compile 145.5; log-softmax 93.2 /
    - / 89.2 / 85.2 / 109.9 / 108.1, torch.compile 125.5.  Over 64 x 65536 (one row a cluster)
    staging lost: 13.2 against 11.9.
    ``row_windows``: fused and row cluster rows that no 16-byte access can start (``N`` odd, say)
    are read and written in aligned 16-byte windows where a call's tensors allow it (see
    ``row_fused_program``; 0: accesses of as many elements as divide ``N``).  On by default for
    the forward's fused rows of at least ``WINDOWED_ROW_WINDOWS`` windows a thread and its row
    clusters; the backwards keep element loads, which won there.  H200, bf16, median of 7 rounds
    in turns, µs, windows / element loads (torch.compile): forward 8192 x 4097 36.9 / 41.2
    (125.5), 8192 x 6001 50.9 / 59.2 (133.6), 256 x 50257 in a row cluster 27.2 / 28.2 (78.8),
    log-softmax 2048 x 50257 171.9 / 180.4 (263.2); 8192 x 4097 in windows on 512 / 256 / 128
    threads 67.7 / 43.3 / 36.9; backward 8192 x 4097 in 512 threads 93.1 against 59.8 (93.6),
    65536 x 127 27.9 against 18.3.  Short rows read an element at a time
    (``ONE_ELEMENT_ROW_ELEMENTS``) take more threads than rows of 16-byte accesses: forward
    65536 x 127 14.0 in 16 threads against 24.1 in 8 (20.4), 16384 x 1001 20.9 in 128 against
    21.5 in 64 (23.4); backward 65536 x 127 16.5 in 32 against 18.4 in 16 (17.8).
    ``held_threads`` (forward; 0: none), ``held_elements``, ``held_min_blocks``: the row held
    program's blocks, the elements a thread holds (``fused_elements_cap``: no spills at 64
    registers) and the blocks an SM must fit.  It takes forward rows that neither one block nor
    enough row clusters hold, where a row needs at most as many blocks as there are SMs
    (``row_held``).  H200, bf16 64 x 262144, median of 9 rounds in turns, µs, against the two
    steps 29.9 (torch.compile 48.8): 256 threads, four blocks an SM 26.1; 128 threads, eight 27.2;
    512, two 27.7; 56 elements a thread 26.3; 64 in three 256-thread blocks an SM (8 bytes
    spilled) 25.8.  Fewer rows gained more: 1 x 262144 7.4 against 9.4, 8 x 262144 9.2 against
    9.9, 4 x 1048576 11.2 against 13.7.  Over 1024 x 65536 row clusters stay ahead (85.1 against
    89.9 held).
    ``row_hinted_min_mib``: fused rows load with ``evict_last`` on calls whose inputs take at
    least this many MiB (0: every call), ``HINTED_MIN_MIB``.  H100, bf16 rows of 4096, median
    of 7 rounds in turns, µs without / with the hint: forward 4096 rows 21.70 / 21.54, 8192
    rows 39.84 / 43.26, 16384 rows 84.38 / 87.39, 32768 rows 176.35 / 174.91; backward (two
    inputs) 2048 rows 17.22 / 17.18, 4096 rows 30.40 / 31.58, 8192 rows 61.15 / 62.21, 16384
    rows 127.74 / 126.53 (torch.compile 126.53), fp32 8192 rows 128.16 / 127.01 (127.65).
    Earlier figures of large calls, off against on against torch.compile, µs: backward bf16
    32768 x 4096 258.4 / 256.4 / 256.7, 8192 x 32768 526.0 / 520.8 / 520.7;
    fp32 32768 x 4096 521.6 / 517.6 / 518.8; log-softmax backward fp32 521.8
    / 517.5 / 519.8, bf16 8192 x 32768 524.8 / 519.4 / 523.1; forward fp32
    352.8 / 350.6 / 352.3, log-softmax 353.0 / 350.7 / 351.9; forward bf16
    32768 x 4096 176.2 / 174.8, 8192 x 32768 367.4 / 365.3; 1 x 4096 and
    log-softmax 8192 x 32768 tie.  ``cluster_cache_hints``, the same for row
    clusters, is off: the backward over 64 x 262144 took 42.4 µs without
    and 42.8 with it.
    """
    vector = max_vector(dtype)
    vectors = 1 if backward and dtype.itemsize == 2 else 2
    cap = fused_elements_cap(dtype, backward)
    windowed = None if backward or N % vector == 0 else _windowed_row_config(N, dtype, cap)
    rows = windowed or _fused_row_config(N, vectors * vector, cap)
    if windowed is None and row_vector(N, dtype) == 1:
        short = _fused_row_config(N, ONE_ELEMENT_ROW_ELEMENTS[backward], cap)
        if short["row_threads"] <= MIN_BLOCK_THREADS:
            rows = short
    # Windows for the forward's fused rows where they pay, and its row clusters.
    row_windows = not backward and (windowed is not None or not fused_fits(N, dtype, backward, rows["row_threads"]))
    whole_block = rows["row_threads"] == MAX_THREADS and fused_fits(N, dtype, backward, MAX_THREADS)
    stages = 2 if log else 1
    staged = fast_memory and not backward and whole_block and staged_fits(N, dtype, MAX_THREADS, stages)
    return {
        **rows,
        "row_stages": stages if staged else 0,
        "cluster_stages": 2 if fast_memory and not backward else 0,
        "cache_exp": 1,
        "row_windows": int(row_windows),
        "row_hinted_min_mib": HINTED_MIN_MIB,
        "cluster_cache_hints": 0,
        "min_blocks": 1,
        "max_cluster": MAX_CLUSTER,
        **_cluster_layout(N, dtype, backward, fast_memory, log),
        "held_threads": 0 if backward else HELD_THREADS,
        "held_elements": fused_elements_cap(dtype, backward),
        "held_min_blocks": HELD_MIN_BLOCKS,
        "split_threads": 512,
        "split_unroll": 4,
        "split_cache_hints": 0 if backward else 1,
        "column_threads": 256,
        "column_unroll": 4,
        "fused_column_threads": 512,
        "fused_column_unroll": FUSED_COLUMN_UNROLL[fast_memory],
        "column_cache_hints": 1 if backward else 0,
        "column_hinted_max_mib": COLUMN_HINTED_MAX_MIB if fast_memory and not backward else 0,
        "column_cluster": MAX_CLUSTER,
    }


def backward_cluster_layout(N: int, dtype: torch.dtype, fast_memory: bool, log: bool) -> Tuple[int, int]:
    """(threads, blocks an SM) of the backward's row clusters over rows of ``N``.

    On fast memory, the narrowest of ``CLUSTER_LAYOUTS`` whose cluster (at most
    ``MAX_CLUSTER`` blocks) holds a row; the softmax backward keeps 1024-thread blocks where they
    give every thread whole 16-byte vectors.  Every layout runs 1024 threads an SM (64 registers a
    thread), each thread holding the same share of a row; smaller blocks only cut the cluster
    finer.  H200, bf16, median of 7 rounds in turns, µs, 1024 x 1 / 512 x 2 / 256 x 4 (torch.compile):
    softmax 2048 x 40000 183.5 / 152.3 / 138.1 (182.4), 4096 x 50257 492.4 / 426.3 / 401.3 (613.9),
    1024 x 57344 112.1 / 94.9 / 94.9 (134.6), 512 x 128256 130.6 / 112.4 / - (154.7); whole
    vectors: 1024 x 65536 99.0 / 108.4 / 103.6 (156.4), 4096 x 49152 304.5 / 346.5 / 326.1 (441.5),
    256 x 131072 58.0 / 57.9 / - , float32 1024 x 65536 192.7 / 192.8 / -.  Log-softmax: 40000
    174.4 / 145.0 / 140.3 (143.3), 50257 491.8 / 425.8 / 396.5 (516.9), 57344 120.8 / 93.6 / 91.9
    (105.5), 128256 128.0 / 107.2 / - (131.3), 65536 107.6 / 104.0 / 101.7 (122.7), 49152 341.9 /
    316.1 / 311.2 (345.2), 256 x 131072 65.6 / 59.9 / - (86.0), float32 1024 x 65536 205.1 / 194.5
    / - (255.1).  The H100 measured 1024-thread blocks faster (softmax 1024 x 65536 136.1 against
    150.8 in 512-thread blocks), so elsewhere they stay.
    """
    wide = (BACKWARD_CLUSTER_THREADS, BACKWARD_CLUSTER_MIN_BLOCKS)
    if not fast_memory:
        return wide
    if not log:
        cluster = row_cluster_size(N, dtype, True, BACKWARD_CLUSTER_THREADS)
        if cluster is not None and N % (cluster * BACKWARD_CLUSTER_THREADS * max_vector(dtype)) == 0:
            return wide
    for threads, min_blocks in CLUSTER_LAYOUTS:
        if row_cluster_size(N, dtype, True, threads) is not None:
            return threads, min_blocks
    return wide


def _cluster_layout(N: int, dtype: torch.dtype, backward: bool, fast_memory: bool, log: bool) -> Dict[str, int]:
    threads, min_blocks = (backward_cluster_layout(N, dtype, fast_memory, log) if backward
                           else (FORWARD_CLUSTER_THREADS, FORWARD_CLUSTER_MIN_BLOCKS))
    return {"cluster_threads": threads, "cluster_min_blocks": min_blocks}


def softmax_autotune_configs(N: int, dtype: torch.dtype, backward: bool = False,
                             log: bool = False) -> List[Dict[str, int]]:
    """Valid candidate configs around the heuristic (the heuristic first, no duplicates), for rows."""
    default = softmax_default_config(N, dtype, backward, log=log)
    vector = max_vector(dtype)
    cap = fused_elements_cap(dtype, backward)
    candidates = [default]
    for per_thread in (vector, 2 * vector, 4 * vector, cap):
        candidates.append({**default, **_fused_row_config(N, per_thread, cap)})
    if N % vector:  # odd rows: element loads against windows
        candidates.append({**default, "row_windows": 0})
    if -(-N // default["row_threads"]) <= cap:  # the default holds a row in one block
        candidates.append({**default, "row_hinted_min_mib": 0})
        if not backward:
            for stages in (0, 1, 2):
                if staged_fits(N, dtype, default["row_threads"], stages):
                    candidates.append({**default, "row_stages": stages})
    else:  # rows take a row cluster or the two-step programs
        for threads in (256, 512, 1024):
            for unroll in (2, 4, 8):
                candidates.append({**default, "split_threads": threads, "split_unroll": unroll})
        candidates.append({**default, "max_cluster": 1})
        candidates.append({**default, "cluster_cache_hints": 1 - default["cluster_cache_hints"]})
        candidates.append({**default, "split_cache_hints": 1 - default["split_cache_hints"]})
        if not backward:
            for stages in (0, 1, 2):
                candidates.append({**default, "cluster_stages": stages})
            for threads, min_blocks in ((0, 1), (128, 8), (HELD_THREADS, HELD_MIN_BLOCKS), (512, 2)):
                candidates.append({**default, "held_threads": threads, "held_min_blocks": min_blocks})
        for threads, min_blocks in CLUSTER_LAYOUTS:
            candidates.append({**default, "cluster_threads": threads, "cluster_min_blocks": min_blocks})
    # No column keys: the tuner times rows (``tuning_inputs``), where they change nothing, so a
    # column candidate would win or lose by noise alone.
    unique: List[Dict[str, int]] = []
    for config in candidates:
        if config not in unique:
            unique.append(config)
    return unique


def _check_config(config: Dict[str, int]) -> None:
    held = config["held_threads"]
    if held and not (is_pow2(held) and WARP <= held <= MAX_THREADS):
        raise ValueError(f"softmax kernels: held_threads must be 0 (no held rows) or a power of two in [{WARP}, "
                         f"{MAX_THREADS}], got {held}")
    for key in ("row_threads", "block_threads", "cluster_threads", "split_threads", "column_threads",
                "fused_column_threads"):
        value = config[key]
        if not (is_pow2(value) and value <= MAX_THREADS):
            raise ValueError(f"softmax kernels: {key} must be a power of two <= {MAX_THREADS}, got {value}")
    if config["block_threads"] < config["row_threads"] or config["block_threads"] < WARP:
        raise ValueError("softmax kernels: block_threads must be >= row_threads and >= 32")
    for key in ("cluster_threads", "split_threads", "column_threads", "fused_column_threads"):
        if config[key] < WARP:
            raise ValueError(f"softmax kernels: {key} must be >= 32")
    for key in ("row_stages", "cluster_stages"):
        if config[key] < 0:
            raise ValueError(f"softmax kernels: {key} must be at least 0, got {config[key]}")
    for key in ("split_unroll", "column_unroll", "fused_column_unroll", "min_blocks", "cluster_min_blocks",
                "held_elements", "held_min_blocks"):
        if config[key] < 1:
            raise ValueError(f"softmax kernels: {key} must be positive")
    for key in ("cache_exp", "row_windows", "cluster_cache_hints", "split_cache_hints", "column_cache_hints"):
        if config[key] not in (0, 1):
            raise ValueError(f"softmax kernels: {key} must be 0 or 1, got {config[key]}")
    for key in ("row_hinted_min_mib", "column_hinted_max_mib"):
        if config[key] < 0:
            raise ValueError(f"softmax kernels: {key} must be at least 0, got {config[key]}")
    for key, what in (("max_cluster", "row"), ("column_cluster", "column")):
        if not (is_pow2(config[key]) and config[key] <= MAX_CLUSTER):
            raise ValueError(f"softmax kernels: {key} must be a power of two <= {MAX_CLUSTER} (1: no {what} "
                             f"clusters), got {config[key]}")


def cluster_elements_cap(dtype: torch.dtype, backward: bool) -> int:
    """Row elements one thread of a row cluster may hold in registers (see ``row_cluster_size``)."""
    return min(fused_elements_cap(dtype, backward), CACHED_EXP_ELEMENTS)


def fused_fits(N: int, dtype: torch.dtype, backward: bool, row_threads: int) -> bool:
    """Whether a row fits in the registers of ``row_threads`` threads."""
    return -(-N // row_threads) <= fused_elements_cap(dtype, backward)


def staged_fits(N: int, dtype: torch.dtype, row_threads: int, stages: int, cluster: int = 1) -> bool:
    """Whether ``stages`` rows of ``N`` copied by ``row_threads`` threads (whole 16-byte vectors
    each; in a cluster of ``cluster`` blocks, a block's share of them) fit in ``STAGED_MAX_BYTES``
    of shared memory."""
    span = row_threads * max_vector(dtype)
    return stages * -(-N // (cluster * span)) * span * dtype.itemsize <= STAGED_MAX_BYTES


def windows_fit(N: int, dtype: torch.dtype, backward: bool, span: int, vector: int, cap: int) -> bool:
    """Whether ``span`` threads hold a row of ``N`` read in windows of ``vector`` elements (see
    ``row_fused_program``), at most ``cap`` elements each.  A row's windows may take a vector more
    a thread than its elements; a backward, holding two inputs, keeps a vector of room below
    ``cap`` (sm_90 ptxas: rows of 50257 bf16 in clusters of 1024-thread blocks, at the cap,
    spilled 164 bytes a thread)."""
    return -(-window_count(N, vector) // span) * vector <= cap - (vector if backward else 0)


def row_cluster_size(N: int, dtype: torch.dtype, backward: bool, threads: int,
                     most: int = MAX_CLUSTER) -> Optional[int]:
    """Blocks of ``threads`` a row cluster needs to hold a row in registers, or None past ``most``.

    A thread holds at most ``CACHED_EXP_ELEMENTS`` elements, so the forward keeps its
    exponentials in registers too.
    """
    per_thread = cluster_elements_cap(dtype, backward)
    cluster = 2
    while cluster <= most:
        if -(-N // (cluster * threads)) <= per_thread:
            return cluster
        cluster *= 2
    return None


def column_tile(inner: int, cvec: int) -> int:
    """Threads across the inner extent in a column block (a power of two, at most 32)."""
    return min(MAX_COL_THREADS, next_pow2(-(-inner // cvec)))


def fused_column_params(N: int, dtype: torch.dtype, outer: int, inner: int, cvec: int, sm_count: int,
                        threads: int, max_cluster: int = 1) -> Optional[ProgramParams]:
    """Shape parameters of the fused column program for ``(outer, N, inner)``, or None for the two steps.

    A fused block owns whole columns, so the launch has only ``outer`` times
    the inner tiles in blocks.  It takes the widest tile (at most
    ``FUSED_COLUMN_MAX_COL_THREADS`` vectors) that still gives one block for
    every ``FUSED_COLUMN_SMS_PER_BLOCK`` SMs and at most
    ``FUSED_COLUMN_BYTES`` of each input a block, and that spans a memory
    sector or the whole inner extent; when no tile does, the columns are too
    few or too long and the two-step programs, which also split the axis,
    fill the GPU better.  A one-vector-wide tile takes half the threads.
    The widest tile may cut the axis among a cluster of up to
    ``max_cluster`` blocks (``column_cluster_size``); its blocks and bytes are
    then counted per block.  Narrower tiles keep one block a column group
    (clusters of them were not measured).
    (H100, bf16, over the middle axis, the fused program against the two
    steps: backward 64 x 4096 x 64, 60 against 100 us; 512 x 4096 x 8, 55
    against 84 us; but 4 x 32768 x 64, forward 201 against 80 us and
    backward 212 against 58; 16 x 32768 x 64 with 16-byte tiles, forward
    over 354 against 227 us.  The forward on 64 x 4096 x 64 takes 54 us,
    where the shared-memory slab program it replaced took 94.  Clusters,
    against one block: 64 x 4096 x 64 in two blocks, forward 45.1 against
    53.7 us, backward 53.0 against 54.9, log-softmax 48.2 against 57.5 and
    39.9 against 45.4; 16 x 32768 x 64 in eight, forward 128.9 against 225.7
    for the two steps, backward 141.6 against 171.5; 1 x 4096 x 1024 in
    four, forward 23.2 against 39.5, backward 19.2 against 37.7; 8 x 8192 x
    256 in four, forward 68.9 against 102.7, backward 70.8 against 108.1.)
    """
    widest = min(FUSED_COLUMN_MAX_COL_THREADS, column_tile(inner, cvec))
    col_threads = widest
    while col_threads >= 1:
        tile = col_threads * cvec
        block_threads = threads if col_threads > 1 else max(threads // 2, WARP)
        blocks = outer * -(-inner // tile)
        most = max_cluster if col_threads == widest else 1
        cluster = column_cluster_size(blocks, N, tile * dtype.itemsize, block_threads // col_threads, sm_count,
                                      most)
        whole_sectors = tile * dtype.itemsize >= SECTOR_BYTES or tile >= inner
        fits = -(-N // cluster) * tile * dtype.itemsize <= FUSED_COLUMN_BYTES
        if blocks * cluster * FUSED_COLUMN_SMS_PER_BLOCK >= sm_count and fits and whole_sectors:
            return (("col_threads", col_threads), ("cvec", cvec), ("threads", block_threads), ("cluster", cluster))
        col_threads //= 2
    return None


def column_cluster_size(blocks: int, N: int, column_bytes: int, lanes: int, sm_count: int, most: int) -> int:
    """Blocks of a fused column cluster (a power of two, at most ``most``; every block walks at
    least ``lanes`` positions of the axis).

    First the fewest whose segments keep ``FUSED_COLUMN_BYTES`` of each input a
    block (``column_bytes``: one position's bytes across the tile) and that give
    a block for every ``FUSED_COLUMN_SMS_PER_BLOCK`` SMs, then more, up to
    ``COLUMN_CLUSTER_SPREAD``, while the launch stays within one block an SM.
    On an H100, bf16 forward (eight vectors in flight a thread), in µs by
    blocks a cluster, timed in turns, the cluster this takes marked *:
    64 x 4096 x 64: 1 53.7, 2* 45.1, 4 62.6, 8 87.2; 1 x 4096 x 1024: 1 39.5,
    2 35.1, 4* 23.2, 8 37.3; 8 x 8192 x 256: 1 102.7, 2 58.7, 4* 68.9, 8 69.3;
    16 x 32768 x 64: 4 193.1, 8* 128.9 (the two-step programs 225.7).  The
    backward followed: 1 x 4096 x 1024 37.7, 33.7, 19.2*, 24.7.
    """
    def halves_keep_lanes(cluster: int) -> bool:
        return -(-N // (2 * cluster)) >= lanes

    def too_few(cluster: int) -> bool:
        return (-(-N // cluster) * column_bytes > FUSED_COLUMN_BYTES
                or blocks * cluster * FUSED_COLUMN_SMS_PER_BLOCK < sm_count)

    cluster = 1
    while cluster < most and too_few(cluster) and halves_keep_lanes(cluster):
        cluster *= 2
    while (cluster < min(most, COLUMN_CLUSTER_SPREAD) and blocks * cluster * 2 <= sm_count
           and halves_keep_lanes(cluster)):
        cluster *= 2
    return cluster


# ---- TileLang building blocks -------------------------------------------------------------------


def _group_reduce(T: Any, stride: int, count: int) -> Callable[..., Any]:
    """Macro: combine a float32 value over ``count`` threads spaced ``stride`` apart.

    Threads ``tx`` with equal ``tx // (stride * count)`` and ``tx % stride``
    form a group (a row's threads have stride 1; a column's threads have the
    column tile width as stride).  Every thread of a group ends with the
    group's result.  Members within a warp combine with xor shuffles; then
    one member per warp (or every member, when ``stride`` spans a warp or
    more) combines through ``scratch[slot, group, part, tx % stride]``.
    Each slot serves one reduction per program, so no barrier is needed
    between reductions.
    """
    span = stride * count
    in_warp = min(span, WARP)
    shuffle_steps = max(0, (in_warp // stride).bit_length() - 1)
    part_width = max(stride, WARP)  # threads whose members agree after the shuffles
    parts = max(1, span // part_width)

    @T.macro
    def reduce(values, index, scratch, slot, tx, use_max):
        for step in T.unroll(shuffle_steps):
            if use_max:
                values[index] = T.max(values[index], T.shfl_xor(values[index], stride * (1 << step)))
            else:
                values[index] = values[index] + T.shfl_xor(values[index], stride * (1 << step))
        if parts > 1:
            if tx % WARP < stride:
                scratch[slot, tx // span, (tx % span) // part_width, tx % stride] = values[index]
            T.sync_threads()
            values[index] = scratch[slot, tx // span, 0, tx % stride]
            for w in T.unroll(1, parts):
                if use_max:
                    values[index] = T.max(values[index], scratch[slot, tx // span, w, tx % stride])
                else:
                    values[index] = values[index] + scratch[slot, tx // span, w, tx % stride]

    return reduce


def _scratch_shape(threads: int, stride: int, count: int, slots: int) -> Tuple[int, int, int, int]:
    span = stride * count
    return (slots, threads // span, max(1, span // max(stride, WARP)), stride)


def _online_macros(T: Any) -> Dict[str, Callable[..., Any]]:
    """Macros on a float32 state ``st`` for the forward's online max/sum.

    ``st[m]`` is a running maximum and ``st[s]`` the sum of ``exp(v - st[m])``
    so far.  The exponent offset is the maximum, or 0 while the maximum is
    still ``-inf``, so a slice that starts with ``-inf`` contributes zeros
    instead of NaN.
    """

    @T.macro
    def safe_scaled(st, dst, src):
        # log2(e) * (the maximum, or 0 while it is -inf): the exponent offset.
        st[dst] = T.if_then_else(st[src] == -T.infinity(ACCUM), T.cast(0, ACCUM), st[src]) * LOG2E

    @T.macro
    def rescale(st, m, s, new_max, t):
        """Move the sum ``st[s]`` from offset ``st[m]`` to ``st[new_max]``; ``st[t]`` gets the new offset."""
        safe_scaled(st, t, new_max)
        st[s] = st[s] * T.exp2(st[m] * LOG2E - st[t])
        st[m] = st[new_max]

    @T.macro
    def merge(st, m, s, other_m, other_s, offset, new_max):
        """Fold the pair (``other_m``, ``other_s``) into (``st[m]``, ``st[s]``); two scratch slots."""
        st[new_max] = T.max(st[m], other_m)
        safe_scaled(st, offset, new_max)
        st[s] = st[s] * T.exp2(st[m] * LOG2E - st[offset]) + other_s * T.exp2(other_m * LOG2E - st[offset])
        st[m] = st[new_max]

    return {"safe_scaled": safe_scaled, "rescale": rescale, "merge": merge}


# State slots of the programs below (float32 locals).
_MAX, _SUM, _OFFSET, _FINAL, _T0, _T1, _T2 = 0, 1, 2, 3, 4, 5, 6
_STATE = 7


def _finalize_forward(T: Any, variant: SoftmaxVariant, width: int = 1) -> Callable[..., Any]:
    """Macro: from a slice's max and sum, set its exponent offset and final factor.

    State slots are slot-major, ``st[slot * width + k]`` for the ``k``-th of
    ``width`` slices a thread serves.  ``_OFFSET`` gets log2(e) times the
    exponent offset; ``_FINAL`` gets ``1 / sum`` (softmax) or ``offset + log(sum)``
    in natural units (log-softmax).
    """
    macros = _online_macros(T)

    @T.macro
    def finalize(st, k):
        macros["safe_scaled"](st, _OFFSET * width + k, _MAX * width + k)
        if variant.log:
            st[_FINAL * width + k] = T.if_then_else(
                st[_MAX * width + k] == -T.infinity(ACCUM), T.cast(0, ACCUM), st[_MAX * width + k]
            ) + T.log(st[_SUM * width + k])
        else:
            st[_FINAL * width + k] = T.cast(1, ACCUM) / st[_SUM * width + k]

    return finalize


def _output_value(T: Any, variant: SoftmaxVariant, dtype: str, width: int = 1,
                  to_float32: Optional[Callable[[Any], Any]] = None,
                  exp2: Optional[Callable[[Any], Any]] = None) -> Callable[..., Any]:
    """The output element from the input element(s) and the reduced state of slice ``k``; a forward
    widens its input with ``to_float32`` and exponentiates with ``exp2`` (default: a cast, ``T.exp2``)."""
    to_float32 = to_float32 or (lambda value: T.cast(value, ACCUM))
    exp2 = exp2 or T.exp2

    def value(a, b, st, k):
        if variant.backward:
            g = T.cast(a, ACCUM)
            y = T.cast(b, ACCUM)
            if variant.log:
                return T.cast(g - T.exp2(y * LOG2E) * st[_SUM * width + k], dtype)
            return T.cast(y * (g - st[_SUM * width + k]), dtype)
        x = to_float32(a)
        if variant.log:
            return T.cast(x - st[_FINAL * width + k], dtype)
        return T.cast(exp2(x * LOG2E - st[_OFFSET * width + k]) * st[_FINAL * width + k], dtype)

    return value


def _backward_term(T: Any, variant: SoftmaxVariant) -> Callable[..., Any]:
    """What the backward sums: ``g * y`` (softmax) or ``g`` (log-softmax)."""

    def term(a, b):
        if variant.log:
            return T.cast(a, ACCUM)
        return T.cast(a, ACCUM) * T.cast(b, ACCUM)

    return term


# ---- row clusters ----------------------------------------------------------------------------------

# Device code the row cluster program adds to its source: a store into another block's
# shared memory (the same variable, in the block of rank ``rank`` of the cluster).
PEER_STORE = r"""
__device__ __forceinline__ void tileops_store_to_peer(float* local, int rank, float value) {
  unsigned int address = static_cast<unsigned int>(__cvta_generic_to_shared(local));
  unsigned int remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(value) : "memory");
}
"""


def _cluster_share(T: Any, cluster: int, once: bool = True) -> Callable[..., Any]:
    """Macro: every block of the cluster gets ``gathered[base + rank, :] = (first, second)`` from
    each block.

    Thread ``k`` of a block stores the block's pair into block ``k``.  A block's
    shared memory may be written only once it runs: with ``once`` (one exchange a
    launch) that is the wait on the cluster barrier the program arrived at when it
    started; a program that exchanges once a row waits on that barrier before its
    first row instead.  The full barrier after the stores makes them visible, and
    since no block touches another's memory after its last one, blocks may then
    finish in any order.
    """

    @T.macro
    def share(gathered, base, rank, first, second):
        if once:
            T.cluster_wait()
        if T.get_thread_binding() < cluster:
            T.call_extern("handle", "tileops_store_to_peer", T.address_of(gathered[base + rank, 0]),
                          T.get_thread_binding(), first)
            T.call_extern("handle", "tileops_store_to_peer", T.address_of(gathered[base + rank, 1]),
                          T.get_thread_binding(), second)
        T.cluster_sync()

    return share


def pack_pair(T: Any, first: Any, second: Any) -> Any:
    """Two float32 values in one 64-bit word, ``first`` in the high half (one atomic access)."""
    return T.bitwise_or(T.shift_left(T.cast(T.reinterpret(first, "uint32"), "uint64"), T.uint64(32)),
                        T.cast(T.reinterpret(second, "uint32"), "uint64"))


def pair_first(T: Any, word: Any) -> Any:
    return T.reinterpret(T.cast(T.shift_right(word, T.uint64(32)), "uint32"), ACCUM)


def pair_second(T: Any, word: Any) -> Any:
    return T.reinterpret(T.cast(word, "uint32"), ACCUM)


# ---- row fused program ----------------------------------------------------------------------------


def row_fused_program(N: int, dtype: str, variant: SoftmaxVariant, *, vector: int, row_threads: int,
                      block_threads: int, cache_exp: int = 0, min_blocks: int = 1, cluster: int = 1,
                      hinted: int = 0, staged: int = 0, row_stages: int = 1, windowed: int = 0, held: int = 0,
                      out_dtype: Optional[str] = None, **_: Any) -> Any:
    """Rows of ``(R, N)`` held in registers: one read, one write.

    ``out_dtype``: the output's element type (default ``dtype``; a forward may write wider).

    ``hinted``: the row's 16-byte loads carry L2's ``evict_last`` hint (see ``cache_hints``;
    ``SoftmaxFamilyKernel.row_programs`` sets it from ``row_hinted_min_mib``).

    ``cache_exp`` (softmax forward, at most ``CACHED_EXP_ELEMENTS`` per thread)
    keeps each ``exp(x - max)`` in float32 registers between the sum and the
    output, instead of computing it twice; ``min_blocks`` asks the compiler to
    fit that many blocks per SM.

    With ``cluster > 1`` a row is held by a cluster of that many blocks of
    ``row_threads`` threads (the row cluster program): each block reduces its
    share of the row, the blocks exchange their partial results through
    distributed shared memory, and each block writes its share.

    With ``staged`` (the row staged program, forward only, one row a block, 16-byte accesses),
    ``blocks`` resident blocks take the rows in turn (block b: rows b, b + blocks, ...) and
    copy each of their next ``row_stages`` rows into shared memory (``cp.async``) while they
    reduce and write the current one, so an SM's next loads are in flight during its math.  A
    thread reads back only the vectors it copied itself: waiting on its own copies is all the
    synchronisation the staging needs.  With a cluster as well (the row cluster staged
    program), the groups that take rows in turn are clusters, each block staging its share of
    the row, and the blocks exchange their pairs once a row.

    With ``held > 1`` (the row held program, forward only) a row is held by that many blocks of
    ``row_threads`` threads that exchange their (max, sum) pairs through global memory instead:
    each block publishes its pair in a status word of a workspace (``tileops.kernels.exchange``),
    waits until every block of its row has published, and writes its share.  Block ``b`` holds
    share ``b % held`` of row ``b // held``, so a row's blocks are neighbours in the grid: where
    blocks start in grid order, as they do on NVIDIA GPUs (CUDA promises no order; CUB's
    single-pass scans rely on the same), a waiting block's row has its other blocks running or
    next to start, and a row's ``held`` blocks fit on the GPU at once, so every row finishes.
    Taking shares in the order blocks start through an atomic counter would not rely on it, and
    cost 7 % (H200, softmax of 64 x 262144 bf16 in 128-thread blocks: 30.3 us against 28.2).  It
    takes the status and control words between the input and the output.

    With ``windowed`` (fused or row cluster rows, not staged; ``vector`` a 16-byte access of the
    widest tensor), rows that no 16-byte access can start (``windows``) are read and written in
    aligned windows: thread ``lane``'s vector ``j`` is the row's window ``j * span + lane``, its
    elements outside the row held as -inf (forward) or 0 (backward), which add nothing to the
    row's maximum or sums, and never stored.  Every input's row stride must equal the output's
    (``N``) modulo ``vector``, and every tensor start a whole vector, so that a row starts as
    far into its first window in each.
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    clustered = cluster > 1
    if held > 1 and (clustered or staged or windowed or variant.backward or held > row_threads
                     or block_threads != row_threads):
        raise ValueError("softmax kernels: the row held program holds a forward's row in at most row_threads "
                         "blocks of one share each (block_threads == row_threads), with no cluster, staging or windows")
    if staged and (variant.backward or block_threads != row_threads or row_stages < 1):
        raise ValueError("softmax kernels: the row staged program holds one row a block (block_threads == "
                         "row_threads; in a row cluster, a share of one), of a forward, at least one row ahead")
    if windowed and staged:
        raise ValueError("softmax kernels: the row staged programs copy rows in whole 16-byte vectors, never windows")
    if clustered and block_threads != row_threads:
        raise ValueError("softmax kernels: each block of a row cluster holds one share of the row "
                         "(block_threads == row_threads)")
    rows_per_block = block_threads // row_threads
    # Threads that share a row: a block's, a whole cluster's, or those of the blocks that hold it.
    span = max(cluster, held) * row_threads
    chunk = span * vector
    # Windowed, a thread folds every window it holds: those past the row's end hold the fill.
    full_vecs = -(-window_count(N, vector) // span) if windowed else N // chunk
    has_tail = not windowed and N % chunk > 0
    vecs = full_vecs + int(has_tail)
    # Held rows recompute their exponentials: a block holds its share in 64 registers a thread or fewer.
    cached = (bool(cache_exp) and held <= 1 and not variant.backward and not variant.log
              and vecs * vector <= CACHED_EXP_ELEMENTS)
    reduce = _group_reduce(T, 1, row_threads)
    # Held rows reduce twice more: the pairs of their blocks.
    scratch_shape = _scratch_shape(block_threads, 1, row_threads, 4 if held > 1 else 2)
    finalize = _finalize_forward(T, variant)
    safe_scaled = _online_macros(T)["safe_scaled"]
    out_dtype = out_dtype or dtype
    # Held rows run at the pace of their instructions: they widen bfloat16 with one integer
    # instruction, take maxima two elements at a time and exponentiate with the bare hardware
    # instruction (``fast_math``; outputs below 2^-126 flush to zero).  H200, softmax of 64 x
    # 262144 bf16: 26.1 us against 29.1 with casts, per-element maxima and ``exp2f``.
    lean = held > 1
    widen = lean and dtype == "bfloat16"
    pair_maxima = widen and vector % 2 == 0
    to_f32 = float32_of(T, widen)
    exp2 = (lambda x: fast_exp2(T, x)) if lean else T.exp2
    output = _output_value(T, variant, out_dtype, to_float32=to_f32, exp2=exp2)
    term = _backward_term(T, variant)
    R = T.dynamic("R")
    row_policy = EVICT_LAST if hinted else None
    load = vector_load(T, row_policy, vector, dtype)
    load_window, store_window = window_macros(T, N, vector, dtype, row_policy, fill_zero=variant.backward)

    @T.macro
    def load_row(src, buf, row, lane):
        if row < R:
            for j in T.unroll(full_vecs):
                load(buf, j * vector, src, row, (j * span + lane) * vector)
            if has_tail:
                if (full_vecs * span + lane) * vector < N:
                    for k in T.vectorized(vector):
                        buf[full_vecs * vector + k] = src[row, (full_vecs * span + lane) * vector + k]

    @T.macro
    def first_window(at, slot, row, stride):
        """``at[slot]``: the window that row ``row`` of a tensor of row ``stride`` starts in."""
        at[slot] = T.cast(row, "int64") * stride // vector

    @T.macro
    def load_windows(src, buf, row, lane, first, skew):
        if row < R:
            for j in T.unroll(full_vecs):
                load_window(buf, j * vector, src, first, j * span + lane, skew)

    @T.macro
    def store_windows(dst, a, b, e, o, st, row, lane, first, skew):
        """Write this thread's windows of the row from ``e`` (cached exponentials), else from
        ``a`` and ``b``, through ``o`` (one window of the output)."""
        if row < R:
            for j in T.unroll(full_vecs):
                for k in T.unroll(vector):
                    if cached:
                        o[k] = T.cast(e[j * vector + k] * st[_FINAL], out_dtype)
                    else:
                        o[k] = output(a[j * vector + k], b[j * vector + k], st, 0)
                store_window(dst, o, 0, first, j * span + lane, skew)

    # A block stages only its own share of a row: vector ``j`` of thread ``tx`` at
    # ``(j * row_threads + tx) * vector`` (with no cluster, where it lies in the row).
    @T.macro
    def copy_vector(src, staging, stage, row, j, lane, tx):
        T.ptx_cp_async(
            T.access_ptr(staging[stage, (j * row_threads + tx) * vector], "w", vector),
            T.access_ptr(src[row, (j * span + lane) * vector], "r", vector),
            vector,
        )

    @T.macro
    def stage_row(src, staging, stage, row, lane, tx):
        """Start copying this thread's vectors of ``row`` into ``staging[stage]``: one cp.async
        group, empty past the last row."""
        if row < R:
            for j in T.unroll(full_vecs):
                copy_vector(src, staging, stage, row, j, lane, tx)
            if has_tail:
                if (full_vecs * span + lane) * vector < N:
                    copy_vector(src, staging, stage, row, full_vecs, lane, tx)
        T.ptx_commit_group()

    @T.macro
    def read_staged(staging, stage, buf, lane, tx):
        """``buf`` = this thread's vectors of ``staging[stage]`` (past the row's end: not read)."""
        for j in T.unroll(full_vecs):
            for k in T.vectorized(vector):
                buf[j * vector + k] = staging[stage, (j * row_threads + tx) * vector + k]
        if has_tail:
            if (full_vecs * span + lane) * vector < N:
                for k in T.vectorized(vector):
                    buf[full_vecs * vector + k] = staging[stage, (full_vecs * row_threads + tx) * vector + k]

    @T.macro
    def fold_pair_maxima(st, slot, a, lane):
        """``st[slot]`` against the maximum of this thread's bfloat16 elements, two at a time."""
        running = T.alloc_local((1,), "uint32")
        running[0] = pair_max_init(T)
        for p in T.unroll(full_vecs * vector // 2):
            running[0] = pair_max(T, running[0], a, p)
        if has_tail:
            if (full_vecs * span + lane) * vector < N:
                for p in T.unroll(vector // 2):
                    running[0] = pair_max(T, running[0], a, full_vecs * vector // 2 + p)
        st[slot] = T.max(st[slot], larger_of_pair(T, running[0]))

    @T.macro
    def fold_element(st, slot, a, b, i, use_max):
        """``st[slot]`` combined with element ``i``: its maximum, or its exponential / backward term."""
        if use_max:
            st[slot] = T.max(st[slot], to_f32(a[i]))
        elif variant.backward:
            st[slot] = st[slot] + term(a[i], b[i])
        else:
            st[slot] = st[slot] + exp2(to_f32(a[i]) * LOG2E - st[_OFFSET])

    @T.macro
    def fold_row(st, slot, a, b, lane, use_max):
        """``st[slot]`` combined over this thread's elements: max of ``a``, or sum of exps / backward terms."""
        if use_max and pair_maxima:
            fold_pair_maxima(st, slot, a, lane)
        else:
            for j in T.unroll(full_vecs):
                for k in T.unroll(vector):
                    fold_element(st, slot, a, b, j * vector + k, use_max)
            if has_tail:
                if (full_vecs * span + lane) * vector < N:
                    for k in T.unroll(vector):
                        fold_element(st, slot, a, b, full_vecs * vector + k, use_max)

    @T.macro
    def fold_cached(st, a, e, lane):
        """``st[_SUM]`` over this thread's elements, keeping each exponential in ``e``."""
        for j in T.unroll(full_vecs):
            for k in T.unroll(vector):
                e[j * vector + k] = T.exp2(T.cast(a[j * vector + k], ACCUM) * LOG2E - st[_OFFSET])
                st[_SUM] = st[_SUM] + e[j * vector + k]
        if has_tail:
            if (full_vecs * span + lane) * vector < N:
                for k in T.unroll(vector):
                    e[full_vecs * vector + k] = T.exp2(
                        T.cast(a[full_vecs * vector + k], ACCUM) * LOG2E - st[_OFFSET]
                    )
                    st[_SUM] = st[_SUM] + e[full_vecs * vector + k]

    @T.macro
    def store_cached(dst, e, st, row, lane):
        if row < R:
            for j in T.unroll(full_vecs):
                for k in T.vectorized(vector):
                    dst[row, (j * span + lane) * vector + k] = T.cast(e[j * vector + k] * st[_FINAL], out_dtype)
            if has_tail:
                if (full_vecs * span + lane) * vector < N:
                    for k in T.vectorized(vector):
                        dst[row, (full_vecs * span + lane) * vector + k] = T.cast(
                            e[full_vecs * vector + k] * st[_FINAL], out_dtype
                        )

    @T.macro
    def store_row(dst, a, b, st, row, lane):
        if row < R:
            for j in T.unroll(full_vecs):
                for k in T.vectorized(vector):
                    dst[row, (j * span + lane) * vector + k] = output(
                        a[j * vector + k], b[j * vector + k], st, 0
                    )
            if has_tail:
                if (full_vecs * span + lane) * vector < N:
                    for k in T.vectorized(vector):
                        dst[row, (full_vecs * span + lane) * vector + k] = output(
                            a[full_vecs * vector + k], b[full_vecs * vector + k], st, 0
                        )

    online = _online_macros(T)
    # The staged program exchanges once a row, into ``gathered[base:base + cluster]``.
    share = _cluster_share(T, cluster, once=not staged)
    exchange = exchange_macros(T, block_threads)

    @T.macro
    def merge_cluster_forward(st, gathered, base, rank):
        """The row's (max, sum) from the blocks' pairs; ``st[_T2]`` keeps this block's exponent offset."""
        st[_T2] = st[_OFFSET]
        share(gathered, base, rank, st[_MAX], st[_SUM])
        st[_MAX] = -T.infinity(ACCUM)
        st[_SUM] = T.cast(0, ACCUM)
        for k in T.unroll(cluster):
            online["merge"](st, _MAX, _SUM, gathered[base + k, 0], gathered[base + k, 1], _T0, _T1)

    @T.macro
    def merge_held_forward(st, scratch, rank, status, sides, row, word, tx):
        """Held rows: publish this block's (max, sum) in ``status``, then the row's, once every
        block of the row has published (thread ``k`` waits on block ``k``'s word and brings its
        pair to the block's reductions).  A published word is never zero: a pair's maximum is
        ``-inf`` (nonzero bits), or finite with a sum of at least 1 (its own term), or NaN."""
        if tx == 0:
            T.atomic_store(status[sides[0], row, rank], pack_pair(T, st[_MAX], st[_SUM]), memory_order="relaxed")
        st[_MAX] = -T.infinity(ACCUM)
        st[_SUM] = T.cast(0, ACCUM)
        if tx < held:
            word[0] = T.atomic_load(status[sides[0], row, tx], memory_order="relaxed")
            while word[0] == T.uint64(0):
                T.call_extern("handle", "__nanosleep", BACKOFF_NS)
                word[0] = T.atomic_load(status[sides[0], row, tx], memory_order="relaxed")
            st[_MAX] = pair_first(T, word[0])
            st[_SUM] = pair_second(T, word[0])
        st[_T2] = st[_MAX]
        reduce(st, _T2, scratch, 2, tx, True)
        online["rescale"](st, _MAX, _SUM, _T2, _OFFSET)
        reduce(st, _SUM, scratch, 3, tx, False)

    def launch(rows):
        """The grid: blocks of ``rows_per_block`` rows, or one cluster a row.  Either way one
        dimension, whose extent may pass 65535 (the limit of the other two)."""
        hints = CACHE_HINT_PRELUDE if takes_hint(row_policy, vector, dtype) else ""
        if clustered:
            return T.Kernel(rows * cluster, threads=block_threads, cluster_dims=(cluster, 1, 1),
                            prelude=PEER_STORE + hints)
        if held > 1:
            lean_code = (BF16_PAIR_MAX_PRELUDE if pair_maxima else "") + FAST_EXP2_PRELUDE + hints
            return T.Kernel(rows * held, threads=block_threads, prelude=widening_prelude(widen, lean_code))
        return T.Kernel(T.ceildiv(rows, rows_per_block), threads=block_threads, prelude=hints or None)

    def place(block, tx):
        """``(row, lane, rank)`` of a thread: its row, its place among the row's threads, and its
        block's rank in the row's cluster (0 without clusters)."""
        if clustered:
            rank = block % cluster
            return block // cluster, rank * row_threads + tx, rank
        return block * rows_per_block + tx // row_threads, tx % row_threads, 0

    if not variant.backward:
        XT, LDX = strided_rows(T, R, N, dtype, "LDX")

        @T.macro
        def fold_max(st, a, lane):
            st[_MAX] = -T.infinity(ACCUM)
            fold_row(st, _MAX, a, a, lane, True)

        @T.macro
        def finish_row(Y, a, e, st, scratch, gathered, base, row, lane, rank, tx, o, at, status, sides, word):
            """Reduce this thread's row maximum, sum the exponentials, and write the row (a cluster's
            blocks exchange their pairs through ``gathered[base:base + cluster]``, a held row's
            through ``status``; windowed, ``Y`` is flat and the row's windows are written through
            ``o`` from ``at``)."""
            reduce(st, _MAX, scratch, 0, tx, True)
            safe_scaled(st, _OFFSET, _MAX)
            st[_SUM] = T.cast(0, ACCUM)
            if cached:
                fold_cached(st, a, e, lane)
            else:
                fold_row(st, _SUM, a, a, lane, False)
            reduce(st, _SUM, scratch, 1, tx, False)
            if clustered:
                merge_cluster_forward(st, gathered, base, rank)
            if held > 1:
                merge_held_forward(st, scratch, rank, status, sides, row, word, tx)
            finalize(st, 0)
            if cached:
                if clustered:
                    # The exponentials were taken from this block's maximum: move them to the
                    # row's (a block whose share is all -inf holds zeros, and keeps them).
                    st[_FINAL] = st[_FINAL] * T.if_then_else(
                        gathered[base + rank, 0] == -T.infinity(ACCUM), T.cast(0, ACCUM),
                        T.exp2(st[_T2] - st[_OFFSET]),
                    )
            if windowed:
                store_windows(Y, a, a, e, o, st, row, lane, at[1], T.cast(at[2], "int32"))
            elif cached:
                store_cached(Y, e, st, row, lane)
            else:
                store_row(Y, a, a, st, row, lane)

        if staged:

            @T.prim_func
            def softmax_row_staged(X: XT, Y: T.Tensor((R, N), out_dtype), blocks: T.int32):
                # Group g (a block, or a cluster of blocks) takes rows g, g + groups, ... (groups:
                # ``blocks // cluster``, not bound to a name: the parameter would take it); no group
                # waits on another, so any ``blocks`` that is a multiple of the cluster is correct
                # (the caller picks about one wave).
                with launch(blocks // cluster) as block:
                    if min_blocks > 1:
                        T.annotate_min_blocks_per_sm(min_blocks)
                    tx = T.get_thread_binding()
                    staging = T.alloc_shared((row_stages, vecs * vector * row_threads), dtype)
                    a = T.alloc_local((vecs * vector,), dtype)
                    e = T.alloc_local((vecs * vector,), ACCUM) if cached else None
                    st = T.alloc_local((_STATE,), ACCUM)
                    scratch = T.alloc_shared(scratch_shape, ACCUM)
                    group, lane, rank = place(block, tx)
                    # Two rows' pairs, by the row's parity: a peer writes the next row's pairs while
                    # this block may still read this row's, and the row after that's only once this
                    # block has passed the next row's exchange (see ``_cluster_share``).
                    gathered = T.alloc_shared((2 * cluster, 2), ACCUM, scope="shared") if clustered else None
                    if clustered:
                        T.cluster_arrive_relaxed()  # paired with the wait before the first row
                    T.assume(LDX % vector == 0)
                    for j in T.unroll(row_stages):
                        stage_row(X, staging, j, group + j * (blocks // cluster), lane, tx)
                    if clustered:
                        T.cluster_wait()
                    for step in T.serial(T.ceildiv(R - group, blocks // cluster)):
                        stage = step % row_stages
                        # This step's copies are the oldest of the row_stages groups in flight.
                        T.ptx_wait_group(row_stages - 1)
                        read_staged(staging, stage, a, lane, tx)
                        fold_max(st, a, lane)
                        # The maximum has consumed ``a``: the slot may take the row row_stages ahead.
                        stage_row(X, staging, stage, group + (step + row_stages) * (blocks // cluster), lane, tx)
                        finish_row(Y, a, e, st, scratch, gathered, (step % 2) * cluster,
                                   group + step * (blocks // cluster), lane, rank, tx, None, None, None, None, None)

            return softmax_row_staged

        if held > 1:
            W = T.dynamic("W")

            @T.prim_func
            def softmax_row_held(
                X: XT,
                Status: T.Tensor((2, W, held), "uint64"),
                Control: T.Tensor((CONTROL_WORDS,), "int32"),
                Y: T.Tensor((R, N), out_dtype),
            ):
                with launch(R) as block:
                    if min_blocks > 1:
                        T.annotate_min_blocks_per_sm(min_blocks)
                    tx = T.get_thread_binding()
                    a = T.alloc_local((vecs * vector,), dtype)
                    st = T.alloc_local((_STATE,), ACCUM)
                    scratch = T.alloc_shared(scratch_shape, ACCUM)
                    # [side of the workspace this launch publishes in, blocks finished before this one]
                    sides = T.alloc_local((2,), "int32")
                    word = T.alloc_local((1,), "uint64")
                    T.assume(LDX % vector == 0)
                    sides[0] = Control[SIDE]
                    row, lane, rank = block // held, (block % held) * row_threads + tx, block % held
                    load_row(X, a, row, lane)
                    # Its stores go out while the row's loads are in flight.
                    exchange["clear_other_side"](Status, sides[0], block, R * held, tx)
                    fold_max(st, a, lane)
                    finish_row(Y, a, None, st, scratch, None, 0, row, lane, rank, tx, None, None, Status, sides, word)
                    exchange["arrive"](Control, sides[0], sides, R * held, tx)

            return softmax_row_held

        @T.prim_func
        def softmax_row_fused(X: XT, Y: T.Tensor((R, N), out_dtype)):
            with launch(R) as block:
                if min_blocks > 1:
                    T.annotate_min_blocks_per_sm(min_blocks)
                tx = T.get_thread_binding()
                a = T.alloc_local((vecs * vector,), dtype)
                e = T.alloc_local((vecs * vector,), ACCUM) if cached else None
                st = T.alloc_local((_STATE,), ACCUM)
                scratch = T.alloc_shared(scratch_shape, ACCUM)
                row, lane, rank = place(block, tx)
                # Static shared memory: peers write it while this block may still use its scratch,
                # so it must not share an address with the dynamic buffers.
                gathered = T.alloc_shared((cluster, 2), ACCUM, scope="shared") if clustered else None
                if clustered:
                    T.cluster_arrive_relaxed()  # paired with the wait before the first remote store
                if windowed:
                    # The rows as flat runs of memory; ``at``: the row's first window in X and in
                    # Y, then its skew into them.
                    XF = T.Tensor((R * LDX,), dtype, X.data)
                    YF = T.Tensor((R * N,), out_dtype, Y.data)
                    at = T.alloc_local((3,), "int64")
                    o = T.alloc_local((vector,), out_dtype)
                    first_window(at, 0, row, LDX)
                    first_window(at, 1, row, N)
                    at[2] = T.cast(row, "int64") * LDX - at[0] * vector
                    load_windows(XF, a, row, lane, at[0], T.cast(at[2], "int32"))
                    fold_max(st, a, lane)
                    finish_row(YF, a, e, st, scratch, gathered, 0, row, lane, rank, tx, o, at, None, None, None)
                else:
                    T.assume(LDX % vector == 0)
                    load_row(X, a, row, lane)
                    fold_max(st, a, lane)
                    finish_row(Y, a, e, st, scratch, gathered, 0, row, lane, rank, tx, None, None, None, None, None)

        return softmax_row_fused

    GT, LDG = strided_rows(T, R, N, dtype, "LDG")
    YT, LDY = strided_rows(T, R, N, dtype, "LDY")

    @T.prim_func
    def softmax_bwd_row_fused(
        G: GT,
        Yv: YT,
        DX: T.Tensor((R, N), out_dtype),
    ):
        with launch(R) as block:
            if min_blocks > 1:
                T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            a = T.alloc_local((vecs * vector,), dtype)
            b = T.alloc_local((vecs * vector,), dtype)
            st = T.alloc_local((_STATE,), ACCUM)
            scratch = T.alloc_shared(scratch_shape, ACCUM)
            row, lane, rank = place(block, tx)
            if clustered:
                gathered = T.alloc_shared((cluster, 2), ACCUM, scope="shared")  # see the forward
                T.cluster_arrive_relaxed()  # paired with the wait before the first remote store
            if windowed:
                # ``at``: the row's first window in G, Yv and DX, then its skew into them.
                GF = T.Tensor((R * LDG,), dtype, G.data)
                YF = T.Tensor((R * LDY,), dtype, Yv.data)
                at = T.alloc_local((4,), "int64")
                first_window(at, 0, row, LDG)
                first_window(at, 1, row, LDY)
                first_window(at, 2, row, N)
                at[3] = T.cast(row, "int64") * LDG - at[0] * vector
                load_windows(GF, a, row, lane, at[0], T.cast(at[3], "int32"))
                load_windows(YF, b, row, lane, at[1], T.cast(at[3], "int32"))
            else:
                T.assume(LDG % vector == 0)
                T.assume(LDY % vector == 0)
                load_row(G, a, row, lane)
                load_row(Yv, b, row, lane)
            st[_SUM] = T.cast(0, ACCUM)
            fold_row(st, _SUM, a, b, lane, False)
            reduce(st, _SUM, scratch, 0, tx, False)
            if clustered:
                share(gathered, 0, rank, st[_SUM], st[_SUM])
                st[_SUM] = gathered[0, 0]
                for k in T.unroll(1, cluster):
                    st[_SUM] = st[_SUM] + gathered[k, 0]
            if windowed:
                DF = T.Tensor((R * N,), out_dtype, DX.data)
                o = T.alloc_local((vector,), out_dtype)
                store_windows(DF, a, b, None, o, st, row, lane, at[2], T.cast(at[3], "int32"))
            else:
                store_row(DX, a, b, st, row, lane)

    return softmax_bwd_row_fused


# ---- row stats / row apply (long rows) ------------------------------------------------------------


def _row_segment_macros(T: Any, N: int, vector: int, threads: int, unroll: int, dtype: str,
                        policy: Optional[str] = None) -> Dict[str, Any]:
    """Loads of one step of a segment walk: ``unroll`` chunks of ``threads * vector`` elements,
    16-byte ones with the L2 eviction ``policy`` (see ``cache_hints``).

    Segment ``seg`` of ``S`` covers chunks ``[seg * per, min((seg + 1) * per, chunks))``
    with ``per = ceil(chunks / S)``; a vector is valid when its chunk is in
    the segment and it starts inside the row (``vector`` divides ``N``).
    """
    chunk = threads * vector
    chunks = -(-N // chunk)
    load = vector_load(T, policy, vector, dtype)

    def valid(c0, u, last, tx):
        return T.And(c0 + u < last, (c0 + u) * chunk + tx * vector < N)

    @T.macro
    def load_step(src, buf, row, c0, last, tx):
        for u in T.unroll(unroll):
            if valid(c0, u, last, tx):
                load(buf, u * vector, src, row, (c0 + u) * chunk + tx * vector)

    @T.macro
    def segment_bounds(bounds, seg, segments):
        # [first, last) chunks of this segment; computed once (S > 0, so truncating division is exact).
        bounds[0] = seg * T.truncdiv(chunks + segments - 1, segments)
        bounds[1] = T.min(bounds[0] + T.truncdiv(chunks + segments - 1, segments), chunks)

    return {"chunk": chunk, "chunks": chunks, "valid": valid, "load_step": load_step,
            "segment_bounds": segment_bounds}


def _block_locals(T: Any, variant: SoftmaxVariant, dtype: str, width: int, state: int,
                  scratch_shape: Tuple[int, ...]) -> Any:
    """Macro ``begin()`` of a statistics or application block: its thread index, the load buffers
    ``a`` and (backward) ``b`` of ``width`` elements, ``state`` float32 states, the segment bounds
    and the reduction scratch; ``b`` is None in the forward."""

    @T.macro
    def begin():
        tx = T.get_thread_binding()
        a = T.alloc_local((width,), dtype)
        b = T.alloc_local((width,), dtype) if variant.backward else None
        st = T.alloc_local((state,), ACCUM)
        bounds = T.alloc_local((2,), "int32")
        scratch = T.alloc_shared(scratch_shape, ACCUM)
        return tx, a, b, st, bounds, scratch

    return begin


def _row_inputs(T: Any, variant: SoftmaxVariant, R: Any, N: int, dtype: str, vector: int) -> Tuple[Any, Any, Any]:
    """The types of a row program's inputs (x, or grad_y and y; the second None in the forward)
    and a macro ``assume_aligned()`` stating that their row strides divide into ``vector``."""
    if variant.backward:
        AT, LDA = strided_rows(T, R, N, dtype, "LDG")
        BT, LDB = strided_rows(T, R, N, dtype, "LDY")
    else:
        (AT, LDA), (BT, LDB) = strided_rows(T, R, N, dtype, "LDX"), (None, None)

    @T.macro
    def assume_aligned():
        T.assume(LDA % vector == 0)
        if variant.backward:
            T.assume(LDB % vector == 0)

    return AT, BT, assume_aligned


def row_stats_program(N: int, dtype: str, variant: SoftmaxVariant, *, vector: int, split_threads: int,
                      split_unroll: int, split_cache_hints: int = 0, **_: Any) -> Any:
    """Partial reductions of the ``S`` segments of every row: ``P*[row, seg]`` (float32).

    ``split_cache_hints``: the loads keep their lines in L2 for the apply program's read.
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    threads, unroll = split_threads, split_unroll
    walk = _row_segment_macros(T, N, vector, threads, unroll, dtype,
                               EVICT_LAST if split_cache_hints else None)
    valid, load_step = walk["valid"], walk["load_step"]
    segment_bounds = walk["segment_bounds"]
    reduce = _group_reduce(T, 1, threads)
    scratch_shape = _scratch_shape(threads, 1, threads, 2)
    online = _online_macros(T)
    term = _backward_term(T, variant)
    R = T.dynamic("R")
    S = T.dynamic("S")

    @T.macro
    def fold_step(st, a, b, c0, last, tx):
        if variant.backward:
            for u in T.unroll(unroll):
                if valid(c0, u, last, tx):
                    for k in T.unroll(vector):
                        st[_SUM] = st[_SUM] + term(a[u * vector + k], b[u * vector + k])
        else:
            st[_T2] = -T.infinity(ACCUM)
            for u in T.unroll(unroll):
                if valid(c0, u, last, tx):
                    for k in T.unroll(vector):
                        st[_T2] = T.max(st[_T2], T.cast(a[u * vector + k], ACCUM))
            st[_T2] = T.max(st[_T2], st[_MAX])
            online["rescale"](st, _MAX, _SUM, _T2, _OFFSET)
            for u in T.unroll(unroll):
                if valid(c0, u, last, tx):
                    for k in T.unroll(vector):
                        st[_SUM] = st[_SUM] + T.exp2(T.cast(a[u * vector + k], ACCUM) * LOG2E - st[_OFFSET])

    @T.macro
    def walk_segment(A, B, a, b, st, bounds, row, seg, tx):
        segment_bounds(bounds, seg, S)
        st[_MAX] = -T.infinity(ACCUM)
        st[_SUM] = T.cast(0, ACCUM)
        for step in T.serial(T.truncdiv(bounds[1] - bounds[0] + unroll - 1, unroll)):
            load_step(A, a, row, bounds[0] + step * unroll, bounds[1], tx)
            if variant.backward:
                load_step(B, b, row, bounds[0] + step * unroll, bounds[1], tx)
            fold_step(st, a, b, bounds[0] + step * unroll, bounds[1], tx)

    @T.macro
    def combine_block(st, scratch, tx):
        """Every thread's (max, sum) or sum folded into the block's, in ``st[_MAX]``/``st[_SUM]``."""
        if variant.backward:
            reduce(st, _SUM, scratch, 0, tx, False)
        else:
            st[_T2] = st[_MAX]
            reduce(st, _T2, scratch, 0, tx, True)
            online["rescale"](st, _MAX, _SUM, _T2, _OFFSET)
            reduce(st, _SUM, scratch, 1, tx, False)

    AT, BT, assume_aligned = _row_inputs(T, variant, R, N, dtype, vector)
    begin = _block_locals(T, variant, dtype, unroll * vector, _STATE, scratch_shape)

    @T.macro
    def stats_block(A, B, PM, PS, row, seg):
        T.pdl_trigger()  # the next launch may start early (see kernel_base)
        tx, a, b, st, bounds, scratch = begin()
        assume_aligned()
        walk_segment(A, B, a, b, st, bounds, row, seg, tx)
        combine_block(st, scratch, tx)
        if tx == 0:
            if not variant.backward:
                PM[row, seg] = st[_MAX]
            PS[row, seg] = st[_SUM]

    if not variant.backward:

        @T.prim_func
        def softmax_row_stats(
            X: AT,
            PM: T.Tensor((R, S), ACCUM),
            PS: T.Tensor((R, S), ACCUM),
        ):
            with T.Kernel(R, S, threads=threads, prelude=CACHE_HINT_PRELUDE) as (row, seg):
                stats_block(X, None, PM, PS, row, seg)

        return softmax_row_stats

    @T.prim_func
    def softmax_bwd_row_stats(
        G: AT,
        Yv: BT,
        PS: T.Tensor((R, S), ACCUM),
    ):
        with T.Kernel(R, S, threads=threads, prelude=CACHE_HINT_PRELUDE) as (row, seg):
            stats_block(G, Yv, None, PS, row, seg)

    return softmax_bwd_row_stats


def row_apply_program(N: int, dtype: str, variant: SoftmaxVariant, *, vector: int, split_threads: int,
                      split_unroll: int, split_cache_hints: int = 0, out_dtype: Optional[str] = None,
                      **_: Any) -> Any:
    """Combine the ``S`` partials of a row, then write the output of one segment per block.

    ``split_cache_hints``: the loads, the last use of their lines, let L2 drop them first.
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    threads, unroll = split_threads, split_unroll
    walk = _row_segment_macros(T, N, vector, threads, unroll, dtype,
                               EVICT_FIRST if split_cache_hints else None)
    chunk, valid, load_step = walk["chunk"], walk["valid"], walk["load_step"]
    segment_bounds = walk["segment_bounds"]
    reduce = _group_reduce(T, 1, threads)
    scratch_shape = _scratch_shape(threads, 1, threads, 2)
    online = _online_macros(T)
    finalize = _finalize_forward(T, variant)
    out_dtype = out_dtype or dtype
    output = _output_value(T, variant, out_dtype)
    R = T.dynamic("R")
    S = T.dynamic("S")

    @T.macro
    def gather_partials(PM, PS, st, scratch, row, tx):
        """The row's reduction from its ``S`` partials, in every thread."""
        st[_MAX] = -T.infinity(ACCUM)
        st[_SUM] = T.cast(0, ACCUM)
        for p in T.serial(T.ceildiv(S, threads)):
            if p * threads + tx < S:
                if variant.backward:
                    st[_SUM] = st[_SUM] + PS[row, p * threads + tx]
                else:
                    online["merge"](
                        st, _MAX, _SUM, PM[row, p * threads + tx], PS[row, p * threads + tx], _T0, _T1
                    )
        if variant.backward:
            reduce(st, _SUM, scratch, 0, tx, False)
        else:
            st[_T2] = st[_MAX]
            reduce(st, _T2, scratch, 0, tx, True)
            online["rescale"](st, _MAX, _SUM, _T2, _OFFSET)
            reduce(st, _SUM, scratch, 1, tx, False)
            finalize(st, 0)

    @T.macro
    def write_segment(A, B, D, a, b, st, bounds, row, seg, tx):
        segment_bounds(bounds, seg, S)
        steps = T.truncdiv(bounds[1] - bounds[0] + unroll - 1, unroll)
        # Last step first: the stats program read the segment front to back, so
        # its end is the likeliest still to be in L2.
        for back in T.serial(steps):
            step = steps - 1 - back
            load_step(A, a, row, bounds[0] + step * unroll, bounds[1], tx)
            if variant.backward:
                load_step(B, b, row, bounds[0] + step * unroll, bounds[1], tx)
            for u in T.unroll(unroll):
                if valid(bounds[0] + step * unroll, u, bounds[1], tx):
                    for k in T.vectorized(vector):
                        D[row, (bounds[0] + step * unroll + u) * chunk + tx * vector + k] = output(
                            a[u * vector + k], b[u * vector + k], st, 0
                        )

    AT, BT, assume_aligned = _row_inputs(T, variant, R, N, dtype, vector)
    begin = _block_locals(T, variant, dtype, unroll * vector, _STATE, scratch_shape)

    @T.macro
    def apply_block(A, B, PM, PS, D, row, seg):
        T.pdl_sync()  # wait for the launch before (see kernel_base)
        tx, a, b, st, bounds, scratch = begin()
        assume_aligned()
        gather_partials(PM, PS, st, scratch, row, tx)
        if variant.backward:
            write_segment(A, B, D, a, b, st, bounds, row, seg, tx)
        else:
            write_segment(A, A, D, a, a, st, bounds, row, seg, tx)

    if not variant.backward:

        @T.prim_func
        def softmax_row_apply(
            X: AT,
            PM: T.Tensor((R, S), ACCUM),
            PS: T.Tensor((R, S), ACCUM),
            Y: T.Tensor((R, N), out_dtype),
        ):
            with T.Kernel(R, S, threads=threads, prelude=CACHE_HINT_PRELUDE) as (row, seg):
                apply_block(X, None, PM, PS, Y, row, seg)

        return softmax_row_apply

    @T.prim_func
    def softmax_bwd_row_apply(
        G: AT,
        Yv: BT,
        PS: T.Tensor((R, S), ACCUM),
        DX: T.Tensor((R, N), out_dtype),
    ):
        with T.Kernel(R, S, threads=threads, prelude=CACHE_HINT_PRELUDE) as (row, seg):
            apply_block(G, Yv, PS, PS, DX, row, seg)

    return softmax_bwd_row_apply


# ---- column stats / column apply ((outer, N, inner) with inner > 1) --------------------------------


def _column_walk(T: Any, N: int, cvec: int, lanes: int, unroll: int, dtype: str, hints: int) -> Dict[str, Any]:
    """Segment bounds along the axis and the loads of one step of a column walk.

    Segment ``seg`` of ``S`` covers ``[seg * per, min((seg + 1) * per, N))``
    with ``per = ceil(N / S)``.  In a step, lane ``l`` reads positions
    ``n0 + u * lanes`` (``n0`` includes the lane) for ``u < unroll``.
    ``load_step`` is the first read of the positions and ``reload_step`` the
    second; with ``hints`` their 16-byte loads keep the lines in L2 for the
    second read and then let them go (see ``cache_hints``).
    """

    def valid(n, last, i0, inner):
        return T.And(n < last, i0 < inner)

    @T.macro
    def segment_bounds(bounds, seg, segments):
        bounds[0] = seg * T.truncdiv(N + segments - 1, segments)
        bounds[1] = T.min(bounds[0] + T.truncdiv(N + segments - 1, segments), N)

    def load_macro(policy: Optional[str]) -> Any:
        load = vector_load(T, policy, cvec, dtype)

        @T.macro
        def load_step(src, buf, o, n0, last, i0, inner):
            for u in T.unroll(unroll):
                if valid(n0 + u * lanes, last, i0, inner):
                    load(buf, u * cvec, src, o, n0 + u * lanes, i0)

        return load_step

    return {"valid": valid, "segment_bounds": segment_bounds,
            "load_step": load_macro(EVICT_LAST if hints else None),
            "reload_step": load_macro(EVICT_FIRST if hints else None)}


def _column_layout(cvec: int, col_threads: int, column_threads: int) -> Tuple[int, int]:
    """(lanes along the axis, inner positions per block) of a column block."""
    if not (is_pow2(cvec) and is_pow2(col_threads) and col_threads <= MAX_COL_THREADS):
        raise ValueError(f"softmax column programs: bad tile cvec={cvec} col_threads={col_threads}")
    return column_threads // col_threads, col_threads * cvec


def _column_setup(T: Any, N: int, cvec: int, col_threads: int, threads: int, unroll: int, dtype: str,
                  hints: int) -> Dict[str, Any]:
    """What both column programs share: the walk, the layout, the lane reduction and the state slots.

    ``place_thread(bx, tx, I)`` gives the outer index of column block ``bx`` and the first inner
    position of its thread ``tx`` (``column_placement``); ``slot(name, k)`` is state ``name`` of
    the thread's ``k``-th inner position.
    """
    lanes, tile = _column_layout(cvec, col_threads, threads)

    def slot(name, k):
        return name * cvec + k

    return {**_column_walk(T, N, cvec, lanes, unroll, dtype, hints), "cvec": cvec, "lanes": lanes, "tile": tile,
            "slot": slot, "unroll": unroll, "place_thread": column_placement(T, tile, col_threads, cvec),
            "reduce": _group_reduce(T, col_threads, lanes),
            "scratch_shape": _scratch_shape(threads, col_threads, lanes, 2 * cvec)}


def _column_passes(T: Any, out_dtype: str, variant: SoftmaxVariant, setup: Dict[str, Any]) -> Dict[str, Any]:
    """Macros walking axis positions ``[first, last)`` of a thread's columns.

    ``reduce_walk`` folds them into the thread's column states (the backward's
    sum, or the forward's running maximum and sum of exponentials, rescaled
    once per step); ``write_walk`` reads them again and writes the output from
    merged states; ``write_step`` writes one step already loaded.
    """
    valid, load_step, reload_step = setup["valid"], setup["load_step"], setup["reload_step"]
    lanes, cvec, slot, unroll = setup["lanes"], setup["cvec"], setup["slot"], setup["unroll"]
    online = _online_macros(T)
    term = _backward_term(T, variant)
    output = _output_value(T, variant, out_dtype, cvec)

    @T.macro
    def fold_step(st, a, b, n0, last, i0, inner):
        for k in T.unroll(cvec):
            if variant.backward:
                for u in T.unroll(unroll):
                    if valid(n0 + u * lanes, last, i0, inner):
                        st[slot(_SUM, k)] = st[slot(_SUM, k)] + term(a[u * cvec + k], b[u * cvec + k])
            else:
                st[slot(_T2, k)] = st[slot(_MAX, k)]
                for u in T.unroll(unroll):
                    if valid(n0 + u * lanes, last, i0, inner):
                        st[slot(_T2, k)] = T.max(st[slot(_T2, k)], T.cast(a[u * cvec + k], ACCUM))
                online["rescale"](st, slot(_MAX, k), slot(_SUM, k), slot(_T2, k), slot(_OFFSET, k))
                for u in T.unroll(unroll):
                    if valid(n0 + u * lanes, last, i0, inner):
                        st[slot(_SUM, k)] = st[slot(_SUM, k)] + T.exp2(
                            T.cast(a[u * cvec + k], ACCUM) * LOG2E - st[slot(_OFFSET, k)]
                        )

    @T.macro
    def reduce_walk(A, B, a, b, st, first, last, o, lane, i0, inner):
        for k in T.unroll(cvec):
            st[slot(_MAX, k)] = -T.infinity(ACCUM)
            st[slot(_SUM, k)] = T.cast(0, ACCUM)
        for step in T.serial(T.truncdiv(last - first + lanes * unroll - 1, lanes * unroll)):
            load_step(A, a, o, first + step * lanes * unroll + lane, last, i0, inner)
            if variant.backward:
                load_step(B, b, o, first + step * lanes * unroll + lane, last, i0, inner)
            fold_step(st, a, b, first + step * lanes * unroll + lane, last, i0, inner)

    @T.macro
    def write_step(D, a, b, st, o, n0, last, i0, inner):
        for u in T.unroll(unroll):
            if valid(n0 + u * lanes, last, i0, inner):
                for k in T.vectorized(cvec):
                    D[o, n0 + u * lanes, i0 + k] = output(a[u * cvec + k], b[u * cvec + k], st, k)

    @T.macro
    def write_walk(A, B, D, a, b, st, first, last, o, lane, i0, inner):
        for step in T.serial(T.truncdiv(last - first + lanes * unroll - 1, lanes * unroll)):
            reload_step(A, a, o, first + step * lanes * unroll + lane, last, i0, inner)
            if variant.backward:
                reload_step(B, b, o, first + step * lanes * unroll + lane, last, i0, inner)
            write_step(D, a, b, st, o, first + step * lanes * unroll + lane, last, i0, inner)

    return {"reduce_walk": reduce_walk, "write_walk": write_walk, "write_step": write_step}


def _combine_lanes(T: Any, variant: SoftmaxVariant, setup: Dict[str, Any],
                   finalize: Optional[Callable[..., Any]] = None) -> Callable[..., Any]:
    """Macro: merge each of a thread's ``cvec`` column states over the block's lanes.

    The backward sums; the forward takes the maximum, moves every sum to it and
    sums.  ``finalize(st, k)``, if given, then runs on each merged state.
    """
    cvec, slot, reduce = setup["cvec"], setup["slot"], setup["reduce"]
    online = _online_macros(T)

    @T.macro
    def combine_lanes(st, scratch, tx):
        for k in T.unroll(cvec):
            if variant.backward:
                reduce(st, slot(_SUM, k), scratch, k, tx, False)
            else:
                st[slot(_T2, k)] = st[slot(_MAX, k)]
                reduce(st, slot(_T2, k), scratch, k, tx, True)
                online["rescale"](st, slot(_MAX, k), slot(_SUM, k), slot(_T2, k), slot(_OFFSET, k))
                reduce(st, slot(_SUM, k), scratch, cvec + k, tx, False)
                if finalize is not None:
                    finalize(st, k)

    return combine_lanes


def _column_inputs(T: Any, variant: SoftmaxVariant, cvec: int, I: Any) -> Tuple[Tuple[Any, ...], Tuple[Any, ...], Any]:
    """The symbolic (outer, axis) strides of a column program's inputs (grad_y's and y's, or x's and
    ``(None, None)``) and a macro ``assume_aligned()`` stating that they and ``I`` divide into ``cvec``."""
    if variant.backward:
        first = (T.dynamic("SGO", "int64"), T.dynamic("SGN", "int64"))
        second = (T.dynamic("SYO", "int64"), T.dynamic("SYN", "int64"))
    else:
        first, second = (T.dynamic("SXO", "int64"), T.dynamic("SXN", "int64")), (None, None)

    @T.macro
    def assume_aligned():
        T.assume(first[0] % cvec == 0)
        T.assume(first[1] % cvec == 0)
        if variant.backward:
            T.assume(second[0] % cvec == 0)
            T.assume(second[1] % cvec == 0)
        T.assume(I % cvec == 0)

    return first, second, assume_aligned


def column_stats_program(N: int, dtype: str, variant: SoftmaxVariant, *, cvec: int, col_threads: int,
                         column_threads: int, column_unroll: int, column_cache_hints: int = 0, **_: Any) -> Any:
    """Partial reductions of the ``S`` axis segments of every column: ``P*[o, seg, i]`` (float32)."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    threads, unroll = column_threads, column_unroll
    setup = _column_setup(T, N, cvec, col_threads, threads, unroll, dtype, column_cache_hints)
    segment_bounds, tile, slot = setup["segment_bounds"], setup["tile"], setup["slot"]
    scratch_shape = setup["scratch_shape"]
    reduce_walk = _column_passes(T, dtype, variant, setup)["reduce_walk"]  # writes nothing
    O = T.dynamic("O")
    I = T.dynamic("I")
    S = T.dynamic("S")

    @T.macro
    def walk_segment(A, B, a, b, st, bounds, o, seg, lane, i0):
        segment_bounds(bounds, seg, S)
        reduce_walk(A, B, a, b, st, bounds[0], bounds[1], o, lane, i0, I)

    combine_block = _combine_lanes(T, variant, setup)

    (SAO, SAN), (SBO, SBN), assume_aligned = _column_inputs(T, variant, cvec, I)
    begin = _block_locals(T, variant, dtype, unroll * cvec, _STATE * cvec, scratch_shape)
    place_thread = setup["place_thread"]

    @T.macro
    def stats_block(A, B, PM, PS, bx, seg):
        T.pdl_trigger()  # the next launch may start early (see kernel_base)
        tx, a, b, st, bounds, scratch = begin()
        assume_aligned()
        o, i0 = place_thread(bx, tx, I)
        walk_segment(A, B, a, b, st, bounds, o, seg, tx // col_threads, i0)
        combine_block(st, scratch, tx)
        if tx < col_threads and i0 < I:
            if not variant.backward:
                for k in T.vectorized(cvec):
                    PM[o, seg, i0 + k] = st[slot(_MAX, k)]
            for k in T.vectorized(cvec):
                PS[o, seg, i0 + k] = st[slot(_SUM, k)]

    if not variant.backward:

        @T.prim_func
        def softmax_column_stats(
            X: T.StridedTensor((O, N, I), (SAO, SAN, 1), dtype),
            PM: T.Tensor((O, S, I), ACCUM),
            PS: T.Tensor((O, S, I), ACCUM),
        ):
            with T.Kernel(O * T.ceildiv(I, tile), S, threads=threads, prelude=CACHE_HINT_PRELUDE) as (bx, seg):
                stats_block(X, None, PM, PS, bx, seg)

        return softmax_column_stats

    @T.prim_func
    def softmax_bwd_column_stats(
        G: T.StridedTensor((O, N, I), (SAO, SAN, 1), dtype),
        Yv: T.StridedTensor((O, N, I), (SBO, SBN, 1), dtype),
        PS: T.Tensor((O, S, I), ACCUM),
    ):
        with T.Kernel(O * T.ceildiv(I, tile), S, threads=threads, prelude=CACHE_HINT_PRELUDE) as (bx, seg):
            stats_block(G, Yv, None, PS, bx, seg)

    return softmax_bwd_column_stats


def column_apply_program(N: int, dtype: str, variant: SoftmaxVariant, *, cvec: int, col_threads: int,
                         column_threads: int, column_unroll: int, column_cache_hints: int = 0,
                         out_dtype: Optional[str] = None, **_: Any) -> Any:
    """Combine the ``S`` partials of each column, then write one axis segment per block."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    threads, unroll = column_threads, column_unroll
    setup = _column_setup(T, N, cvec, col_threads, threads, unroll, dtype, column_cache_hints)
    segment_bounds, lanes, tile = setup["segment_bounds"], setup["lanes"], setup["tile"]
    slot, scratch_shape = setup["slot"], setup["scratch_shape"]
    online = _online_macros(T)
    combine_lanes = _combine_lanes(T, variant, setup, _finalize_forward(T, variant, cvec))
    out_dtype = out_dtype or dtype
    write_walk = _column_passes(T, out_dtype, variant, setup)["write_walk"]
    O = T.dynamic("O")
    I = T.dynamic("I")
    S = T.dynamic("S")

    @T.macro
    def gather_partials(PM, PS, st, scratch, o, lane, i0, tx):
        for k in T.unroll(cvec):
            st[slot(_MAX, k)] = -T.infinity(ACCUM)
            st[slot(_SUM, k)] = T.cast(0, ACCUM)
        for p in T.serial(T.truncdiv(S + lanes - 1, lanes)):
            if p * lanes + lane < S and i0 < I:
                for k in T.unroll(cvec):
                    if variant.backward:
                        st[slot(_SUM, k)] = st[slot(_SUM, k)] + PS[o, p * lanes + lane, i0 + k]
                    else:
                        online["merge"](
                            st, slot(_MAX, k), slot(_SUM, k), PM[o, p * lanes + lane, i0 + k],
                            PS[o, p * lanes + lane, i0 + k], slot(_T0, k), slot(_T1, k),
                        )
        combine_lanes(st, scratch, tx)

    @T.macro
    def write_segment(A, B, D, a, b, st, bounds, o, seg, lane, i0):
        segment_bounds(bounds, seg, S)
        write_walk(A, B, D, a, b, st, bounds[0], bounds[1], o, lane, i0, I)

    (SAO, SAN), (SBO, SBN), assume_aligned = _column_inputs(T, variant, cvec, I)
    begin = _block_locals(T, variant, dtype, unroll * cvec, _STATE * cvec, scratch_shape)
    place_thread = setup["place_thread"]

    @T.macro
    def apply_block(A, B, PM, PS, D, bx, seg):
        T.pdl_sync()  # wait for the launch before (see kernel_base)
        tx, a, b, st, bounds, scratch = begin()
        assume_aligned()
        o, i0 = place_thread(bx, tx, I)
        gather_partials(PM, PS, st, scratch, o, tx // col_threads, i0, tx)
        if variant.backward:
            write_segment(A, B, D, a, b, st, bounds, o, seg, tx // col_threads, i0)
        else:
            write_segment(A, A, D, a, a, st, bounds, o, seg, tx // col_threads, i0)

    if not variant.backward:

        @T.prim_func
        def softmax_column_apply(
            X: T.StridedTensor((O, N, I), (SAO, SAN, 1), dtype),
            PM: T.Tensor((O, S, I), ACCUM),
            PS: T.Tensor((O, S, I), ACCUM),
            Y: T.Tensor((O, N, I), out_dtype),
        ):
            with T.Kernel(O * T.ceildiv(I, tile), S, threads=threads, prelude=CACHE_HINT_PRELUDE) as (bx, seg):
                apply_block(X, None, PM, PS, Y, bx, seg)

        return softmax_column_apply

    @T.prim_func
    def softmax_bwd_column_apply(
        G: T.StridedTensor((O, N, I), (SAO, SAN, 1), dtype),
        Yv: T.StridedTensor((O, N, I), (SBO, SBN, 1), dtype),
        PS: T.Tensor((O, S, I), ACCUM),
        DX: T.Tensor((O, N, I), out_dtype),
    ):
        with T.Kernel(O * T.ceildiv(I, tile), S, threads=threads, prelude=CACHE_HINT_PRELUDE) as (bx, seg):
            apply_block(G, Yv, PS, PS, DX, bx, seg)

    return softmax_bwd_column_apply


# ---- column fused (whole columns a block) --------------------------------------------------------------


def _cluster_share_columns(T: Any, variant: SoftmaxVariant, cluster: int, col_threads: int,
                           setup: Dict[str, Any]) -> Callable[..., Any]:
    """Macro: every block of a column cluster gets each block's merged column states.

    After it, ``gathered[r, p, c]`` holds part ``p`` (the forward's maximum and
    sum, or the backward's sum) of column ``c`` of the block of rank ``r``.
    Lane ``l < cluster`` of each column group stores its ``cvec`` columns'
    states into the block of rank ``l``; the barriers are ``_cluster_share``'s.
    """
    cvec, slot = setup["cvec"], setup["slot"]

    @T.macro
    def store(gathered, rank, part, column, tx, value):
        T.call_extern("handle", "tileops_store_to_peer", T.address_of(gathered[rank, part, column]),
                      tx // col_threads, value)

    @T.macro
    def share(gathered, rank, st, tx):
        T.cluster_wait()
        if tx // col_threads < cluster:
            for k in T.unroll(cvec):
                if variant.backward:
                    store(gathered, rank, 0, (tx % col_threads) * cvec + k, tx, st[slot(_SUM, k)])
                else:
                    store(gathered, rank, 0, (tx % col_threads) * cvec + k, tx, st[slot(_MAX, k)])
                    store(gathered, rank, 1, (tx % col_threads) * cvec + k, tx, st[slot(_SUM, k)])
        T.cluster_sync()

    return share


def column_fused_program(N: int, dtype: str, variant: SoftmaxVariant, *, cvec: int, col_threads: int,
                         threads: int, fused_column_unroll: int, column_cache_hints: int = 0, cluster: int = 1,
                         hinted: int = 0, out_dtype: Optional[str] = None, **_: Any) -> Any:
    """Whole columns in one block, or in one cluster of blocks: reduce, merge, write; no partials.

    Block ``bx`` takes outer index ``o`` and ``tile = col_threads * cvec``
    neighbouring inner positions, and walks the axis twice: once to reduce,
    once to write, the second reading what the first just read (from L2 as
    far as the blocks in flight fit there).  With ``cluster > 1`` the axis
    is cut into ``cluster`` equal segments, one a block of a thread block
    cluster; the blocks exchange their columns' merged states through
    distributed shared memory before writing, so more blocks share the GPU
    and each walks a shorter segment.  When one step of a block covers its
    segment (``ceil(N / cluster) <= lanes * fused_column_unroll``), the
    second walk is not needed: the thread writes from the registers it loaded.
    ``hinted`` (a call's, ``SoftmaxFamilyKernel.column_programs``) loads with ``evict_last`` as
    ``column_cache_hints`` does for every call.
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    lanes, tile = _column_layout(cvec, col_threads, threads)
    clustered = cluster > 1
    per = -(-N // cluster)  # axis positions of one block's segment
    resident = per <= lanes * fused_column_unroll
    unroll = -(-per // lanes) if resident else fused_column_unroll
    setup = _column_setup(T, N, cvec, col_threads, threads, unroll, dtype, int(column_cache_hints or hinted))
    place_thread, scratch_shape, slot = setup["place_thread"], setup["scratch_shape"], setup["slot"]
    out_dtype = out_dtype or dtype
    passes = _column_passes(T, out_dtype, variant, setup)
    finalize = _finalize_forward(T, variant, cvec)
    combine_lanes = _combine_lanes(T, variant, setup, None if clustered else finalize)
    share = _cluster_share_columns(T, variant, cluster, col_threads, setup)
    merge = _online_macros(T)["merge"]
    O = T.dynamic("O")
    I = T.dynamic("I")

    @T.macro
    def merge_cluster(st, gathered, tx):
        """Each of the thread's column states from the cluster's blocks' states."""
        for k in T.unroll(cvec):
            if variant.backward:
                st[slot(_SUM, k)] = T.cast(0, ACCUM)
                for r in T.unroll(cluster):
                    st[slot(_SUM, k)] = st[slot(_SUM, k)] + gathered[r, 0, (tx % col_threads) * cvec + k]
            else:
                st[slot(_MAX, k)] = -T.infinity(ACCUM)
                st[slot(_SUM, k)] = T.cast(0, ACCUM)
                for r in T.unroll(cluster):
                    merge(st, slot(_MAX, k), slot(_SUM, k), gathered[r, 0, (tx % col_threads) * cvec + k],
                          gathered[r, 1, (tx % col_threads) * cvec + k], slot(_T0, k), slot(_T1, k))
                finalize(st, k)

    @T.macro
    def reduce_and_write(A, B, D, bx, tx):
        a = T.alloc_local((unroll * cvec,), dtype)
        b = T.alloc_local((unroll * cvec,), dtype) if variant.backward else a
        st = T.alloc_local((_STATE * cvec,), ACCUM)
        scratch = T.alloc_shared(scratch_shape, ACCUM)
        if clustered:
            # Static shared memory, apart from the scratch the peers' stores may overlap in time.
            gathered = T.alloc_shared((cluster, variant.partials, tile), ACCUM, scope="shared")
            T.cluster_arrive_relaxed()  # paired with the wait before the first remote store
        column_block = T.truncdiv(bx, cluster)
        rank = bx % cluster
        o, i0 = place_thread(column_block, tx, I)
        lane = tx // col_threads
        first = rank * per
        last = T.min(first + per, N)
        passes["reduce_walk"](A, B, a, b, st, first, last, o, lane, i0, I)
        combine_lanes(st, scratch, tx)
        if clustered:
            share(gathered, rank, st, tx)
            merge_cluster(st, gathered, tx)
        if resident:
            passes["write_step"](D, a, b, st, o, first + lane, last, i0, I)
        else:
            passes["write_walk"](A, B, D, a, b, st, first, last, o, lane, i0, I)

    def launch():
        blocks = O * T.ceildiv(I, tile) * cluster
        if clustered:
            return T.Kernel(blocks, threads=threads, cluster_dims=(cluster, 1, 1),
                            prelude=CACHE_HINT_PRELUDE + PEER_STORE)
        return T.Kernel(blocks, threads=threads, prelude=CACHE_HINT_PRELUDE)

    (SAO, SAN), (SBO, SBN), assume_aligned = _column_inputs(T, variant, cvec, I)

    @T.macro
    def fused_block(A, B, D, bx):
        assume_aligned()
        reduce_and_write(A, B, D, bx, T.get_thread_binding())

    if not variant.backward:

        @T.prim_func
        def softmax_column_fused(
            X: T.StridedTensor((O, N, I), (SAO, SAN, 1), dtype),
            Y: T.Tensor((O, N, I), out_dtype),
        ):
            with launch() as bx:
                fused_block(X, X, Y, bx)

        return softmax_column_fused

    @T.prim_func
    def softmax_bwd_column_fused(
        G: T.StridedTensor((O, N, I), (SAO, SAN, 1), dtype),
        Yv: T.StridedTensor((O, N, I), (SBO, SBN, 1), dtype),
        DX: T.Tensor((O, N, I), out_dtype),
    ):
        with launch() as bx:
            fused_block(G, Yv, DX, bx)

    return softmax_bwd_column_fused


# ---- program table and kernels ------------------------------------------------------------------------


def row_cluster_program(N: int, dtype: str, variant: SoftmaxVariant, *, vector: int, cluster: int,
                        cluster_threads: int, cluster_min_blocks: int = 1, cache_exp: int = 0,
                        cluster_cache_hints: int = 0, windowed: int = 0, out_dtype: Optional[str] = None,
                        **_: Any) -> Any:
    """A row held by a cluster of ``cluster`` blocks of ``cluster_threads`` threads (see ``row_fused_program``),
    built for ``cluster_min_blocks`` blocks an SM; ``cluster_cache_hints`` is its ``hinted``."""
    return row_fused_program(N, dtype, variant, vector=vector, row_threads=cluster_threads,
                             block_threads=cluster_threads, cache_exp=cache_exp, min_blocks=cluster_min_blocks,
                             cluster=cluster, hinted=cluster_cache_hints, windowed=windowed, out_dtype=out_dtype)


def row_held_program(N: int, dtype: str, variant: SoftmaxVariant, *, vector: int, held: int, held_threads: int,
                     held_min_blocks: int = 1, out_dtype: Optional[str] = None, **_: Any) -> Any:
    """A forward's row held by ``held`` blocks of ``held_threads`` threads that exchange their pairs
    through global memory (see ``row_fused_program``), built for ``held_min_blocks`` blocks an SM."""
    return row_fused_program(N, dtype, variant, vector=vector, row_threads=held_threads, block_threads=held_threads,
                             min_blocks=held_min_blocks, held=held, out_dtype=out_dtype)


def row_staged_program(N: int, dtype: str, variant: SoftmaxVariant, **config: Any) -> Any:
    """The fused program's rows with the next ``row_stages`` rows staged in shared memory (see
    ``row_fused_program``); it takes the number of resident blocks as its last argument."""
    return row_fused_program(N, dtype, variant, **config, staged=1)


def row_cluster_staged_program(N: int, dtype: str, variant: SoftmaxVariant, *, vector: int, cluster: int,
                               cache_exp: int = 0, cluster_stages: int = 1, out_dtype: Optional[str] = None,
                               **_: Any) -> Any:
    """The row cluster program's rows taken in turn by a wave of resident clusters of 1024-thread
    blocks, each block staging its share of the next ``cluster_stages`` rows (see
    ``row_fused_program``); it takes the number of resident blocks (a multiple of ``cluster``) as
    its last argument."""
    return row_fused_program(N, dtype, variant, vector=vector, row_threads=MAX_THREADS, block_threads=MAX_THREADS,
                             cache_exp=cache_exp, cluster=cluster, staged=1, row_stages=cluster_stages,
                             out_dtype=out_dtype)


_BUILDERS: Dict[str, Callable[..., Any]] = {
    ROW_FUSED: row_fused_program,
    ROW_STAGED: row_staged_program,
    ROW_CLUSTER: row_cluster_program,
    ROW_CLUSTER_STAGED: row_cluster_staged_program,
    ROW_HELD: row_held_program,
    ROW_STATS: row_stats_program,
    ROW_APPLY: row_apply_program,
    COLUMN_STATS: column_stats_program,
    COLUMN_APPLY: column_apply_program,
    COLUMN_FUSED: column_fused_program,
}


def build_program(name: str, N: int, dtype: torch.dtype, variant: SoftmaxVariant, config: Dict[str, int],
                  params: ProgramParams, out_dtype: Optional[torch.dtype] = None) -> Any:
    """The TileLang ``prim_func`` of program ``name`` for one config and shape parameters; the output
    of ``out_dtype`` (default ``dtype``)."""
    if name not in _BUILDERS:
        raise ValueError(f"softmax kernels: unknown program {name!r}; expected one of {list(_BUILDERS)}")
    _check_config(config)
    return _BUILDERS[name](N, torch_dtype_to_tl(dtype), variant, **config, **dict(params),
                           out_dtype=torch_dtype_to_tl(out_dtype or dtype))


class SoftmaxFamilyKernel(Kernel):
    """One member of the softmax family (see the module docstring) along an axis of length ``N``.

    ``forward(*inputs, out)`` takes the inputs (``x``, or ``grad_y`` and ``y``)
    as ``(rows, N)`` views whose rows have unit stride, or as
    ``(outer, N, inner)`` views whose innermost axis has unit stride, and a
    contiguous preallocated ``out`` of the same shape.  The access width
    follows the alignment of each call's tensors, so any such view works.

    Args:
        N: length of the reduced axis, fixed at construction.
        dtype: dtype of inputs and output (float16, bfloat16, float32).
        out_dtype: the output's dtype, where it differs: a forward's float32 from half precision,
            a backward's any (its input's, for the gradient).
        config: explicit config (keys of ``default_config``; may be partial).
        tune: pick the fastest of ``autotune_configs`` on the current GPU.
    """

    variant: SoftmaxVariant = SoftmaxVariant(backward=False, log=False)
    # "2": fused rows take the hint per call, from ``row_hinted_min_mib`` on (was ``row_cache_hints``);
    # "3": the row staged program (``row_stages``); "4": the row cluster staged program (``cluster_stages``);
    # "5": odd rows in windows (``row_windows``); "6": small fused column calls hinted
    # (``column_hinted_max_mib``); "7": the row held program (``held_threads``, ...).
    version = "7"

    def __init__(
        self,
        N: int,
        dtype: torch.dtype,
        *,
        config: Optional[Dict[str, Any]] = None,
        tune: bool = False,
        out_dtype: Optional[torch.dtype] = None,
    ) -> None:
        name = type(self).__name__
        check_kernel_args(name, dtype, N=N)
        check_out_dtype(name, dtype, out_dtype, rounds=self.variant.backward)
        self.N = int(N)
        # Accesses as wide as 16 bytes of the wider of the input and the output: a float32 output of
        # half-precision rows then takes 16-byte stores (and 8-byte loads), each warp's covering
        # whole sectors.  Stores of 32 bytes a thread, two 16-byte halves each filling half of
        # every sector a warp touches, ran at 60-72 % of copy bandwidth where these reach 88-94 %
        # (H200, softmax of 32768 x 4096 bf16: 263.0 us against 200.1; 8192 x 32768: 625.8 against 428.8).
        widest = out_dtype if out_dtype is not None and out_dtype.itemsize > dtype.itemsize else dtype
        self._row_vector = row_vector(self.N, widest)
        self._max_vector = max_vector(widest)
        # Rows no 16-byte access can start may be read in windows (``windows_allowed``).
        self._may_window = self.N % self._max_vector != 0
        self._held_workspaces = ExchangeWorkspaces()
        super().__init__(dtype, config=config, tune=tune, out_dtype=out_dtype)

    # ---- configs -----------------------------------------------------------------------------
    @property
    def default_config(self) -> Dict[str, Any]:
        return softmax_default_config(self.N, self.dtype, self.variant.backward, has_fast_memory(),
                                      self.variant.log)

    @property
    def autotune_configs(self) -> List[Dict[str, Any]]:
        return softmax_autotune_configs(self.N, self.dtype, self.variant.backward, self.variant.log)

    def fused(self, config: Optional[Dict[str, Any]] = None) -> bool:
        """Whether rows take the fused program under ``config`` (default: the current one)."""
        config = self.config if config is None else config
        return fused_fits(self.N, self.dtype, self.variant.backward, config["row_threads"])

    def row_cluster(self, config: Optional[Dict[str, Any]] = None) -> Optional[int]:
        """Blocks of the row cluster program under ``config``, or None where rows never take it."""
        config = self.config if config is None else config
        if self.fused(config):
            return None
        return row_cluster_size(self.N, self.dtype, self.variant.backward, config["cluster_threads"],
                                config["max_cluster"])

    def least_cluster_rows(self, sm_count: int) -> float:
        """The fewest rows that take the row cluster program on ``sm_count`` SMs (inf: none do)."""
        cluster = self.row_cluster()
        if cluster is None:
            return math.inf
        threads = CLUSTER_MIN_THREADS_PER_SM[self.variant.backward] * sm_count
        return -(-threads // (cluster * self.config["cluster_threads"]))

    def stages_rows(self, vector: int, config: Optional[Dict[str, Any]] = None) -> bool:
        """Whether fused rows read ``vector`` elements at a time take the row staged program."""
        config = self.config if config is None else config
        return (config["row_stages"] > 0 and not self.variant.backward and vector == self._max_vector
                and config["row_threads"] == config["block_threads"] and self.fused(config))

    def stages_clusters(self, vector: int, config: Optional[Dict[str, Any]] = None) -> bool:
        """Whether rows too long for one block, read ``vector`` elements at a time, may take the row
        cluster staged program: a forward's, ``cluster_stages`` rows ahead, whose rows two
        1024-thread blocks hold (``STAGED_CLUSTER``), in 16-byte copies that fit in shared memory."""
        config = self.config if config is None else config
        return (config["cluster_stages"] > 0 and not self.variant.backward and not self.fused(config)
                and vector == self._max_vector
                and row_cluster_size(self.N, self.dtype, False, MAX_THREADS, config["max_cluster"]) == STAGED_CLUSTER
                and staged_fits(self.N, self.dtype, MAX_THREADS, config["cluster_stages"], STAGED_CLUSTER))

    def least_staged_cluster_rows(self, sm_count: int) -> float:
        """The fewest rows that take the row cluster staged program (inf: none do), rows read in
        16-byte vectors."""
        if not self.stages_clusters(self._max_vector):
            return math.inf
        return STAGED_CLUSTER_MIN_TURNS * (sm_count // STAGED_CLUSTER)

    def row_held(self, sm_count: int, config: Optional[Dict[str, Any]] = None) -> Optional[int]:
        """Blocks of the row held program under ``config`` on ``sm_count`` SMs, or None where rows
        never take it: off (``held_threads`` 0), a row one block holds, or more blocks than its
        threads can wait on or than there are SMs (a row's blocks must fit on the GPU at once)."""
        config = self.config if config is None else config
        threads = config["held_threads"]
        if not threads or self.variant.backward:
            return None
        held = -(-self.N // (threads * config["held_elements"]))
        return held if 1 < held <= min(threads, sm_count) else None

    def row_programs(self, rows: int, vector: int, sm_count: int,
                     windows: bool = False) -> Tuple[Tuple[str, ...], ProgramParams]:
        """The programs ``rows`` rows launch, with their shape parameters; ``windows``: the rows
        may be read in windows (``windows_allowed``), which the fused and row cluster programs
        take where ``vector`` is narrower than 16 bytes and the windows fit their registers."""
        names, params = self._row_programs(rows, vector, sm_count)
        if windows and self.config["row_windows"] and vector < self._max_vector and names[0] in (ROW_FUSED, ROW_CLUSTER):
            return names, self._windowed_params(names[0], rows, params) or params
        return names, params

    def _windowed_params(self, name: str, rows: int, params: ProgramParams) -> Optional[ProgramParams]:
        """``params`` of program ``name`` (fused or row cluster) read in 16-byte windows, or None
        where the windows would not fit the registers of the row's threads."""
        vector, backward, config = self._max_vector, self.variant.backward, self.config
        if name == ROW_FUSED:
            span, cap = config["row_threads"], fused_elements_cap(self.dtype, backward)
            extra = (("hinted", int(self.hints_rows(rows, vector))),)
        else:
            cluster = dict(params)["cluster"]
            span, cap = cluster * config["cluster_threads"], cluster_elements_cap(self.dtype, backward)
            extra = (("cluster", cluster),)
        if not windows_fit(self.N, self.dtype, backward, span, vector, cap):
            return None
        return self.row_params(vector) + extra + (("windowed", 1),)

    def windows_allowed(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether rows of ``tensors`` (``(*inputs, out)``, 2-D) may be read in 16-byte windows:
        ``N`` is not a multiple of one, every tensor starts on one, and every row starts as far
        into its window in each (row strides equal to ``N`` modulo a window)."""
        vector = self._max_vector
        if not self._may_window:
            return False
        return all(widest_access(tensor, 0, vector) == vector
                   and (tensor.shape[0] == 1 or (tensor.stride(0) - self.N) % vector == 0) for tensor in tensors)

    def _row_programs(self, rows: int, vector: int, sm_count: int) -> Tuple[Tuple[str, ...], ProgramParams]:
        if self.fused():
            if self.stages_rows(vector):
                return (ROW_STAGED,), self.row_params(vector)
            return (ROW_FUSED,), self.row_params(vector) + (("hinted", int(self.hints_rows(rows, vector))),)
        # Staged clusters copy 16-byte vectors; ``least_staged_cluster_rows`` is inf where they never run.
        if vector == self._max_vector and rows >= self.least_staged_cluster_rows(sm_count):
            return (ROW_CLUSTER_STAGED,), self.row_params(vector) + (("cluster", STAGED_CLUSTER),)
        if rows >= self.least_cluster_rows(sm_count):
            return (ROW_CLUSTER,), self.row_params(vector) + (("cluster", self.row_cluster()),)
        held = self.row_held(sm_count)
        if held is not None:
            return (ROW_HELD,), self.row_params(vector) + (("held", held),)
        return (ROW_STATS, ROW_APPLY), self.row_params(vector)

    # ---- programs ----------------------------------------------------------------------------
    def program(self, **config: Any) -> Any:
        """The first row program of aligned, contiguous rows (fused or staged, or the stats step)."""
        config = {**self.default_config, **config}
        vector = self._row_vector
        if not self.fused(config):
            name = ROW_STATS
        else:
            name = ROW_STAGED if self.stages_rows(vector, config) else ROW_FUSED
        return build_program(name, self.N, self.dtype, self.variant, config, self.row_params(vector), self.result_dtype)

    def line_input_bytes(self) -> int:
        """Bytes the inputs of one row (or one column: a line along the axis) take."""
        return self.N * self.dtype.itemsize * self.variant.inputs

    def least_hinted_rows(self) -> int:
        """The fewest rows whose inputs take ``row_hinted_min_mib`` MiB."""
        return -(-hinted_min_bytes(self.config["row_hinted_min_mib"]) // self.line_input_bytes())

    def hints_rows(self, rows: int, vector: int) -> bool:
        """Whether a call of ``rows`` fused rows, read ``vector`` elements at a time, loads them with
        ``evict_last``: its inputs take ``row_hinted_min_mib`` or more and its loads move 16 bytes."""
        return rows >= self.least_hinted_rows() and takes_hint(EVICT_LAST, vector, torch_dtype_to_tl(self.dtype))

    def hints_columns(self, columns: int) -> bool:
        """Whether a fused column call over ``columns`` columns (outer times inner) loads with
        ``evict_last`` beyond ``column_cache_hints``: its inputs take at most ``column_hinted_max_mib``
        MiB, so what its first walk read is still in L2 for the second."""
        most = self.config["column_hinted_max_mib"] << 20
        return bool(most) and not self.config["column_cache_hints"] and columns * self.line_input_bytes() <= most

    def row_params(self, vector: int) -> ProgramParams:
        return (("vector", vector),)

    @staticmethod
    def column_params(inner: int, cvec: int) -> ProgramParams:
        return (("col_threads", column_tile(inner, cvec)), ("cvec", cvec))

    def column_programs(self, outer: int, inner: int, cvec: int,
                        sm_count: int) -> Tuple[Tuple[str, ...], ProgramParams]:
        """The fused column program when whole columns fill the GPU (``fused_column_params``), else the two steps."""
        fused = fused_column_params(self.N, self.dtype, outer, inner, cvec, sm_count,
                                    self.config["fused_column_threads"], self.config["column_cluster"])
        if fused is not None:
            return (COLUMN_FUSED,), fused + ((("hinted", 1),) if self.hints_columns(outer * inner) else ())
        return (COLUMN_STATS, COLUMN_APPLY), self.column_params(inner, cvec)

    def program_specs(self, inner: int = 1, vector: Optional[int] = None, outer: int = 1,
                      sm_count: int = PLANNING_SM_COUNT) -> List[Tuple[str, ProgramParams]]:
        """The programs one call launches on aligned contiguous ``(outer, N, inner)`` tensors
        (for ``inner == 1``, ``outer`` is the number of rows)."""
        if inner == 1:
            vector = self._row_vector if vector is None else vector
            names, params = self.row_programs(outer, vector, sm_count, windows=self._may_window)
            return [(name, params) for name in names]
        cvec = largest_pow2_divisor(inner, self._max_vector) if vector is None else vector
        names, params = self.column_programs(outer, inner, cvec, sm_count)
        return [(name, params) for name in names]

    def program_specs_for(self, shape: Sequence[int], dim: int) -> List[Tuple[str, ProgramParams]]:
        """``program_specs`` of an aligned contiguous tensor of ``shape`` taken over axis ``dim``."""
        axis = dim % len(shape)
        return self.program_specs(math.prod(shape[axis + 1:]), outer=math.prod(shape[:axis]))

    def compile_program(self, name: str, params: ProgramParams, config: Optional[Dict[str, Any]] = None,
                        target: Any = "auto") -> Any:
        """The compiled program ``name`` with shape ``params`` for ``config`` (default: the current one), cached."""
        config = dict(self.config if config is None else config)
        key = (name, params, repr(target)) + tuple(sorted(config.items()))
        return self.compile_once(key, lambda: build_program(name, self.N, self.dtype, self.variant, config, params,
                                                            self.result_dtype),
                                 target, (name, params, config))

    def build_all_for_sm90(self, inner: int = 8) -> Dict[str, Any]:
        """Compile the row programs and every column program (for ``inner``) for sm_90, without a GPU."""
        # One outer index gives the two-step programs; many give the fused or clustered ones where they may run.
        specs = (self.program_specs(1) + self.program_specs(1, outer=1 << 16) + self.program_specs(inner)
                 + self.program_specs(inner, outer=1 << 16))
        return {name: self.compile_program(name, params, target=SM90_BUILD_TARGET) for name, params in specs}

    def tuning_inputs(self, rows: Optional[int] = None) -> tuple:
        """Random inputs and a preallocated output of ``rows`` rows on the current GPU."""
        rows = self.tuning_rows if rows is None else rows
        inputs = [torch.randn(rows, self.N, device="cuda", dtype=self.dtype) for _ in range(self.variant.inputs)]
        if self.variant.backward:
            inputs[1] = torch.softmax(inputs[1].float(), -1).to(self.dtype)
        return (*inputs, torch.empty_like(inputs[0], dtype=self.result_dtype))

    # ---- launch ------------------------------------------------------------------------------
    # What a call needs from the current config is kept in the per-config plans: deriving it per
    # call would cost microseconds.
    def _fuses_rows(self) -> bool:
        return self._launch_plans.get("fused", self.fused)

    def _clusters_rows(self, rows: int, device: torch.device) -> Tuple[bool, bool]:
        """Whether ``rows`` rows of a call on ``device`` are enough for the row cluster program, and
        for the row cluster staged one."""
        least = self._launch_plans.get(("cluster rows", device), lambda: (
            self.least_cluster_rows(self.sm_count(device)), self.least_staged_cluster_rows(self.sm_count(device))))
        return rows >= least[0], rows >= least[1]

    def _launcher(self, name: str, params: ProgramParams) -> Any:
        return self._launch_plans.get(("launcher", name, params), lambda: self._make_launcher(name, params))

    def _make_launcher(self, name: str, params: ProgramParams) -> Any:
        launch = direct_launcher(self.compile_program(name, params))
        if name == ROW_HELD:
            held = dict(params)["held"]

            def launch_held(*tensors: torch.Tensor) -> None:
                out = tensors[-1]
                launch(*tensors[:-1], *self._held_workspaces.get(out.shape[0], held, out.device), out)

            return launch_held
        if name == ROW_STAGED:
            per_sm, cluster = max(1, self.config["min_blocks"]), 1
        elif name == ROW_CLUSTER_STAGED:
            per_sm, cluster = 1, dict(params)["cluster"]
        else:
            return launch

        def launch_staged(*tensors: torch.Tensor) -> None:
            # One wave of resident blocks in whole clusters, each group taking its rows in turn.
            out = tensors[-1]
            groups = max(1, min(out.shape[0], per_sm * self.sm_count(out.device) // cluster))
            launch(*tensors, groups * cluster)

        return launch_staged

    def _target_blocks(self, device: torch.device) -> int:
        return BLOCKS_PER_SM * self.sm_count(device)

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        """Write the result for ``tensors = (*inputs, out)`` into ``out`` and return it."""
        if len(tensors) != self.variant.inputs + 1:
            raise TypeError(
                f"{type(self).__name__}: expected {self.variant.inputs} inputs and out, got {len(tensors)} tensors"
            )
        inputs, out = tensors[:-1], tensors[-1]
        launchers, params = self._planned_launch(tensors)
        if len(launchers) == 1:  # a fused program
            launchers[0](*tensors)
            return out
        stats, apply = launchers
        shape = (out.shape[0], self._segments(out, params)) + tuple(out.shape[2:])
        partials = [torch.empty(shape, dtype=torch.float32, device=out.device) for _ in range(self.variant.partials)]
        stats(*inputs, *partials)
        apply(*inputs, *partials, out)
        return out

    def _planned_launch(self, tensors: Tuple[torch.Tensor, ...]) -> Tuple[Tuple[Any, ...], ProgramParams]:
        """The launchers of ``_launch_plan``'s programs and their shape parameters.

        A plan depends on the tensors' addresses and strides only through the access
        width they allow (at most 16 bytes), so it is derived once per alignment,
        rank and, for rows, whether there are enough of them for the hint (fused rows) or
        a row cluster (or a staged one); for columns, per extents and device: a small call then
        costs a lookup.
        """
        out = tensors[-1]
        if out.dim() == 2:
            key: Tuple[Any, ...] = (access_alignment(tensors, (0,)),)
            if self._may_window:
                key += (self.windows_allowed(tensors),)
            if self._fuses_rows():
                key += (out.shape[0] >= self._launch_plans.get("hinted rows", self.least_hinted_rows),)
            else:
                key += (self._clusters_rows(out.shape[0], out.device),)
        else:
            key = (access_alignment(tensors, (0, 1)), out.shape[0], out.shape[2], out.device)
        return self._launch_plans.get(key, lambda: self._derive_launch(tensors))

    def _derive_launch(self, tensors: Tuple[torch.Tensor, ...]) -> Tuple[Tuple[Any, ...], ProgramParams]:
        names, params = self._launch_plan(tensors)
        return tuple(self._launcher(name, params) for name in names), params

    def programs_for(self, *tensors: torch.Tensor) -> List[Tuple[str, ProgramParams]]:
        """The programs ``forward(*tensors)`` launches (tensors may live on any device; off a GPU,
        the plan assumes ``PLANNING_SM_COUNT`` SMs)."""
        names, params = self._launch_plan(tensors)
        return [(name, params) for name in names]

    def _launch_plan(self, tensors: Tuple[torch.Tensor, ...]) -> Tuple[Tuple[str, ...], ProgramParams]:
        """Programs and shape parameters for ``(*inputs, out)``: the access width follows their alignment."""
        out = tensors[-1]
        sm_count = self.sm_count(out.device) if out.is_cuda else PLANNING_SM_COUNT
        if out.dim() == 2:
            vector = self._row_vector
            for tensor in tensors:
                vector = widest_access(tensor, tensor.stride(0), vector)
            return self.row_programs(out.shape[0], vector, sm_count, self.windows_allowed(tensors))
        inner = out.shape[2]
        cvec = largest_pow2_divisor(inner, self._max_vector)
        for tensor in tensors:
            cvec = widest_access(tensor, tensor.stride(0) | tensor.stride(1), cvec)
        return self.column_programs(out.shape[0], inner, cvec, sm_count)

    def _segments(self, out: torch.Tensor, params: ProgramParams) -> int:
        """Segments per row or column: enough blocks to fill the GPU, at least one step of work each."""
        shape = dict(params)
        if out.dim() == 2:
            blocks = out.shape[0]
            chunks = -(-self.N // (self.config["split_threads"] * shape["vector"]))
            most = -(-chunks // self.config["split_unroll"])
        else:
            outer, _, inner = out.shape
            lanes = self.config["column_threads"] // shape["col_threads"]
            blocks = outer * -(-inner // (shape["col_threads"] * shape["cvec"]))
            most = -(-self.N // (lanes * self.config["column_unroll"]))
        return max(1, min(-(-self._target_blocks(out.device) // blocks), most))


class SoftmaxFwdKernel(SoftmaxFamilyKernel):
    """``y = softmax(x)`` along the axis of length ``N``; ``forward(x, out)``."""

    variant = SoftmaxVariant(backward=False, log=False)


class SoftmaxBwdKernel(SoftmaxFamilyKernel):
    """``grad_x = y * (grad_y - sum(grad_y * y))`` along the axis; ``forward(grad_y, y, out)``."""

    variant = SoftmaxVariant(backward=True, log=False)
