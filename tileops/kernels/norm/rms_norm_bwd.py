"""RMSNorm backward: ``grad_x`` and ``grad_weight`` of ``y = x * rsqrt(mean(x**2, -1) + eps) * weight``.

The programs (shared with LayerNorm's backward) are in
``tileops.kernels.norm.backward``: one persistent row launch writes ``grad_x``
and float32 per-column partial sums of ``grad_y * x * rsqrt(...)``, and a small
column-sum launch reduces those partials into ``grad_weight``.
"""

from tileops.kernels.norm.backward import NormBwdKernel

__all__ = ["RMSNormBwdKernel"]


class RMSNormBwdKernel(NormBwdKernel):
    """RMSNorm backward; ``forward(grad_y, x, weight, grad_x, grad_weight)``.

    The reciprocal root mean square of each row is recomputed from ``x``.
    """

    layer = False
