"""L2 base of the reduction family: the CUDA path of reductions over any set of axes.

The reduced axes are merged into one extent ``N`` on the host.  When they
are adjacent, the input is handed to the kernel as a view whenever its memory
allows one: ``(rows, N)`` with any row stride when nothing follows them, else
``(outer, N, inner)`` with any outer and axis strides when the axes after them
are contiguous.  Reduced axes that are not adjacent (``dim=(0, 2)`` of a 3-d
tensor), and layouts no such view describes (a transpose, every other
element), are copied once, kept axes first, into a contiguous ``(kept, N)``
tensor.  Extents and strides are TileLang symbolic values, so one kernel per
device and layout kind (rows or columns) serves every shape.  These decisions
depend only on the input's sizes, strides and dtype, so each op makes them once
per geometry (``CallLayout``, kept in the op's ``LayoutMemo``).
"""

import dataclasses
import math
from typing import Optional, Sequence, Tuple

import torch

from tileops import _shape_rules as rules
from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import (
    LaunchRanges,
    ViewSpec,
    int32_launch_ranges,
    kernel_view_spec,
    launch_in_ranges,
    on_device,
)
from tileops.ops.op_base import Op

__all__ = ["CallLayout", "ReductionOp", "reduction_view"]

ROWS, COLUMNS = 2, 3


@dataclasses.dataclass(frozen=True)
class CallLayout:
    """What every call with one input shape, stride and dtype does on the host (see ``ReductionOp``)."""

    out_shape: Tuple[int, ...]
    out_dtype: torch.dtype
    # "launch", or "empty" (nothing to write) / "fill" (the empty reduction's value) without a launch.
    action: str
    view: ViewSpec
    rank: int
    # The output as the kernel writes it: ``(rows,)`` or ``(outer, inner)``; None: the output itself.
    out_view: Optional[Tuple[int, ...]]
    # Slices of the view's leading axis launched one by one; None: one launch of everything.
    ranges: Optional[LaunchRanges]


def reduction_view(x: torch.Tensor, axes: Tuple[int, ...]) -> torch.Tensor:
    """``x`` as the kernel reads it: see ``kernel_view_spec``."""
    return kernel_view_spec(x.shape, x.stride(), axes).apply(x)


class ReductionOp(Op):
    """Shared forward flow of the reduction family.

    L3 ops set ``dim``, ``keepdim``, ``dtype``, ``tune`` (and ``correction`` for the variance,
    ``out_dtype`` for the sum, mean and 2-norm, see ``Op._kernel_dtypes``) and a one-entry ``kernel_map``.
    ``empty_result`` is what a reduction over no elements gives (ops whose rules refuse it have none).
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
        return self.kernel_map[key](**self._kernel_dtype_args(), correction=getattr(self, "correction", 0),
                                    tune=self.tune)

    # Every extent and stride is symbolic: ``_run_kernel`` names the kernel by
    # ``(device index, view rank)`` (rows or columns).
    kernels_keyed_by_launch = True

    def _run_kernel(self, x: torch.Tensor) -> torch.Tensor:
        cast, _ = self._kernel_dtypes()
        if cast is not None:
            x = x.to(cast)
        layout = self._layouts.get((x.shape, x.stride(), x.dtype), lambda: self._call_layout(x))
        device = x.device
        out = torch.empty(layout.out_shape, dtype=layout.out_dtype, device=device)
        if layout.action != "launch":
            return out if layout.action == "empty" else out.fill_(self.empty_result)
        view = layout.view.apply(x)
        kernel = self._kernel(self.kernel_key, (device.index, layout.rank))
        target = out if layout.out_view is None else out.view(layout.out_view)
        with on_device(device):
            launch_in_ranges(kernel, (view, target), layout.ranges)
        return out

    def _call_layout(self, x: torch.Tensor) -> CallLayout:
        """The host side of every call with ``x``'s shape, stride and dtype."""
        shape, strides = tuple(x.shape), x.stride()
        axes = rules.normalize_dims(self.dim, len(shape))
        out_shape = rules.shape_without_axes(shape, axes, self.keepdim)
        # A kernel class's own output dtype (an index), else the op's (``out_dtype``).
        out_dtype = getattr(self.kernel_map[self.kernel_key], "out_dtype", None) or self._kernel_dtypes()[1]
        if 0 in shape:  # nothing to write, or the empty reduction's value: no launch
            action = "empty" if 0 in out_shape else "fill"
            return CallLayout(out_shape, out_dtype, action, ViewSpec(None, None, None), ROWS, None, None)
        # A scalar reduces as a one-element vector.
        view = kernel_view_spec(shape, strides, axes) if shape else ViewSpec(None, (1, 1), (1, 1))
        size = shape if view.size is None else view.size
        kernel_out = (size[0],) if len(size) == ROWS else (size[0], size[2])
        # Programs number their blocks and outputs rows, or outer * inner, in int32.
        return CallLayout(out_shape, out_dtype, "launch", view, len(size),
                          None if out_shape == kernel_out else kernel_out, int32_launch_ranges(size, "reduction"))
