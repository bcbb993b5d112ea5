"""Inclusive scans (cumsum, its reverse, cumprod) along one axis of length ``N``.

The input is seen as ``(outer, N, inner)`` row-major, so a scan over any
axis of a contiguous tensor needs no transpose copy.  Every program takes
the scan operator (``combine``: "add" or "mul", float32 either way; the
output has the input dtype) and a direction (``reverse`` scans from the end
of the axis: the gradient of cumsum).  ``N`` is fixed at construction; the
other extents are TileLang symbolic dimensions.  Three programs (described
for a forward sum):

* **row scan** (``inner == 1``, given as ``(rows, N)``): ``row_threads``
  threads share a row and walk it in chunks of ``row_threads * items``
  elements.  Each thread scans its ``items`` consecutive elements in
  registers, a shuffle scan combines the threads of a warp, a shared-memory
  pass combines the warps of a row, and a running carry links the chunks.
  Short rows are packed several to a block.  A half-precision row scanned
  into float32 has 32 bytes of results a thread for its 16-byte load; lanes
  trade them so that each 16-byte store of a warp fills whole sectors.
* **split row scan**, for few long rows that would leave SMs idle: a first
  program sums each of ``segments`` slices of every row, a second scans each
  slice in its own block, starting from the sum of the slices before it
  (reduce-then-scan: the second read of the input is partly an L2 hit).
* **look-back row scan**, the single-pass alternative for the same rows: a
  fixed set of resident blocks walks the rows' tiles, copying them into
  shared memory (``cp.async``).  A block sums each tile and publishes the
  sum a step before it scans the tile; then it adds the sums its
  predecessors published, scans and stores.  Which predecessors had
  published varies run to run, and with it the last bits of float results:
  under ``torch.use_deterministic_algorithms`` these rows take the split scan.
* **column scan** (``inner > 1``): a block takes a tile of neighbouring
  columns (16-byte vectors where the row allows, the tile narrowed until
  the blocks fill the GPU) and its threads walk the axis, neighbouring
  threads reading neighbouring addresses.
* **split column scan**, for tiles too few even at the narrowest: the column
  totals of each segment of the axis, then each segment scanned in its own
  block from the totals before it (as the split row scan).  Single columns
  that few go through transposed rows instead.

Global indices are computed in 64-bit by TileLang.
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from tileops.kernels.cache_hints import CACHE_HINT_PRELUDE, EVICT_FIRST, EVICT_LAST, vector_load
from tileops.kernels.exchange import BACKOFF_NS, CONTROL_WORDS, SIDE, ExchangeWorkspaces, exchange_macros
from tileops.kernels.kernel_base import (
    PASS_CONFIGS,
    SM90_BUILD_TARGET,
    Kernel,
    column_locator,
    strided_rows,
    torch_dtype_to_tl,
)
from tileops.kernels.launch import direct_launcher
from tileops.kernels.sizes import (
    ACCUM,
    MAX_THREADS,
    MIN_BLOCK_THREADS,
    THREADS_PER_SM,
    VECTOR_BYTES,
    WARP,
    check_kernel_args,
    check_out_dtype,
    largest_pow2_divisor,
    next_pow2,
)

__all__ = [
    "ScanKernel",
    "CumsumFwdKernel",
    "CumsumBwdKernel",
    "cumsum_default_config",
    "cumsum_autotune_configs",
]


MAX_GRID_Y = 65535
# Narrowest tile of 16-byte vectors a column program takes where the row is
# wider (64 bytes a position: H100, tiles of 32 bytes ran at half the speed).
MIN_VECTOR_TILE = 4

# Program names, besides the row scan that ``program`` returns.
SEGMENT_SUMS = "segment_sums"
SPLIT_ROW_SCAN = "split_row_scan"
LOOKBACK_ROW_SCAN = "lookback_row_scan"
COLUMN_SCAN = "column_scan"  # one program per tile width: "column_scan_<tile>"
COLUMN_SUMS = "column_sums"  # the split column scan's first step, per tile width
SPLIT_COLUMN_SCAN = "split_column_scan"  # and its second
ROW_SCAN = "row_scan"
COLUMN_TILES = (1, 2, 4, 8, 16, 32)


# Scan operators: how two partial results combine, and the value that changes nothing.
ADD = "add"
MUL = "mul"
_IDENTITY = {ADD: 0, MUL: 1}


def _combiner(combine: str) -> Tuple[Callable[[Any, Any], Any], int]:
    """``(combine(a, b), identity)`` of the scan operator ``combine`` ("add" or "mul")."""
    if combine == ADD:
        return (lambda a, b: a + b), _IDENTITY[ADD]
    if combine == MUL:
        return (lambda a, b: a * b), _IDENTITY[MUL]
    raise ValueError(f"scan kernel: combine must be one of {sorted(_IDENTITY)}, got {combine!r}")


def _row_layout(N: int, items: int, row_threads: int) -> Tuple[int, int, int]:
    """(chunk, full chunks, tail elements) of a row walked ``row_threads * items`` at a time."""
    chunk = row_threads * items
    full_chunks = N // chunk
    return chunk, full_chunks, N - full_chunks * chunk


def _row_config(N: int, elem_bytes: int, items: int, threads_cap: int) -> Dict[str, int]:
    items = min(items, next_pow2(N))
    row_threads = min(threads_cap, next_pow2(-(-N // items)))
    return {"threads": max(row_threads, MIN_BLOCK_THREADS), "items": items, "row_threads": row_threads}


def _default_segments(N: int, items: int, row_threads: int, lookback: int, elem_bytes: int) -> int:
    """Slices of a long row for the split scan (at least two chunks each, at most 64), or
    tiles for the look-back scan (``LOOKBACK_TILE_CHUNKS`` chunks each); 1 (no split)
    below four chunks."""
    chunk, full_chunks, tail = _row_layout(N, items, row_threads)
    total_chunks = full_chunks + (tail > 0)
    if total_chunks < 4:
        return 1
    if lookback:
        return -(-total_chunks // LOOKBACK_TILE_CHUNKS[elem_bytes >= 4])
    return min(64, total_chunks // 2)


def cumsum_default_config(N: int, dtype: torch.dtype) -> Dict[str, int]:
    """Heuristic config for scan length ``N`` and ``dtype``.

    One 16-byte vector per thread and chunk; a row gets as many threads as
    cover it in one chunk, up to 256 (longer rows loop).  (H100: 8192 x 32768
    bf16, one vector 374 us for both cumsum and cumprod at 128 to 512 threads,
    two swung between 383 and 465 us with the operator and the thread count;
    64 x 262144 float32, one vector 79 us, two 121 us forward and 86 backward.)  When at most
    ``split_max_rows`` rows come, rows of four or more chunks are cut into
    ``segments`` slices of at least two chunks each, for the split scan or,
    with ``lookback=1``, for the single-pass look-back scan.
    """
    elem_bytes = dtype.itemsize
    config = _row_config(N, elem_bytes, VECTOR_BYTES // elem_bytes, 256)
    # Few long rows (at most ``split_max_rows``) are cut across blocks.  H100,
    # 64 x 262144 forward, flushed L2, copy 21.7 us bf16 and 43.6 us float32:
    # split scan (64 segments, 8 blocks an SM) 33.8 / 66.8 us; look-back with
    # tiles held in registers 37-41 / 59-60; look-back with tiles staged in
    # shared memory, 256 threads, 2 stages: bf16 30.9 us (4-chunk tiles, 4
    # blocks an SM), float32 54.9 (8-chunk tiles, 3 blocks an SM).  A third
    # stage changed nothing; fewer blocks an SM cost 15-40%.  Once no launch
    # zeroed the status words: bf16 4-chunk tiles 29.3 us with 4 blocks an SM,
    # 28.1-28.2 with 5 (forward, reverse, product alike), 27.6-28.4 with 6;
    # float32 8-chunk tiles with 3 blocks 52.1-54.2, 4-chunk with 6 54.0-55.3.
    # Timed in turns (median of 7), reverse bf16: 4-chunk tiles with 5 blocks
    # 27.7-28.0 us, with 6 28.6; 8-chunk with 3 27.6, 6-chunk with 4 28.4;
    # 2-chunk with 6 or 8 33.5 / 31.2; 128-thread blocks (4-chunk tiles, 10
    # or 12 blocks) 29.5 / 28.7; 512-thread blocks 29.0-31.7.  The forward
    # ran alike (27.5 us as it is).  H200, with each tile reduced a step before
    # its scan (median of 7 in turns, bf16): 4-chunk tiles with 5 blocks 20.6-21.4
    # us, with 6 20.8-21.3, 3 stages with 4 blocks 21.4-21.7; 3-chunk tiles 23.4;
    # float32 8-chunk tiles with 3 blocks 36.9-37.3 (docs/performance.md).
    config["split_max_rows"] = 128
    config["lookback"] = 1
    config["segments"] = _default_segments(
        N, config["items"], config["row_threads"], config["lookback"], elem_bytes
    )
    # A lower bound on resident blocks (``__launch_bounds__``): it caps registers
    # per thread, and the look-back scan launches this many blocks an SM.
    config["blocks_per_sm"] = LOOKBACK_BLOCKS_PER_SM[elem_bytes >= 4]
    # Tiles a look-back block keeps in shared memory: the one it scans, the next
    # (reduced a step ahead) and those in flight besides.
    config["lookback_stages"] = 2
    config["column_threads"] = 256
    config["column_items"] = 16  # H100, 8 x 4096 x 4096 bf16 over dim 1: 16 beats 8 by 15%
    # Scans over a middle axis want at least ``column_min_blocks`` column
    # blocks: rows of 16-byte vectors take the widest tile that gives that
    # many.  Fewer would leave SMs idle: rows of vectors then cut their axis
    # into segments, about ``column_split_blocks`` blocks in all; single
    # columns at least ``4 * column_threads`` long transpose to rows instead.
    # H100, bf16 unless said, us: 64 x 4096 x 64 tiles of 8 / 4 vectors 61.8 /
    # 44.4 (fp32, 16 / 8: 100.6 / 55.5); 16 x 4096 x 1024 tiles of 32 / 16 / 8
    # vectors 224 / 121 / 122; 4 x 32768 x 256 split over 256 blocks 132
    # (transposed 532); 1 x 262144 x 64 fp32 in tiles of 4 vectors split over
    # 128, 256 and 512 blocks 140, 105, 104 (transposed 337; tiles of 16
    # vectors over 1024 blocks 300); 5 x 3000 x 40 fp32 (single columns)
    # split 34.5, transposed 18.4.  Once each thread located its columns once
    # rather than at every access (``column_scan_program``), in us against a copy
    # of the same tensor: 64 x 4096 x 64 25.7 (copy 21.7; tiles of 8 vectors
    # 32.0, split in two 40.8), 16 x 4096 x 1024 93.2 (87.3), 8 x 4096 x 4096
    # 183.8 (176.0), 256 x 512 x 64 14.7 (12.8), 4 x 32768 x 256 split 81.4
    # (44.6), 1 x 262144 x 64 fp32 split 83.9 (43.5).  Twice the column items
    # won 3-5% on the first and the last and lost 1-8% on the others; 512
    # threads lost everywhere.  The split scan's L2 hints (``column_scan_program``),
    # the previous code and this one back to back: 4 x 32768 x 256 81.2 -> 79.4-79.7,
    # 1 x 262144 x 64 fp32 85.0 -> 80.2, 16 x 8192 x 128 41.9 -> 37.5-37.7,
    # 2 x 65536 x 64 23.1 -> 22.0-22.6, 64 x 4096 x 64 cut in two 39.9 -> 37.6-37.8.
    config["column_min_blocks"] = 128
    config["column_split_blocks"] = 256
    # Half-precision rows scanned into float32 trade results between lanes so that every store
    # fills whole sectors (``row_scan_program``), in the look-back scan and in plain rows of at
    # most this many chunks.  H200, bf16 to float32, µs, direct stores / traded (median of 7-9 in
    # turns): 32768 x 4096 (2 chunks) 223.7 / 195.8, 16384 x 8192 (4) 226.9 / 204.3, 8192 x
    # 16384 (8) 214.1 / 255.9, 8192 x 32768 (16) 420.6 / 508.5; 64 x 262144 (look-back) 44.9 /
    # 30.0; 2097152 x 64 (lanes paired) 197.9 / 194.7.  Why long plain rows lose was not found.
    config["traded_max_chunks"] = 4
    return config


def cumsum_autotune_configs(N: int, dtype: torch.dtype) -> List[Dict[str, int]]:
    """Valid candidate configs around the heuristic (the heuristic first).

    Candidates vary the row layout (items per thread, threads per row), each
    with the default tiling of its own layout, plus the two-pass split scan.
    """
    elem_bytes = dtype.itemsize
    vector = VECTOR_BYTES // elem_bytes
    default = cumsum_default_config(N, dtype)
    candidates = [default]
    for items in (vector, 2 * vector, 4 * vector):
        for threads_cap in (256, 512, 1024):
            config = {**default, **_row_config(N, elem_bytes, items, threads_cap)}
            config["segments"] = _default_segments(
                N, config["items"], config["row_threads"], config["lookback"], elem_bytes
            )
            candidates.append(config)
    # The two-pass split scan, for rows the look-back scan serves worse.
    split = {**default, "lookback": 0, "blocks_per_sm": 8}
    split["segments"] = _default_segments(N, split["items"], split["row_threads"], 0, elem_bytes)
    candidates.append(split)
    unique: List[Dict[str, int]] = []
    for config in candidates:
        if config not in unique:
            unique.append(config)
    return unique


def _validate_row_config(N: int, threads: int, items: int, row_threads: int, segments: int) -> None:
    def pow2(n: int) -> bool:
        return n >= 1 and n & (n - 1) == 0

    if not (WARP <= threads <= MAX_THREADS and pow2(threads)):
        raise ValueError(f"scan kernel: threads must be a power of two in [32, 1024], got {threads}")
    if not (pow2(row_threads) and row_threads <= threads):
        raise ValueError(f"scan kernel: row_threads must be a power of two <= threads, got {row_threads}")
    if items < 1 or segments < 1:
        raise ValueError(f"scan kernel: items and segments must be positive, got {items}, {segments}")


# Look-back scan defaults, indexed by whether the dtype is 4 bytes wide (see
# ``cumsum_default_config``): chunks a tile, blocks an SM.
LOOKBACK_TILE_CHUNKS = (4, 8)
LOOKBACK_BLOCKS_PER_SM = (5, 3)
# Shared memory one SM gives its blocks (H100: 228 KB, 1 KB of it reserved per block).
SHARED_BYTES_PER_SM = 227 * 1024

# Segments of at most this many chunks are loaded whole before they are scanned
# (every load in flight at once); longer ones stream chunk by chunk.
MAX_PRELOAD_CHUNKS = 8


def _segment_layout(N: int, items: int, row_threads: int, segments: int) -> Tuple[int, int]:
    """(chunks per segment, segments actually used) when a row is split."""
    chunk, full_chunks, tail = _row_layout(N, items, row_threads)
    total_chunks = full_chunks + (tail > 0)
    per_segment = -(-total_chunks // segments)
    return per_segment, -(-total_chunks // per_segment)


def _elem_bytes(dtype: str) -> int:
    """Bytes of one element of a TileLang dtype name (the scans take float16, bfloat16, float32)."""
    return 4 if dtype == "float32" else 2


def _row_access(N: int, dtype: str) -> int:
    """Elements of a row's widest access (``row_vector``): in-place row strides are multiples of it."""
    return largest_pow2_divisor(N, VECTOR_BYTES // _elem_bytes(dtype))


def _load_vector(N: int, items: int, dtype: str) -> int:
    """Elements per vectorized access: divides ``items`` and ``N`` (aligned rows), <= 16 bytes."""
    return largest_pow2_divisor(N, largest_pow2_divisor(items, VECTOR_BYTES // _elem_bytes(dtype)))


# Status of a tile in the single-pass (look-back) scan; also the index of the
# word that holds the published value.
STATUS_EMPTY = 0  # not published yet
STATUS_AGGREGATE = 1  # the sum of the tile alone
STATUS_PREFIX = 2  # the sum of the row up to and including the tile


def row_scan_program(
    N: int,
    dtype: str,
    *,
    threads: int,
    items: int,
    row_threads: int,
    segments: int = 1,
    mode: str = "plain",
    combine: str = ADD,
    reverse: bool = False,
    blocks_per_sm: int = 0,
    lookback_stages: int = 2,
    out_dtype: Optional[str] = None,
    traded_max_chunks: int = 0,
    **_: Any,
) -> Any:
    """A row scan of ``(R, N)`` in one of three modes, written in ``out_dtype`` (default ``dtype``).

    ``combine`` is the scan operator ("add": cumsum, "mul": cumprod; float32
    either way); ``reverse`` scans from the end of each row to its start.  A
    reverse scan reads and writes the same 16-byte vectors as a forward one,
    mirrored: each thread owns ``items`` consecutive elements ending where a
    forward thread's would start, and walks its registers backwards.

    * ``plain``: one row group walks its row chunk by chunk (loads of the next
      chunk are issued before the current one is scanned).
    * ``split`` (``segments > 1``): the second step of the split scan; takes
      ``Partial: (R, S)`` float32 segment sums and scans segment ``s`` of each
      row in block ``(row block, s)`` from ``sum(Partial[row, :s])``.
    * ``lookback``: a single pass over rows cut into tiles of up to
      ``MAX_PRELOAD_CHUNKS`` chunks (``lookback_layout``).  ``blocks`` blocks,
      all resident at once, take the tiles in turn (block b: b, b + blocks,
      ...), staging them in ``lookback_stages`` slots of shared memory.  A
      block reduces each tile a step before it scans it: at step ``s`` it
      starts copying the tile of step ``s + stages - 1``, waits for the one
      of step ``s + 1``, sums it and publishes the sum in a status word (one
      64-bit word a tile: status and float32 value together); then its first
      warp looks back over the predecessors of step ``s``'s tile, 32 at a
      time, until it meets an inclusive prefix, publishes the tile's own, and
      the block scans the tile from the predecessors' total and stores.  By
      then the predecessors, staged by other blocks about as early, have had
      a step to publish (publishing and looking back in the same step, the
      block waited on them: 23.6 against 20.6-21.4 us on an H200, 64 x
      262144 bf16).  A tile waits only on
      earlier tiles, which resident blocks reach first, so the scan always
      finishes.  The status words live in a workspace that is left ready for
      the next launch (see ``ScanKernel.lookback_workspace``): no launch zeroes them.
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    out_dtype = out_dtype or dtype

    _validate_row_config(N, threads, items, row_threads, segments)
    blocks_per_sm = min(blocks_per_sm, THREADS_PER_SM // threads)
    if mode == "lookback":
        row_threads = threads
    rows_per_block = threads // row_threads
    chunk, full_chunks, tail = _row_layout(N, items, row_threads)
    total_chunks = full_chunks + (tail > 0)
    group = min(row_threads, WARP)  # lanes of one row inside a warp
    warps_per_row = max(1, row_threads // WARP)
    vector = _load_vector(N, items, dtype)
    per_segment, used_segments = _segment_layout(N, items, row_threads, segments) if mode == "split" else (0, 1)
    preload = per_segment <= MAX_PRELOAD_CHUNKS
    op, identity = _combiner(combine)
    R = T.dynamic("R")
    # Rows of ``x`` may lie any multiple of the row's access width apart (``strided_rows``).
    XT, LDX = strided_rows(T, R, N, dtype, "LDX")
    row_access = _row_access(N, dtype)

    def first_element(lane, chunk_index):
        """Where the thread's ``items`` elements start in memory (they end there when reversed)."""
        if reverse:
            return N - (chunk_index * chunk + lane * items) - items
        return chunk_index * chunk + lane * items

    def in_row(first, k):
        """Whether element ``first + k`` of the thread's span lies in the row (``k`` in memory order)."""
        if reverse:
            return first + k >= 0
        return first + k < N

    def register(k):
        """The register that holds the ``k``-th element of a thread's span in memory order."""
        return items - 1 - k if reverse else k

    @T.macro
    def load_chunk(X, raw, at, row, lane, chunk_index, guarded):
        # ``raw[at:at + items]`` gets the thread's span in memory order; ``widen`` puts it in scan order.
        first = first_element(lane, chunk_index)
        if guarded:
            for k in T.unroll(items):
                raw[at + k] = T.if_then_else(
                    (row < R) and in_row(first, k),
                    X[row, first + k],
                    T.cast(identity, dtype),
                )
        else:
            if row < R:
                for v in T.unroll(items // vector):
                    for k in T.vectorized(vector):
                        raw[at + v * vector + k] = X[row, first + v * vector + k]
            else:
                for k in T.unroll(items):
                    raw[at + k] = T.cast(identity, dtype)

    @T.macro
    def widen(raw, at, vals):
        for k in T.unroll(items):
            vals[k] = T.cast(raw[at + register(k)], ACCUM)

    @T.macro
    def scan_chunk(vals, totals, state, tx, buffer):
        """Scan the chunk in ``vals`` in place, offset by the carry ``state[0]``; advance the carry.

        ``state`` holds [carry, inclusive, exclusive, warp prefix, chunk total] in float32.
        """
        lane_in_group = tx % group
        for k in T.unroll(1, items):
            vals[k] = op(vals[k - 1], vals[k])
        state[1] = vals[items - 1]
        for step in T.unroll(max(1, group.bit_length() - 1)):
            if (1 << step) < group:
                neighbour = T.shfl_up(state[1], 1 << step, group)
                if lane_in_group >= (1 << step):
                    state[1] = op(state[1], neighbour)
        state[2] = T.shfl_up(state[1], 1, group)
        if lane_in_group == 0:
            state[2] = T.cast(identity, ACCUM)
        if warps_per_row > 1:
            row_in_block = tx // row_threads
            warp_in_row = (tx % row_threads) // WARP
            if lane_in_group == WARP - 1:
                totals[buffer, row_in_block, warp_in_row] = state[1]
            # One barrier a chunk: the totals alternate between two buffers, so a
            # warp that runs ahead cannot overwrite totals another is still reading.
            T.sync_threads()
            state[3] = T.cast(identity, ACCUM)
            state[4] = T.cast(identity, ACCUM)
            for w in T.unroll(warps_per_row):
                if w < warp_in_row:
                    state[3] = op(state[3], totals[buffer, row_in_block, w])
                state[4] = op(state[4], totals[buffer, row_in_block, w])
            state[2] = op(state[2], state[3])
        else:
            state[4] = T.shfl_sync(state[1], group - 1, group)
        for k in T.unroll(items):
            vals[k] = op(vals[k], op(state[0], state[2]))
        state[0] = op(state[0], state[4])

    # Half-precision rows scanned into float32: a thread's 16-byte load becomes 32 bytes of results,
    # which two 16-byte stores of its own would write as half of every sector they touch.  Lanes
    # trade halves of their spans instead (``store_warp``, ``store_pair``), so that every store fills
    # whole sectors; not in plain rows of more than ``traded_max_chunks`` chunks, where trading
    # measured slower (see ``cumsum_default_config``).
    half = items // 2
    traded = (traded_max_chunks > 0 and not reverse and items == vector and row_threads >= 2
              and vector * _elem_bytes(out_dtype) == 2 * VECTOR_BYTES
              and (mode == "lookback" or total_chunks <= traded_max_chunks))

    @T.macro
    def store_warp(Y, vals, staged, row, lane, first):
        """A warp's ``WARP * items`` consecutive elements in two stores of consecutive 16-byte
        pieces: in store ``s`` lane ``l`` writes half the span of lane ``s * WARP / 2 + l / 2``."""
        lane_in_warp = lane % WARP
        odd = lane_in_warp % 2
        for s in T.unroll(2):
            # Every lane shuffles both halves (no shuffle under a branch), then keeps its own.
            for k in T.unroll(half):
                staged[k] = T.shfl_sync(vals[k], s * (WARP // 2) + lane_in_warp // 2)
                staged[half + k] = T.shfl_sync(vals[half + k], s * (WARP // 2) + lane_in_warp // 2)
            for k in T.unroll(half):
                staged[k] = T.if_then_else(odd == 1, staged[half + k], staged[k])
            if row < R:
                for k in T.vectorized(half):
                    Y[row, first - lane_in_warp * half + s * WARP * half + k] = staged[k]

    @T.macro
    def store_pair(Y, vals, staged, row, lane, first):
        """Rows narrower than a warp: lanes ``2j`` and ``2j + 1`` (spans ``[F, F + items)`` and
        ``[F + items, F + 2 * items)``) write ``[F, F + items)`` in one store and the rest in the
        next, each lane half a span a store."""
        odd = lane % 2
        # The even lane sends its second half and receives its partner's first; the odd one the reverse.
        for k in T.unroll(half):
            staged[half + k] = T.shfl_xor(T.if_then_else(odd == 1, vals[k], vals[half + k]), 1)
        for k in T.unroll(half):
            staged[k] = T.if_then_else(odd == 1, staged[half + k], vals[k])
            staged[half + k] = T.if_then_else(odd == 1, vals[half + k], staged[half + k])
        if row < R:
            for s in T.unroll(2):
                for k in T.vectorized(half):
                    Y[row, first - odd * half + s * items + k] = staged[s * half + k]

    @T.macro
    def store_chunk(Y, vals, staged, row, lane, chunk_index, guarded):
        first = first_element(lane, chunk_index)
        if guarded:
            for k in T.unroll(items):
                if (row < R) and in_row(first, k):
                    Y[row, first + k] = T.cast(vals[register(k)], out_dtype)
        elif traded:
            if row_threads >= WARP:
                store_warp(Y, vals, staged, row, lane, first)
            else:
                store_pair(Y, vals, staged, row, lane, first)
        else:
            if row < R:
                if reverse:
                    # Narrow into memory order first: the vector stores then read
                    # consecutive registers.
                    for k in T.unroll(items):
                        staged[k] = T.cast(vals[register(k)], out_dtype)
                    for v in T.unroll(items // vector):
                        for k in T.vectorized(vector):
                            Y[row, first + v * vector + k] = staged[v * vector + k]
                else:
                    for v in T.unroll(items // vector):
                        for k in T.vectorized(vector):
                            Y[row, first + v * vector + k] = T.cast(vals[v * vector + k], out_dtype)

    @T.macro
    def carry_in(Partial, state, row, lane, segment):
        """``state[0]`` = the total of the segments before ``segment``: one segment a lane, then a group reduction.

        One load per lane keeps few loads (and registers) in flight, where one
        thread summing every segment held all of them.
        """
        lane_in_group = lane % group
        state[0] = T.cast(identity, ACCUM)
        for base in T.serial(T.ceildiv(used_segments, group)):
            if row < R and base * group + lane_in_group < segment:
                state[0] = op(state[0], Partial[row, base * group + lane_in_group])
        for step in T.unroll(max(1, group.bit_length() - 1)):
            if (1 << step) < group:
                state[0] = op(state[0], T.shfl_xor(state[0], 1 << step, group))

    if mode == "plain":

        @T.prim_func
        def cumsum_row_scan(X: XT, Y: T.Tensor((R, N), out_dtype)):
            with T.Kernel(T.ceildiv(R, rows_per_block), threads=threads) as bx:
                T.assume(LDX % row_access == 0)
                tx = T.get_thread_binding()
                raw = T.alloc_local((items,), dtype)
                staged = T.alloc_local((items,), out_dtype)  # used by reverse scans and traded stores only
                vals = T.alloc_local((items,), ACCUM)
                state = T.alloc_local((5,), ACCUM)
                totals = T.alloc_shared((2, rows_per_block, warps_per_row), ACCUM)
                row = bx * rows_per_block + tx // row_threads
                lane = tx % row_threads
                state[0] = T.cast(identity, ACCUM)
                if full_chunks > 0:
                    load_chunk(X, raw, 0, row, lane, 0, False)
                for c in T.serial(full_chunks):
                    widen(raw, 0, vals)
                    # Issue the next chunk's loads now: they are in flight while this one is scanned.
                    if c + 1 < full_chunks:
                        load_chunk(X, raw, 0, row, lane, c + 1, False)
                    scan_chunk(vals, totals, state, tx, c % 2)
                    store_chunk(Y, vals, staged, row, lane, c, False)
                if tail > 0:
                    load_chunk(X, raw, 0, row, lane, full_chunks, True)
                    widen(raw, 0, vals)
                    scan_chunk(vals, totals, state, tx, full_chunks % 2)
                    store_chunk(Y, vals, staged, row, lane, full_chunks, True)

        return cumsum_row_scan

    if mode == "split":

        @T.prim_func
        def cumsum_split_row_scan(
            X: XT,
            Partial: T.Tensor((R, used_segments), ACCUM),
            Y: T.Tensor((R, N), out_dtype),
        ):
            with T.Kernel(T.ceildiv(R, rows_per_block), used_segments, threads=threads) as (bx, by):
                T.assume(LDX % row_access == 0)
                T.pdl_sync()  # wait for the launch before (see kernel_base)
                tx = T.get_thread_binding()
                raw = T.alloc_local((items,), dtype)
                staged = T.alloc_local((items,), out_dtype)  # used by reverse scans and traded stores only
                vals = T.alloc_local((items,), ACCUM)
                state = T.alloc_local((5,), ACCUM)
                totals = T.alloc_shared((2, rows_per_block, warps_per_row), ACCUM)
                segment_raw = T.alloc_local((per_segment * items if preload else 1,), dtype)
                if blocks_per_sm:
                    T.annotate_min_blocks_per_sm(blocks_per_sm)
                # Last segment first: the segment sums just read the last segments,
                # so those are the likeliest still in L2 (H100, 64 x 262144 bf16:
                # 35.0 us against 39.6 in segment order).
                segment = used_segments - 1 - by
                row = bx * rows_per_block + tx // row_threads
                lane = tx % row_threads
                first_chunk = segment * per_segment
                # Full chunks of this segment: all of them but in the segment that holds the tail.
                full_here = T.min(per_segment, full_chunks - first_chunk)
                if preload:
                    # Every chunk of the segment is in flight at once; the carry is gathered meanwhile.
                    for c in T.unroll(per_segment):
                        if c < full_here:
                            load_chunk(X, segment_raw, c * items, row, lane, first_chunk + c, False)
                    carry_in(Partial, state, row, lane, segment)
                    for c in T.unroll(per_segment):
                        if c < full_here:
                            widen(segment_raw, c * items, vals)
                            scan_chunk(vals, totals, state, tx, c % 2)
                            store_chunk(Y, vals, staged, row, lane, first_chunk + c, False)
                else:
                    # The first loads go out before the carry is gathered, so its latency hides behind theirs.
                    if full_here > 0:
                        load_chunk(X, raw, 0, row, lane, first_chunk, False)
                    carry_in(Partial, state, row, lane, segment)
                    for c in T.serial(full_here):
                        widen(raw, 0, vals)
                        if c + 1 < full_here:
                            load_chunk(X, raw, 0, row, lane, first_chunk + c + 1, False)
                        scan_chunk(vals, totals, state, tx, c % 2)
                        store_chunk(Y, vals, staged, row, lane, first_chunk + c, False)
                if tail > 0:
                    if first_chunk + full_here == full_chunks and full_here < per_segment:
                        load_chunk(X, raw, 0, row, lane, full_chunks, True)
                        widen(raw, 0, vals)
                        scan_chunk(vals, totals, state, tx, full_here % 2)
                        store_chunk(Y, vals, staged, row, lane, full_chunks, True)

        return cumsum_split_row_scan

    if mode != "lookback":
        raise ValueError(f"scan kernel: unknown row scan mode {mode!r}")

    stages = lookback_stages
    elem_bytes = _elem_bytes(dtype)
    if stages < 2:
        raise ValueError(f"scan kernel: lookback_stages must be at least 2, got {stages}")
    if vector * elem_bytes != VECTOR_BYTES:
        raise ValueError(f"scan kernel: the look-back scan needs rows of whole 16-byte vectors, got N={N}")
    per_tile, used_tiles = lookback_layout(N, threads, items, segments, elem_bytes, stages)
    tile_items = per_tile * chunk
    warps = threads // WARP

    def pack(status, value):
        """One 64-bit status word: the status above the float32 bits of ``value``.

        Status and value travel in one atomic access, so a reader that sees a
        status also sees its value, with no fence between them.
        """
        return T.bitwise_or(
            T.shift_left(T.cast(status, "uint64"), T.uint64(32)), T.cast(T.reinterpret(value, "uint32"), "uint64")
        )

    def word_status(word):
        return T.cast(T.shift_right(word, T.uint64(32)), "int32")

    def word_value(word):
        return T.reinterpret(T.cast(word, "uint32"), ACCUM)

    @T.macro
    def copy_vector(X, staging, stage, row, first, c, v, tx):
        T.ptx_cp_async(
            T.access_ptr(staging[stage, c * chunk + tx * items + v * vector], "w", vector),
            T.access_ptr(X[row, first + v * vector], "r", vector),
            vector,
        )

    @T.macro
    def issue_tile(X, staging, stage, tile_index, tx):
        """Start copying this thread's spans of tile ``tile_index`` into ``staging[stage]``
        (one cp.async group, empty past the last tile). Each thread reads back only what it copied."""
        if tile_index < R * used_tiles:
            row = tile_index // used_tiles
            first_chunk = (tile_index % used_tiles) * per_tile
            for c in T.unroll(per_tile):
                first = first_element(tx, first_chunk + c)
                for v in T.unroll(items // vector):
                    if first_chunk + c < full_chunks:
                        copy_vector(X, staging, stage, row, first, c, v, tx)
                    elif first_chunk + c < total_chunks:
                        # Whole vectors lie in or out of the row (N is a multiple of the vector).
                        if in_row(first + v * vector, 0):
                            copy_vector(X, staging, stage, row, first, c, v, tx)
        T.ptx_commit_group()

    @T.macro
    def read_span(staging, stage, raw, tile_index, c, tx):
        """``raw`` = this thread's span of chunk ``c`` of the staged tile, identity outside the row."""
        first_chunk = (tile_index % used_tiles) * per_tile
        if first_chunk + c < full_chunks:
            for k in T.vectorized(items):
                raw[k] = staging[stage, c * chunk + tx * items + k]
        else:
            first = first_element(tx, first_chunk + c)
            for k in T.unroll(items):
                raw[k] = T.if_then_else(
                    in_row(first, k), staging[stage, c * chunk + tx * items + k], T.cast(identity, dtype)
                )

    @T.macro
    def read_window(Status, side, row, lane, window, word):
        """Lane j: ``word[0]`` = the published word of predecessor ``window[0] - j``; lanes
        before the row start see an inclusive prefix of nothing."""
        word[0] = pack(STATUS_PREFIX, T.cast(identity, ACCUM))
        if window[0] - lane >= 0:
            word[0] = T.atomic_load(Status[side, row, window[0] - lane], memory_order="relaxed")

    @T.macro
    def look_back(Status, side, row, tile, lane, found, window, word):
        """Warp 0: ``found[0]`` = the total of the row's tiles before ``tile``, from their published words."""
        window[0] = tile - 1
        read_window(Status, side, row, lane, window, word)
        found[0] = T.cast(identity, ACCUM)
        window[1] = 0
        while window[1] == 0:
            window[2] = word_status(word[0])
            if T.ballot_sync(window[2] == STATUS_EMPTY) == T.uint64(0):
                # window[2] becomes 1 + the lane of the nearest inclusive prefix (0: none).
                window[2] = T.__ffs(T.ballot_sync(window[2] == STATUS_PREFIX))
                found[1] = word_value(word[0])
                if window[2] > 0:
                    # The nearest inclusive prefix ends the look-back.
                    if lane >= window[2]:
                        found[1] = T.cast(identity, ACCUM)
                    window[1] = 1
                else:
                    window[0] = window[0] - WARP
                    read_window(Status, side, row, lane, window, word)
                for step in T.unroll(5):
                    found[1] = op(found[1], T.shfl_xor(found[1], 1 << step))
                found[0] = op(found[0], found[1])
            else:
                # Back off: spinning at full rate steals L2 bandwidth from the loads being waited on.
                T.call_extern("handle", "__nanosleep", BACKOFF_NS)
                read_window(Status, side, row, lane, window, word)

    S = T.dynamic("S")

    exchange = exchange_macros(T, threads)
    clear_other_side, arrive = exchange["clear_other_side"], exchange["arrive"]

    @T.macro
    def reduce_tile(Status, side, staging, stage, index, tx, lane, warp, raw, spans, total, running, warp_totals):
        """``spans[c]`` = the total of staged tile ``index`` before this thread's span of chunk
        ``c``; ``total[0]`` = the tile's total (every thread), which thread 0 publishes (an
        inclusive prefix for a row's first tile).  Per chunk the span totals, a warp scan of
        them, and one exchange of warp totals through ``warp_totals``."""
        for c in T.unroll(per_tile):
            read_span(staging, stage, raw, index, c, tx)
            spans[c] = T.cast(identity, ACCUM)
            for k in T.unroll(items):
                spans[c] = op(spans[c], T.cast(raw[k], ACCUM))
            for sh in T.unroll(5):
                neighbour = T.shfl_up(spans[c], 1 << sh)
                if lane >= (1 << sh):
                    spans[c] = op(spans[c], neighbour)
            if lane == WARP - 1:
                warp_totals[c, warp] = spans[c]
            spans[c] = T.shfl_up(spans[c], 1)
            if lane == 0:
                spans[c] = T.cast(identity, ACCUM)
        T.sync_threads()
        total[0] = T.cast(identity, ACCUM)
        for c in T.unroll(per_tile):
            running[0] = T.cast(identity, ACCUM)
            running[1] = T.cast(identity, ACCUM)
            for w in T.unroll(warps):
                if w < warp:
                    running[0] = op(running[0], warp_totals[c, w])
                running[1] = op(running[1], warp_totals[c, w])
            spans[c] = op(total[0], op(running[0], spans[c]))
            total[0] = op(total[0], running[1])
        if tx == 0:
            T.atomic_store(
                Status[side, index // used_tiles, index % used_tiles],
                pack(T.if_then_else(index % used_tiles == 0, STATUS_PREFIX, STATUS_AGGREGATE), total[0]),
                memory_order="relaxed",
            )

    @T.prim_func
    def cumsum_lookback_row_scan(
        X: XT,
        Status: T.Tensor((2, S, used_tiles), "uint64"),
        Control: T.Tensor((CONTROL_WORDS,), "int32"),
        Y: T.Tensor((R, N), out_dtype),
        blocks: T.int32,
    ):
        # Block b scans tiles b, b + blocks, b + 2 * blocks, ... in order; every block
        # must be resident at once (the caller keeps ``blocks`` within what fits).
        with T.Kernel(blocks, threads=threads) as block:
            T.assume(LDX % row_access == 0)
            tx = T.get_thread_binding()
            staging = T.alloc_shared((stages, tile_items), dtype)
            warp_totals = T.alloc_shared((per_tile, warps), ACCUM)
            # By step parity: the last step has one barrier, so warp 0 may set its offset
            # while other warps still read the one before.
            tile_offset = T.alloc_shared((2,), ACCUM)
            raw = T.alloc_local((items,), dtype)
            staged = T.alloc_local((items,), out_dtype)  # used by reverse scans and traded stores only
            vals = T.alloc_local((items,), ACCUM)
            # Per chunk, the tile's total before this thread's span, and the tile's total: of
            # the tile being scanned, and of the next one, reduced a step ahead.
            spans = T.alloc_local((per_tile,), ACCUM)
            total = T.alloc_local((1,), ACCUM)
            next_spans = T.alloc_local((per_tile,), ACCUM)
            next_total = T.alloc_local((1,), ACCUM)
            # [warps before this one, all warps]
            running = T.alloc_local((2,), ACCUM)
            # [sum of predecessors found so far, this lane's contribution]
            found = T.alloc_local((2,), ACCUM)
            # [nearest predecessor of the window, look-back done, this lane's status / nearest prefix]
            window = T.alloc_local((3,), "int32")
            word = T.alloc_local((1,), "uint64")
            # [side of the workspace this launch publishes in, arrivals before this block]
            sides = T.alloc_local((2,), "int32")
            if blocks_per_sm:
                T.annotate_min_blocks_per_sm(blocks_per_sm)
            lane = tx % WARP
            warp = tx // WARP
            steps = T.ceildiv(R * used_tiles - block, blocks)
            for j in T.unroll(stages - 1):
                issue_tile(X, staging, j, block + j * blocks, tx)
            sides[0] = Control[SIDE]
            clear_other_side(Status, sides[0], block, blocks, tx)
            # Each tile is reduced and its total published a step before it is scanned:
            # by the time a block looks back, its predecessors (tiles other blocks staged
            # about as early) have had a step to publish theirs.
            T.ptx_wait_group(stages - 2)
            reduce_tile(Status, sides[0], staging, 0, block, tx, lane, warp, raw, next_spans, next_total, running,
                        warp_totals)
            # The loop's first reduction rewrites the warp totals this one read.
            T.sync_threads()
            for step in T.serial(steps):
                index = block + step * blocks
                row = index // used_tiles
                tile = index % used_tiles
                total[0] = next_total[0]
                for c in T.unroll(per_tile):
                    spans[c] = next_spans[c]
                issue_tile(X, staging, (step + stages - 1) % stages, block + (step + stages - 1) * blocks, tx)
                if step + 1 < steps:
                    T.ptx_wait_group(stages - 2)
                    reduce_tile(Status, sides[0], staging, (step + 1) % stages, index + blocks, tx, lane, warp, raw,
                                next_spans, next_total, running, warp_totals)
                # Warp 0 looks back while the other warps wait.
                if tx < WARP:
                    look_back(Status, sides[0], row, tile, tx, found, window, word)
                    if tx == 0:
                        if tile > 0:
                            T.atomic_store(
                                Status[sides[0], row, tile],
                                pack(STATUS_PREFIX, op(found[0], total[0])),
                                memory_order="relaxed",
                            )
                        tile_offset[step % 2] = found[0]
                T.sync_threads()
                first_chunk = tile * per_tile
                for c in T.unroll(per_tile):
                    if first_chunk + c < total_chunks:
                        read_span(staging, step % stages, raw, index, c, tx)
                        widen(raw, 0, vals)
                        vals[0] = op(op(tile_offset[step % 2], spans[c]), vals[0])
                        for k in T.unroll(1, items):
                            vals[k] = op(vals[k - 1], vals[k])
                        if first_chunk + c < full_chunks:
                            store_chunk(Y, vals, staged, row, tx, first_chunk + c, False)
                        else:
                            store_chunk(Y, vals, staged, row, tx, first_chunk + c, True)
            arrive(Control, sides[0], sides, blocks, tx)

    return cumsum_lookback_row_scan.with_attr(
        "tilelang_pass_configs", {**PASS_CONFIGS, "tl.disable_thread_storage_sync": True}
    )


def segment_sums_program(
    N: int,
    dtype: str,
    *,
    threads: int,
    items: int,
    row_threads: int,
    segments: int,
    combine: str = ADD,
    reverse: bool = False,
    **_: Any,
) -> Any:
    """First step of the split scan: ``Partial[r, s]`` = float32 total of segment ``s`` of row ``r``.

    The total is the sum (``combine="add"``) or product (``"mul"``); with
    ``reverse`` the segments are numbered from the end of the row.
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    _validate_row_config(N, threads, items, row_threads, segments)
    rows_per_block = threads // row_threads
    chunk, full_chunks, tail = _row_layout(N, items, row_threads)
    group = min(row_threads, WARP)
    warps_per_row = max(1, row_threads // WARP)
    vector = _load_vector(N, items, dtype)
    per_segment, used_segments = _segment_layout(N, items, row_threads, segments)
    preload = per_segment <= MAX_PRELOAD_CHUNKS
    op, identity = _combiner(combine)
    R = T.dynamic("R")
    # Rows of ``x`` may lie any multiple of the row's access width apart (``strided_rows``).
    XT, LDX = strided_rows(T, R, N, dtype, "LDX")
    row_access = _row_access(N, dtype)

    def position(index):
        """Where element ``index`` of the row in scan order lies in memory."""
        return N - 1 - index if reverse else index

    @T.macro
    def load_full(X, raw, at, row, lane, chunk_index):
        # The order within a thread's span does not matter to a total: read it as
        # the vectors the scan reads (mirrored when reversed).
        first = chunk_index * chunk + lane * items
        if reverse:
            first = N - first - items
        for v in T.unroll(items // vector):
            for k in T.vectorized(vector):
                raw[at + v * vector + k] = X[row, first + v * vector + k]

    @T.prim_func
    def cumsum_segment_sums(X: XT, Partial: T.Tensor((R, used_segments), ACCUM)):
        with T.Kernel(T.ceildiv(R, rows_per_block), used_segments, threads=threads) as (bx, segment):
            T.assume(LDX % row_access == 0)
            T.pdl_trigger()  # the next launch may start early (see kernel_base)
            tx = T.get_thread_binding()
            raw = T.alloc_local((items,), dtype)
            segment_raw = T.alloc_local((per_segment * items if preload else 1,), dtype)
            vals = T.alloc_local((items,), ACCUM)
            acc = T.alloc_local((1,), ACCUM)
            warp_sums = T.alloc_shared((rows_per_block, warps_per_row), ACCUM)
            row = bx * rows_per_block + tx // row_threads
            lane = tx % row_threads
            acc[0] = T.cast(identity, ACCUM)
            if row < R:
                first_chunk = segment * per_segment
                # Full chunks of this segment: all of them but in the segment that holds the tail.
                full_here = T.min(per_segment, full_chunks - first_chunk)
                if preload:
                    # Every chunk of the segment is in flight at once.
                    for c in T.unroll(per_segment):
                        if c < full_here:
                            load_full(X, segment_raw, c * items, row, lane, first_chunk + c)
                    for c in T.unroll(per_segment):
                        if c < full_here:
                            for k in T.unroll(items):
                                acc[0] = op(acc[0], T.cast(segment_raw[c * items + k], ACCUM))
                else:
                    if full_here > 0:
                        load_full(X, raw, 0, row, lane, first_chunk)
                    for c in T.serial(full_here):
                        for k in T.unroll(items):
                            vals[k] = T.cast(raw[k], ACCUM)
                        # The next chunk's loads are in flight while this one is summed.
                        if c + 1 < full_here:
                            load_full(X, raw, 0, row, lane, first_chunk + c + 1)
                        for k in T.unroll(items):
                            acc[0] = op(acc[0], vals[k])
                if tail > 0:
                    if first_chunk + full_here == full_chunks and full_here < per_segment:
                        for k in T.unroll(items):
                            if full_chunks * chunk + lane * items + k < N:
                                acc[0] = op(
                                    acc[0], T.cast(X[row, position(full_chunks * chunk + lane * items + k)], ACCUM)
                                )
            for step in T.unroll(max(1, group.bit_length() - 1)):
                if (1 << step) < group:
                    acc[0] = op(acc[0], T.shfl_xor(acc[0], 1 << step, group))
            if warps_per_row > 1:
                if tx % WARP == 0:
                    warp_sums[tx // row_threads, (tx % row_threads) // WARP] = acc[0]
                T.sync_threads()
                if lane == 0:
                    acc[0] = T.cast(identity, ACCUM)
                    for w in T.unroll(warps_per_row):
                        acc[0] = op(acc[0], warp_sums[tx // row_threads, w])
            if lane == 0 and row < R:
                Partial[row, segment] = acc[0]

    return cumsum_segment_sums


def column_scan_program(
    N: int,
    dtype: str,
    *,
    column_threads: int,
    column_items: int,
    column_tile: int,
    column_vector: int = 1,
    mode: str = "plain",
    combine: str = ADD,
    reverse: bool = False,
    out_dtype: Optional[str] = None,
    **_: Any,
) -> Any:
    """Scan of ``(O, N, I)`` along ``N``, a block per ``column_tile * column_vector`` neighbouring columns,
    written in ``out_dtype`` (default ``dtype``).

    Thread ``tx = tn * column_tile + ti`` owns columns ``[ti * V, ti * V + V)``
    of its tile (``V = column_vector``, read as one vector) and ``items``
    consecutive positions along ``N`` of each chunk of ``(column_threads //
    column_tile) * items`` positions: the threads of one position read
    neighbouring addresses.  A thread scans its items in registers; the
    threads of one column combine through shuffles within a warp and shared
    memory across warps; a per-column carry links the chunks.  Tensors come
    as ``(O, N, I // V, V)`` views, so that a vector never straddles the edge
    (``I % V == 0``) and its accesses compile to single 16-byte ones.  With
    ``V > 1`` each thread holds half the items to keep its registers in check.
    ``combine`` and ``reverse`` are as in ``row_scan_program``; a reverse scan
    visits positions ``N - 1`` down to ``0``.

    Columns too few to fill the GPU are cut along the axis into ``S``
    segments of whole chunks (``S`` is the middle extent of ``Partial: (O, S,
    I, V)``, float32, so one program serves every cut), block ``(tile, s)``
    taking segment ``s`` in scan order:

    * ``sums``: ``Partial[o, s]`` = the total of each column over segment ``s``;
    * ``split``: scans segment ``s`` starting from the total of the segments
      before it (reduce-then-scan, as the split row scan).
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    out_dtype = out_dtype or dtype

    if mode not in ("plain", "sums", "split"):
        raise ValueError(f"scan kernel: unknown column mode {mode!r}")
    tile = column_tile
    threads = column_threads
    vector = column_vector
    items = _column_items(column_items, vector)
    if (
        tile not in COLUMN_TILES
        or threads % WARP
        or not (WARP <= threads <= MAX_THREADS)
        or column_items < 1
        or vector not in (1, 2, 4, 8)
    ):
        raise ValueError(
            f"scan kernel: bad column config threads={threads} items={column_items} "
            f"tile={tile} vector={vector}"
        )
    positions = threads // tile  # threads that share one column
    chunk = positions * items
    full_chunks = N // chunk
    tail = N - full_chunks * chunk
    total_chunks = full_chunks + (tail > 0)
    warps = threads // WARP
    lanes_per_column = WARP // tile  # threads of one column inside a warp
    op, identity = _combiner(combine)
    O = T.dynamic("O")
    I = T.dynamic("I")  # columns in units of vectors

    def position(index):
        """Where position ``index`` of the axis in scan order lies in memory."""
        return N - 1 - index if reverse else index

    def full_chunks_from(first_chunk, chunks):
        """Full chunks among ``chunks`` from ``first_chunk``: all of them but where the tail lies."""
        if isinstance(first_chunk, int):
            return max(min(chunks, full_chunks - first_chunk), 0)
        return T.max(T.min(chunks, full_chunks - first_chunk), 0)

    # (outer index, column in vectors): a block's ``tile`` columns take a thread each.
    locate = column_locator(T, tile, tile)

    # The split scan reads its input twice: the sums keep the lines in L2 (``evict_last``) and
    # the scan, their second read, lets them go first (see ``cache_hints``).
    load_vector = vector_load(T, {"sums": EVICT_LAST, "split": EVICT_FIRST}.get(mode), vector, dtype)

    @T.macro
    def load_chunk(X, raw, outer, column, tx, chunk_index, guarded):
        first = chunk_index * chunk + (tx // tile) * items
        for k in T.unroll(items):
            if guarded:
                if (column < I) and (first + k < N):
                    load_vector(raw, k * vector, X, outer, position(first + k), column, 0)
                else:
                    for v in T.unroll(vector):
                        raw[k * vector + v] = T.cast(identity, dtype)
            else:
                if column < I:
                    load_vector(raw, k * vector, X, outer, position(first + k), column, 0)
                else:
                    for v in T.unroll(vector):
                        raw[k * vector + v] = T.cast(identity, dtype)

    @T.macro
    def widen(raw, vals):
        for k in T.unroll(items * vector):
            vals[k] = T.cast(raw[k], ACCUM)

    @T.macro
    def scan_chunk(Y, vals, totals, state, outer, column, tx, chunk_index, guarded):
        """``state[:, v]`` holds [carry, inclusive, exclusive, chunk total] of column ``v``."""
        first = chunk_index * chunk + (tx // tile) * items
        lane_position = (tx % WARP) // tile
        for v in T.unroll(vector):
            for k in T.unroll(1, items):
                vals[k * vector + v] = op(vals[(k - 1) * vector + v], vals[k * vector + v])
            state[1, v] = vals[(items - 1) * vector + v]
            for step in T.unroll(max(1, lanes_per_column.bit_length() - 1)):
                if (1 << step) < lanes_per_column:
                    neighbour = T.shfl_up(state[1, v], (1 << step) * tile)
                    if lane_position >= (1 << step):
                        state[1, v] = op(state[1, v], neighbour)
            state[2, v] = T.shfl_up(state[1, v], tile)
            if lane_position == 0:
                state[2, v] = T.cast(identity, ACCUM)
        if warps > 1:
            if lane_position == lanes_per_column - 1:
                for v in T.unroll(vector):
                    totals[chunk_index % 2, tx // WARP, (tx % tile) * vector + v] = state[1, v]
            T.sync_threads()
            for v in T.unroll(vector):
                state[3, v] = T.cast(identity, ACCUM)
                for w in T.unroll(warps):
                    if w < tx // WARP:
                        state[2, v] = op(state[2, v], totals[chunk_index % 2, w, (tx % tile) * vector + v])
                    state[3, v] = op(state[3, v], totals[chunk_index % 2, w, (tx % tile) * vector + v])
        else:
            for v in T.unroll(vector):
                state[3, v] = T.shfl_sync(state[1, v], (lanes_per_column - 1) * tile + tx % tile)
        for k in T.unroll(items):
            for v in T.unroll(vector):
                vals[k * vector + v] = op(vals[k * vector + v], op(state[0, v], state[2, v]))
            if guarded:
                if (column < I) and (first + k < N):
                    for v in T.vectorized(vector):
                        Y[outer, position(first + k), column, v] = T.cast(vals[k * vector + v], out_dtype)
            else:
                if column < I:
                    for v in T.vectorized(vector):
                        Y[outer, position(first + k), column, v] = T.cast(vals[k * vector + v], out_dtype)
        for v in T.unroll(vector):
            state[0, v] = op(state[0, v], state[3, v])

    @T.macro
    def add_chunk(vals, state):
        for k in T.unroll(items):
            for v in T.unroll(vector):
                state[0, v] = op(state[0, v], vals[k * vector + v])

    @T.macro
    def walk(X, Y, raw, vals, state, totals, outer, column, tx, first_chunk, chunks):
        """Scan (or, in ``sums`` mode, total in ``state[0]``) chunks ``first_chunk`` on, at most ``chunks`` of them."""
        full_here = full_chunks_from(first_chunk, chunks)
        if full_here > 0:
            load_chunk(X, raw, outer, column, tx, first_chunk, False)
        for c in T.serial(full_here):
            widen(raw, vals)
            # Issue the next chunk's loads now: they are in flight while this one is scanned.
            if c + 1 < full_here:
                load_chunk(X, raw, outer, column, tx, first_chunk + c + 1, False)
            if mode == "sums":
                add_chunk(vals, state)
            else:
                scan_chunk(Y, vals, totals, state, outer, column, tx, first_chunk + c, False)
        if tail > 0:
            if first_chunk + full_here == full_chunks and full_here < chunks:
                load_chunk(X, raw, outer, column, tx, full_chunks, True)
                widen(raw, vals)
                if mode == "sums":
                    add_chunk(vals, state)
                else:
                    scan_chunk(Y, vals, totals, state, outer, column, tx, full_chunks, True)

    @T.macro
    def combine_positions(state, totals, tx):
        """Every thread's ``state[0]`` = the combined ``state[0]`` of all positions of its columns.

        Shuffles within a warp, then shared memory across warps, added in warp order.
        """
        for v in T.unroll(vector):
            for step in T.unroll(max(1, lanes_per_column.bit_length() - 1)):
                if (1 << step) < lanes_per_column:
                    state[0, v] = op(state[0, v], T.shfl_xor(state[0, v], (1 << step) * tile))
        if warps > 1:
            if tx % WARP < tile:
                for v in T.unroll(vector):
                    totals[0, tx // WARP, (tx % tile) * vector + v] = state[0, v]
            T.sync_threads()
            for v in T.unroll(vector):
                state[0, v] = totals[0, 0, (tx % tile) * vector + v]
                for w in T.unroll(1, warps):
                    state[0, v] = op(state[0, v], totals[0, w, (tx % tile) * vector + v])
            # ``totals`` is reused by the scan that follows.
            T.sync_threads()

    @T.macro
    def carry_in(Partial, state, totals, outer, column, segment, tx):
        """``state[0]`` = the column totals of the segments before ``segment``.

        The positions of a column share the segments out, one load each per
        round, where one thread reading them all held every load in turn.
        """
        for base in T.serial(T.ceildiv(segment, positions)):
            if column < I and base * positions + tx // tile < segment:
                for v in T.unroll(vector):
                    state[0, v] = op(state[0, v], Partial[outer, base * positions + tx // tile, column, v])
        combine_positions(state, totals, tx)

    if mode == "plain":

        @T.prim_func
        def cumsum_column_scan(X: T.Tensor((O, N, I, vector), dtype), Y: T.Tensor((O, N, I, vector), out_dtype)):
            with T.Kernel(O * T.ceildiv(I, tile), threads=threads) as bx:
                tx = T.get_thread_binding()
                raw = T.alloc_local((items * vector,), dtype)
                vals = T.alloc_local((items * vector,), ACCUM)
                state = T.alloc_local((4, vector), ACCUM)
                totals = T.alloc_shared((2, warps, tile * vector), ACCUM)
                place = T.alloc_local((2,), "int32")
                locate(place, bx, tx, I)
                outer, column = place[0], place[1]
                for v in T.unroll(vector):
                    state[0, v] = T.cast(identity, ACCUM)
                walk(X, Y, raw, vals, state, totals, outer, column, tx, 0, total_chunks)

        return cumsum_column_scan

    S = T.dynamic("S")

    @T.macro
    def walk_segment(X, Y, Partial, bx, segment, tx):
        """Segment ``segment`` of the block's columns: its totals into ``Partial`` (``sums``),
        or its scan from the totals before it (``split``), which also needs the scan's state
        rows and a second set of totals."""
        raw = T.alloc_local((items * vector,), dtype)
        vals = T.alloc_local((items * vector,), ACCUM)
        state = T.alloc_local((1 if mode == "sums" else 4, vector), ACCUM)
        totals = T.alloc_shared((1 if mode == "sums" else 2, warps, tile * vector), ACCUM)
        # [outer index, column, chunks a segment]: the symbolic division worked out once.
        place = T.alloc_local((3,), "int32")
        locate(place, bx, tx, I)
        outer, column = place[0], place[1]
        place[2] = T.ceildiv(total_chunks, S)
        per_segment = place[2]
        for v in T.unroll(vector):
            state[0, v] = T.cast(identity, ACCUM)
        if mode == "split":
            carry_in(Partial, state, totals, outer, column, segment, tx)
        walk(X, Y, raw, vals, state, totals, outer, column, tx, segment * per_segment, per_segment)
        if mode == "sums":
            combine_positions(state, totals, tx)
            if tx < tile and column < I:
                for v in T.unroll(vector):
                    Partial[outer, segment, column, v] = state[0, v]

    if mode == "sums":

        @T.prim_func
        def cumsum_column_sums(X: T.Tensor((O, N, I, vector), dtype), Partial: T.Tensor((O, S, I, vector), ACCUM)):
            with T.Kernel(O * T.ceildiv(I, tile), S, threads=threads, prelude=CACHE_HINT_PRELUDE) as (bx, segment):
                T.pdl_trigger()  # the next launch may start early (see kernel_base)
                walk_segment(X, X, Partial, bx, segment, T.get_thread_binding())

        return cumsum_column_sums

    @T.prim_func
    def cumsum_split_column_scan(
        X: T.Tensor((O, N, I, vector), dtype),
        Partial: T.Tensor((O, S, I, vector), ACCUM),
        Y: T.Tensor((O, N, I, vector), out_dtype),
    ):
        with T.Kernel(O * T.ceildiv(I, tile), S, threads=threads, prelude=CACHE_HINT_PRELUDE) as (bx, segment):
            T.pdl_sync()  # wait for the launch before (see kernel_base)
            walk_segment(X, Y, Partial, bx, segment, T.get_thread_binding())

    return cumsum_split_column_scan


def _build_program(
    name: str, N: int, dtype: str, config: Dict[str, Any], *, combine: str = ADD, reverse: bool = False,
    out_dtype: Optional[str] = None,
) -> Any:
    """The program ``name`` of the scan with operator ``combine``, forward or ``reverse``, its output
    in ``out_dtype`` (default ``dtype``)."""
    operator = {"combine": combine, "reverse": reverse, "out_dtype": out_dtype}
    if name == ROW_SCAN:
        program = row_scan_program(N, dtype, **{**config, "segments": 1, "mode": "plain"}, **operator)
    elif name == SPLIT_ROW_SCAN:
        program = row_scan_program(N, dtype, **{**config, "mode": "split"}, **operator)
    elif name == LOOKBACK_ROW_SCAN:
        program = row_scan_program(N, dtype, **{**config, "mode": "lookback"}, **operator)
    elif name == SEGMENT_SUMS:
        program = segment_sums_program(N, dtype, **config, combine=combine, reverse=reverse)
    elif name.startswith((COLUMN_SCAN, COLUMN_SUMS, SPLIT_COLUMN_SCAN)):
        tile, vector = _column_tile(name)
        mode = {COLUMN_SCAN: "plain", COLUMN_SUMS: "sums", SPLIT_COLUMN_SCAN: "split"}[name.rpartition("_")[0]]
        program = column_scan_program(N, dtype, column_tile=tile, column_vector=vector, mode=mode, **config, **operator)
    else:
        raise ValueError(f"scan kernel: unknown program {name!r}")
    return _named_for_operator(program, combine, reverse)


def _named_for_operator(program: Any, combine: str, reverse: bool) -> Any:
    """``program`` under a symbol that names its operator (``cumsum_row_scan`` -> ``cumprod_reverse_row_scan``).

    Profiles then tell the forward, reverse and product scans apart.
    """
    if combine == ADD and not reverse:
        return program
    symbol = str(program.attrs["global_symbol"])
    stem = symbol.removeprefix("cumsum_")
    prefix = "cumprod" if combine == MUL else "cumsum"
    return program.with_attr("global_symbol", f"{prefix}{'_reverse' if reverse else ''}_{stem}")


def lookback_layout(
    N: int, threads: int, items: int, segments: int, elem_bytes: int, stages: int
) -> Tuple[int, int]:
    """(chunks per tile, tiles per row) of the look-back scan: ``segments`` tiles, or more
    where a tile would exceed ``MAX_PRELOAD_CHUNKS`` chunks or ``stages`` tiles would not
    fit in one SM's shared memory."""
    chunk, full_chunks, tail = _row_layout(N, items, threads)
    total_chunks = full_chunks + (tail > 0)
    fitting = max(1, SHARED_BYTES_PER_SM // (stages * chunk * elem_bytes))
    per_tile = min(-(-total_chunks // max(1, segments)), MAX_PRELOAD_CHUNKS, fitting)
    return per_tile, -(-total_chunks // per_tile)


def lookback_resident_blocks(
    N: int, threads: int, items: int, segments: int, elem_bytes: int, stages: int, blocks_per_sm: int
) -> int:
    """Look-back blocks sure to be resident on one SM at once: the launch bound
    (``blocks_per_sm``, 1 when the compiler chooses), within shared memory and threads."""
    per_tile, _ = lookback_layout(N, threads, items, segments, elem_bytes, stages)
    staging = stages * per_tile * threads * items * elem_bytes
    return max(1, min(max(1, blocks_per_sm), SHARED_BYTES_PER_SM // (staging + 1024), THREADS_PER_SM // threads))


def _column_items(column_items: int, vector: int) -> int:
    """Positions a column thread holds per chunk: half of ``column_items`` with vectors, to keep registers in check."""
    return column_items if vector == 1 else max(2, column_items // 2)


def column_layouts(inner: int, elem_bytes: int = 2) -> List[Tuple[int, int]]:
    """The (tile, vector) layouts a column program may take for ``inner`` columns, widest tile first.

    Rows of whole 16-byte vectors (a warp of them, or a power of two) get one
    vector per thread, in tiles of a warp of vectors down to
    ``MIN_VECTOR_TILE`` (or the row, if narrower); other rows one column per
    thread, in one tile as wide as the columns up to a warp.
    """
    vector = VECTOR_BYTES // elem_bytes
    vectors = inner // vector
    if inner % vector or not (vectors >= WARP or (vectors >= 2 and vectors & (vectors - 1) == 0)):
        return [(min(WARP, next_pow2(inner)), 1)]
    widest = min(WARP, vectors)
    return [(tile, vector) for tile in COLUMN_TILES[::-1] if min(widest, MIN_VECTOR_TILE) <= tile <= widest]


def column_program_name(tile: int, vector: int, program: str = COLUMN_SCAN) -> str:
    """The name of column program ``program`` (``COLUMN_SCAN``, ``COLUMN_SUMS`` or
    ``SPLIT_COLUMN_SCAN``) in the layout (``tile``, ``vector``)."""
    return f"{program}_{tile}" if vector == 1 else f"{program}_{tile}x{vector}"


def _column_tile(name: str) -> Tuple[int, int]:
    """(tile, vector) of a column program's name."""
    tile, _, vector = name.rpartition("_")[2].partition("x")
    return int(tile), int(vector or 1)


class ScanKernel(Kernel):
    """Inclusive scan along an axis of length ``N`` (float32 accumulation).

    Subclasses pick the operator (``combine``: "add" or "mul") and the
    direction (``reverse``: from the end of the axis to its start); every
    program, layout and config is shared.

    ``forward(x, out)`` takes ``x`` as ``(rows, N)`` (a scan over the last
    axis) or ``(outer, N, inner)``, contiguous and 16-byte aligned, and writes
    ``out`` (same shape and dtype, preallocated).  Few long rows (at most
    ``config["split_max_rows"]``) are cut across blocks: the look-back scan
    (``config["lookback"]``) or the split scan (``config["segments"] > 1``).
    Columns take the tile and, when too few, the cut that ``_column_plan`` picks.

    Args:
        N: length of the scanned axis, fixed at construction.
        dtype: dtype of ``x`` and ``out`` (float16, bfloat16, float32).
        out_dtype: ``out``'s dtype where it differs: float32 from half precision; a reverse scan (a
            gradient) any.
        config: explicit config (keys of ``default_config``; may be partial).
        tune: pick the fastest of ``autotune_configs`` on the current GPU.
    """

    combine: str = ADD
    reverse: bool = False
    version = "2"  # the config gained ``traded_max_chunks``

    def __init__(
        self,
        N: int,
        dtype: torch.dtype,
        *,
        config: Optional[Dict[str, Any]] = None,
        tune: bool = False,
        out_dtype: Optional[torch.dtype] = None,
    ) -> None:
        check_kernel_args(type(self).__name__, dtype, N=N)
        check_out_dtype(type(self).__name__, dtype, out_dtype, rounds=self.reverse)
        self.N = int(N)
        self._lookback_workspaces = ExchangeWorkspaces()
        super().__init__(dtype, config=config, tune=tune, out_dtype=out_dtype)

    @property
    def default_config(self) -> Dict[str, Any]:
        return cumsum_default_config(self.N, self.dtype)

    @property
    def autotune_configs(self) -> List[Dict[str, Any]]:
        return cumsum_autotune_configs(self.N, self.dtype)

    @property
    def split_segments(self) -> int:
        """Segments a row is cut into on the split path (1: no split path).  Kernels whose long
        rows take the look-back scan keep the split path for deterministic calls (see
        ``_takes_lookback``)."""
        config = self.config
        if config["segments"] <= 1:
            return 1
        return _segment_layout(self.N, config["items"], config["row_threads"], config["segments"])[1]

    def lookback_blocks(self, rows: int, device: torch.device) -> int:
        """Blocks of a look-back scan over ``rows`` rows: as many as are sure to be
        resident at once (the scan needs every block running), never more than tiles."""
        tiles, resident = self._lookback_layout()
        return min(rows * tiles, self.sm_count(device) * resident)

    def lookback_workspace(self, rows: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """The status words (a word a tile) and control words of a look-back scan over ``rows`` rows
        (see ``tileops.kernels.exchange``)."""
        return self._lookback_workspaces.get(rows, self._lookback_tiles(), device)

    def _takes_lookback(self) -> bool:
        """Whether this call takes the look-back scan: not under ``torch.use_deterministic_algorithms``.

        A tile adds up whichever of its predecessors' sums had been published when it
        looked back, so the float32 rounding of its offset, and the last bits of the
        output, may differ run to run; the split scan adds in a fixed order.
        """
        return self._uses_lookback() and not torch.are_deterministic_algorithms_enabled()

    def _uses_lookback(self) -> bool:
        """Whether few long rows take the look-back scan (rows of whole 16-byte vectors only)."""
        return self._lookback_tiles() > 1

    def _lookback_tiles(self) -> int:
        return self._lookback_layout()[0]

    def _lookback_layout(self) -> Tuple[int, int]:
        """(tiles per row, blocks resident an SM) of the look-back scan; (0, 0) where the config
        or the row length rules it out.  Worked out once per config: ``forward`` asks every call."""
        return self._launch_plans.get("lookback", self._derive_lookback_layout)

    def _derive_lookback_layout(self) -> Tuple[int, int]:
        config = self.config
        elem_bytes = self.dtype.itemsize
        row_bytes, span_bytes = self.N * elem_bytes, config["items"] * elem_bytes
        if not (config["lookback"] and row_bytes % VECTOR_BYTES == 0 and span_bytes % VECTOR_BYTES == 0):
            return 0, 0
        shape = (self.N, config["threads"], config["items"], config["segments"], elem_bytes)
        return (
            lookback_layout(*shape, config["lookback_stages"])[1],
            lookback_resident_blocks(*shape, config["lookback_stages"], config["blocks_per_sm"]),
        )

    def program(self, **config: Any) -> Any:
        """The row-scan program (the one every row count can use)."""
        return self._build(ROW_SCAN, config)

    def _build(self, name: str, config: Dict[str, Any]) -> Any:
        return _build_program(
            name, self.N, torch_dtype_to_tl(self.dtype), config, combine=self.combine, reverse=self.reverse,
            out_dtype=torch_dtype_to_tl(self.result_dtype),
        )

    def program_names(self, inner: int = 1) -> List[str]:
        """The programs ``forward`` may launch with the current config (``inner``: columns per position)."""
        names = [ROW_SCAN]
        if inner > 1:
            layouts = column_layouts(inner, self.dtype.itemsize)
            names += [column_program_name(*layout) for layout in layouts]
            tile, vector = layouts[-1]
            if vector > 1:  # rows of vectors may take the split column scan
                names += [column_program_name(tile, vector, step) for step in (COLUMN_SUMS, SPLIT_COLUMN_SCAN)]
        if self._uses_lookback():
            names.append(LOOKBACK_ROW_SCAN)
        elif self.split_segments > 1:
            names += [SEGMENT_SUMS, SPLIT_ROW_SCAN]
        return names

    def compile_program(self, name: str, config: Optional[Dict[str, Any]] = None, target: Any = "auto") -> Any:
        """The compiled program ``name`` for ``config`` (default: ``self.config``), cached."""
        if name == ROW_SCAN:
            return self.compile(config, target)
        config = dict(self.config if config is None else config)
        key = (name, repr(target)) + tuple(sorted(config.items()))
        return self.compile_once(key, lambda: self._build(name, config), target, (name, config))

    def build_all_for_sm90(self, inner: int = 1) -> Dict[str, Any]:
        """Compile every program of the current config for sm_90 (no GPU needed)."""
        return {name: self.compile_program(name, target=SM90_BUILD_TARGET) for name in self.program_names(inner)}

    def tuning_inputs(self, rows: Optional[int] = None) -> Tuple[torch.Tensor, ...]:
        """Random ``(x, out)`` rows on the current GPU to time a candidate on."""
        x = torch.randn(self.tuning_rows if rows is None else rows, self.N, device="cuda", dtype=self.dtype)
        return x, torch.empty_like(x, dtype=self.result_dtype)

    def _launcher(self, name: str) -> Any:
        # Compiled programs kept per config: looking them up through ``compile`` builds a key
        # per call, which costs microseconds.
        return self._launch_plans.get(("launcher", name), lambda: direct_launcher(self.compile_program(name)))

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the inclusive scan of ``x`` along its axis of length ``N`` into ``out``.

        ``x``: ``(rows, N)`` or ``(outer, N, inner)``, contiguous, 16-byte
        aligned, at least one element; ``out`` alike.
        """
        if x.dim() == 2:
            return self._scan_rows(x, out)
        outer, _, inner = x.shape
        if inner == 1:
            self._scan_rows(x.view(outer, self.N), out.view(outer, self.N))
            return out
        tile, vector, segments = self._column_plan(outer, inner)
        if segments == 0:
            rows = x.transpose(1, 2).contiguous()
            scanned = torch.empty_like(rows, dtype=out.dtype)
            self._scan_rows(rows.view(-1, self.N), scanned.view(-1, self.N))
            out.copy_(scanned.transpose(1, 2))
            return out
        shape = (outer, self.N, inner // vector, vector)
        x_vectors, out_vectors = x.view(shape), out.view(shape)
        if segments == 1:
            self._launcher(column_program_name(tile, vector))(x_vectors, out_vectors)
            return out
        partial = torch.empty((outer, segments, inner // vector, vector), dtype=torch.float32, device=x.device)
        self._launcher(column_program_name(tile, vector, COLUMN_SUMS))(x_vectors, partial)
        self._launcher(column_program_name(tile, vector, SPLIT_COLUMN_SCAN))(x_vectors, partial, out_vectors)
        return out

    def _column_plan(self, outer: int, inner: int) -> Tuple[int, int, int]:
        """(tile, vector, segments) of an ``(outer, N, inner)`` scan: segments 0 through
        transposed rows, 1 in the column program, more in the split column scan.

        The widest tile that gives ``column_min_blocks`` blocks.  Where even the
        narrowest gives fewer, rows of vectors cut the axis into segments of
        whole chunks (each block still walks its segment with loads in flight);
        single columns scan transposed rows, faster than leaving most SMs idle
        even with the two extra copies.
        """
        config = self.config
        layouts = column_layouts(inner, self.dtype.itemsize)
        for tile, vector in layouts:
            blocks = outer * -(-inner // (tile * vector))
            if blocks >= config["column_min_blocks"]:
                return tile, vector, 1
        # Rows of vectors read whole sectors with few loads, so cutting their axis pays.
        if vector > 1:
            chunk = config["column_threads"] // tile * _column_items(config["column_items"], vector)
            chunks = -(-self.N // chunk)
            return tile, vector, max(1, min(chunks, -(-config["column_split_blocks"] // blocks), MAX_GRID_Y))
        return tile, vector, 0 if self.N >= 4 * config["column_threads"] else 1

    def programs_for(self, shape: Tuple[int, ...]) -> List[str]:
        """The programs ``forward`` launches for an input of ``shape`` (to compile them ahead)."""
        if len(shape) == 2:
            return self._row_programs(shape[0])
        outer, _, inner = shape
        if inner == 1:
            return self._row_programs(outer)
        tile, vector, segments = self._column_plan(outer, inner)
        if segments == 0:
            return self._row_programs(outer * inner)
        if segments == 1:
            return [column_program_name(tile, vector)]
        return [column_program_name(tile, vector, step) for step in (COLUMN_SUMS, SPLIT_COLUMN_SCAN)]

    def _row_programs(self, rows: int) -> List[str]:
        config = self.config
        if rows <= min(config["split_max_rows"], MAX_GRID_Y):
            if self._takes_lookback():
                return [LOOKBACK_ROW_SCAN]
            if self.split_segments > 1:
                return [SEGMENT_SUMS, SPLIT_ROW_SCAN]
        return [ROW_SCAN]

    def _scan_rows(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        config = self.config
        # Split programs put rows on the grid's y axis (at most 65535 blocks).
        if rows <= min(config["split_max_rows"], MAX_GRID_Y):
            if self._takes_lookback():
                status, control = self.lookback_workspace(rows, x.device)
                self._launcher(LOOKBACK_ROW_SCAN)(x, status, control, out, self.lookback_blocks(rows, x.device))
                return out
            segments = self.split_segments
            if segments > 1:
                partial = torch.empty((rows, segments), dtype=torch.float32, device=x.device)
                self._launcher(SEGMENT_SUMS)(x, partial)
                self._launcher(SPLIT_ROW_SCAN)(x, partial, out)
                return out
        self._launcher(ROW_SCAN)(x, out)
        return out


class CumsumFwdKernel(ScanKernel):
    """Inclusive cumsum along an axis of length ``N``: ``out[i] = x[0] + ... + x[i]``."""


class CumsumBwdKernel(ScanKernel):
    """Reverse inclusive cumsum, the gradient of cumsum: ``out[i] = x[i] + ... + x[N - 1]``."""

    reverse = True
