"""Helpers shared by kernels and the op bases that launch them.

Kept apart from ``kernel_base`` so that ops can prepare tensors without
importing TileLang.
"""

import contextlib
import dataclasses
import math
from typing import Any, Callable, ContextManager, Dict, Generic, Hashable, Optional, Sequence, Tuple, TypeVar

import torch

from tileops.kernels.sizes import MAX_EXTENT, row_vector

__all__ = ["ALIGNMENT", "access_alignment", "aligned_contiguous", "aligned_rows", "contiguous_strides", "direct_launcher",
           "empty_contiguous", "folded_stride", "has_unit_rows", "is_aligned_contiguous", "is_contiguous",
           "int32_launch_ranges", "kernel_view_spec", "launch_in_ranges", "LaunchRanges", "LayoutMemo",
           "merged_axes_view", "on_device", "rows_and_output", "unit_stride_rows", "ViewSpec", "widest_access"]

# Kernels read and write their tensors with 16-byte vector accesses.
ALIGNMENT = 16

_NO_SWITCH = contextlib.nullcontext()
# Marks a key the memo has not seen (``None`` is a value worth remembering).
_MISSING: Any = object()

LayoutT = TypeVar("LayoutT")
# Slices ``(start, stop)`` of a kernel view's leading axis, launched one after the other.
LaunchRanges = Tuple[Tuple[int, int], ...]


class LayoutMemo(Generic[LayoutT]):
    """What an op derives on the host from its inputs' shapes and strides, remembered per geometry.

    An eager call of a small input spends most of its time on the host: normalizing
    axes, working out the output's shape and the views a kernel reads.  Those depend
    only on the inputs' sizes, strides and dtypes, so an op computes them once per
    geometry.  The memo is bounded (emptied when full, so a stream of new shapes costs
    what it cost without one) and needs no lock: a lost race computes the same value twice.
    """

    def __init__(self, capacity: int = 512) -> None:
        self._capacity = capacity
        self._entries: Dict[Hashable, LayoutT] = {}

    def get(self, key: Hashable, derive: Callable[[], LayoutT]) -> LayoutT:
        layout = self._entries.get(key, _MISSING)
        if layout is _MISSING:
            layout = derive()
            if len(self._entries) >= self._capacity:
                self._entries.clear()
            self._entries[key] = layout
        return layout

    def __len__(self) -> int:
        return len(self._entries)


