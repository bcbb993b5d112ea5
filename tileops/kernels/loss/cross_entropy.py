"""Cross-entropy over rows of ``V`` class logits, forward and backward, in float32.

Forward (one block per row, one pass over the row): each thread walks the row
in steps of ``unroll`` 16-byte vectors, keeping a running maximum ``m``, the sum
``s`` of ``exp(x - m)`` rescaled whenever ``m`` grows (online softmax) and the
plain sum of the logits (for label smoothing).  The block then combines the
threads' states, and one thread writes

* ``lse = m + log(s)``, saved for the backward, and
* ``loss = (1 - eps) * (lse - x[target]) + eps * (lse - sum(x) / V)``, or 0
  when ``target == ignore_index``.

Backward (a grid of row tiles, one pass): with per-row coefficients
``cs`` (multiplies the smoothed target) and ``cp = cs + grad_lse`` (multiplies
the softmax),

    grad = cp * exp(x - lse) - cs * ((1 - eps) * [col == target] + eps / V)

so the only ``[N, V]`` tensor written is the gradient itself.  Each block forms
its row's ``cs`` from ``grad_loss`` (one value per row, or one for the batch),
the target (0 where ignored) and, for ``mean``, the count of kept rows; the
reduction is compiled into the program, so a call allocates nothing of ``N``
rows beside the gradient.

Two one-block programs serve the batch as a whole, each in one launch where
tensor arithmetic would take several: the forward's **total** (the sum of the
row losses, divided for ``mean`` by the rows whose target is kept) and the
backward's **kept rows** (that divisor, for a ``mean`` backward).  A forward
mean or sum over at most ``SMALL_TOTAL_ELEMENTS`` logits is one launch of a
third, which does the rows (a warp each) and the total in one block.

The total stays a launch of its own: folding it into the row program (each block
counts itself on an arrival counter, the last to arrive sums the rows) measured
slower beyond two waves of blocks, as each block's ordered arrival holds its SM
slot idle.  H100, bf16 rows of 32000, row program alone / with the separate
total / folded, us: 528 rows 18.5 / 22.5 / 20.7; 4096 rows 92.0 / 95.2 / 98.5;
8192 rows 173.3 / 177.6 / 185.6.  Instead the total's launch overlaps the row
program's last blocks (see ``kernel_base``): 4096 rows 95.3 -> 94.2 us.

Rows whose length is not a multiple of a 16-byte vector (GPT-2's 50257 classes) do not all
start on a 16-byte boundary; both row programs then read them (and the backward writes the
gradient) in aligned windows of a flat view (``windowed_rows``), one 16-byte access per window
but for the two that straddle a row's ends.

``V``, ``ignore_index`` and the label smoothing are compile-time constants; the
row count is a TileLang symbolic value, so one program serves every batch.
Row offsets are 64-bit (the row stride is an int64 symbolic value).  A row
whose logits are all ``-inf`` gives NaN, as PyTorch does.  A target outside
``[0, V)`` other than ``ignore_index`` gives its row a NaN loss and a NaN
gradient row (so a mean or sum is NaN too): PyTorch's CUDA kernels stop the
process with a device-side assertion there, and an error raised on the host
would need a device synchronisation every call.
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
import functools
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from tileops.kernels.cache_hints import CACHE_HINT_PRELUDE, EVICT_LAST, takes_hint, vector_load
from tileops.kernels.device_traits import has_fast_memory
from tileops.kernels.fast_math import FAST_EXP2_PRELUDE, fast_exp2
from tileops.kernels.kernel_base import SM90_BUILD_TARGET, Kernel, strided_rows, torch_dtype_to_tl
from tileops.kernels.launch import direct_launcher
from tileops.kernels.sizes import ACCUM, MAX_THREADS, WARP, check_kernel_args, max_vector, next_pow2, row_vector
from tileops.kernels.windows import flat_rows, window_count, window_macros, windowed_rows

__all__ = [
    "CrossEntropyFwdKernel",
    "CrossEntropyBwdKernel",
    "cross_entropy_fwd_program",
    "cross_entropy_bwd_program",
    "flat_rows",
    "windowed_rows",
]


LOG2E = 1.4426950408889634

# A program's compile-time switches, ``((name, value), ...)`` in name order.
Flags = Tuple[Tuple[str, bool], ...]

# float32 state slots of the forward program.
_MAX, _SUM, _XSUM, _NEW_MAX, _OFFSET, _LSE = 0, 1, 2, 3, 4, 5
_STATE = 6


def _threads_for(V: int, vector: int, most: int) -> int:
    """Threads that cover a row with one vector each, as a power of two in [32, most]."""
    return max(WARP, min(most, next_pow2(-(-V // vector))))


def _check_config(config: Dict[str, int]) -> None:
    threads, unroll = config["threads"], config["unroll"]
    if threads < WARP or threads > MAX_THREADS or threads & (threads - 1):
        raise ValueError(f"cross-entropy kernels: threads must be a power of two in [32, 1024], got {threads}")
    if unroll < 1:
        raise ValueError(f"cross-entropy kernels: unroll must be positive, got {unroll}")
    if config.get("blocks_per_sm", 0) < 0:
        raise ValueError(f"cross-entropy kernels: blocks_per_sm must be >= 0, got {config['blocks_per_sm']}")


# ---- programs ------------------------------------------------------------------------------------


def _block_reduce(T: Any, threads: int) -> Any:
    """Macro: ``st[slot]`` of every thread combined (max or sum) into every thread's ``st[slot]``.

    Warps combine with xor shuffles, then through ``scratch[row_slot, warp]``;
    each reduction of a program takes its own scratch row, so no barrier is
    needed between reductions.
    """
    warps = threads // WARP

    @T.macro
    def block_reduce(st, slot, scratch, row_slot, tx, use_max):
        for step in T.unroll(5):
            if use_max:
                st[slot] = T.max(st[slot], T.shfl_xor(st[slot], 1 << step))
            else:
                st[slot] = st[slot] + T.shfl_xor(st[slot], 1 << step)
        if warps > 1:
            if tx % WARP == 0:
                scratch[row_slot, tx // WARP] = st[slot]
            T.sync_threads()
            st[slot] = scratch[row_slot, 0]
            for w in T.unroll(1, warps):
                if use_max:
                    st[slot] = T.max(st[slot], scratch[row_slot, w])
                else:
                    st[slot] = st[slot] + scratch[row_slot, w]

    return block_reduce


def _online_max(T: Any, V: int, vector: int, unroll: int, column: Any, slots: Tuple[int, int, int, int]) -> Any:
    """Macros ``(advance, rescale_sum)`` of an online softmax over ``st[slots]``, the running
    maximum, the sum of ``exp(x - offset)``, the new maximum and the offset.

    ``advance(st, a, step, tx)`` folds one step's logits ``a`` (``unroll`` vectors, the columns
    ``column(step, u, tx)`` before ``V``) into the maximum; ``rescale_sum(st)`` moves the sum
    from the old maximum to the new one, leaving the offset at the new maximum, or 0 while it
    is -inf (so -inf logits add 0, not NaN), with ``fast_exp2``: a program that takes these
    names ``FAST_EXP2_PRELUDE`` in its kernel's prelude."""
    max_, sum_, new_max, offset = slots

    @T.macro
    def rescale_sum(st):
        st[offset] = T.if_then_else(st[new_max] == -T.infinity(ACCUM), T.cast(0, ACCUM), st[new_max])
        st[sum_] = st[sum_] * fast_exp2(T, (st[max_] - st[offset]) * LOG2E)
        st[max_] = st[new_max]

    @T.macro
    def advance(st, a, step, tx):
        st[new_max] = st[max_]
        for u in T.unroll(unroll):
            if column(step, u, tx) < V:
                for k in T.unroll(vector):
                    st[new_max] = T.max(st[new_max], T.cast(a[u * vector + k], ACCUM))
        rescale_sum(st)

    return advance, rescale_sum


