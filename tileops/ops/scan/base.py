"""L2 base of the scan family: the CUDA path of scans along one axis.

A scan op commits the length ``N`` of its axis ``dim`` at construction.  A
contiguous input is seen as ``(outer, N, inner)`` without copying; the kernels
take ``outer`` and ``inner`` as TileLang symbolic dimensions, so one kernel per
device serves every input shape.  A scan along the last axis also reads rows in
place when they have unit stride and lie a multiple of the access width apart
(a row slice of a wider tensor); other layouts are copied once.  The output is
contiguous.
"""

import math
from typing import Tuple

import torch

from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import (
    aligned_contiguous,
    empty_contiguous,
    int32_launch_ranges,
    launch_in_ranges,
    on_device,
    rows_and_output,
)
from tileops.ops.op_base import Op

__all__ = ["ScanOp"]


class ScanOp(Op):
    """Shared forward flow of the scan family (cumsum, its gradient, cumprod).

    L3 ops set ``N``, ``dim``, ``dtype``, ``tune`` and a one-entry
    ``kernel_map`` (the kernel decides the operator and direction; cumsum's and cumprod's forward
    and cumsum's backward an ``out_dtype`` too, see ``Op._kernel_dtypes``), and call
    ``_run_kernel`` once every check has passed with CUDA tensors.
    """

    N: int
    dim: int
    tune: bool

    @property
    def kernel_key(self) -> str:
        """The family's ops launch one kernel: the only kernel_map entry."""
        return next(iter(self.kernel_map))

    def _build_kernel(self, key: str, *input_shapes: Tuple[int, ...]) -> Kernel:
        return self.kernel_map[key](self.N, **self._kernel_dtype_args(), tune=self.tune)

    # outer and inner are symbolic: ``_run_kernel`` names the kernel by ``(device index,)``.
    kernels_keyed_by_launch = True

    def _run_kernel(self, x: torch.Tensor) -> torch.Tensor:
        """``y`` shaped like ``x``: the scan of ``x`` along ``self.dim``."""
        cast, out_dtype = self._kernel_dtypes()
        if cast is not None:
            x = x.to(cast)
        shape = x.shape
        if x.numel() == 0:
            return empty_contiguous(x, shape, out_dtype)
        if x.dim() == 0:
            # A scalar scans as a row of one (dim 0 or -1, as PyTorch wraps them).
            return self._run_kernel(x.view(1)).view(())
        N = self.N
        ndim = len(shape)
        dim = self.dim % ndim
        inner = 1 if dim == ndim - 1 else math.prod(shape[dim + 1:])
        device = x.device
        kernel = self._kernel(self.kernel_key, (device.index,))
        with on_device(device):
            if inner > 1:
                y = empty_contiguous(x, shape, out_dtype)
                outer = y.numel() // (N * inner)
                columns = (aligned_contiguous(x).view(outer, N, inner), y.view(outer, N, inner))
                # The column programs number their blocks in int32: at most outer * ceil(inner / 32)
                # (tiles narrower than 32 columns are taken only where that gives under 256 blocks).
                launch_in_ranges(kernel.forward, columns, int32_launch_ranges(columns[1].shape, "scan", 32))
                return y
            # A scan of rows; size-1 axes after ``dim`` fold into it.
            x_rows, y, y_rows = rows_and_output(x if dim == ndim - 1 else x.flatten(dim), N, out_dtype)
            launch_in_ranges(kernel.forward, (x_rows, y_rows), int32_launch_ranges(y_rows.shape, "scan"))
        return y if dim == ndim - 1 else y.view(shape)
