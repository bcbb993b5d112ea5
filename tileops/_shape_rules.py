"""Helper functions of the shape-rule language.

Generated op code calls these at run time and the codegen interpreter calls the
same functions, so a rule means one thing everywhere.  Pure Python on tuples of
ints: no torch import, so the generator can use them too.
"""

from __future__ import annotations

from itertools import zip_longest
from typing import Iterable, Optional, Sequence, Tuple, Union

from tileops._params import is_int

Shape = Tuple[int, ...]
Dims = Union[None, int, Sequence[int]]

__all__ = [
    "numel", "prod", "broadcastable", "broadcast_shapes", "reduced_shape", "shape_without_axes", "normalize_dims",
    "axis_size", "HELPERS",
]


def prod(values: Iterable[int]) -> int:
    """Product of integers (1 for an empty sequence)."""
    result = 1
    for value in values:
        result *= int(value)
    return result


def numel(shape: Sequence[int]) -> int:
    """Number of elements of a tensor of this shape."""
    return prod(shape)


def broadcastable(*shapes: Sequence[int]) -> bool:
    """Whether the shapes broadcast together (PyTorch/NumPy rules), at any rank.

    One call where a rule per axis would cost each eager call a few microseconds."""
    if len(shapes) == 2:  # the usual case
        return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(shapes[0]), reversed(shapes[1])))
    return all(_common_size(sizes) is not None for sizes in zip_longest(*(reversed(s) for s in shapes), fillvalue=1))


def broadcast_shapes(*shapes: Sequence[int]) -> Shape:
    """PyTorch/NumPy broadcasting of shapes; ``ValueError`` when they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(-ndim, 0):
        size = _common_size([s[axis] for s in shapes if len(s) >= -axis])
        if size is None:
            raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        result.append(size)
    return tuple(result)


def _common_size(sizes: Sequence[int]) -> Optional[int]:
    """The size that the sizes of one axis broadcast to, or None if they do not.  Compared one by one,
    never hashed: under ``torch.compile`` with dynamic shapes a size is a ``SymInt``, which is
    unhashable."""
    common = 1
    for size in sizes:
        if size != 1:
            if common != 1 and size != common:
                return None
            common = size
    return common


def normalize_dims(dims: Dims, ndim: int) -> Tuple[int, ...]:
    """Non-negative, sorted, unique axes; ``None`` means every axis."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    bound = max(ndim, 1)  # PyTorch lets a 0-d tensor reduce over dim 0 or -1
    out = set()
    for d in dims:
        if not -bound <= d < bound:
            raise ValueError(f"dim {d} out of range for a tensor of rank {ndim}")
        out.add(d % bound)
    if len(out) != len(tuple(dims)):
        raise ValueError(f"dim {tuple(dims)} names an axis twice")
    return tuple(sorted(out))


def reduced_shape(shape: Sequence[int], dims: Dims, keepdim: bool = False) -> Shape:
    """Shape after reducing ``dims`` (``None``: all) with or without ``keepdim``."""
    return shape_without_axes(shape, normalize_dims(dims, len(shape)), keepdim)


def shape_without_axes(shape: Sequence[int], axes: Sequence[int], keepdim: bool = False) -> Shape:
    """``reduced_shape`` for axes already normalized (non-negative)."""
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def axis_size(shape: Sequence[int], axis: int, missing: int = -1) -> int:
    """``shape[axis]``, or ``missing`` when the axis does not exist or is no int (the op's own
    checks then explain why).  A 0-d shape has one element along axis 0 or -1: PyTorch's ops
    that take a ``dim`` (``cumsum``, ``softmax``, ``sum``) wrap those dims onto a scalar."""
    if type(axis) is not int:
        if not is_int(axis):  # NumPy integers count, as in PyTorch; bools do not
            return missing
        axis = int(axis)
    if len(shape) == 0 and axis in (-1, 0):
        return 1
    return shape[axis] if -len(shape) <= axis < len(shape) else missing


# The closed set of helper names a rule may call, with their implementations.
HELPERS = {
    "numel": numel,
    "prod": prod,
    "len": len,
    "min": min,
    "max": max,
    "broadcastable": broadcastable,
    "broadcast_shapes": broadcast_shapes,
    "reduced_shape": reduced_shape,
    "normalize_dims": normalize_dims,
}