def _row_and_tile(block: Any, tiles: int) -> Tuple[Any, Any]:
    """(row, tile of the row) of ``block`` in a grid of ``rows * tiles`` blocks.

    A row's tiles are launched one after another, so the blocks resident at once cover one stretch
    of memory.  With rows on the grid's x axis and tiles on y (as before) they covered the same
    tile of as many rows, and the backward ran 5-6 % slower (H200, bf16, µs, rows on x / in
    order): 4096 x 32000 135.4 / 129.2, 16384 x 32000 532.4 / 507.2, 8192 x 131072 1098.8 /
    1037.4; against soft targets 8192 x 131072 1540.1 / 1465.6."""
    return block // tiles, block % tiles


def _nan_unless_in_range(T: Any, target: Any, V: int, value: Any) -> Any:
    """``value``, or NaN when ``target`` lies outside ``[0, V)``: a bad target (not the ignored
    one) shows in the loss and its gradient row instead of giving a plausible wrong number."""
    return T.if_then_else(T.And(target >= 0, target < V), value, T.cast(float("nan"), ACCUM))


def _row_loss(T: Any, X: Any, Target: Any, row: Any, st: Any, V: int, label_smoothing: float,
              row_start: Any = None) -> Any:
    """The loss of a kept row from its state (``_LSE``, ``_XSUM``); NaN for a target outside the row,
    whose logit is read clamped into the row.  ``row_start``: ``X`` is flat (a windowed program's
    view) and the row begins at that element."""
    column = T.min(T.max(Target[row], 0), V - 1)
    logit = X[row, column] if row_start is None else X[row_start + column]
    loss = ((1.0 - label_smoothing) * (st[_LSE] - T.cast(logit, ACCUM))
            + label_smoothing * (st[_LSE] - st[_XSUM] / V))
    return _nan_unless_in_range(T, Target[row], V, loss)


