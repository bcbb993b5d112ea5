"""RMSNorm backward: ``grad_x`` and ``grad_weight`` of ``y = x * rsqrt(mean(x**2, -1) + eps) * weight``,
and of RMSNorm fused with a residual add.

The programs (shared with LayerNorm's backward) are in
``tileops.kernels.norm.backward``: one persistent row launch writes ``grad_x``
and float32 per-column partial sums of ``grad_y * x * rsqrt(...)``, and a small
column-sum launch reduces those partials into ``grad_weight``.
"""

from typing import Tuple

import torch

from tileops.kernels.norm.backward import NormBwdKernel

__all__ = ["RMSNormBwdKernel", "FusedAddRMSNormBwdKernel"]


class RMSNormBwdKernel(NormBwdKernel):
    """RMSNorm backward; ``forward(grad_y, x, weight, grad_x, grad_weight)``.

    The reciprocal root mean square of each row is recomputed from ``x``.
    """

    layer = False


class FusedAddRMSNormBwdKernel(NormBwdKernel):
    """Backward of ``h = x + residual; y = rms_norm(h) * weight`` (``h`` returned too);
    ``forward(grad_y, grad_h, h, weight, grad_x, grad_weight)``.

    ``grad_x`` is RMSNorm's gradient of ``h`` plus ``grad_h``, the gradient of the returned sum:
    the gradient of ``x`` and of ``residual`` alike.  It is added as the row is written, so the
    sum costs one more read of ``grad_h`` and no launch of its own.
    """

    layer = False
    residual = True

    def forward(self, grad_y: torch.Tensor, grad_h: torch.Tensor, h: torch.Tensor,  # type: ignore[override]
                weight: torch.Tensor, grad_x: torch.Tensor, grad_weight: torch.Tensor) -> torch.Tensor:
        """Fill ``grad_x`` and ``grad_weight``; return ``grad_x``."""
        row_inputs: Tuple[torch.Tensor, ...] = (grad_y, grad_h, h)
        return self._launch_rows(row_inputs, weight, grad_x, [grad_weight])
