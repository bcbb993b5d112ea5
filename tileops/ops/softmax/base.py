"""L2 base of the softmax family: the CUDA path of softmax-like ops along one axis.

An op commits the length ``N`` of its axis ``dim`` at construction.  Each
input is handed to the kernel as a view whenever its memory allows one:
``(rows, N)`` with any row stride (including 0, for broadcast rows) when
``dim`` is the last axis and has unit stride, else ``(outer, N, inner)`` with
any outer and axis strides when the axes after ``dim`` are contiguous.  So
row and column slices of a larger tensor need no copy; other layouts (a
transpose, every other element) are copied once.  The output is contiguous,
as the traced (fake) output is.  The kernels take every extent and stride as
TileLang symbolic values, so one kernel per device serves every shape and layout.
"""

import math
from typing import Hashable, List, Optional, Tuple

import torch

from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import empty_contiguous, has_unit_rows, merged_axes_view, on_device
from tileops.kernels.sizes import MAX_EXTENT
from tileops.ops.op_base import Op

__all__ = ["SoftmaxFamilyOp", "axis_view", "kernel_view"]


def axis_view(tensor: torch.Tensor, dim: int, N: int) -> Optional[torch.Tensor]:
    """``tensor`` as ``(rows, N)`` (``dim`` innermost) or ``(outer, N, inner)`` without a copy, if it can be.

    ``dim`` is non-negative.  The innermost axis of the view has unit stride;
    ``None`` when no such view describes the tensor's memory.
    """
    view = merged_axes_view(tensor.shape, tensor.stride(), dim, dim)
    return None if view is None else tensor.as_strided(*view)


def kernel_view(tensor: torch.Tensor, dim: int, N: int) -> torch.Tensor:
    """``axis_view`` of ``tensor``, or of a contiguous copy when no view describes it."""
    view = axis_view(tensor, dim, N)
    if view is None:
        view = axis_view(tensor.contiguous(), dim, N)
    assert view is not None  # a contiguous tensor always folds
    return view


class SoftmaxFamilyOp(Op):
    """Shared forward flow of the softmax family (softmax, log-softmax, forward and backward).

    L3 ops set ``N``, ``dim``, ``dtype``, ``tune`` and a one-entry ``kernel_map``,
    and call ``_run_kernel(*inputs)`` once every check has passed with CUDA tensors.
    """

    N: int
    dim: int
    tune: bool

    def _build_kernel(self, key: str, *input_shapes: Tuple[int, ...]) -> Kernel:
        return self.kernel_map[key](self.N, self.dtype, tune=self.tune)

    def _cache_key(self, *input_shapes: Tuple[int, ...]) -> Hashable:
        # Every extent and stride is symbolic in the kernels, so only the device
        # decides which kernel serves a call; ``_run_kernel`` passes ``(device index,)``.
        return input_shapes[0]

    @property
    def kernel_key(self) -> str:
        """The family's ops launch exactly one kernel."""
        return next(iter(self.kernel_map))

    def _run_kernel(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The contiguous output: the kernel on the inputs' axis views."""
        # Runs on every call: tensors that already have the kernel's shape take no view.
        first = inputs[0]
        shape = first.shape
        out = empty_contiguous(first, shape)
        numel = out.numel()
        if numel == 0:
            return out
        N = self.N
        dim = self.dim % len(shape)
        inner = math.prod(shape[dim + 1:])
        kernel_shape = (numel // (N * inner), N) if inner == 1 else (numel // (N * inner), N, inner)
        reshape = shape != kernel_shape
        views = [(t.view(kernel_shape) if reshape else t) if has_unit_rows(t) else kernel_view(t, dim, N)
                 for t in inputs]
        out_view = out.view(kernel_shape) if reshape else out
        device = first.device
        kernel = self._kernel(self.kernel_key, (device.index,))
        with on_device(device):
            if numel // N <= MAX_EXTENT:  # rows, or outer * inner, fit the int32 extents
                kernel(*views, out_view)
            else:
                for start, stop in self._launch_ranges(out_view):
                    kernel(*(v[start:stop] for v in views), out_view[start:stop])
        return out

    @staticmethod
    def _launch_ranges(out_view: torch.Tensor) -> List[Tuple[int, int]]:
        """Slices of the leading axis small enough for the kernels' int32 extents."""
        leading = out_view.shape[0]
        if out_view.dim() == 2:
            per_launch = MAX_EXTENT
        else:
            inner = out_view.shape[2]
            if inner > MAX_EXTENT:
                raise ValueError(
                    f"softmax: {inner} elements after the reduced axis exceed {MAX_EXTENT}; reshape the input"
                )
            # Column programs number their blocks outer * (inner tiles) in int32.
            per_launch = max(1, MAX_EXTENT // inner)
        return [(start, min(leading, start + per_launch)) for start in range(0, leading, per_launch)]