def aligned_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` if it is contiguous and 16-byte aligned, else an aligned contiguous copy."""
    if not tensor.is_contiguous():
        return tensor.contiguous()
    if tensor.data_ptr() % ALIGNMENT:
        # A view at an odd offset into its storage: a fresh allocation is aligned.
        return tensor.clone()
    return tensor


def has_unit_rows(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is contiguous with a unit-stride last axis.

    A contiguous tensor whose last axis has size 1 may carry any stride there, and the
    programs read their innermost axis with unit stride.
    """
    return tensor.is_contiguous() and (tensor.dim() == 0 or tensor.stride(-1) == 1)


def is_aligned_contiguous(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is what the programs read without a view: contiguous with unit-stride
    rows, from a 16-byte aligned start (``aligned_contiguous`` returns it as it is)."""
    return has_unit_rows(tensor) and not tensor.data_ptr() % ALIGNMENT


def empty_contiguous(like: torch.Tensor, shape: Sequence[int], dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``shape`` with ``like``'s device and dtype (or ``dtype``).

    Runs on every call of an op: ``empty_like`` of a contiguous tensor of the same shape
    is several times cheaper than ``torch.empty``, which is itself cheaper given a tuple
    than a ``torch.Size``.
    """
    if like.shape == shape and has_unit_rows(like):
        return torch.empty_like(like, dtype=dtype)
    return torch.empty(tuple(shape), dtype=dtype or like.dtype, device=like.device)


def contiguous_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    """The strides ``torch.Tensor.contiguous`` gives a tensor of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """``torch.Tensor.is_contiguous`` from a shape and strides (size-1 axes may carry any stride)."""
    if 0 in shape:
        return True
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def folded_stride(sizes: Sequence[int], strides: Sequence[int]) -> Tuple[bool, Optional[int]]:
    """Whether axes of ``sizes``/``strides`` step through memory as one axis, and that axis's stride
    (``None`` when every size is 1, so that any stride would do)."""
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


def unit_stride_rows(tensor: torch.Tensor, width: int) -> Optional[torch.Tensor]:
    """``tensor`` (its last axis of ``width`` elements) as ``(rows, width)`` with unit-stride rows
    ``row_stride`` elements apart, without a copy; ``None`` when its memory allows no such view.

    Row slices of a wider tensor and broadcast rows (stride 0) qualify; a transpose does not.
    A 2-D tensor that already is such a view comes back as it is (a view costs a microsecond).
    """
    sizes, strides = tensor.shape, tensor.stride()
    if width > 1 and strides[-1] != 1:
        return None
    folds, row_stride = folded_stride(sizes[:-1], strides[:-1])
    if not folds:
        return None
    if row_stride is None:  # one row: any stride addresses it
        row_stride = width
    if len(sizes) == 2 and strides[0] == row_stride and strides[1] == 1:
        return tensor
    return tensor.as_strided((math.prod(sizes[:-1]), width), (row_stride, 1))


def merged_axes_view(sizes: Sequence[int], strides: Sequence[int], first: int,
                     last: int) -> Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """Size and stride of an in-place view of memory ``sizes``/``strides`` with axes ``first..last``
    merged into one axis ``N``: ``(outer, N)`` when nothing follows them, else ``(outer, N, inner)``.
    The innermost axis of the view has unit stride; ``None`` when no such view describes the memory
    (the axes before, within or after the range do not fold, or the innermost stride is not 1)."""
    outer, N, inner = math.prod(sizes[:first]), math.prod(sizes[first:last + 1]), math.prod(sizes[last + 1:])
    outer_folds, outer_stride = folded_stride(sizes[:first], strides[:first])
    axis_folds, axis_stride = folded_stride(sizes[first:last + 1], strides[first:last + 1])
    inner_folds, inner_stride = folded_stride(sizes[last + 1:], strides[last + 1:])
    if not (outer_folds and axis_folds and inner_folds) or inner_stride not in (None, 1):
        return None
    outer_stride = N * inner if outer_stride is None else outer_stride  # outer == 1: any stride will do
    if inner == 1:
        if axis_stride not in (None, 1):
            return None
        return (outer, N), (outer_stride, 1)
    axis_stride = inner if axis_stride is None else axis_stride
    return (outer, N, inner), (outer_stride, axis_stride, 1)


@dataclasses.dataclass(frozen=True)
class ViewSpec:
    """How an input of one shape and stride becomes the kernel's view.

    ``order``: ``None`` reads the input in place; otherwise it is copied once,
    its axes permuted into ``order``.  ``size``/``stride``: the view of the
    (copied) tensor, ``None`` when it already is the view.
    """

    order: Optional[Tuple[int, ...]]
    size: Optional[Tuple[int, ...]]
    stride: Optional[Tuple[int, ...]]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        if self.order is not None:
            x = x.permute(self.order).contiguous()
        return x if self.size is None else x.as_strided(self.size, self.stride)


def _strided_view(sizes: Sequence[int], strides: Sequence[int], first: int, last: int) -> Optional[ViewSpec]:
    """``(outer, N)`` or ``(outer, N, inner)`` over the merged axes ``first..last`` in place, if the memory allows."""
    view = merged_axes_view(sizes, strides, first, last)
    return None if view is None else ViewSpec(None, *view)


def kernel_view_spec(sizes: Sequence[int], strides: Sequence[int], axes: Tuple[int, ...]) -> ViewSpec:
    """The view of a tensor of ``sizes``/``strides`` as ``(rows, N)`` or ``(outer, N, inner)``, with the
    sorted, non-empty ``axes`` merged into ``N``.

    The other axes keep their order, so the view's rows, or its ``(outer, inner)``
    positions, run in row-major order over them.  Merged axes that are not adjacent,
    and layouts no in-place view describes, are copied once (other axes first).
    """
    ndim = len(sizes)
    first, last = axes[0], axes[-1]
    if last - first + 1 == len(axes):
        if is_contiguous(sizes, strides):
            return _contiguous_view(None, sizes, strides, first, last)
        view = _strided_view(sizes, strides, first, last)
        return _contiguous_view(tuple(range(ndim)), sizes, None, first, last) if view is None else view
    order = tuple(axis for axis in range(ndim) if axis not in axes) + tuple(axes)
    return _contiguous_view(order, [sizes[axis] for axis in order], None, ndim - len(axes), ndim - 1)


def _contiguous_view(order: Optional[Tuple[int, ...]], sizes: Sequence[int], strides: Optional[Sequence[int]],
                     first: int, last: int) -> ViewSpec:
    """A contiguous tensor of ``sizes`` (copied into ``order`` unless ``None``) as ``(rows, N)`` or
    ``(outer, N, inner)`` over axes ``first..last``.

    ``strides`` are the tensor's own when it is read in place: one that already has the
    view's shape and strides is taken as it is.  (``view`` would keep whatever strides
    size-1 axes of a contiguous tensor carry; the programs need unit-stride rows.)
    """
    N, inner = math.prod(sizes[first:last + 1]), math.prod(sizes[last + 1:])
    numel = math.prod(sizes)
    if inner == 1:
        if strides is not None and len(sizes) == 2 and first == 1 and strides[1] == 1:
            return ViewSpec(order, None, None)
        return ViewSpec(order, (numel // N, N), (N, 1))
    if strides is not None and len(sizes) == 3 and first == last == 1:
        return ViewSpec(order, None, None)
    return ViewSpec(order, (numel // (N * inner), N, inner), (N * inner, inner, 1))


def int32_launch_ranges(shape: Sequence[int], what: str, inner_per_block: int = 1) -> Optional[LaunchRanges]:
    """Slices of the leading axis of a kernel view ``(rows, N)`` or ``(outer, N, inner)`` whose
    launches number their blocks and outputs within int32; None when one launch of all fits.

    Row programs count rows; column programs count ``outer`` times the inner positions, of
    which ``inner_per_block`` share a number.  An inner extent past int32 cannot be sliced:
    ``what`` names the op family in that ValueError.
    """
    leading = shape[0]
    if len(shape) == 2:
        per_launch = MAX_EXTENT
    else:
        inner = shape[2]
        if inner > MAX_EXTENT:
            raise ValueError(f"{what}: {inner} elements follow the axis, more than the {MAX_EXTENT} one launch "
                             "can number; reshape the input")
        per_launch = max(1, MAX_EXTENT // -(-inner // inner_per_block))
    if leading <= per_launch:
        return None
    return tuple((start, min(leading, start + per_launch)) for start in range(0, leading, per_launch))


def launch_in_ranges(launch: Callable[..., Any], tensors: Sequence[torch.Tensor],
                     ranges: Optional[LaunchRanges]) -> None:
    """``launch(*tensors)``, or one launch per slice of their leading axis (``int32_launch_ranges``).

    Slices of a view start at a multiple of its leading stride, so they stay as aligned as the
    whole view (the programs' vector accesses need no more)."""
    if ranges is None:
        launch(*tensors)
        return
    for start, stop in ranges:
        launch(*(tensor[start:stop] for tensor in tensors))


def aligned_rows(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``tensor`` as ``(rows, width)`` for programs that read unit-stride rows ``row_vector(width)``
    elements at a time from 16-byte aligned starts (``kernel_base.strided_rows``): in place when
    its memory allows (``unit_stride_rows``, a row stride that is a multiple of that access
    width, an aligned start), else an aligned contiguous copy."""
    if is_aligned_contiguous(tensor):  # the usual call, on its fast path
        return _contiguous_rows(tensor, width)
    view = unit_stride_rows(tensor, width)
    if view is None or view.data_ptr() % ALIGNMENT or view.stride(0) % row_vector(width, tensor.dtype):
        return _contiguous_rows(aligned_contiguous(tensor), width)
    return view


def _contiguous_rows(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """A contiguous ``tensor`` as ``(rows, width)`` rows ``width`` elements apart: itself when 2-D,
    else a view.  A single row may carry any stride and still be contiguous (a row sliced from a
    wider buffer), and the programs read its stride as the rows' distance: it gets a view too."""
    if tensor.dim() == 2 and (tensor.shape[0] != 1 or tensor.stride(0) == width):
        return tensor
    return tensor.view(-1, width)


def rows_and_output(tensor: torch.Tensor, width: int,
                    dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aligned_rows(tensor, width)``, an uninitialised contiguous output shaped like ``tensor``
    (of its dtype, or ``dtype``), and the output as ``(rows, width)``.

    Runs on every call of a row op: a contiguous input takes no views when 2-D, and
    ``empty_like`` of it is several times cheaper than ``torch.empty``.
    """
    if is_aligned_contiguous(tensor):
        out = torch.empty_like(tensor, dtype=dtype)
        if tensor.dim() == 2:
            rows = _contiguous_rows(tensor, width)
            # ``empty_like`` gives a contiguous 2-D tensor its strides: the output needs a view
            # exactly where the input did (a single row with a wider stride).
            return rows, out, out if rows is tensor else out.view(-1, width)
        return tensor.view(-1, width), out, out.view(-1, width)
    out = torch.empty(tuple(tensor.shape), dtype=dtype or tensor.dtype, device=tensor.device)
    return aligned_rows(tensor, width), out, out.view(-1, width)


def access_alignment(tensors: Sequence[torch.Tensor], axes: Sequence[int] = ()) -> int:
    """The tensors' addresses and their strides along ``axes`` (in bytes) or-ed together, modulo
    ``ALIGNMENT``: all that the widest access a program may make on them depends on, so a launch
    plan chosen from them can be remembered by this value."""
    bits = 0
    for tensor in tensors:
        bits |= tensor.data_ptr()
        for axis in axes:
            bits |= tensor.stride(axis) * tensor.element_size()
    return bits % ALIGNMENT


def widest_access(tensor: torch.Tensor, strides: int, cap: int) -> int:
    """The widest access, in elements (a power of two <= ``cap``), that ``tensor``'s address and ``strides`` allow.

    ``strides`` is the or of every stride (in elements) a program steps by
    between accesses of that width.
    """
    bits = tensor.data_ptr() // tensor.element_size() | strides
    while cap > 1 and bits % cap:
        cap >>= 1
    return cap


def on_device(device: torch.device) -> ContextManager[Any]:
    """Make ``device`` current for a launch, restoring the previous device afterwards.

    Compiled programs switch to their tensors' device themselves but leave it
    current; the guard keeps the caller's current device unchanged.
    """
    if device.index is None or device.index == torch.cuda.current_device():
        return _NO_SWITCH
    return torch.cuda.device(device)


def direct_launcher(compiled: Any) -> Callable[..., Any]:
    """The fastest callable that launches a compiled TileLang program on preallocated tensors.

    With the TVM-FFI backend and no TileLang-allocated outputs, the packed
    function checks shapes, dtypes, strides and devices itself; calling it
    directly skips a Python wrapper that only matters when TileLang allocates
    outputs.  Any other backend gets the compiled program as is.
    """
    adapter = getattr(compiled, "adapter", None)
    get_executable = getattr(adapter, "_get_executable", None)
    if get_executable is None or getattr(adapter, "result_idx", None):
        return compiled
    try:
        executable = get_executable()
        # A freshly compiled program is an executable whose every call re-walks its module
        # tree to find the entry function; a program loaded from TileLang's cache is the
        # module itself.  Either way, the entry function is resolved once, here.
        jit = getattr(executable, "jit", None)
        module = jit() if jit is not None else executable
        return module.main
    except Exception:  # noqa: BLE001 - an unknown backend layout: the wrapper still works
        return compiled
