"""L2 base of the reduction family: the CUDA path of reductions over any set of axes.

The reduced axes are merged into one extent ``N`` on the host.  When they
are adjacent, the input is handed to the kernel as a view whenever its memory
allows one: ``(rows, N)`` with any row stride when nothing follows them, else
``(outer, N, inner)`` with any outer and axis strides when the axes after them
are contiguous.  Reduced axes that are not adjacent (``dim=(0, 2)`` of a 3-d
tensor), and layouts no such view describes (a transpose, every other
element), are copied once, kept axes first, into a contiguous ``(kept, N)``
tensor.  Extents and strides are TileLang symbolic values, so one kernel per
device and layout kind (rows or columns) serves every shape.
"""

import math
from typing import Hashable, Optional, Sequence, Tuple

import torch

from tileops import _shape_rules as rules
from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import on_device
from tileops.kernels.sizes import MAX_EXTENT
from tileops.ops.op_base import Op

__all__ = ["ReductionOp", "reduction_view"]

ROWS, COLUMNS = 2, 3


def _folded_stride(sizes: Sequence[int], strides: Sequence[int]) -> Tuple[bool, Optional[int]]:
    """Whether axes fold into one, and the folded stride (``None`` when every size is 1)."""
    stride: Optional[int] = None
    expected = 0
    for size, step in zip(reversed(sizes), reversed(strides)):
        if size == 1:
            continue
        if stride is None:
            stride = step
        elif step != expected:
            return False, None
        expected = step * size
    return True, stride


def _strided_view(x: torch.Tensor, first: int, last: int) -> Optional[torch.Tensor]:
    """``x`` as ``(outer, N)`` or ``(outer, N, inner)`` over reduced axes ``first..last``, without a copy."""
    sizes, strides = x.shape, x.stride()
    outer, N, inner = math.prod(sizes[:first]), math.prod(sizes[first:last + 1]), math.prod(sizes[last + 1:])
    outer_folds, outer_stride = _folded_stride(sizes[:first], strides[:first])
    axis_folds, axis_stride = _folded_stride(sizes[first:last + 1], strides[first:last + 1])
    inner_folds, inner_stride = _folded_stride(sizes[last + 1:], strides[last + 1:])
    if not (outer_folds and axis_folds and inner_folds) or inner_stride not in (None, 1):
        return None
    outer_stride = N * inner if outer_stride is None else outer_stride
    if inner == 1:
        if axis_stride not in (None, 1):
            return None
        return x.as_strided((outer, N), (outer_stride, 1))
    axis_stride = inner if axis_stride is None else axis_stride
    return x.as_strided((outer, N, inner), (outer_stride, axis_stride, 1))


def reduction_view(x: torch.Tensor, axes: Tuple[int, ...]) -> torch.Tensor:
    """``x`` as ``(rows, N)`` or ``(outer, N, inner)`` with the sorted, non-empty ``axes`` merged into ``N``.

    The kept axes keep their order, so the output (kept axes in order) is the
    view's rows, or its ``(outer, inner)`` positions, in row-major order.
    """
    first, last = axes[0], axes[-1]
    if last - first + 1 == len(axes):
        if x.is_contiguous():  # the common case, without walking the strides
            return _contiguous_view(x, first, last)
        view = _strided_view(x, first, last)
        return _contiguous_view(x.contiguous(), first, last) if view is None else view
    kept = [axis for axis in range(x.dim()) if axis not in axes]
    moved = x.permute(*kept, *axes).contiguous()
    return _contiguous_view(moved, len(kept), x.dim() - 1)


