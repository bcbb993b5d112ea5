"""Fused residual add and RMSNorm: ``residual_out = x + residual``, ``y = rms_norm(residual_out) * weight``.

One pass over the inputs: the sum is formed in float32, stored rounded to the
dtype as ``residual_out``, and normalised from its float32 value (so ``y`` is
the normalisation of the exact sum, as the float64 reference computes it).
Rows that fit in registers keep the float32 sum there (*resident*: each input
read once); longer rows are walked twice (*streamed*): the first pass writes
``residual_out`` and sums squares, the second re-reads ``x`` and ``residual``
(L2 hits, in reverse order) to write ``y``.
"""

# No ``from __future__ import annotations``: TileLang evaluates the
# ``T.Tensor`` annotations of its programs against the enclosing scope.
from typing import Any, Dict, List, Optional, Tuple

import torch

from tileops.kernels.cache_hints import EVICT_LAST, HINTED_MIN_MIB
from tileops.kernels.kernel_base import strided_rows, torch_dtype_to_tl
from tileops.kernels.norm.rows import (
    MAX_EXTENT,
    RowLayout,
    RowNormKernel,
    StreamLayout,
    resident_layout,
    row_slices,
    row_sum_macro,
    scratch_shape,
    stream_layout,
    stream_macros,
)
from tileops.kernels.norm.rms_norm import resident_rms_program
from tileops.kernels.sizes import ACCUM, MAX_THREADS, max_vector

__all__ = ["FusedAddRMSNormFwdKernel", "fused_add_rms_norm_default_config"]

# float32 sums a thread may hold in registers in the resident program.
RESIDENT_CAP = 32

RESIDENT = "fused_add_rms_norm_resident"
RESIDENT_HINTED = "fused_add_rms_norm_resident_hinted"
STREAMED = "fused_add_rms_norm_streamed"


