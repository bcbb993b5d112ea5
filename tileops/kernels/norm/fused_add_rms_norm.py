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
from typing import Any, Dict, Optional, Tuple

import torch

from tileops.kernels.norm.rms_norm import RMSNormFwdKernel, rms_norm_default_config
from tileops.kernels.norm.rows import MAX_EXTENT, row_slices

__all__ = ["FusedAddRMSNormFwdKernel", "fused_add_rms_norm_default_config"]

RESIDENT = "fused_add_rms_norm_resident"
RESIDENT_HINTED = "fused_add_rms_norm_resident_hinted"
STREAMED = "fused_add_rms_norm_streamed"


def fused_add_rms_norm_default_config(N: int, dtype: torch.dtype) -> Dict[str, int]:
    """RMSNorm's (``rms_norm_default_config``): two 16-byte vectors of each input per thread (more for
    long rows, at most 1024 threads a row); streamed rows: 512 threads with two vectors of each input
    in flight.

    ``hinted_min_mib``: resident calls whose inputs (``x`` and ``residual`` together) take at least
    this many MiB load them with L2's ``evict_last`` (the ``RESIDENT_HINTED`` program; 0: every
    call whose loads can take it).  The inputs are read once, yet on large calls the hint let the
    fused add keep pace with torch.compile, presumably because the lines it writes then leave L2
    first (H100, bf16 32768 x 4096, median of 7 rounds in turns, µs, no hint / evict_first /
    evict_last / torch.compile: 353.6 / 358.5 / 351.3 / 351.5; 8 x 4096 x 4096 without and with
    evict_first 177.1 / 180.3, compile 175.6).  On smaller calls it cost 3-7 % (bf16 rows of
    4096, without / with / torch.compile: 4096 rows 40.38 / 43.36 / 43.94, 8192 rows 84.70 /
    87.62 / 88.00, 16384 rows 177.10 / 175.49 / 175.66; fp32 8192 rows 177.38 / 175.58 /
    178.37).  Elements per thread changed nothing (8, 16 or 32: 353.5-353.6 µs).  Unlike RMSNorm's,
    its rows of 64 KiB stay in registers on devices with fast memory too, where they kept pace
    (H200, bf16 8192 x 32768, two inputs and two outputs: 498.8 µs, 100.5 % of copy bandwidth)."""
    return rms_norm_default_config(N, dtype)


class FusedAddRMSNormFwdKernel(RMSNormFwdKernel):
    """``forward(x, residual, weight, y, residual_out)``: 16-byte aligned tensors on one GPU; the outputs
    contiguous, the inputs' rows of unit stride and a multiple of ``row_vector(N)`` elements apart."""

    # "2": the hint is taken per call from ``hinted_min_mib`` on, not by every call (``row_cache_hints``).
    version = "2"
    resident_name, streamed_name, hinted_name = RESIDENT, STREAMED, RESIDENT_HINTED
    residual = True

    @property
    def default_config(self) -> Dict[str, Any]:
        return fused_add_rms_norm_default_config(self.N, self.dtype)

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
