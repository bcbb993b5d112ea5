"""L2 bases of the elementwise family: the CUDA path of activations, gated activations, add and mul.

Every kernel of the family takes its extents (and strides) as TileLang
symbolic values, so the kernel an op builds depends only on the device:
``_cache_key`` ignores shapes.  Outputs are contiguous, as the traced (fake)
outputs are.

* ``UnaryElementwiseOp`` (activations and their backward): inputs of one
  shape, flattened; a non-contiguous input is copied once.
* ``GatedElementwiseOp``: ``x`` as ``(rows, N)`` rows, strided rows read in
  place (e.g. a slice of a fused projection's output); other layouts are
  copied once.
* ``BinaryElementwiseOp``: operands of one shape and contiguous run the flat
  program; anything else (broadcasting, strided views) is folded into a
  ``(D0, D1, D2)`` problem whose operands are read in place with stride 0
  along broadcast axes.  An operand without a unit or zero inner stride (a
  transpose, every other element) is copied once; a broadcast that does not
  fold into three axes (rare: e.g. ``(A, 1, B, 1, C)`` against
  ``(1, D, 1, E, 1)``) materializes the operands at the output's shape.  The
  fold is worked out once per pair of operand geometries (``BinaryLayout``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import List, Optional, Sequence, Tuple

import torch

from tileops import _shape_rules as rules
from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import contiguous_strides, empty_contiguous, is_contiguous, on_device, unit_stride_rows
from tileops.ops.op_base import Op

__all__ = [
    "ElementwiseFamilyOp", "UnaryElementwiseOp", "GatedElementwiseOp", "BinaryElementwiseOp",
    "BinaryLayout", "binary_layout", "expanded_strides", "fold_broadcast", "row_view",
]

logger = logging.getLogger(__name__)

# Axes a broadcast folds into for the kernel: (D0, D1, D2).
KERNEL_AXES = 3
# One folded axis: its size and the stride of each operand along it.
Axis = Tuple[int, Tuple[int, ...]]


class ElementwiseFamilyOp(Op):
    """Kernel construction and launch shared by the family's ops.

    L3 ops set ``dtype``, ``tune`` and a one-entry ``kernel_map``; the kernel
    class's ``op_params`` names the op attributes (``N``, ``approximate``) its
    constructor takes.
    """

    tune: bool

    def _build_kernel(self, key: str, *input_shapes: Tuple[int, ...]) -> Kernel:
        kernel_cls = self.kernel_map[key]
        params = {name: getattr(self, name) for name in getattr(kernel_cls, "op_params", ())}
        return kernel_cls(dtype=self.dtype, tune=self.tune, **params)

    # Every extent is symbolic: ``_launch`` names the kernel by ``(device index,)``.
    kernels_keyed_by_launch = True

    @property
    def kernel_key(self) -> str:
        """The family's ops launch exactly one kernel."""
        return next(iter(self.kernel_map))

    def _launch(self, device: torch.device, *tensors: torch.Tensor) -> None:
        """Run the op's kernel on ``tensors = (*inputs, out)`` on ``device``."""
        kernel = self._kernel(self.kernel_key, (device.index,))
        with on_device(device):
            kernel(*tensors)


class UnaryElementwiseOp(ElementwiseFamilyOp):
    """Activations ``y = f(x)`` and their backward ``grad_x = f'(grad_y, x)``: inputs of one shape."""

    def _run_kernel(self, *inputs: torch.Tensor) -> torch.Tensor:
        x = inputs[-1]
        out = empty_contiguous(x, x.shape)
        if out.numel() == 0:
            return out
        self._launch(x.device, *(_flat(t) for t in inputs), _flat(out))
        return out


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a 1-D contiguous tensor (itself when it is one already)."""
    if tensor.dim() == 1 and tensor.is_contiguous():
        return tensor
    return tensor.contiguous().view(-1)


def row_view(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``tensor`` as ``(rows, width)`` with contiguous rows: a view when its memory allows, else a copy."""
    view = unit_stride_rows(tensor, width)
    return tensor.contiguous().view(-1, width) if view is None else view


class GatedElementwiseOp(ElementwiseFamilyOp):
    """Gated activations over rows of width ``N = 2H``: forward ``(x) -> y``, backward ``(grad_y, x) -> grad_x``."""

    N: int

    def _run_kernel(self, *inputs: torch.Tensor) -> torch.Tensor:
        x = inputs[-1]
        backward = len(inputs) == 2
        half = self.N // 2
        out_shape = x.shape if backward else x.shape[:-1] + (half,)
        out = empty_contiguous(x, out_shape)
        if out.numel() == 0:
            return out
        views = [row_view(t, half if backward and index == 0 else self.N) for index, t in enumerate(inputs)]
        self._launch(x.device, *views, out if out.dim() == 2 else out.view(-1, out_shape[-1]))
        return out


def expanded_strides(shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int]) -> Tuple[int, ...]:
    """The strides of a tensor of ``shape``/``strides`` broadcast to ``out_shape`` (0 along broadcast axes)."""
    lead = len(out_shape) - len(shape)
    return tuple(0 if axis < lead or shape[axis - lead] != size else strides[axis - lead]
                 for axis, size in enumerate(out_shape))


