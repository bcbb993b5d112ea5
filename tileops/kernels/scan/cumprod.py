"""Inclusive prefix product (cumprod) along one axis of length ``N``.

The scan programs of ``cumsum`` with a multiply combine (identity 1):
products accumulate in float32 and the output has the input dtype, over the
same layouts (rows, few long rows split across blocks, a non-last axis).
"""

from tileops.kernels.scan.cumsum import MUL, ScanKernel

__all__ = ["CumprodFwdKernel"]


class CumprodFwdKernel(ScanKernel):
    """Inclusive cumprod along an axis of length ``N``: ``out[i] = x[0] * ... * x[i]``."""

    combine = MUL
