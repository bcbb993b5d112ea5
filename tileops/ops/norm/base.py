"""L2 base of the norm family: the CUDA path of normalisations over the last axis.

A norm op commits its hidden size ``N`` (the last axis) at construction; all
leading axes fold into one row axis, which the kernels take as a TileLang
symbolic dimension, so one kernel per device serves every input shape.
"""

from typing import Hashable, Tuple

import torch

from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import aligned_contiguous, on_device
from tileops.ops.op_base import Op

__all__ = ["NormOp"]

# Kernels take the row count as an int32 extent.
MAX_ROWS_PER_LAUNCH = 2**31 - 1


class NormOp(Op):
    """Shared forward flow of the norm family (``RMSNormFwdOp`` and kin).

    L3 ops set ``N``, ``dtype``, ``eps``, ``tune`` and ``kernel_map``, and call
    ``_run_kernel`` once every check has passed with CUDA tensors.
    """

    N: int
    eps: float
    tune: bool

    # The kernel_map entry this family's forward launches.
    kernel_key = "rms_norm_fwd"

    def _build_kernel(self, key: str, *input_shapes: Tuple[int, ...]) -> Kernel:
        return self.kernel_map[key](self.N, self.dtype, eps=self.eps, tune=self.tune)

    def _cache_key(self, *input_shapes: Tuple[int, ...]) -> Hashable:
        # Rows are symbolic in the kernel, so only the device decides which
        # kernel (and which tuned config) serves a call; ``_run_kernel`` passes
        # ``(device index,)`` as the only "shape".
        return input_shapes[0]

    def _run_kernel(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``y`` shaped like ``x``: the kernel on ``x`` viewed as ``(rows, N)``."""
        # Runs on every call: each step below is chosen for its host cost
        # (``empty_like`` of a contiguous tensor is contiguous and several times
        # cheaper than ``torch.empty(shape, ...)``; 2-D inputs need no views).
        x = aligned_contiguous(x)
        y = torch.empty_like(x)
        if x.ndim == 2:
            x_rows, y_rows = x, y
        else:
            x_rows, y_rows = x.view(-1, self.N), y.view(-1, self.N)
        rows = x_rows.shape[0]
        if rows == 0:
            return y
        weight = aligned_contiguous(weight)
        device = x.device
        kernel = self._kernel(self.kernel_key, (device.index,))
        with on_device(device):
            if rows <= MAX_ROWS_PER_LAUNCH:
                kernel.forward(x_rows, weight, y_rows)
            else:
                # Slices start at a multiple of N elements, so they stay as
                # aligned as the kernel's vector accesses need.
                for start in range(0, rows, MAX_ROWS_PER_LAUNCH):
                    stop = min(rows, start + MAX_ROWS_PER_LAUNCH)
                    kernel.forward(x_rows[start:stop], weight, y_rows[start:stop])
        return y