def fold_broadcast(out_shape: Sequence[int], operand_strides: Sequence[Sequence[int]]) -> List[Axis]:
    """The output's axes with each operand's strides along them (``expanded_strides``), size-1 axes
    dropped and neighbours merged wherever every operand steps through them as one axis (outermost first)."""
    axes: List[Axis] = []
    for axis, size in enumerate(out_shape):
        if size == 1:
            continue
        steps = tuple(s[axis] for s in operand_strides)
        if axes and all(outer == inner * size for outer, inner in zip(axes[-1][1], steps)):
            axes[-1] = (axes[-1][0] * size, steps)
        else:
            axes.append((size, steps))
    return axes


# How ``BinaryLayout`` prepares an operand: read it as it is, copy it contiguous, or
# materialize it at the output's shape.
KEEP, CONTIGUOUS, EXPAND = "keep", "contiguous", "expand"


@dataclasses.dataclass(frozen=True)
class BinaryLayout:
    """What every call with one pair of operand geometries does on the host (see the module docstring).

    ``sizes`` is None for the flat program over 1-D views, else the ``(D0, D1, D2)``
    problem with each prepared operand's ``strides`` along it.
    """

    out_shape: Tuple[int, ...]
    prepare: Tuple[str, str]
    sizes: Optional[Tuple[int, ...]]
    strides: Tuple[Tuple[int, ...], ...]

    def operands(self, a: torch.Tensor, b: torch.Tensor) -> List[torch.Tensor]:
        """``a`` and ``b`` as the kernel reads them."""
        views = []
        for tensor, how, strides in zip((a, b), self.prepare, self.strides):
            if how == CONTIGUOUS:
                tensor = tensor.contiguous()
            elif how == EXPAND:
                tensor = tensor.expand(self.out_shape).contiguous()
            if self.sizes is None:
                views.append(_flat(tensor))
            else:
                views.append(tensor.as_strided(self.sizes, strides))
        return views


def binary_layout(a: Tuple[Sequence[int], Sequence[int]], b: Tuple[Sequence[int], Sequence[int]]) -> BinaryLayout:
    """The layout of operands with these ``(shape, strides)`` (see ``BinaryLayout``)."""
    shapes = (tuple(a[0]), tuple(b[0]))
    out_shape = shapes[0] if shapes[0] == shapes[1] else rules.broadcast_shapes(*shapes)
    contiguous = [is_contiguous(shape, strides) for shape, strides in zip(shapes, (a[1], b[1]))]
    if shapes[0] == shapes[1] and all(contiguous):
        return BinaryLayout(out_shape, (KEEP, KEEP), None, ((), ()))
    prepare = [KEEP, KEEP]
    strides = [expanded_strides(shape, s, out_shape) for shape, s in zip(shapes, (a[1], b[1]))]
    axes = fold_broadcast(out_shape, strides)
    if not axes:  # one element
        return BinaryLayout(out_shape, (CONTIGUOUS, CONTIGUOUS), None, ((), ()))
    # The kernel reads an operand along the innermost axis with unit stride, or not at all;
    # a contiguous copy always has one of those (its innermost axis is the output's, or broadcast).
    for index, step in enumerate(axes[-1][1]):
        if step not in (0, 1):
            prepare[index] = CONTIGUOUS
            strides[index] = expanded_strides(shapes[index], contiguous_strides(shapes[index]), out_shape)
    if all(step == 0 for step in fold_broadcast(out_shape, strides)[-1][1]):
        # Both constant along the innermost axis (expanded inputs): one of them must vary.
        prepare[0] = EXPAND
        strides[0] = contiguous_strides(out_shape)
    axes = fold_broadcast(out_shape, strides)
    if len(axes) > KERNEL_AXES:
        logger.debug("broadcast of %s and %s folds into %d axes; materializing the operands",
                     shapes[0], shapes[1], len(axes))
        full = [KEEP if shape == out_shape and flat else EXPAND for shape, flat in zip(shapes, contiguous)]
        return BinaryLayout(out_shape, (full[0], full[1]), None, ((), ()))
    axes = [(1, (0, 0))] * (KERNEL_AXES - len(axes)) + axes
    sizes = tuple(size for size, _ in axes)
    return BinaryLayout(out_shape, (prepare[0], prepare[1]), sizes,
                        tuple(tuple(steps[i] for _, steps in axes) for i in range(2)))


class BinaryElementwiseOp(ElementwiseFamilyOp):
    """``y = f(a, b)`` with PyTorch broadcasting (see the module docstring)."""

    def _run_kernel(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        layout = self._layouts.get((a.shape, a.stride(), b.shape, b.stride()),
                                   lambda: binary_layout((a.shape, a.stride()), (b.shape, b.stride())))
        out = empty_contiguous(a, layout.out_shape)
        if out.numel() == 0:
            return out
        operands = layout.operands(a, b)
        self._launch(a.device, *operands, _flat(out) if layout.sizes is None else out.view(layout.sizes))
        return out
