"""Helpers of the manifest's gradient formulas (``backward: {gradients: ...}``).

A formula is a PyTorch expression of an input's gradient, written in the manifest and
rendered into the op's ``_formula_gradients``.  It reads the saved tensors, the output
gradients ``grad_<output>``, the params, and these helpers; an input that is not saved
appears as a ``ShapeOf`` (its shape, rank, dtype and device, no values), which is all
the gradient of an add or a sum needs.

The helpers are the reduction bookkeeping that PyTorch's own derivative formulas do in
C++ (``sum_backward``, ``amax_backward``, ...): putting reduced axes back, counting
reduced elements, sharing an extremum's gradient among its ties, the variance's
degenerate cases, and the cumulative product's zeros.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch

from tileops import _shape_rules as rules

__all__ = ["ShapeOf", "unreduce", "reduced_count", "extremum_gradient", "variance_gradient", "cumprod_gradient"]

Dims = rules.Dims


class ShapeOf(NamedTuple):
    """What a formula sees of an input whose values the gradient does not depend on."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "ShapeOf":
        return cls(tensor.shape, tensor.dtype, tensor.device)


def unreduce(reduced: torch.Tensor, shape: Sequence[int], dim: Dims, keepdim: bool) -> torch.Tensor:
    """``reduced`` (a reduction over ``dim`` of a tensor of ``shape``) with its reduced axes put
    back as size 1, so that it broadcasts against the unreduced tensor (a view)."""
    if keepdim:
        return reduced
    return reduced.reshape(rules.reduced_shape(tuple(shape), dim, True))


def reduced_count(shape: Sequence[int], dim: Dims) -> int:
    """How many elements each output of a reduction over ``dim`` of ``shape`` combines."""
    if not shape:  # a 0-d tensor reduces over its one element
        return 1
    return rules.prod(shape[axis] for axis in rules.normalize_dims(dim, len(shape)))


def extremum_gradient(grad: torch.Tensor, x: torch.Tensor, extremum: torch.Tensor, dim: Dims,
                      keepdim: bool) -> torch.Tensor:
    """The gradient of ``amax``/``amin`` over ``dim``: each output's gradient shared equally among
    the inputs equal to it, as PyTorch's autograd does."""
    ties = x == unreduce(extremum, x.shape, dim, keepdim)
    axes = rules.normalize_dims(dim, x.ndim) if x.ndim else ()
    # Divided while still reduced: one full-size pass for the product instead of two.
    return (unreduce(grad, x.shape, dim, keepdim) / ties.sum(axes, keepdim=True)) * ties


def variance_gradient(grad: torch.Tensor, x: torch.Tensor, dim: Dims, correction: float,
                      keepdim: bool) -> torch.Tensor:
    """The gradient of ``var`` over ``dim`` with ``correction``, as PyTorch's autograd gives it:
    ``2 / (count - correction) * grad * (x - mean)``, except over every element (``dim`` None or
    a 0-d ``x``) with no degrees of freedom left (``numel <= correction``, where the variance
    itself is NaN): there an element equal to the mean gets NaN and any other an infinity."""
    centered = x - x.mean(dim, keepdim=True)
    spread = unreduce(grad, x.shape, dim, keepdim)
    if (dim is None or x.ndim == 0) and x.numel() <= correction:
        return spread * centered.new_full(centered.shape, math.inf).masked_fill_(centered == 0, math.nan)
    # Scaled while still reduced: the full-size work is the mean, the difference and one product.
    return spread * 2 / (reduced_count(x.shape, dim) - correction) * centered


def cumprod_gradient(grad: torch.Tensor, x: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    """The gradient of ``y = cumprod(x, dim)``, the values PyTorch's first-order backward gives,
    zeros included, in tensor operations only: no host sync and no loop over the axis.

    PyTorch's own backward asks the device whether ``x`` has a zero, and with grad mode on or
    traced tensors runs a loop over the axis, whose traced graph grows with the axis and whose
    work grows with its square.  Here: before an axis's first zero ``z``,
    ``sum_{j >= k} grad_j y_j / x_k``; at ``z``, ``y_{z-1}`` times ``sum_j grad_j prod_{z < i <= j}
    x_i`` over ``z <= j`` short of the next zero; after it, 0.  Its own derivative (a second-order
    gradient) is exact where the axis has no zero."""
    if x.ndim == 0 or x.shape[dim] <= 1:
        return grad
    is_zero = x == 0
    zeros_so_far = torch.cumsum(is_zero, dim)
    before_first = zeros_so_far == 0
    weighted = (y * grad).masked_fill(~before_first, 0)
    tail = torch.flip(torch.cumsum(torch.flip(weighted, (dim,)), dim), (dim,))
    # Divided where it is kept only: a zero's quotient would reach a second-order gradient as NaN.
    result = torch.where(before_first, tail / torch.where(before_first, x, 1), 0)
    first_zero = is_zero & (zeros_so_far == 1)
    after_first = (zeros_so_far == 1) & ~first_zero
    products = torch.where(after_first, x, 1).cumprod(dim)
    at_first = (products * grad.masked_fill(zeros_so_far != 1, 0)).sum(dim, keepdim=True)
    # y just before the first zero (1 where the zero opens the axis); argmax finds the first True.
    position = first_zero.to(torch.uint8).argmax(dim, keepdim=True)
    before = torch.where(position == 0, 1, y.gather(dim, (position - 1).clamp(min=0)))
    return torch.where(first_zero, at_first * before, result)