def cross_entropy_fwd_program(V: int, dtype: str, *, vector: int, threads: int, unroll: int,
                              ignore_index: int, label_smoothing: float, blocks_per_sm: int = 0,
                              windowed: bool = False) -> Any:
    """Per-row ``loss`` and ``lse`` (float32) of ``logits`` ``(R, V)`` and ``target`` ``(R,)``.

    ``windowed``: the logits come as a flat view of their rows and their row stride, and are read
    in windows (see ``windowed_rows``); ``(X, Target, Loss, Lse, LDX)``."""
    if windowed:
        return _cross_entropy_fwd_windowed(V, dtype, vector=vector, threads=threads, unroll=unroll,
                                           ignore_index=ignore_index, label_smoothing=label_smoothing,
                                           blocks_per_sm=blocks_per_sm)
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    chunk = threads * vector
    step_elems = chunk * unroll
    steps = -(-V // step_elems)
    warps = threads // WARP
    R = T.dynamic("R")
    XT, LDX = strided_rows(T, R, V, dtype, "LDX")

    def column(step, u, tx):
        return step * step_elems + u * chunk + tx * vector

    advance_max, rescale_sum = _online_max(T, V, vector, unroll, column, (_MAX, _SUM, _NEW_MAX, _OFFSET))
    end_row = _row_end(T, threads, V, ignore_index, label_smoothing, rescale_sum, flat=False)

    @T.prim_func
    def cross_entropy_fwd(
        X: XT,
        Target: T.Tensor((R,), "int64"),
        Loss: T.Tensor((R,), ACCUM),
        Lse: T.Tensor((R,), ACCUM),
    ):
        # The sums of exponentials take ``fast_exp2``: their terms are relative to the maximum.
        with T.Kernel(R, threads=threads, prelude=FAST_EXP2_PRELUDE) as row:
            if blocks_per_sm:
                T.annotate_min_blocks_per_sm(blocks_per_sm)
            T.pdl_trigger()  # the next launch may start early (see kernel_base)
            tx = T.get_thread_binding()
            a = T.alloc_local((unroll * vector,), dtype)
            st = T.alloc_local((_STATE,), ACCUM)
            scratch = T.alloc_shared((3, max(1, warps)), ACCUM)
            T.assume(LDX % vector == 0)
            st[_MAX] = -T.infinity(ACCUM)
            st[_SUM] = T.cast(0, ACCUM)
            st[_XSUM] = T.cast(0, ACCUM)
            for step in T.serial(steps):
                for u in T.unroll(unroll):
                    if column(step, u, tx) < V:
                        for k in T.vectorized(vector):
                            a[u * vector + k] = X[row, column(step, u, tx) + k]
                advance_max(st, a, step, tx)
                for u in T.unroll(unroll):
                    if column(step, u, tx) < V:
                        for k in T.unroll(vector):
                            # Subtract, then scale: the maximum itself gives exp2(0) = 1 exactly.
                            st[_SUM] = st[_SUM] + fast_exp2(T, (T.cast(a[u * vector + k], ACCUM) - st[_OFFSET]) * LOG2E)
                            st[_XSUM] = st[_XSUM] + T.cast(a[u * vector + k], ACCUM)
            end_row(st, scratch, tx, X, Target, Loss, Lse, row, 0)

    return cross_entropy_fwd


def _row_end(T: Any, threads: int, V: int, ignore_index: int, label_smoothing: float, rescale_sum: Any,
             flat: bool) -> Any:
    """Macro ``end_row(st, scratch, tx, X, Target, Loss, Lse, row, row_start)``: the block's
    maximum, every thread's sum moved to it and summed, then ``Lse`` and ``Loss`` of the row
    (``flat``: ``X`` is a flat view and the row begins at its element ``row_start``)."""
    block_reduce = _block_reduce(T, threads)

    def loss(X: Any, Target: Any, row: Any, st: Any, row_start: Any) -> Any:
        return _row_loss(T, X, Target, row, st, V, label_smoothing, row_start if flat else None)

    @T.macro
    def end_row(st, scratch, tx, X, Target, Loss, Lse, row, row_start):
        st[_NEW_MAX] = st[_MAX]
        block_reduce(st, _NEW_MAX, scratch, 0, tx, True)
        rescale_sum(st)
        block_reduce(st, _SUM, scratch, 1, tx, False)
        block_reduce(st, _XSUM, scratch, 2, tx, False)
        if tx == 0:
            # The maximum itself (not offset / log2(e)), so a one-class row's loss is exactly 0.
            st[_LSE] = T.if_then_else(st[_MAX] == -T.infinity(ACCUM), T.cast(0, ACCUM), st[_MAX]) + T.log(st[_SUM])
            Lse[row] = st[_LSE]
            if Target[row] == ignore_index:
                Loss[row] = T.cast(0, ACCUM)
            else:
                Loss[row] = loss(X, Target, row, st, row_start)

    return end_row


def _cross_entropy_fwd_windowed(V: int, dtype: str, *, vector: int, threads: int, unroll: int,
                                ignore_index: int, label_smoothing: float, blocks_per_sm: int) -> Any:
    """``cross_entropy_fwd_program`` over rows read in windows: the same walk, each step ``unroll``
    windows a thread; elements outside the row are -inf, which add nothing to the maximum or to
    the sum of exponentials, and are left out of the plain sum."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    step_windows = threads * unroll
    steps = -(-window_count(V, vector) // step_windows)
    warps = threads // WARP
    R = T.dynamic("R")
    L = T.dynamic("L", "int64")
    load_window, _ = window_macros(T, V, vector, dtype)
    _, rescale_sum = _online_max(T, V, vector, unroll, None, (_MAX, _SUM, _NEW_MAX, _OFFSET))
    end_row = _row_end(T, threads, V, ignore_index, label_smoothing, rescale_sum, flat=True)

    @T.prim_func
    def cross_entropy_fwd_windowed(
        X: T.Tensor((L,), dtype),
        Target: T.Tensor((R,), "int64"),
        Loss: T.Tensor((R,), ACCUM),
        Lse: T.Tensor((R,), ACCUM),
        LDX: T.int64,
    ):
        with T.Kernel(R, threads=threads, prelude=FAST_EXP2_PRELUDE) as row:
            if blocks_per_sm:
                T.annotate_min_blocks_per_sm(blocks_per_sm)
            T.pdl_trigger()  # the next launch may start early (see kernel_base)
            tx = T.get_thread_binding()
            a = T.alloc_local((unroll * vector,), dtype)
            st = T.alloc_local((_STATE,), ACCUM)
            at = T.alloc_local((3,), "int64")  # the row's first element, its first window, its skew
            scratch = T.alloc_shared((3, max(1, warps)), ACCUM)
            at[0] = T.cast(row, "int64") * LDX
            at[1] = at[0] // vector
            at[2] = at[0] - at[1] * vector
            st[_MAX] = -T.infinity(ACCUM)
            st[_SUM] = T.cast(0, ACCUM)
            st[_XSUM] = T.cast(0, ACCUM)
            for step in T.serial(steps):
                for u in T.unroll(unroll):
                    load_window(a, u * vector, X, at[1], step * step_windows + u * threads + tx,
                                T.cast(at[2], "int32"))
                st[_NEW_MAX] = st[_MAX]
                for i in T.unroll(unroll * vector):
                    st[_NEW_MAX] = T.max(st[_NEW_MAX], T.cast(a[i], ACCUM))
                rescale_sum(st)
                for u in T.unroll(unroll):
                    first_column = (step * step_windows + u * threads + tx) * vector - T.cast(at[2], "int32")
                    if first_column < V:
                        for k in T.unroll(vector):  # -inf outside the row: exp2 gives 0
                            st[_SUM] = st[_SUM] + fast_exp2(T, (T.cast(a[u * vector + k], ACCUM) - st[_OFFSET]) * LOG2E)
                        if label_smoothing > 0:  # else the plain sum is not read
                            if T.And(first_column >= 0, first_column + vector <= V):
                                for k in T.unroll(vector):
                                    st[_XSUM] = st[_XSUM] + T.cast(a[u * vector + k], ACCUM)
                            else:
                                for k in T.unroll(vector):
                                    st[_XSUM] = st[_XSUM] + T.if_then_else(
                                        T.And(first_column + k >= 0, first_column + k < V),
                                        T.cast(a[u * vector + k], ACCUM), T.cast(0, ACCUM))
            end_row(st, scratch, tx, X, Target, Loss, Lse, row, at[0])

    return cross_entropy_fwd_windowed


def cross_entropy_bwd_program(V: int, dtype: str, *, vector: int, threads: int, unroll: int,
                              ignore_index: int, label_smoothing: float, blocks_per_sm: int = 0,
                              per_row: bool = True, has_grad_lse: bool = True, mean: bool = False,
                              hinted_min_classes: int = 0, windowed: bool = False) -> Any:
    """``grad = cp * exp(x - lse) - cs * ((1 - eps) * onehot(target) + eps / V)`` over ``(R, V)`` tiles.

    ``cs``, the row's share of the loss's gradient: ``GradLoss[row]`` (``per_row``) or
    ``GradLoss[0]``, divided for ``mean`` by ``Kept[0]`` (the kept rows), 0 where the target
    is ignored and NaN where it lies outside ``[0, V)``; ``cp = cs + GradLse[row]``
    (``has_grad_lse``) or ``cs``.  Unused arguments are not read (any tensor of their dtype
    will do).  Rows of ``hinted_min_classes`` classes or more (0: none) load the logits with
    L2's ``evict_last`` hint (``cache_hints``).

    ``windowed``: the logits and the gradient come as flat views of their rows and their row
    strides, which must be equal modulo ``vector`` (every row then starts as far into a window in
    both), and are read and written in windows (see ``windowed_rows``); ``(X, Target, Lse,
    GradLoss, GradLse, Kept, G, LDX, LDG)``.
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    if windowed:
        return _cross_entropy_bwd_windowed(
            T, V, dtype, vector=vector, threads=threads, unroll=unroll, ignore_index=ignore_index,
            label_smoothing=label_smoothing, blocks_per_sm=blocks_per_sm, per_row=per_row,
            has_grad_lse=has_grad_lse, mean=mean, hinted_min_classes=hinted_min_classes)
    chunk = threads * vector
    tile = chunk * unroll
    R = T.dynamic("R")
    XT, LDX = strided_rows(T, R, V, dtype, "LDX")
    GT, LDG = strided_rows(T, R, V, dtype, "LDG")
    GL = T.dynamic("GL")
    GS = T.dynamic("GS")
    hinted = 0 < hinted_min_classes <= V and takes_hint(EVICT_LAST, vector, dtype)
    load_vector = vector_load(T, EVICT_LAST if hinted else None, vector, dtype)
    tiles = -(-V // tile)
    gradient = _gradient_macro(T, V, dtype, vector=vector, threads=threads, unroll=unroll, ignore_index=ignore_index,
                               label_smoothing=label_smoothing, per_row=per_row, has_grad_lse=has_grad_lse, mean=mean)

    @T.prim_func
    def cross_entropy_bwd(
        X: XT,
        Target: T.Tensor((R,), "int64"),
        Lse: T.Tensor((R,), ACCUM),
        GradLoss: T.Tensor((GL,), dtype),
        GradLse: T.Tensor((GS,), ACCUM),
        Kept: T.Tensor((1,), ACCUM),
        G: GT,
    ):
        with T.Kernel(R * tiles, threads=threads, prelude=CACHE_HINT_PRELUDE if hinted else None) as block:
            row, bx = _row_and_tile(block, tiles)
            if blocks_per_sm:
                T.annotate_min_blocks_per_sm(blocks_per_sm)
            if mean:  # the kept-row count comes from the launch before
                T.pdl_sync()  # wait for the launch before (see kernel_base)
            tx = T.get_thread_binding()
            a = T.alloc_local((unroll * vector,), dtype)  # the logits, then (in place) the gradient
            st = T.alloc_local((5,), ACCUM)
            here = T.alloc_local((1,), "int64")
            T.assume(LDX % vector == 0)
            T.assume(LDG % vector == 0)
            for u in T.unroll(unroll):
                if bx * tile + u * chunk + tx * vector < V:
                    load_vector(a, u * vector, X, row, bx * tile + u * chunk + tx * vector)
            here[0] = Target[row] - (bx * tile + tx * vector)
            gradient(a, st, row, here, Target, Lse, GradLoss, GradLse, Kept)
            for u in T.unroll(unroll):
                if bx * tile + u * chunk + tx * vector < V:
                    for k in T.vectorized(vector):
                        G[row, bx * tile + u * chunk + tx * vector + k] = a[u * vector + k]

    return cross_entropy_bwd


def _gradient_macro(T: Any, V: int, dtype: str, *, vector: int, threads: int, unroll: int, ignore_index: int,
                    label_smoothing: float, per_row: bool, has_grad_lse: bool, mean: bool) -> Any:
    """Macro ``gradient(a, st, row, here, Target, Lse, GradLoss, GradLse, Kept)``: the row's
    coefficients into ``st``, then the gradient of the thread's ``unroll`` vectors of logits ``a``,
    in place.  ``here[0]`` is the target's column less the column of the thread's first element;
    the element ``u * threads * vector + k`` on is the target's when that is where it lies."""
    target_weight = 1.0 - label_smoothing
    uniform_weight = label_smoothing / V
    span = threads * vector * unroll

    @T.macro
    def gradient(a, st, row, here, Target, Lse, GradLoss, GradLse, Kept):
        # The target's offset from this thread's first element, or -1 when none of the thread's
        # elements is the target: each element then compares a 32-bit register with a constant.
        # Ignored rows: cs = 0 and no element matches.
        target_at = T.if_then_else(
            T.And(T.And(Target[row] != ignore_index, here[0] >= 0), here[0] < span),
            T.cast(here[0], "int32"), -1)
        # Per element the subtracted term is one of two row constants.  (x - lse) is
        # formed before the scaling, not folded into one fma with lse * log2(e): near
        # p = 1 that rounding would swamp the gradient p - 1 (exactly 0 for V = 1).
        st[0] = Lse[row]
        st[4] = T.cast(GradLoss[row if per_row else 0], ACCUM)
        if mean:
            st[4] = st[4] / Kept[0]
        st[4] = T.if_then_else(Target[row] == ignore_index, T.cast(0, ACCUM),
                               _nan_unless_in_range(T, Target[row], V, st[4]))
        st[1] = st[4] + GradLse[row] if has_grad_lse else st[4]
        st[2] = st[4] * uniform_weight
        st[3] = st[2] + st[4] * target_weight
        for u in T.unroll(unroll):
            for k in T.unroll(vector):
                a[u * vector + k] = T.cast(
                    st[1] * T.exp2((T.cast(a[u * vector + k], ACCUM) - st[0]) * LOG2E)
                    - T.if_then_else(u * threads * vector + k == target_at, st[3], st[2]),
                    dtype,
                )

    return gradient


def _cross_entropy_bwd_windowed(T: Any, V: int, dtype: str, *, vector: int, threads: int, unroll: int,
                                ignore_index: int, label_smoothing: float, blocks_per_sm: int, per_row: bool,
                                has_grad_lse: bool, mean: bool, hinted_min_classes: int) -> Any:
    """``cross_entropy_bwd_program`` over rows read and written in windows: a block's tile is
    ``unroll`` windows a thread; elements outside the row are computed from -inf and not stored."""
    tile_windows = threads * unroll
    tiles = -(-window_count(V, vector) // tile_windows)
    R = T.dynamic("R")
    LX = T.dynamic("LX", "int64")
    LG = T.dynamic("LG", "int64")
    GL = T.dynamic("GL")
    GS = T.dynamic("GS")
    hinted = 0 < hinted_min_classes <= V and takes_hint(EVICT_LAST, vector, dtype)
    load_window, store_window = window_macros(T, V, vector, dtype, EVICT_LAST if hinted else None)
    gradient = _gradient_macro(T, V, dtype, vector=vector, threads=threads, unroll=unroll, ignore_index=ignore_index,
                               label_smoothing=label_smoothing, per_row=per_row, has_grad_lse=has_grad_lse, mean=mean)

    @T.prim_func
    def cross_entropy_bwd_windowed(
        X: T.Tensor((LX,), dtype),
        Target: T.Tensor((R,), "int64"),
        Lse: T.Tensor((R,), ACCUM),
        GradLoss: T.Tensor((GL,), dtype),
        GradLse: T.Tensor((GS,), ACCUM),
        Kept: T.Tensor((1,), ACCUM),
        G: T.Tensor((LG,), dtype),
        LDX: T.int64,
        LDG: T.int64,
    ):
        with T.Kernel(R * tiles, threads=threads, prelude=CACHE_HINT_PRELUDE if hinted else None) as block:
            row, bx = _row_and_tile(block, tiles)
            if blocks_per_sm:
                T.annotate_min_blocks_per_sm(blocks_per_sm)
            if mean:  # the kept-row count comes from the launch before
                T.pdl_sync()  # wait for the launch before (see kernel_base)
            tx = T.get_thread_binding()
            a = T.alloc_local((unroll * vector,), dtype)  # the logits, then (in place) the gradient
            st = T.alloc_local((5,), ACCUM)
            here = T.alloc_local((1,), "int64")
            at = T.alloc_local((3,), "int64")  # the row's first window in X and in G, its skew
            at[0] = T.cast(row, "int64") * LDX // vector
            at[2] = T.cast(row, "int64") * LDX - at[0] * vector
            at[1] = T.cast(row, "int64") * LDG // vector
            for u in T.unroll(unroll):
                load_window(a, u * vector, X, at[0], bx * tile_windows + u * threads + tx, T.cast(at[2], "int32"))
            here[0] = Target[row] - ((bx * tile_windows + tx) * vector - at[2])
            gradient(a, st, row, here, Target, Lse, GradLoss, GradLse, Kept)
            for u in T.unroll(unroll):
                store_window(G, a, u * vector, at[1], bx * tile_windows + u * threads + tx, T.cast(at[2], "int32"))

    return cross_entropy_bwd_windowed


# ---- batch programs (one block) ---------------------------------------------------------------------

BATCH_THREADS = 1024


def _kept(T: Any, target: Any, ignore_index: int) -> Any:
    """1.0 for a row whose target is kept, 0.0 for an ignored one (float32, to be counted)."""
    return T.if_then_else(target == ignore_index, T.cast(0, ACCUM), T.cast(1, ACCUM))


def _total_macro(T: Any, threads: int, mean: bool, dtype: str) -> Any:
    """Macro: add the block's ``acc`` (loss sum, kept rows) and write the sum or the kept-row mean to ``Out[0]``."""
    block_reduce = _block_reduce(T, threads)

    @T.macro
    def store_total(acc, scratch, Out, tx):
        block_reduce(acc, 0, scratch, 0, tx, False)
        if mean:
            block_reduce(acc, 1, scratch, 1, tx, False)
        if tx == 0:
            if mean:
                Out[0] = T.cast(acc[0] / acc[1], dtype)
            else:
                Out[0] = T.cast(acc[0], dtype)

    return store_total


def cross_entropy_total_program(dtype: str, *, mean: bool, ignore_index: int,
                                threads: int = BATCH_THREADS) -> Any:
    """``Out[0]``: the sum of ``LossRows`` (``mean``: over the rows whose target is kept), cast to ``dtype``.

    The kept rows are counted in float32, exact up to 2^24 rows (logits of
    that many rows would not fit in GPU memory).  No kept row: 0 / 0 = NaN,
    as PyTorch gives.
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    store_total = _total_macro(T, threads, mean, dtype)
    R = T.dynamic("R")

    @T.prim_func
    def cross_entropy_total(
        LossRows: T.Tensor((R,), ACCUM),
        Target: T.Tensor((R,), "int64"),
        Out: T.Tensor((1,), dtype),
    ):
        with T.Kernel(1, threads=threads):
            T.pdl_sync()  # wait for the launch before (see kernel_base)
            tx = T.get_thread_binding()
            acc = T.alloc_local((2,), ACCUM)
            scratch = T.alloc_shared((2, threads // WARP), ACCUM)
            acc[0] = T.cast(0, ACCUM)
            acc[1] = T.cast(0, ACCUM)
            for i in T.serial(T.ceildiv(R, threads)):
                if i * threads + tx < R:
                    acc[0] = acc[0] + LossRows[i * threads + tx]
                    acc[1] = acc[1] + _kept(T, Target[i * threads + tx], ignore_index)
            store_total(acc, scratch, Out, tx)

    return cross_entropy_total


# Forward calls of at most this many logits that reduce to a mean or a sum take one launch of one
# block (``cross_entropy_small_total_program``) instead of the row program and the total.
SMALL_TOTAL_ELEMENTS = 8192
SMALL_TOTAL_THREADS = 256


def cross_entropy_small_total_program(V: int, dtype: str, *, mean: bool, ignore_index: int, label_smoothing: float,
                                      threads: int = SMALL_TOTAL_THREADS) -> Any:
    """``Lse`` of every row and ``Out[0]``, the sum (``mean``: the kept-row mean) of the row losses,
    from one block: each warp takes rows ``w, w + warps, ...``, its lanes striding over the row,
    and adds the losses of its rows; the block then adds the warps' sums.  For calls so small that
    a second launch would cost more than the whole computation."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    warps = threads // WARP
    lane_steps = -(-V // WARP)
    shuffle_steps = WARP.bit_length() - 1
    store_total = _total_macro(T, threads, mean, dtype)
    R = T.dynamic("R")
    XT, LDX = strided_rows(T, R, V, dtype, "LDX")

    @T.macro
    def warp_sum(st, slot):
        for step in T.unroll(shuffle_steps):
            st[slot] = st[slot] + T.shfl_xor(st[slot], 1 << step)

    @T.prim_func
    def cross_entropy_small_total(
        X: XT,
        Target: T.Tensor((R,), "int64"),
        Lse: T.Tensor((R,), ACCUM),
        Out: T.Tensor((1,), dtype),
    ):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            lane = tx % WARP
            st = T.alloc_local((_STATE,), ACCUM)
            acc = T.alloc_local((2,), ACCUM)  # the warp's loss sum and kept rows
            scratch = T.alloc_shared((2, warps), ACCUM)
            acc[0] = T.cast(0, ACCUM)
            acc[1] = T.cast(0, ACCUM)
            for i in T.serial(T.ceildiv(R, warps)):
                row = i * warps + tx // WARP
                if row < R:  # the same for the whole warp
                    st[_MAX] = -T.infinity(ACCUM)
                    for c in T.serial(lane_steps):
                        if c * WARP + lane < V:
                            st[_MAX] = T.max(st[_MAX], T.cast(X[row, c * WARP + lane], ACCUM))
                    for step in T.unroll(shuffle_steps):
                        st[_MAX] = T.max(st[_MAX], T.shfl_xor(st[_MAX], 1 << step))
                    # The maximum, or 0 when it is -inf (as the row program's offset).
                    st[_OFFSET] = T.if_then_else(st[_MAX] == -T.infinity(ACCUM), T.cast(0, ACCUM), st[_MAX])
                    st[_SUM] = T.cast(0, ACCUM)
                    st[_XSUM] = T.cast(0, ACCUM)
                    for c in T.serial(lane_steps):
                        if c * WARP + lane < V:
                            st[_SUM] = st[_SUM] + T.exp2((T.cast(X[row, c * WARP + lane], ACCUM) - st[_OFFSET]) * LOG2E)
                            st[_XSUM] = st[_XSUM] + T.cast(X[row, c * WARP + lane], ACCUM)
                    warp_sum(st, _SUM)
                    warp_sum(st, _XSUM)
                    st[_LSE] = st[_OFFSET] + T.log(st[_SUM])
                    if lane == 0:
                        Lse[row] = st[_LSE]
                        if Target[row] != ignore_index:
                            acc[0] = acc[0] + _row_loss(T, X, Target, row, st, V, label_smoothing)
                            acc[1] = acc[1] + T.cast(1, ACCUM)
            store_total(acc, scratch, Out, tx)

    return cross_entropy_small_total


def cross_entropy_kept_rows_program(dtype: str, *, ignore_index: int, threads: int = BATCH_THREADS) -> Any:
    """``Out[0]``: how many rows keep their target (float32), the divisor of a ``mean`` backward."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    block_reduce = _block_reduce(T, threads)
    R = T.dynamic("R")

    @T.prim_func
    def cross_entropy_kept_rows(Target: T.Tensor((R,), "int64"), Out: T.Tensor((1,), ACCUM)):
        with T.Kernel(1, threads=threads):
            T.pdl_trigger()  # the next launch may start early (see kernel_base)
            tx = T.get_thread_binding()
            acc = T.alloc_local((1,), ACCUM)
            scratch = T.alloc_shared((1, threads // WARP), ACCUM)
            acc[0] = T.cast(0, ACCUM)
            for i in T.serial(T.ceildiv(R, threads)):
                if i * threads + tx < R:
                    acc[0] = acc[0] + _kept(T, Target[i * threads + tx], ignore_index)
            block_reduce(acc, 0, scratch, 0, tx, False)
            if tx == 0:
                Out[0] = acc[0]

    return cross_entropy_kept_rows


# ---- kernels -------------------------------------------------------------------------------------


class _CrossEntropyKernel(Kernel):
    """Shared construction, config and launch of the two cross-entropy programs.

    Args:
        V: number of classes (row length), fixed at construction.
        dtype: dtype of the logits (float16, bfloat16, float32).
        ignore_index: target value whose rows are skipped.
        label_smoothing: weight of the uniform distribution mixed into the target.
        config: explicit config (``threads``, ``unroll``, ``blocks_per_sm`` and the class's
            ``program_keys``; may be partial).
        tune: pick the fastest of ``autotune_configs`` on the current GPU.
    """

    builder = staticmethod(cross_entropy_fwd_program)
    most_threads = 512

    def __init__(self, V: int, dtype: torch.dtype, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                 config: Optional[Dict[str, Any]] = None, tune: bool = False) -> None:
        name = type(self).__name__
        check_kernel_args(name, dtype, V=V)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"{name}: label_smoothing must be in [0, 1], got {label_smoothing}")
        self.V = int(V)
        self.ignore_index = int(ignore_index)
        self.label_smoothing = float(label_smoothing)
        self.windowed = self.reads_windows and windowed_rows(self.V, dtype)
        self._vector = self._access_vector(dtype)
        super().__init__(dtype, config=config, tune=tune)

    # Whether the class's programs read rows that no 16-byte access can start in windows
    # (``windowed_rows``); else such rows are read as many elements at a time as divide ``V``.
    reads_windows = False

    def _access_vector(self, dtype: torch.dtype) -> int:
        """Elements each thread reads at a time along a row."""
        return max_vector(dtype) if self.windowed else row_vector(self.V, dtype)

    def _program_constants(self) -> Dict[str, Any]:
        """The builder's compile-time arguments beside ``V``, the dtype, the vector and the config."""
        return {"ignore_index": self.ignore_index, "label_smoothing": self.label_smoothing}

    # Vectors in flight per thread, at most, once a row spans that many steps.
    most_unroll = 4
    # Blocks of the main program that must fit on an SM at once (caps registers per
    # thread; 0: the compiler's choice).
    blocks_per_sm = 0
    # Rows shorter than ``short_row`` use at most ``short_row_threads`` threads.
    short_row = 0
    short_row_threads = 0

    # The most threads and vectors in flight a row takes on a device with fast memory
    # (``device_traits``); 0: as on others.
    fast_memory_threads = 0
    fast_memory_unroll = 0
    # Rows shorter than this take the fast-memory layout (0: rows of any length).
    fast_memory_below = 0
    # Config keys of the main program beside the layout's, with their defaults.
    program_keys: Dict[str, Any] = {}

    @property
    def default_config(self) -> Dict[str, Any]:
        most = self.short_row_threads if self.V < self.short_row else self.most_threads
        most_unroll = self.most_unroll
        fast_row = not self.fast_memory_below or self.V < self.fast_memory_below
        if self.fast_memory_threads and fast_row and has_fast_memory():
            most, most_unroll = min(most, self.fast_memory_threads), min(most_unroll, self.fast_memory_unroll)
        threads = _threads_for(self.V, self._vector, most)
        step = threads * self._vector
        unroll = next((u for u in (most_unroll, 4) if u <= most_unroll and self.V >= u * step), 1)
        return {"threads": threads, "unroll": unroll, "blocks_per_sm": self.blocks_per_sm, **self.program_keys}

    @property
    def autotune_configs(self) -> List[Dict[str, Any]]:
        default = self.default_config
        configs = [default]
        for threads in (128, 256, 512, 1024):
            for unroll in (1, 2, 4, 8):
                candidate = {**default, "threads": _threads_for(self.V, self._vector, threads), "unroll": unroll}
                if candidate not in configs:
                    configs.append(candidate)
        return configs

    def _checked_config(self, config: Dict[str, Any]) -> Dict[str, Any]:
        merged = super()._checked_config(config)
        _check_config(merged)  # refuse a bad explicit config at construction, not at first launch
        return merged

    def program(self, flags: Flags = (), **config: Any) -> Any:
        """The main program for ``config``; ``flags`` (``((name, value), ...)``) override the
        builder's defaults, which ``Kernel.compile`` and the tuner take."""
        config = {**self.default_config, **config}
        _check_config(config)
        windowed = {"windowed": True} if self.windowed else {}
        return self.builder(self.V, torch_dtype_to_tl(self.dtype), vector=self._vector,
                            **self._program_constants(), **config, **dict(flags), **windowed)

    # Every flag combination of the main program a call may take (``()``: the builder's defaults).
    main_flags: Tuple[Flags, ...] = ((),)
    # The one-block batch program: its builder, and every flag combination a call may take.
    batch_builder: Any = None
    batch_flags: Tuple[Flags, ...] = ()

    def program_builds(self, target: Any = "auto") -> Dict[str, Callable[[], Any]]:
        """Every program a call may launch, by name, as a function that compiles it for ``target``
        (once: later calls return the compiled program)."""
        builds = {f"main{dict(flags)}" if flags else "main": functools.partial(self._compile_main, flags, target)
                  for flags in self.main_flags}
        builds.update({f"batch{dict(flags)}": functools.partial(self._compile_batch, flags, target)
                       for flags in self.batch_flags})
        return builds

    def build_all_for_sm90(self) -> Dict[str, Any]:
        return {name: build() for name, build in self.program_builds(SM90_BUILD_TARGET).items()}

    def _compile_main(self, flags: Flags, target: Any = "auto") -> Any:
        if not flags:
            return self.compile(target=target)
        config = dict(self.config)
        key = (repr(target), ("flags", flags)) + tuple(sorted(config.items()))
        return self.compile_once(key, lambda: self.program(flags, **config), target, ("config", config, flags))

    # Launchers are kept in the per-config plans: compiling looks programs up by a key of the
    # whole config, which costs microseconds per call.
    def _launcher(self, **flags: bool) -> Any:
        key = tuple(sorted(flags.items()))
        return self._launch_plans.get(("main", key), lambda: direct_launcher(self._compile_main(key)))

    def _compile_batch(self, flags: Tuple[Tuple[str, bool], ...], target: Any = "auto") -> Any:
        """The batch program for ``flags`` (``((name, value), ...)``), compiled once."""

        def build() -> Any:
            return self.batch_builder(torch_dtype_to_tl(self.dtype), ignore_index=self.ignore_index, **dict(flags))

        return self.compile_once(("batch", flags, repr(target)), build, target, ("batch", flags))

    def _batch_launcher(self, **flags: bool) -> Any:
        key = tuple(sorted(flags.items()))
        return self._launch_plans.get(("batch", key), lambda: direct_launcher(self._compile_batch(key)))


class CrossEntropyFwdKernel(_CrossEntropyKernel):
    """``forward(logits, target, loss_rows, lse)``: per-row loss and logsumexp (float32 outputs)."""

    builder = staticmethod(cross_entropy_fwd_program)
    most_threads = 512
    # Measured on an H100 (bf16, every threads x unroll): eight vectors in flight won
    # at V = 32000 and 128256, and 256 threads a row at 32000 (100 us against 108 us
    # for 512 x 4 on 4096 rows); 256000 was level.
    most_unroll = 8
    short_row = 65536
    short_row_threads = 256
    # On an H200 (fast memory), bf16, every threads x unroll timed in turns, µs: 512 x 8
    # (116 registers: one block an SM, idle while it reduces its row) 590.8 at 8192 x 131072
    # and 147.1 at 1024 x 262144; 256 x 4 481.8 and 131.2 (256 x 1 480.3 and 130.0, but
    # 80.7 against 70.0 at 4096 x 32000, where 256 x 8 ran 70.7).  The row's end was no
    # lever either: one block barrier a row instead of three (the threads' online-softmax
    # states merged by shuffles, then by thread 0 across warps), the target's logit read at the
    # row's start and the plain sum skipped without label smoothing ran, old / new, µs, five
    # rounds in turns: 4096 x 32000 68.70 / 70.34 (smoothing 0.1) and 69.18 / 68.35 (none),
    # 8192 x 131072 478.05 / 475.87, 1024 x 262144 128.86 / 132.37.  Nor was the row's read: one
    # bulk copy of the whole row into shared memory (three blocks an SM, every byte of the row in
    # flight at once) ran 76.3 µs at 4096 x 32000 against 69.6 (512 threads 92.0); eight vectors
    # in flight from one block barrier, 85.4; a launch bound of three or two blocks an SM, 69.8
    # and 70.6 against 70.1.
    fast_memory_threads = 256
    fast_memory_unroll = 4
    batch_builder = staticmethod(cross_entropy_total_program)
    batch_flags = ((("mean", False),), (("mean", True),))

    reads_windows = True

    def forward(self, logits: torch.Tensor, target: torch.Tensor, loss_rows: torch.Tensor,
                lse: torch.Tensor) -> torch.Tensor:
        if self.windowed:
            self._launcher()(flat_rows(logits), target, loss_rows, lse, logits.stride(0))
        else:
            self._launcher()(logits, target, loss_rows, lse)
        return loss_rows

    def total(self, loss_rows: torch.Tensor, target: torch.Tensor, out: torch.Tensor, *, mean: bool) -> torch.Tensor:
        """Write into ``out`` (one element, the logits' dtype) the sum or kept-row mean of ``loss_rows``."""
        self._batch_launcher(mean=mean)(loss_rows, target, out)
        return out

    def takes_small_total(self, rows: int) -> bool:
        """Whether a mean or sum over ``rows`` rows is one launch of ``small_total``."""
        return rows * self.V <= SMALL_TOTAL_ELEMENTS

    def small_total(self, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, *,
                    mean: bool) -> torch.Tensor:
        """Write ``lse`` and, into ``out``, the sum or kept-row mean of the row losses, in one launch."""
        launcher = self._launch_plans.get(("small", mean), lambda: direct_launcher(self._compile_small(mean)))
        launcher(logits, target, lse, out)
        return out

    def _compile_small(self, mean: bool, target: Any = "auto") -> Any:
        def build() -> Any:
            return cross_entropy_small_total_program(
                self.V, torch_dtype_to_tl(self.dtype), mean=mean, ignore_index=self.ignore_index,
                label_smoothing=self.label_smoothing)

        return self.compile_once(("small", mean, repr(target)), build, target, ("small", mean))

    def program_builds(self, target: Any = "auto") -> Dict[str, Callable[[], Any]]:
        builds = super().program_builds(target)
        builds.update({f"small{ {'mean': mean} }": functools.partial(self._compile_small, mean, target)
                       for mean in (False, True)})
        return builds

    def tuning_inputs(self, rows: Optional[int] = None) -> tuple:
        rows = self.tuning_rows if rows is None else rows
        logits = torch.randn(rows, self.V, device="cuda", dtype=self.dtype)
        target = torch.randint(0, self.V, (rows,), device="cuda")
        empty = torch.empty(rows, device="cuda", dtype=torch.float32)
        return logits, target, empty, torch.empty_like(empty)


class CrossEntropyBwdKernel(_CrossEntropyKernel):
    """``forward(logits, target, lse, grad_loss, grad_lse, kept, grad, **flags)``: writes ``grad``
    ``(R, V)``; ``flags`` and the arguments they make read are ``cross_entropy_bwd_program``'s
    (``per_row``, ``has_grad_lse``, ``mean``)."""

    builder = staticmethod(cross_entropy_bwd_program)
    most_threads = 256
    # H100, bf16 4096 x 32000 (256 threads, four vectors): 180.0 us with four blocks an
    # SM guaranteed (53 registers) against 182.4 with the compiler's 72 (three blocks);
    # 8192 x 131072 level at 1482-1484; six blocks (40 registers) 184.8 and 1516.
    blocks_per_sm = 4
    version = "2"  # the config gained ``hinted_min_classes``
    # Rows of this many classes or more load the logits with L2's ``evict_last`` hint.  H200, bf16,
    # µs, plain / hinted: 131072 classes, 2048 rows 263.3 / 251.3, 4096 rows 522.2 / 498.9, 8192
    # rows 1037.4 / 992.6; 32000 classes, 4096 rows 129.2 / 132.0, 8192 rows 255.0 / 260.4, 16384
    # rows 507.2 / 517.0.  The row length decides, not the call's size.
    program_keys = {"hinted_min_classes": 65536}
    # The reductions' flags (none: per row; sum; mean), each with and without grad_lse.
    main_flags = tuple((("has_grad_lse", lse), ("mean", mean), ("per_row", row))
                       for lse in (False, True) for mean, row in ((False, True), (False, False), (True, False)))
    batch_builder = staticmethod(cross_entropy_kept_rows_program)
    batch_flags = ((),)

    reads_windows = True

    def forward(self, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, grad_loss: torch.Tensor,
                grad_lse: torch.Tensor, kept: torch.Tensor, grad: torch.Tensor, *, per_row: bool = True,
                has_grad_lse: bool = True, mean: bool = False) -> torch.Tensor:
        launch = self._launcher(has_grad_lse=has_grad_lse, mean=mean, per_row=per_row)
        if not self.windowed:
            launch(logits, target, lse, grad_loss, grad_lse, kept, grad)
            return grad
        if (logits.stride(0) - grad.stride(0)) % self._vector:
            # Logits rows that start at other offsets into their windows than the gradient's (a row
            # slice of a wider buffer, written to a new contiguous gradient) are read from a copy.
            logits = logits.contiguous()
        launch(flat_rows(logits), target, lse, grad_loss, grad_lse, kept, flat_rows(grad), logits.stride(0),
               grad.stride(0))
        return grad

    def kept_rows(self, target: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write into ``out`` (one float32) how many rows keep their target: a mean's divisor."""
        self._batch_launcher()(target, out)
        return out

    def tuning_inputs(self, rows: Optional[int] = None) -> tuple:
        rows = self.tuning_rows if rows is None else rows
        logits = torch.randn(rows, self.V, device="cuda", dtype=self.dtype)
        target = torch.randint(0, self.V, (rows,), device="cuda")
        lse = torch.logsumexp(logits.float(), -1)
        grad_loss = torch.rand(rows, device="cuda").to(self.dtype)
        grad_lse = torch.rand(rows, device="cuda")
        return logits, target, lse, grad_loss, grad_lse, lse[:1], torch.empty_like(logits)
