"""Helpers shared by kernels and the op bases that launch them.

Kept apart from ``kernel_base`` so that ops can prepare tensors without
importing TileLang.
"""

import contextlib
from typing import Any, Callable, ContextManager, Dict, Generic, Hashable, Sequence, Tuple, TypeVar

import torch

__all__ = ["ALIGNMENT", "LayoutMemo", "aligned_contiguous", "contiguous_strides", "direct_launcher", "empty_contiguous",
           "has_unit_rows", "is_contiguous", "on_device", "widest_access"]

# Kernels read and write their tensors with 16-byte vector accesses.
ALIGNMENT = 16

_NO_SWITCH = contextlib.nullcontext()

LayoutT = TypeVar("LayoutT")


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
        layout = self._entries.get(key)
        if layout is None:
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


def empty_contiguous(like: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``shape`` with ``like``'s dtype and device.

    Runs on every call of an op: ``empty_like`` of a contiguous tensor of the same shape
    is several times cheaper than ``torch.empty``, which is itself cheaper given a tuple
    than a ``torch.Size``.
    """
    if like.shape == shape and has_unit_rows(like):
        return torch.empty_like(like)
    return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)


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
