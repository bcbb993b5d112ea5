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

Single-pass calls with inputs of ``hinted_min_mib`` or more launch the same rows as
``resident_rms_program`` lays them out (shared with the fused residual add), their
loads carrying L2's ``evict_last`` hint.

Global indices are computed in 64-bit by TileLang, so tensors over 2**31
elements are addressed correctly.
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
import logging
from typing import Any, Dict, List, Optional, Tuple

import torch

from tileops.kernels.cache_hints import EVICT_LAST, HINTED_MIN_MIB, hinted_min_bytes, takes_hint
from tileops.kernels.kernel_base import SM90_BUILD_TARGET, Kernel, strided_rows, torch_dtype_to_tl
from tileops.kernels.launch import direct_launcher
from tileops.kernels.norm.rows import RowLayout, resident_macros, row_sum_macro, scratch_shape
from tileops.kernels.sizes import (
    ACCUM,
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

    ``hinted_min_mib``: single-pass calls whose input takes at least this many MiB load it with
    L2's ``evict_last`` (``resident_rms_program``; 0: every call that can).  The input is read
    once, yet on large calls the hint let the kernel pass torch.compile, as in the fused residual
    add; on smaller ones it cost up to 8 %.  H100, rows of 4096, median of 7 rounds in turns, µs
    without / with the hint (the single pass before the hint): bf16 8192 rows 40.19 / 43.33
    (40.78), 16384 rows 84.61 / 87.26 (84.93, torch.compile 89.47), 24576 rows 131.73 / 131.01
    (131.81), 32768 rows 176.48 / 175.07 (176.05), 65536 rows 352.96 / 351.02 (352.67); fp32
    8192 rows 84.48 / 87.17 (84.90), 16384 rows 176.51 / 174.94 (176.35, torch.compile 175.26),
    32768 rows 353.31 / 351.33 (352.99); bf16 16384 x 8192 176.13 / 175.04 (175.68).
    """
    vector_elems = max_vector(dtype)
    if N <= MAX_THREADS * MAX_ELEMENTS_PER_THREAD:
        per_thread = max(2 * vector_elems, -(-N // MAX_THREADS))
        return {**_single_pass_config(N, dtype, per_thread), "hinted_min_mib": HINTED_MIN_MIB}
    threads = 512
    return {"block_rows": 1, "threads": threads, "chunk": threads * 2 * vector_elems, "hinted_min_mib": HINTED_MIN_MIB}


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
        config = {**config, "hinted_min_mib": HINTED_MIN_MIB}
        if config not in unique:
            unique.append(config)
    return unique


def _validate_config(N: int, block_rows: int, threads: int, chunk: int, hinted_min_mib: int = 0) -> None:
    if not (32 <= threads <= MAX_THREADS and threads % 32 == 0):
        raise ValueError(f"RMSNormFwdKernel: threads must be a multiple of 32 in [32, 1024], got {threads}")
    if block_rows < 1 or chunk < 1:
        raise ValueError(f"RMSNormFwdKernel: block_rows and chunk must be positive, got {block_rows}, {chunk}")
    if chunk < N and block_rows != 1:
        raise ValueError("RMSNormFwdKernel: the chunked program (chunk < N) takes block_rows=1")
    if hinted_min_mib < 0:
        raise ValueError(f"RMSNormFwdKernel: hinted_min_mib must be at least 0, got {hinted_min_mib}")


def rms_norm_fwd_program(N: int, dtype: str, eps: float, *, block_rows: int, threads: int, chunk: int,
                         hinted_min_mib: int = 0, row_access: int = 1) -> Any:
    """The TileLang program for one config (see the module docstring); ``x``'s row stride is a
    multiple of ``row_access`` elements.  (``hinted_min_mib`` chooses between this program and
    ``resident_rms_program`` per call.)"""
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    _validate_config(N, block_rows, threads, chunk, hinted_min_mib)
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


def hinted_layout(N: int, dtype: torch.dtype, config: Dict[str, Any]) -> Optional[RowLayout]:
    """The rows of ``config``'s single pass as ``resident_rms_program`` lays them out, when their
    16-byte loads can carry an L2 hint; else None (chunked rows, narrower accesses)."""
    threads, block_rows = config["threads"], config["block_rows"]
    vector = row_vector(N, dtype)
    row_threads = threads // block_rows
    if (config["chunk"] < N or threads % block_rows or row_threads & (row_threads - 1)
            or not takes_hint(EVICT_LAST, vector, torch_dtype_to_tl(dtype))):
        return None
    return RowLayout(N, vector, row_threads, threads)


def resident_rms_program(N: int, dtype: str, eps: float, layout: RowLayout, policy: Optional[str],
                         residual: bool) -> Any:
    """RMSNorm of rows held in registers (``layout``), their loads carrying L2 eviction ``policy``
    (``cache_hints``; None: plain loads).

    ``residual``: the fused residual add's program, ``(X, R, W, Y, RO)``: it stores ``RO = X + R``
    and normalises that sum from its float32 value; else ``(X, W, Y)``.
    """
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    M = T.dynamic("M")
    XT, LDX = strided_rows(T, M, N, dtype, "LDX")
    RT, LDR = strided_rows(T, M, N, dtype, "LDR") if residual else (None, None)
    per_thread, vector, row_threads = layout.per_thread, layout.vector, layout.row_threads
    rows_per_block = layout.rows_per_block
    loads = resident_macros(T, layout, M, policy, dtype)
    prelude = loads["prelude"]
    column, each_vector = loads["column"], loads["each_vector"]
    row_sum = row_sum_macro(T, row_threads, 1)
    inv_n = 1.0 / N

    @T.macro
    def store_sum(RO, zb, row, lane, j):
        for k in T.vectorized(vector):
            RO[row, column(j, lane) + k] = T.cast(zb[j * vector + k], dtype)

    @T.macro
    def store_normalized(Y, W, zb, st, row, lane, j):
        # The weight is read at the store (an L1 hit after the first row), not held in registers.
        for k in T.vectorized(vector):
            Y[row, column(j, lane) + k] = T.cast(
                T.cast(zb[j * vector + k], ACCUM) * st[0] * T.cast(W[column(j, lane) + k], ACCUM), dtype)

    @T.macro
    def body(X, R, W, Y, RO):
        with T.Kernel(T.ceildiv(M, rows_per_block), threads=layout.block_threads, prelude=prelude) as bx:
            T.assume(LDX % vector == 0)
            if residual:
                T.assume(LDR % vector == 0)
            tx = T.get_thread_binding()
            xb = T.alloc_local((per_thread,), dtype)
            if residual:
                rb = T.alloc_local((per_thread,), dtype)
                zb = T.alloc_local((per_thread,), ACCUM)
            else:
                zb = xb  # the row itself is normalised (cast to float32 at the store)
            st = T.alloc_local((1,), ACCUM)
            scratch = T.alloc_shared(scratch_shape(layout.block_threads, 1), ACCUM)
            row = bx * rows_per_block + tx // row_threads
            lane = tx % row_threads
            loads["load_row"](X, xb, row, lane)
            if residual:
                loads["load_row"](R, rb, row, lane)
            st[0] = T.cast(0, ACCUM)
            if residual:
                for i in T.unroll(per_thread):  # missing elements are zeros and add nothing
                    zb[i] = T.cast(xb[i], ACCUM) + T.cast(rb[i], ACCUM)
                    st[0] = st[0] + zb[i] * zb[i]
                # The sum is stored before the row's reduction: its writes drain while the block
                # waits at the reduction's barrier instead of after it.
                if row < M:
                    each_vector(lane, store_sum, RO, zb, row, lane)
            else:
                for i in T.unroll(per_thread):
                    st[0] = st[0] + T.cast(xb[i], ACCUM) * T.cast(xb[i], ACCUM)
            row_sum(st, 0, scratch, 0, tx)
            st[0] = T.rsqrt(st[0] * inv_n + eps)
            if row < M:
                each_vector(lane, store_normalized, Y, W, zb, st, row, lane)

    if not residual:

        @T.prim_func
        def rms_norm_fwd_resident(X: XT, W: T.Tensor((N,), dtype), Y: T.Tensor((M, N), dtype)):
            body(X, None, W, Y, None)

        return rms_norm_fwd_resident

    @T.prim_func
    def fused_add_rms_norm_fwd(X: XT, R: RT, W: T.Tensor((N,), dtype), Y: T.Tensor((M, N), dtype),
                               RO: T.Tensor((M, N), dtype)):
        body(X, R, W, Y, RO)

    return fused_add_rms_norm_fwd


class RMSNormFwdKernel(Kernel):
    """RMSNorm forward over the last axis of an ``(M, N)`` tensor.

    Args:
        N: hidden size (length of the normalised axis), fixed at construction.
        dtype: dtype of ``x``, ``weight`` and ``y`` (float16, bfloat16, float32).
        eps: added to the mean of squares before the reciprocal square root.
        config: explicit ``{"block_rows", "threads", "chunk", "hinted_min_mib"}`` (keys may be partial).
        tune: pick the fastest of ``autotune_configs`` on the current GPU.
    """

    # "2": large single-pass calls take the hinted resident program (``hinted_min_mib``).
    version = "2"

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

    def hinted_kernel(self, target: Any = "auto") -> Optional[Any]:
        """The compiled ``resident_rms_program`` of the current config, its loads hinted ``evict_last``;
        None for a config that ``hinted_layout`` does not lay out."""
        config = dict(self.config)
        layout = hinted_layout(self.N, self.dtype, config)
        if layout is None:
            return None
        key = ("hinted", repr(target)) + tuple(sorted(config.items()))
        return self.compile_once(key, lambda: resident_rms_program(
            self.N, torch_dtype_to_tl(self.dtype), self.eps, layout, EVICT_LAST, residual=False),
            target, ("hinted", config))

    def build_all_for_sm90(self) -> Dict[str, Any]:
        programs = {"main": self.build_for_sm90()}
        hinted = self.hinted_kernel(SM90_BUILD_TARGET)
        if hinted is not None:
            programs["hinted"] = hinted
        return programs

    def _launcher(self, large: bool) -> Any:
        """The launcher of calls at least ``hinted_min_mib`` large (``large``) or smaller."""
        hinted = self.hinted_kernel() if large else None
        return direct_launcher(self.kernel if hinted is None else hinted)

    def tuning_inputs(self, rows: Optional[int] = None) -> Tuple[torch.Tensor, ...]:
        """Random ``(x, weight, out)`` on the current GPU to time a candidate on."""
        x = torch.randn(self.tuning_rows if rows is None else rows, self.N, device="cuda", dtype=self.dtype)
        weight = torch.randn(self.N, device="cuda", dtype=self.dtype)
        return x, weight, torch.empty_like(x)

    def forward(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write ``rms_norm(x) * weight`` into ``out`` (contiguous); ``x`` has rows of unit stride lying a
        multiple of ``row_vector(N)`` elements apart; all 16-byte aligned, on one GPU."""
        # The launchers of the current config, kept in the per-config plans: looking one up
        # through ``compile`` builds a key per call, which costs microseconds.
        large = x.nbytes >= hinted_min_bytes(self.config["hinted_min_mib"])
        self._launch_plans.get(("launcher", large), lambda: self._launcher(large))(x, weight, out)
        return out
