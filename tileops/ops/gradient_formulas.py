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
    work grows with its square.  Here: at ``x_k != 0``, ``sum_{j >= k} grad_j y_j / x_k`` (``y_j``
    is 0 from an axis's first zero on); at the first zero, ``sum_{j >= k} grad_j`` times the
    products of ``x`` up to ``j`` with that zero left out (0 from the next zero on); at a later
    zero, 0.  Its own derivative (a second-order gradient) is exact where the axis has no zero."""
    if x.ndim == 0 or x.shape[dim] <= 1:
        return grad
    is_zero = x == 0
    first_zero = is_zero & (torch.cumsum(is_zero, dim) == 1)
    without_first_zero = torch.where(first_zero, 1, x).cumprod(dim)
    at_zero = torch.where(first_zero, _reversed_cumsum(grad * without_first_zero, dim), 0)
    # Divided by 1 at zeros, whose quotient is replaced: a second-order gradient sees no NaN from it.
    elsewhere = _reversed_cumsum(grad * y, dim) / torch.where(is_zero, 1, x)
    return torch.where(is_zero, at_zero, elsewhere)


def _reversed_cumsum(values: torch.Tensor, dim: int) -> torch.Tensor:
    """``sum_{j >= k} values_j`` along ``dim``, summed from the end (no difference of totals)."""
    return torch.flip(torch.cumsum(torch.flip(values, (dim,)), dim), (dim,))