def _contiguous_view(x: torch.Tensor, first: int, last: int) -> torch.Tensor:
    """Contiguous ``x`` as ``(rows, N)`` or ``(outer, N, inner)`` over axes ``first..last``.

    Runs on every call, so a tensor that already has the view's shape and strides is
    returned as it is.  (``view`` would keep whatever strides size-1 axes of a contiguous
    tensor carry; the programs need unit-stride rows.)
    """
    shape = x.shape
    N, inner = math.prod(shape[first:last + 1]), math.prod(shape[last + 1:])
    if inner == 1:
        if len(shape) == 2 and first == 1 and x.stride(1) == 1:
            return x
        return x.as_strided((x.numel() // N, N), (N, 1))
    if len(shape) == 3 and first == last == 1:
        return x
    return x.as_strided((x.numel() // (N * inner), N, inner), (N * inner, inner, 1))


class ReductionOp(Op):
    """Shared forward flow of the reduction family.

    L3 ops set ``dim``, ``keepdim``, ``dtype``, ``tune`` (and ``correction`` for
    the variance) and a one-entry ``kernel_map``.  ``empty_result`` is what a
    reduction over no elements gives (ops whose rules refuse it have none).
    """

    dim: Optional[Sequence[int]]
    keepdim: bool
    tune: bool

    @property
    def empty_result(self) -> float:
        """The value of a reduction over no elements (sum: 0, mean: NaN, ...)."""
        return {"sum_fwd": 0.0, "l2_norm_fwd": 0.0, "logsumexp_fwd": -math.inf}.get(self.kernel_key, math.nan)

    @property
    def kernel_key(self) -> str:
        """The family's ops launch exactly one kernel."""
        return next(iter(self.kernel_map))

    def _build_kernel(self, key: str, *input_shapes: Tuple[int, ...]) -> Kernel:
        return self.kernel_map[key](self.dtype, correction=getattr(self, "correction", 0), tune=self.tune)

    def _cache_key(self, *input_shapes: Tuple[int, ...]) -> Hashable:
        # Every extent and stride is symbolic in the kernels, so only the device and the layout
        # kind decide which kernel serves a call; ``_run_kernel`` passes ``(device index, view rank)``.
        return input_shapes[0]

    def _run_kernel(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        axes = rules.normalize_dims(self.dim, len(shape))
        out_shape = rules.shape_without_axes(shape, axes, self.keepdim)
        if not shape:  # a scalar reduces as a one-element vector
            x, axes = x.reshape(1), (0,)
        kernel_cls = self.kernel_map[self.kernel_key]
        device = x.device
        out = torch.empty(out_shape, dtype=getattr(kernel_cls, "out_dtype", None) or x.dtype, device=device)
        if out.numel() == 0:
            return out
        if 0 in shape:
            return out.fill_(self.empty_result)
        view = reduction_view(x, axes)
        rank = view.dim()
        kernel = self._kernel(self.kernel_key, (device.index, rank))
        with on_device(device):
            if rank == ROWS:
                self._launch_rows(kernel, view, out if out.dim() == 1 else out.view(-1))
            else:
                outer, _, inner = view.shape
                self._launch_columns(kernel, view, out if out.shape == (outer, inner) else out.view(outer, inner))
        return out

    @staticmethod
    def _launch_rows(kernel: Kernel, view: torch.Tensor, out: torch.Tensor) -> None:
        rows = view.shape[0]
        if rows <= MAX_EXTENT:  # slicing costs microseconds a call: only huge inputs pay for it
            kernel(view, out)
            return
        for start in range(0, rows, MAX_EXTENT):
            stop = min(rows, start + MAX_EXTENT)
            kernel(view[start:stop], out[start:stop])

    @staticmethod
    def _launch_columns(kernel: Kernel, view: torch.Tensor, out: torch.Tensor) -> None:
        outer, _, inner = view.shape
        if inner > MAX_EXTENT:
            raise ValueError(f"reduction: {inner} elements after the reduced axes exceed {MAX_EXTENT}; "
                             "reduce a reshaped input")
        # Programs number their blocks and outputs outer * inner in int32.
        per_launch = max(1, MAX_EXTENT // inner)
        if outer <= per_launch:
            kernel(view, out)
            return
        for start in range(0, outer, per_launch):
            stop = min(outer, start + per_launch)
            kernel(view[start:stop], out[start:stop])

