"""RMSNorm forward: ``y = x * rsqrt(mean(x**2, -1) + eps) * weight``.

``x`` and ``y`` are ``(M, N)`` with unit-stride rows and ``M`` a TileLang symbolic
dimension (one compiled program serves every row count) and ``N`` fixed at
construction; ``x``'s rows may lie any multiple of ``row_vector(N)`` elements
apart (``strided_rows``), ``y`` is contiguous.  Sums of squares accumulate in float32 whatever the input
dtype.  Two program shapes, chosen by ``config["chunk"]``:

* single pass (``chunk >= N``): a block loads ``block_rows`` whole rows into
  registers once, reduces, scales and stores; the input is read exactly once.
* chunked (``chunk < N``): rows too long for registers are walked twice in
  ``chunk``-wide column tiles, first to accumulate the sum of squares, then
  (in reverse, so the tiles read last are still in L2) to write the output.

Global indices are computed in 64-bit by TileLang, so tensors over 2**31
elements are addressed correctly.
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
import logging
from typing import Any, Dict, List, Optional, Tuple

import torch

from tileops.kernels.kernel_base import Kernel, strided_rows, torch_dtype_to_tl
from tileops.kernels.launch import direct_launcher
from tileops.kernels.sizes import (
    MAX_THREADS,
    MIN_BLOCK_THREADS,
    check_kernel_args,
    max_vector,
    next_pow2,
    row_vector,
)

__all__ = ["RMSNormFwdKernel", "rms_norm_default_config", "rms_norm_autotune_configs"]

logger = logging.getLogger(__name__)


# A thread keeps at most this many row elements in registers in the single
# pass; longer rows switch to the chunked program (1024 threads x 32).
MAX_ELEMENTS_PER_THREAD = 32


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _single_pass_config(N: int, dtype: torch.dtype, elements_per_thread: int) -> Dict[str, int]:
    vector = row_vector(N, dtype)
    row_threads = min(MAX_THREADS, next_pow2(-(-N // elements_per_thread)))
    threads = max(row_threads, MIN_BLOCK_THREADS)
    return {
        "block_rows": threads // row_threads,
        "threads": threads,
        # Padded so each thread of the row owns whole vectors.
        "chunk": _round_up(N, row_threads * vector),
    }


def rms_norm_default_config(N: int, dtype: torch.dtype) -> Dict[str, int]:
    """Heuristic config for hidden size ``N`` and ``dtype``.

    Rows that fit in registers at two 16-byte vectors per thread (more for
    long rows, up to ``MAX_ELEMENTS_PER_THREAD``) take the single pass; longer
    rows take the chunked program with 512 threads, which leaves room for
    several blocks per SM to overlap their load and reduce phases.
    """
    vector_elems = max_vector(dtype)
    if N <= MAX_THREADS * MAX_ELEMENTS_PER_THREAD:
        per_thread = max(2 * vector_elems, -(-N // MAX_THREADS))
        return _single_pass_config(N, dtype, per_thread)
    threads = 512
    return {"block_rows": 1, "threads": threads, "chunk": threads * 2 * vector_elems}


def rms_norm_autotune_configs(N: int, dtype: torch.dtype) -> List[Dict[str, int]]:
    """Valid candidate configs around the heuristic (the heuristic first)."""
    vector_elems = max_vector(dtype)
    candidates = [rms_norm_default_config(N, dtype)]
    # Registers allow 64 half-precision (32 packed registers) or 32 fp32 elements per thread.
    register_cap = 64 if dtype.itemsize == 2 else MAX_ELEMENTS_PER_THREAD
    if N <= MAX_THREADS * register_cap:
        for per_thread in (vector_elems, 2 * vector_elems, 4 * vector_elems, MAX_ELEMENTS_PER_THREAD, register_cap):
            if -(-N // per_thread) <= MAX_THREADS:
                candidates.append(_single_pass_config(N, dtype, per_thread))
    for threads in (256, 512, 1024):
        for vectors in (1, 2, 4):
            chunk = threads * vectors * vector_elems
            if chunk < N:
                candidates.append({"block_rows": 1, "threads": threads, "chunk": chunk})
    unique: List[Dict[str, int]] = []
    for config in candidates:
        if config not in unique:
            unique.append(config)
    return unique


def _validate_config(N: int, block_rows: int, threads: int, chunk: int) -> None:
    if not (32 <= threads <= MAX_THREADS and threads % 32 == 0):
        raise ValueError(f"RMSNormFwdKernel: threads must be a multiple of 32 in [32, 1024], got {threads}")
    if block_rows < 1 or chunk < 1:
        raise ValueError(f"RMSNormFwdKernel: block_rows and chunk must be positive, got {block_rows}, {chunk}")
    if chunk < N and block_rows != 1:
        raise ValueError("RMSNormFwdKernel: the chunked program (chunk < N) takes block_rows=1")


def rms_norm_fwd_program(N: int, dtype: str, eps: float, *, block_rows: int, threads: int, chunk: int,
                         row_access: int = 1) -> Any:
    """The TileLang program for one config (see the module docstring); ``x``'s row stride is a
    multiple of ``row_access`` elements."""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    _validate_config(N, block_rows, threads, chunk)
    accum = "float32"
    inv_n = 1.0 / N
    M = T.dynamic("M")
    XT, LDX = strided_rows(T, M, N, dtype, "LDX")

    if chunk >= N:

        @T.prim_func
        def rms_norm_fwd_single_pass(
            X: XT,
            W: T.Tensor((N,), dtype),
            Y: T.Tensor((M, N), dtype),
        ):
            with T.Kernel(T.ceildiv(M, block_rows), threads=threads) as bx:
                T.assume(LDX % row_access == 0)
                x_tile = T.alloc_fragment((block_rows, chunk), dtype)
                squares = T.alloc_fragment((block_rows, chunk), accum)
                scale = T.alloc_fragment((block_rows,), accum)
                for i, j in T.Parallel(block_rows, chunk):
                    x_tile[i, j] = T.if_then_else(
                        (bx * block_rows + i < M) and (j < N), X[bx * block_rows + i, j], T.cast(0, dtype)
                    )
                for i, j in T.Parallel(block_rows, chunk):
                    squares[i, j] = T.cast(x_tile[i, j], accum) * T.cast(x_tile[i, j], accum)
                T.reduce_sum(squares, scale, dim=1)
                for i in T.Parallel(block_rows):
                    scale[i] = T.rsqrt(scale[i] * inv_n + eps)
                for i, j in T.Parallel(block_rows, chunk):
                    if (bx * block_rows + i < M) and (j < N):
                        Y[bx * block_rows + i, j] = T.cast(
                            T.cast(x_tile[i, j], accum) * scale[i] * T.cast(W[j], accum), dtype
                        )

        return rms_norm_fwd_single_pass

    full_chunks = N // chunk
    tail = N - full_chunks * chunk

    @T.prim_func
    def rms_norm_fwd_chunked(
        X: XT,
        W: T.Tensor((N,), dtype),
        Y: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M, threads=threads) as row:
            T.assume(LDX % row_access == 0)
            squares = T.alloc_fragment((1, chunk), accum)
            scale = T.alloc_fragment((1,), accum)
            T.clear(squares)
            # Full tiles need no column guard, which keeps their accesses vectorized.
            for k in T.serial(full_chunks):
                for i, j in T.Parallel(1, chunk):
                    squares[i, j] += T.cast(X[row, k * chunk + j], accum) * T.cast(X[row, k * chunk + j], accum)
            if tail > 0:
                for i, j in T.Parallel(1, chunk):
                    if j < tail:
                        squares[i, j] += T.cast(X[row, full_chunks * chunk + j], accum) * T.cast(
                            X[row, full_chunks * chunk + j], accum
                        )
            T.reduce_sum(squares, scale, dim=1)
            for i in T.Parallel(1):
                scale[i] = T.rsqrt(scale[i] * inv_n + eps)
            # Second pass in reverse: the tiles read last in the first pass are the likeliest L2 hits.
            if tail > 0:
                for i, j in T.Parallel(1, chunk):
                    if j < tail:
                        Y[row, full_chunks * chunk + j] = T.cast(
                            T.cast(X[row, full_chunks * chunk + j], accum)
                            * scale[i]
                            * T.cast(W[full_chunks * chunk + j], accum),
                            dtype,
                        )
            for kk in T.serial(full_chunks):
                for i, j in T.Parallel(1, chunk):
                    Y[row, (full_chunks - 1 - kk) * chunk + j] = T.cast(
                        T.cast(X[row, (full_chunks - 1 - kk) * chunk + j], accum)
                        * scale[i]
                        * T.cast(W[(full_chunks - 1 - kk) * chunk + j], accum),
                        dtype,
                    )

    return rms_norm_fwd_chunked


class RMSNormFwdKernel(Kernel):
    """RMSNorm forward over the last axis of an ``(M, N)`` tensor.

    Args:
        N: hidden size (length of the normalised axis), fixed at construction.
        dtype: dtype of ``x``, ``weight`` and ``y`` (float16, bfloat16, float32).
        eps: added to the mean of squares before the reciprocal square root.
        config: explicit ``{"block_rows", "threads", "chunk"}`` (keys may be partial).
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
        check_kernel_args(type(self).__name__, dtype, N=N)
        self.N = int(N)
        self.eps = float(eps)
        super().__init__(dtype, config=config, tune=tune)

    @property
    def default_config(self) -> Dict[str, Any]:
        return rms_norm_default_config(self.N, self.dtype)

    @property
    def autotune_configs(self) -> List[Dict[str, Any]]:
        return rms_norm_autotune_configs(self.N, self.dtype)

    def program(self, **config: Any) -> Any:
        return rms_norm_fwd_program(self.N, torch_dtype_to_tl(self.dtype), self.eps,
                                    row_access=row_vector(self.N, self.dtype), **config)

    def tuning_inputs(self, rows: Optional[int] = None) -> Tuple[torch.Tensor, ...]:
        """Random ``(x, weight, out)`` on the current GPU to time a candidate on."""
        x = torch.randn(self.tuning_rows if rows is None else rows, self.N, device="cuda", dtype=self.dtype)
        weight = torch.randn(self.N, device="cuda", dtype=self.dtype)
        return x, weight, torch.empty_like(x)

    def forward(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write ``rms_norm(x) * weight`` into ``out`` (contiguous); ``x`` has rows of unit stride lying a
        multiple of ``row_vector(N)`` elements apart; all 16-byte aligned, on one GPU."""
        # The launcher of the current config, kept in the per-config plans: looking it up
        # through ``compile`` builds a key per call, which costs microseconds.
        self._launch_plans.get("launcher", lambda: direct_launcher(self.kernel))(x, weight, out)
        return out