def fused_add_rms_norm_default_config(N: int, dtype: torch.dtype) -> Dict[str, int]:
    """Two 16-byte vectors of each input per thread (more for long rows, at most 1024 threads a row);
    streamed rows: 512 threads with two vectors of each input in flight.

    ``hinted_min_mib``: resident calls whose inputs (``x`` and ``residual`` together) take at least
    this many MiB load them with L2's ``evict_last`` (the ``RESIDENT_HINTED`` program; 0: every
    call whose loads can take it).  The inputs are read once, yet on large calls the hint let the
    fused add keep pace with torch.compile, presumably because the lines it writes then leave L2
    first (H100, bf16 32768 x 4096, median of 7 rounds in turns, µs, no hint / evict_first /
    evict_last / torch.compile: 353.6 / 358.5 / 351.3 / 351.5; 8 x 4096 x 4096 without and with
    evict_first 177.1 / 180.3, compile 175.6).  On smaller calls it cost 3-7 % (bf16 rows of
    4096, without / with / torch.compile: 4096 rows 40.38 / 43.36 / 43.94, 8192 rows 84.70 /
    87.62 / 88.00, 16384 rows 177.10 / 175.49 / 175.66; fp32 8192 rows 177.38 / 175.58 /
    178.37).  Elements per thread changed nothing (8, 16 or 32: 353.5-353.6 µs)."""
    vector_elems = max_vector(dtype)
    return {"per_thread": max(2 * vector_elems, -(-N // MAX_THREADS)), "stream_threads": 512, "stream_unroll": 2,
            "hinted_min_mib": HINTED_MIN_MIB}


def _streamed_program(N: int, dtype: str, eps: float, layout: StreamLayout) -> Any:
    import tilelang.language as T  # deferred: importing tilelang costs seconds

    M = T.dynamic("M")
    XT, LDX = strided_rows(T, M, N, dtype, "LDX")
    RT, LDR = strided_rows(T, M, N, dtype, "LDR")
    vector, unroll, threads, steps = layout.vector, layout.unroll, layout.threads, layout.steps
    walk = stream_macros(T, layout)
    column, valid = walk["column"], walk["valid"]
    row_sum = row_sum_macro(T, threads, 1)
    inv_n = 1.0 / N

    def total(x, r):
        return T.cast(x, ACCUM) + T.cast(r, ACCUM)

    @T.prim_func
    def fused_add_rms_norm_fwd_streamed(
        X: XT,
        R: RT,
        W: T.Tensor((N,), dtype),
        Y: T.Tensor((M, N), dtype),
        RO: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(M, threads=threads) as row:
            T.assume(LDX % vector == 0)
            T.assume(LDR % vector == 0)
            tx = T.get_thread_binding()
            xb = T.alloc_local((unroll * vector,), dtype)
            rb = T.alloc_local((unroll * vector,), dtype)
            wb = T.alloc_local((unroll * vector,), dtype)
            st = T.alloc_local((1,), ACCUM)
            scratch = T.alloc_shared(scratch_shape(threads, 1), ACCUM)
            st[0] = T.cast(0, ACCUM)
            for step in T.serial(steps):
                walk["load_step"](X, xb, row, step, tx)
                walk["load_step"](R, rb, row, step, tx)
                for u in T.unroll(unroll):
                    if valid(step, u, tx):
                        for k in T.vectorized(vector):
                            RO[row, column(step, u, tx) + k] = T.cast(
                                total(xb[u * vector + k], rb[u * vector + k]), dtype)
                for i in T.unroll(unroll * vector):  # missing elements are zeros and add nothing
                    st[0] = st[0] + total(xb[i], rb[i]) * total(xb[i], rb[i])
            row_sum(st, 0, scratch, 0, tx)
            st[0] = T.rsqrt(st[0] * inv_n + eps)
            # Reverse order: the chunks read last are the likeliest L2 hits.
            for back in T.serial(steps):
                walk["load_step"](X, xb, row, steps - 1 - back, tx)
                walk["load_step"](R, rb, row, steps - 1 - back, tx)
                walk["load_step_vector"](W, wb, steps - 1 - back, tx)
                for u in T.unroll(unroll):
                    if valid(steps - 1 - back, u, tx):
                        for k in T.vectorized(vector):
                            Y[row, column(steps - 1 - back, u, tx) + k] = T.cast(
                                total(xb[u * vector + k], rb[u * vector + k]) * st[0]
                                * T.cast(wb[u * vector + k], ACCUM), dtype)

    return fused_add_rms_norm_fwd_streamed


class FusedAddRMSNormFwdKernel(RowNormKernel):
    """``forward(x, residual, weight, y, residual_out)``: 16-byte aligned tensors on one GPU; the outputs
    contiguous, the inputs' rows of unit stride and a multiple of ``row_vector(N)`` elements apart."""

    # "2": the hint is taken per call from ``hinted_min_mib`` on, not by every call (``row_cache_hints``).
    version = "2"
    hinted_name = RESIDENT_HINTED

    @property
    def default_config(self) -> Dict[str, Any]:
        return fused_add_rms_norm_default_config(self.N, self.dtype)

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
        if resident.per_thread <= RESIDENT_CAP:
            return resident
        return stream_layout(self.N, self.dtype, config["stream_threads"], config["stream_unroll"])

    def main_program(self) -> str:
        return self.cached("program", lambda: RESIDENT if isinstance(self.layout(), RowLayout) else STREAMED)

    def build_program(self, name: str, config: Dict[str, Any]) -> Any:
        layout = self.layout(config)
        dtype = torch_dtype_to_tl(self.dtype)
        if isinstance(layout, RowLayout):
            return resident_rms_program(self.N, dtype, self.eps, layout,
                                        EVICT_LAST if name == RESIDENT_HINTED else None, residual=True)
        return _streamed_program(self.N, dtype, self.eps, layout)

    def program_keys(self) -> List[Tuple[str, Tuple[Tuple[str, Any], ...]]]:
        return [(name, ()) for name in self.row_program_names()]

    def tuning_inputs(self, rows: Optional[int] = None) -> Tuple[torch.Tensor, ...]:
        rows = self.tuning_rows if rows is None else rows
        x, residual = (torch.randn(rows, self.N, device="cuda", dtype=self.dtype) for _ in range(2))
        weight = torch.randn(self.N, device="cuda", dtype=self.dtype)
        return x, residual, weight, torch.empty_like(x), torch.empty_like(x)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, y: torch.Tensor,
                residual_out: torch.Tensor) -> torch.Tensor:
        """Write ``residual_out = x + residual`` and ``y = rms_norm(residual_out) * weight``; return ``y``."""
        launch = self.launcher(self.row_program(x.nbytes + residual.nbytes))
        if x.shape[0] <= MAX_EXTENT:
            launch(x, residual, weight, y, residual_out)
            return y
        for start, stop in row_slices(x.shape[0]):
            launch(x[start:stop], residual[start:stop], weight, y[start:stop], residual_out[start:stop])
        return y
