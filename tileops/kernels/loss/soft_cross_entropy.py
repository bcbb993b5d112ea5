"""Cross-entropy against class probabilities (soft targets), forward and backward, in float32.

With ``q = ((1 - eps) * p + eps / V) * w`` for target probabilities ``p``, label
smoothing ``eps`` and class weights ``w`` (1 when absent), row ``n`` loses

    loss = sum_j q_j * (lse - x_j) = lse * sum(q) - q @ x

Forward (one block per row, one pass over the logits and the targets, as the
index-target forward): each thread keeps the online-softmax state of its
columns and the two sums ``sum(q)`` and ``q @ x``; the block combines them and
one thread writes the row's loss, its ``lse`` and its target mass ``sum(q)``,
both saved for the backward.

Backward (a grid of row tiles, one pass over the logits and the targets):

    grad = (c * sum(q) + grad_lse) * exp(x - lse) - c * q

with ``c`` the row's share of the loss's gradient (``grad_loss`` per row, or
one for the batch, divided by the row count for ``mean``).  The only ``[N, V]``
tensor written is the gradient.

Both programs read the logits and the targets with one access width, the
smaller of the two dtypes' (bf16 logits with float32 targets: four elements).
``V``, the label smoothing and the targets' dtype are compile-time constants;
whether class weights are read and how ``grad_loss`` is shaped are flags.
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
from typing import Any, Dict, Optional

import torch

from tileops.kernels.fast_math import FAST_EXP2_PRELUDE, fast_exp2
from tileops.kernels.kernel_base import strided_rows, torch_dtype_to_tl
from tileops.kernels.loss.cross_entropy import LOG2E, _block_reduce, _CrossEntropyKernel, _online_max, _row_and_tile
from tileops.kernels.sizes import ACCUM, SUPPORTED_DTYPES, WARP, row_vector

__all__ = [
    "SoftCrossEntropyFwdKernel",
    "SoftCrossEntropyBwdKernel",
    "soft_cross_entropy_fwd_program",
    "soft_cross_entropy_bwd_program",
]

# float32 state slots of the forward program.
_MAX, _SUM, _NEW_MAX, _OFFSET, _MASS, _DOT, _LSE = 0, 1, 2, 3, 4, 5, 6
_STATE = 7


def _mixed_target(T: Any, p: Any, W: Any, column: Any, V: int, label_smoothing: float, weighted: bool) -> Any:
    """``q`` of one class (float32): the smoothed target probability ``p``, times its weight."""
    q = T.cast(p, ACCUM)
    if label_smoothing:
        q = q * (1.0 - label_smoothing) + label_smoothing / V
    return q * W[column] if weighted else q


def soft_cross_entropy_fwd_program(V: int, dtype: str, *, target_dtype: str, vector: int, threads: int,
                                   unroll: int, label_smoothing: float, weighted: bool = False,
                                   blocks_per_sm: int = 0) -> Any:
    """Per-row ``Loss``, ``Lse`` and ``Mass`` (float32) of ``logits`` and ``targets`` ``(R, V)``.

    ``W`` (``(V,)`` float32) is read only when ``weighted``; otherwise any float32 tensor will do."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    chunk = threads * vector
    step_elems = chunk * unroll
    steps = -(-V // step_elems)
    warps = threads // WARP
    R = T.dynamic("R")
    WN = T.dynamic("WN")
    XT, LDX = strided_rows(T, R, V, dtype, "LDX")
    PT, LDP = strided_rows(T, R, V, target_dtype, "LDP")
    block_reduce = _block_reduce(T, threads)

    def column(step, u, tx):
        return step * step_elems + u * chunk + tx * vector

    advance_max, rescale_sum = _online_max(T, V, vector, unroll, column, (_MAX, _SUM, _NEW_MAX, _OFFSET))

    @T.prim_func
    def soft_cross_entropy_fwd(
        X: XT,
        P: PT,
        W: T.Tensor((WN,), ACCUM),
        Loss: T.Tensor((R,), ACCUM),
        Lse: T.Tensor((R,), ACCUM),
        Mass: T.Tensor((R,), ACCUM),
    ):
        # The sums of exponentials take ``fast_exp2``, as in the cross-entropy forward.
        with T.Kernel(R, threads=threads, prelude=FAST_EXP2_PRELUDE) as row:
            if blocks_per_sm:
                T.annotate_min_blocks_per_sm(blocks_per_sm)
            tx = T.get_thread_binding()
            a = T.alloc_local((unroll * vector,), dtype)
            b = T.alloc_local((unroll * vector,), target_dtype)
            st = T.alloc_local((_STATE,), ACCUM)
            scratch = T.alloc_shared((4, max(1, warps)), ACCUM)
            T.assume(LDX % vector == 0)
            T.assume(LDP % vector == 0)
            st[_MAX] = -T.infinity(ACCUM)
            st[_SUM] = T.cast(0, ACCUM)
            st[_MASS] = T.cast(0, ACCUM)
            st[_DOT] = T.cast(0, ACCUM)
            for step in T.serial(steps):
                for u in T.unroll(unroll):
                    if column(step, u, tx) < V:
                        for k in T.vectorized(vector):
                            a[u * vector + k] = X[row, column(step, u, tx) + k]
                        for k in T.vectorized(vector):
                            b[u * vector + k] = P[row, column(step, u, tx) + k]
                advance_max(st, a, step, tx)
                for u in T.unroll(unroll):
                    if column(step, u, tx) < V:
                        for k in T.unroll(vector):
                            q = _mixed_target(T, b[u * vector + k], W, column(step, u, tx) + k, V,
                                              label_smoothing, weighted)
                            st[_SUM] = st[_SUM] + fast_exp2(T, (T.cast(a[u * vector + k], ACCUM) - st[_OFFSET]) * LOG2E)
                            st[_MASS] = st[_MASS] + q
                            st[_DOT] = st[_DOT] + q * T.cast(a[u * vector + k], ACCUM)
            st[_NEW_MAX] = st[_MAX]
            block_reduce(st, _NEW_MAX, scratch, 0, tx, True)
            rescale_sum(st)
            block_reduce(st, _SUM, scratch, 1, tx, False)
            block_reduce(st, _MASS, scratch, 2, tx, False)
            block_reduce(st, _DOT, scratch, 3, tx, False)
            if tx == 0:
                st[_LSE] = T.if_then_else(st[_MAX] == -T.infinity(ACCUM), T.cast(0, ACCUM), st[_MAX]) + T.log(st[_SUM])
                Lse[row] = st[_LSE]
                Mass[row] = st[_MASS]
                Loss[row] = st[_LSE] * st[_MASS] - st[_DOT]

    return soft_cross_entropy_fwd


def soft_cross_entropy_bwd_program(V: int, dtype: str, *, target_dtype: str, vector: int, threads: int,
                                   unroll: int, label_smoothing: float, weighted: bool = False,
                                   blocks_per_sm: int = 0, per_row: bool = True, has_grad_lse: bool = True,
                                   mean: bool = False) -> Any:
    """``grad = (c * Mass + grad_lse) * exp(x - lse) - c * q`` over ``(R, V)`` tiles.

    ``c``: ``GradLoss[row]`` (``per_row``) or ``GradLoss[0]``, divided by ``R`` for ``mean``.
    ``GradLse`` is read only with ``has_grad_lse`` and ``W`` only when ``weighted``."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    chunk = threads * vector
    tile = chunk * unroll
    R = T.dynamic("R")
    WN = T.dynamic("WN")
    GL = T.dynamic("GL")
    GS = T.dynamic("GS")
    XT, LDX = strided_rows(T, R, V, dtype, "LDX")
    PT, LDP = strided_rows(T, R, V, target_dtype, "LDP")
    GT, LDG = strided_rows(T, R, V, dtype, "LDG")

    tiles = -(-V // tile)

    def column(bx, u, tx):
        return bx * tile + u * chunk + tx * vector

    @T.prim_func
    def soft_cross_entropy_bwd(
        X: XT,
        P: PT,
        W: T.Tensor((WN,), ACCUM),
        Lse: T.Tensor((R,), ACCUM),
        Mass: T.Tensor((R,), ACCUM),
        GradLoss: T.Tensor((GL,), ACCUM),
        GradLse: T.Tensor((GS,), ACCUM),
        G: GT,
    ):
        with T.Kernel(R * tiles, threads=threads) as block:
            row, bx = _row_and_tile(block, tiles)
            if blocks_per_sm:
                T.annotate_min_blocks_per_sm(blocks_per_sm)
            tx = T.get_thread_binding()
            a = T.alloc_local((unroll * vector,), dtype)  # the logits, then the gradient
            b = T.alloc_local((unroll * vector,), target_dtype)
            st = T.alloc_local((3,), ACCUM)
            T.assume(LDX % vector == 0)
            T.assume(LDP % vector == 0)
            T.assume(LDG % vector == 0)
            for u in T.unroll(unroll):
                if column(bx, u, tx) < V:
                    for k in T.vectorized(vector):
                        a[u * vector + k] = X[row, column(bx, u, tx) + k]
                    for k in T.vectorized(vector):
                        b[u * vector + k] = P[row, column(bx, u, tx) + k]
            st[0] = Lse[row]
            st[1] = GradLoss[row if per_row else 0]
            if mean:
                st[1] = st[1] / T.cast(R, ACCUM)
            st[2] = st[1] * Mass[row] + GradLse[row] if has_grad_lse else st[1] * Mass[row]
            for u in T.unroll(unroll):
                if column(bx, u, tx) < V:
                    for k in T.unroll(vector):
                        # (x - lse) before the scaling, as the index-target backward, so a row's
                        # near-certain class keeps its small gradient.
                        a[u * vector + k] = T.cast(
                            st[2] * T.exp2((T.cast(a[u * vector + k], ACCUM) - st[0]) * LOG2E)
                            - st[1] * _mixed_target(T, b[u * vector + k], W, column(bx, u, tx) + k, V,
                                                    label_smoothing, weighted),
                            dtype,
                        )
                    for k in T.vectorized(vector):
                        G[row, column(bx, u, tx) + k] = a[u * vector + k]

    return soft_cross_entropy_bwd


# ---- kernels -------------------------------------------------------------------------------------


class _SoftCrossEntropyKernel(_CrossEntropyKernel):
    """The index-target kernels' configs and launches, for targets of ``target_dtype``.

    Args:
        V: number of classes (row length), fixed at construction.
        dtype: dtype of the logits (float16, bfloat16, float32).
        target_dtype: dtype of the target probabilities (float16, bfloat16, float32).
        label_smoothing: weight of the uniform distribution mixed into the targets.
        config: explicit config (``threads``, ``unroll``, ``blocks_per_sm``; may be partial).
        tune: pick the fastest of ``autotune_configs`` on the current GPU.
    """

    def __init__(self, V: int, dtype: torch.dtype, *, target_dtype: torch.dtype, label_smoothing: float = 0.0,
                 config: Optional[Dict[str, Any]] = None, tune: bool = False) -> None:
        if target_dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{type(self).__name__}: target_dtype must be one of {SUPPORTED_DTYPES}, "
                            f"got {target_dtype}")
        self._target_dtype = target_dtype
        # Public, so tuned configs are keyed by it too.
        self.target_dtype = str(target_dtype).replace("torch.", "")
        super().__init__(V, dtype, label_smoothing=label_smoothing, config=config, tune=tune)

    def _access_vector(self, dtype: torch.dtype) -> int:
        return min(row_vector(self.V, dtype), row_vector(self.V, self._target_dtype))

    def _program_constants(self) -> Dict[str, Any]:
        return {"target_dtype": torch_dtype_to_tl(self._target_dtype), "label_smoothing": self.label_smoothing}

    def _tuning_targets(self, rows: int) -> torch.Tensor:
        return torch.softmax(torch.randn(rows, self.V, device="cuda"), -1).to(self._target_dtype)


class SoftCrossEntropyFwdKernel(_SoftCrossEntropyKernel):
    """``forward(logits, targets, weight, loss_rows, lse, mass, weighted=...)``: per-row loss,
    logsumexp and target mass (float32 outputs)."""

    builder = staticmethod(soft_cross_entropy_fwd_program)
    most_threads = 512
    most_unroll = 8
    short_row = 65536
    short_row_threads = 256
    # On an H200 (fast memory), bf16 4096 x 32000, every threads x unroll timed in turns, µs:
    # 256 x 8 (the layout above) 137.9, 256 x 4 127.2, 512 x 4 128.2, 128 x 4 128.5, 256 x 2
    # 130.0, 1024 x 4 193.2 (torch.compile 408.8): the cross-entropy forward's layout there, for
    # short rows.  Long rows keep theirs (8192 x 131072 ran at 102 % of copy bandwidth there, and
    # 256 x 4 takes 103 registers a thread, two blocks an SM).
    fast_memory_threads = 256
    fast_memory_unroll = 4
    fast_memory_below = short_row
    main_flags = ((("weighted", False),), (("weighted", True),))

    def forward(self, logits: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, loss_rows: torch.Tensor,
                lse: torch.Tensor, mass: torch.Tensor, *, weighted: bool = False) -> torch.Tensor:
        self._launcher(weighted=weighted)(logits, targets, weight, loss_rows, lse, mass)
        return loss_rows

    def tuning_inputs(self, rows: Optional[int] = None) -> tuple:
        rows = self.tuning_rows if rows is None else rows
        logits = torch.randn(rows, self.V, device="cuda", dtype=self.dtype)
        empty = torch.empty(rows, device="cuda", dtype=torch.float32)
        return logits, self._tuning_targets(rows), empty, empty, torch.empty_like(empty), torch.empty_like(empty)


class SoftCrossEntropyBwdKernel(_SoftCrossEntropyKernel):
    """``forward(logits, targets, weight, lse, mass, grad_loss, grad_lse, grad, **flags)``: writes
    ``grad`` ``(R, V)``; ``flags`` are ``soft_cross_entropy_bwd_program``'s (``per_row``,
    ``has_grad_lse``, ``mean``, ``weighted``)."""

    builder = staticmethod(soft_cross_entropy_bwd_program)
    most_threads = 256
    main_flags = tuple((("has_grad_lse", lse), ("mean", mean), ("per_row", row), ("weighted", weighted))
                       for weighted in (False, True) for lse in (False, True)
                       for mean, row in ((False, True), (False, False), (True, False)))

    def forward(self, logits: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, lse: torch.Tensor,
                mass: torch.Tensor, grad_loss: torch.Tensor, grad_lse: torch.Tensor, grad: torch.Tensor, *,
                per_row: bool = True, has_grad_lse: bool = True, mean: bool = False,
                weighted: bool = False) -> torch.Tensor:
        self._launcher(has_grad_lse=has_grad_lse, mean=mean, per_row=per_row, weighted=weighted)(
            logits, targets, weight, lse, mass, grad_loss, grad_lse, grad)
        return grad

    def tuning_inputs(self, rows: Optional[int] = None) -> tuple:
        rows = self.tuning_rows if rows is None else rows
        logits = torch.randn(rows, self.V, device="cuda", dtype=self.dtype)
        lse = torch.logsumexp(logits.float(), -1)
        grad_loss = torch.rand(rows, device="cuda")
        grad_lse = torch.rand(rows, device="cuda")
        return (logits, self._tuning_targets(rows), lse, lse, torch.rand_like(lse), grad_loss, grad_lse,
                torch.empty_like(logits))
