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
These decisions depend only on the inputs' sizes and strides, so each op makes
them once per geometry (``AxisCallLayout``, kept in the op's ``LayoutMemo``).
"""

import dataclasses
from typing import Optional, Tuple

import torch

from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import (
    LaunchRanges,
    ViewSpec,
    contiguous_strides,
    has_unit_rows,
    int32_launch_ranges,
    kernel_view_spec,
    launch_in_ranges,
    on_device,
)
from tileops.ops.op_base import Op

__all__ = ["AxisCallLayout", "SoftmaxFamilyOp", "kernel_view"]

_AS_IS = ViewSpec(None, None, None)


def kernel_view(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """``tensor`` as the kernels read it along non-negative ``dim``: ``(rows, N)`` or ``(outer, N, inner)``,
    in place when its memory allows, else of a contiguous copy (``kernel_view_spec``)."""
    return kernel_view_spec(tensor.shape, tensor.stride(), (dim,)).apply(tensor)


@dataclasses.dataclass(frozen=True)
class AxisCallLayout:
    """What every call with one geometry of inputs does on the host (see ``SoftmaxFamilyOp``)."""

    out_shape: Tuple[int, ...]
    # The output is ``empty_like`` of the first input: several times cheaper than ``torch.empty``.
    out_like_first: bool
    # How each input becomes the kernel's view; empty when there is nothing to launch.
    views: Tuple[ViewSpec, ...]
    # The output as the kernel writes it; None: the output itself.
    out_view: Optional[Tuple[int, ...]]
    # Slices of the leading axis launched one by one; None: one launch of everything.
    ranges: Optional[LaunchRanges]
    # The kernel takes the inputs and the output as they are: no view to take.
    in_place: bool


class SoftmaxFamilyOp(Op):
    """Shared forward flow of the softmax family (softmax, log-softmax, forward and backward).

    L3 ops set ``N``, ``dim``, ``dtype``, ``out_dtype`` (see ``Op._kernel_dtypes``), ``tune`` and a
    one-entry ``kernel_map``, and call ``_run_kernel(*inputs)`` once every check has passed with
    CUDA tensors.
    """

    N: int
    dim: int
    tune: bool

    def _build_kernel(self, key: str, *input_shapes: Tuple[int, ...]) -> Kernel:
        return self.kernel_map[key](self.N, **self._kernel_dtype_args(), tune=self.tune)

    # Every extent and stride is symbolic: ``_run_kernel`` names the kernel by ``(device index,)``.
    kernels_keyed_by_launch = True

    @property
    def kernel_key(self) -> str:
        """The family's ops launch exactly one kernel."""
        return next(iter(self.kernel_map))

    def _run_kernel(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The contiguous output: the kernel on the inputs' axis views."""
        cast, out_dtype = self._kernel_dtypes()
        if cast is not None:
            inputs = tuple(t.to(cast) for t in inputs)
        first = inputs[0]
        if first.dim() == 0:
            # A scalar is a row of one (dim 0 or -1, as PyTorch wraps them).
            return self._run_kernel(*(t.view(1) for t in inputs)).view(())
        # Inputs of one call share a shape, so their strides tell their geometries apart.
        key = (first.shape, *map(torch.Tensor.stride, inputs))
        layout = self._layouts.get(key, lambda: self._call_layout(inputs))
        if layout.out_like_first:
            out = torch.empty_like(first, dtype=out_dtype)
        else:
            out = torch.empty(layout.out_shape, dtype=out_dtype, device=first.device)
        if not layout.views:
            return out
        if layout.in_place:
            views, out_view = inputs, out
        else:
            views = tuple(spec.apply(t) for spec, t in zip(layout.views, inputs))
            out_view = out if layout.out_view is None else out.view(layout.out_view)
        device = first.device
        kernel = self._kernel(self.kernel_key, (device.index,))
        with on_device(device):
            launch_in_ranges(kernel.forward, (*views, out_view), layout.ranges)
        return out

    def _call_layout(self, inputs: Tuple[torch.Tensor, ...]) -> AxisCallLayout:
        """The host side of every call with these inputs' shape and strides."""
        first = inputs[0]
        shape = tuple(first.shape)
        out_like_first = has_unit_rows(first)
        if first.numel() == 0:
            return AxisCallLayout(shape, out_like_first, (), None, None, False)
        axes = (self.dim % len(shape),)
        views = tuple(kernel_view_spec(shape, t.stride(), axes) for t in inputs)
        # The output is contiguous, as a contiguous input is: it takes the view such an input would.
        kernel_shape = kernel_view_spec(shape, contiguous_strides(shape), axes).size
        in_place = kernel_shape is None and all(spec == _AS_IS for spec in views)
        return AxisCallLayout(shape, out_like_first, views, kernel_shape,
                              int32_launch_ranges(kernel_shape or shape, "softmax"), in_place)
