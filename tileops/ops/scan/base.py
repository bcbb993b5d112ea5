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
from typing import Hashable, Tuple

import torch

from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import aligned_contiguous, empty_contiguous, on_device, rows_and_output
from tileops.kernels.sizes import MAX_EXTENT
from tileops.ops.op_base import Op

__all__ = ["ScanOp"]


class ScanOp(Op):
    """Shared forward flow of the scan family (cumsum, its gradient, cumprod).

    L3 ops set ``N``, ``dim``, ``dtype``, ``tune`` and a one-entry
    ``kernel_map`` (the kernel decides the operator and direction), and call
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
        return self.kernel_map[key](self.N, self.dtype, tune=self.tune)

    def _cache_key(self, *input_shapes: Tuple[int, ...]) -> Hashable:
        # outer and inner are symbolic in the kernels, so only the device decides
        # which kernel serves a call; ``_run_kernel`` passes ``(device index,)``.
        return input_shapes[0]

    def _run_kernel(self, x: torch.Tensor) -> torch.Tensor:
        """``y`` shaped like ``x``: the scan of ``x`` along ``self.dim``."""
        shape = x.shape
        if x.numel() == 0:
            return empty_contiguous(x, shape)
        N = self.N
        ndim = len(shape)
        dim = self.dim % ndim
        inner = 1 if dim == ndim - 1 else math.prod(shape[dim + 1:])
        device = x.device
        kernel = self._kernel(self.kernel_key, (device.index,))
        with on_device(device):
            if inner > 1:
                y = empty_contiguous(x, shape)
                outer = y.numel() // (N * inner)
                self._launch_columns(kernel, aligned_contiguous(x).view(outer, N, inner), y.view(outer, N, inner))
                return y
            # A scan of rows; size-1 axes after ``dim`` fold into it.
            x_rows, y, y_rows = rows_and_output(x if dim == ndim - 1 else x.flatten(dim), N)
            self._launch_rows(kernel, x_rows, y_rows)
        return y if dim == ndim - 1 else y.view(shape)

    @staticmethod
    def _launch_rows(kernel: Kernel, x: torch.Tensor, y: torch.Tensor) -> None:
        rows = x.shape[0]
        if rows <= MAX_EXTENT:
            kernel.forward(x, y)
            return
        # Slices start at a multiple of the row stride: as aligned as the kernel needs.
        for start in range(0, rows, MAX_EXTENT):
            stop = min(rows, start + MAX_EXTENT)
            kernel.forward(x[start:stop], y[start:stop])

    @staticmethod
    def _launch_columns(kernel: Kernel, x: torch.Tensor, y: torch.Tensor) -> None:
        outer, _, inner = x.shape
        if inner > MAX_EXTENT:
            raise ValueError(
                f"{type(kernel).__name__}: {inner} elements after the scanned axis exceed "
                f"{MAX_EXTENT}; reshape the input"
            )
        # The column programs number their blocks in int32: at most outer * ceil(inner / 32)
        # (tiles narrower than 32 columns are taken only where that gives under 256 blocks).
        outer_per_launch = max(1, MAX_EXTENT // -(-inner // 32))
        if outer <= outer_per_launch:
            kernel.forward(x, y)
            return
        for start in range(0, outer, outer_per_launch):
            stop = min(outer, start + outer_per_launch)
            kernel.forward(x[start:stop], y[start:stop])
