"""Gradient formulas (``backward: {gradients: ...}``) against PyTorch's autograd, on awkward cases:
broadcast operands, every reduction layout, ties, zeros, empty tensors, double backward, compile."""

from __future__ import annotations

from typing import Callable, List, Sequence

import pytest
import torch

import tileops.functional as F
from tileops.ops.gradient_formulas import reduced_count, unreduce


def _grads(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], seed: torch.Tensor) -> List[torch.Tensor]:
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    (fn(*leaves) * seed).sum().backward()
    return [leaf.grad for leaf in leaves]


def _tied(*shape: int) -> torch.Tensor:
    # Few distinct values: every row has ties for its maximum and its minimum.
    return torch.randint(-2, 3, shape).float()


CASES = [
    # (id, ours, torch's, inputs)
    ("add-same", F.add, torch.add, lambda: [torch.randn(4, 5), torch.randn(4, 5)]),
    ("add-row", F.add, torch.add, lambda: [torch.randn(4, 5), torch.randn(5)]),
    ("add-both-broadcast", F.add, torch.add, lambda: [torch.randn(4, 1, 3), torch.randn(1, 6, 1)]),
    ("add-0d", F.add, torch.add, lambda: [torch.randn(3, 2), torch.randn(())]),
    ("mul-col", F.mul, torch.mul, lambda: [torch.randn(4, 5), torch.randn(4, 1)]),
    ("mul-both-broadcast", F.mul, torch.mul, lambda: [torch.randn(2, 1, 3), torch.randn(5, 1)]),
    ("relu-zeros", F.relu, torch.relu, lambda: [torch.tensor([-1.0, 0.0, 2.0, -0.0, 3.5])]),
    ("sigmoid", F.sigmoid, torch.sigmoid, lambda: [torch.randn(3, 7)]),
    ("exp", F.exp, torch.exp, lambda: [torch.randn(2, 3, 4)]),
    ("sum-mid", lambda x: F.sum(x, [1]), lambda x: x.sum(1), lambda: [torch.randn(3, 4, 5)]),
    ("sum-two-keep", lambda x: F.sum(x, [0, 2], True), lambda x: x.sum((0, 2), True), lambda: [torch.randn(3, 4, 5)]),
    ("sum-all", F.sum, torch.sum, lambda: [torch.randn(3, 4)]),
    ("sum-0d", lambda x: F.sum(x, -1), lambda x: x.sum(-1), lambda: [torch.randn(())]),
    ("mean-last", lambda x: F.mean(x, -1), lambda x: x.mean(-1), lambda: [torch.randn(3, 7)]),
    ("mean-all-keep", lambda x: F.mean(x, None, True), lambda x: x.mean((0, 1), True), lambda: [torch.randn(3, 7)]),
    ("amax-ties", lambda x: F.amax(x, 1), lambda x: x.amax(1), lambda: [_tied(6, 9)]),
    ("amin-ties-all", F.amin, torch.amin, lambda: [_tied(4, 5)]),
    ("amax-first-keep", lambda x: F.amax(x, 0, True), lambda x: x.amax(0, True), lambda: [_tied(5, 3)]),
    ("var-unbiased", lambda x: F.var(x, 1), lambda x: x.var(1), lambda: [torch.randn(4, 6)]),
    ("var-population-all", lambda x: F.var(x, None, correction=0), lambda x: x.var(None, correction=0),
     lambda: [torch.randn(4, 6)]),
    ("var-keep", lambda x: F.var(x, [0, 2], True), lambda x: x.var((0, 2), keepdim=True),
     lambda: [torch.randn(3, 4, 5)]),
    ("logsumexp-last", lambda x: F.log_sum_exp(x, -1), lambda x: x.logsumexp(-1), lambda: [torch.randn(5, 8)]),
    ("logsumexp-all", F.log_sum_exp, lambda x: x.reshape(-1).logsumexp(0), lambda: [torch.randn(5, 8)]),
    ("logsumexp-all-keep", lambda x: F.log_sum_exp(x, None, True), lambda x: x.logsumexp((0, 1), True),
     lambda: [torch.randn(5, 8)]),
    ("l2norm-zero-row", lambda x: F.l2_norm(x, -1), lambda x: torch.linalg.vector_norm(x, 2, -1),
     lambda: [torch.cat([torch.zeros(1, 4), torch.randn(3, 4)])]),
    ("l2norm-all", F.l2_norm, torch.linalg.vector_norm, lambda: [torch.randn(3, 4)]),
    ("sum-empty", lambda x: F.sum(x, 0), lambda x: x.sum(0), lambda: [torch.randn(0, 4)]),
    ("add-empty", F.add, torch.add, lambda: [torch.randn(0, 3), torch.randn(3)]),
]


@pytest.mark.parametrize("ours, theirs, make", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_formula_gradients_match_autograd(ours, theirs, make, dtype) -> None:
    torch.manual_seed(0)
    inputs = [t.to(dtype) for t in make()]
    expected_out = theirs(*inputs)
    seed = torch.randn(expected_out.shape).to(dtype)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for mine, expected in zip(_grads(ours, inputs, seed), _grads(theirs, inputs, seed)):
        assert mine.shape == expected.shape and mine.dtype == expected.dtype
        torch.testing.assert_close(mine, expected, **tolerance, equal_nan=True)


def test_formula_gradients_are_differentiable_again() -> None:
    """``create_graph=True``: the formulas record their own graph (Hessian-vector products)."""
    x = torch.randn(4, 6, requires_grad=True)
    for ours, theirs in ((lambda t: F.var(t, 1), lambda t: t.var(1)),
                         (lambda t: F.log_sum_exp(t, -1), lambda t: t.logsumexp(-1)),
                         (lambda t: F.mul(t, t.sin()), lambda t: t * t.sin())):
        (grad,) = torch.autograd.grad(ours(x).sum(), x, create_graph=True)
        (expected,) = torch.autograd.grad(theirs(x).sum(), x, create_graph=True)
        torch.testing.assert_close(torch.autograd.grad(grad.square().sum(), x)[0],
                                   torch.autograd.grad(expected.square().sum(), x)[0], rtol=1e-4, atol=1e-5)


def test_formula_gradients_trace_into_a_compiled_backward() -> None:
    def loss(a, b):
        h = F.relu(F.add(F.mul(a, b), b))
        return F.sum(F.exp(h) / F.l2_norm(h, -1, True), [1]).square().mean() + F.amax(a, 0).sum()

    a = torch.randn(6, 5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    expected = torch.autograd.grad(loss(a, b), (a, b))
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    for mine, theirs in zip(torch.autograd.grad(compiled(a, b), (a, b)), expected):
        torch.testing.assert_close(mine, theirs)


def test_unreduce_puts_reduced_axes_back_and_counts_them() -> None:
    y = torch.randn(3, 5)
    assert unreduce(y, (3, 4, 5), [1], False).shape == (3, 1, 5)
    assert unreduce(y.reshape(3, 1, 5), (3, 4, 5), [1], True).shape == (3, 1, 5)
    assert unreduce(torch.tensor(2.0), (3, 4), None, False).shape == (1, 1)
    assert reduced_count((3, 4, 5), [0, 2]) == 15
    assert reduced_count((3, 4, 5), None) == 60
    assert reduced_count((), [0]) == 1
    assert reduced_count((3, 0), [1]) == 0


@pytest.mark.parametrize("shape, dim, correction", [((), None, 2), ((), (0,), 1), ((1,), None, 1), ((2,), None, 2),
                                                     ((3, 2), None, 7), ((1, 4), (0,), 1), ((3, 2), (1,), 2)],
                         ids=str)
def test_variance_gradient_without_degrees_of_freedom_is_pytorchs(shape, dim, correction: int) -> None:
    # Over every element with nothing left to divide by, PyTorch gives NaN where an element equals
    # the mean and an infinity elsewhere; over given axes, 2 / (count - correction) whatever its sign.
    x = torch.tensor([[1.0, 4.0, 2.5, 2.5], [7.0, -1.0, 3.0, 0.5], [2.0, 2.0, 5.0, 1.0]]).flatten()
    x = x[: max(1, torch.Size(shape).numel())].reshape(shape)
    if shape == (2,):
        x = torch.tensor([3.0, 3.0])  # both equal to the mean: NaN, not an infinity
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    (got,) = torch.autograd.grad(F.var(ours, dim=dim, correction=correction).sum(), ours)
    (expected,) = torch.autograd.grad(torch.var(theirs, dim=dim, correction=correction).sum(), theirs)
    torch.testing.assert_close(got, expected, equal_nan=True)


def _with_zeros(shape: Sequence[int], dim: int, layout: str) -> torch.Tensor:
    """Values with zeros planted along ``dim``: none, one an axis, two, or opening it."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape) + dim))
    if layout == "none" or x.ndim == 0 or x.numel() == 0:
        return x
    length = x.shape[dim]
    moved = x.movedim(dim, -1)
    if layout == "opening":
        moved[..., 0] = 0
    else:
        moved[..., length // 2] = 0
    if layout == "two" and length > 2:
        moved[..., -1] = 0
    return x


@pytest.mark.parametrize("shape, dim", [((), 0), ((1,), 0), ((7,), -1), ((4, 9), 1), ((4, 9), 0), ((3, 0, 5), 2),
                                        ((2, 6, 3), -2), ((2, 1, 3), 1)], ids=str)
@pytest.mark.parametrize("layout", ["none", "one", "two", "opening"])
def test_the_cumulative_products_gradient_is_pytorchs_zeros_included(shape, dim: int, layout: str) -> None:
    x = _with_zeros(shape, dim, layout)
    seed = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    (got,) = _grads(lambda t: F.cumprod(t, dim), [x], seed)
    (expected,) = _grads(lambda t: torch.cumprod(t, dim), [x], seed)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_the_cumulative_products_gradient_traces_to_a_graph_its_axis_does_not_grow() -> None:
    # PyTorch's own backward, traced through torch.func, unrolls a loop over the axis (ten
    # operations an element); the formula's traced graph is the same for an axis of 16 or 4096.
    from torch.fx.experimental.proxy_tensor import make_fx

    from tileops.ops.gradient_formulas import cumprod_gradient

    def traced_size(length: int) -> int:
        x = torch.rand(3, length) + 0.5
        graph = make_fx(lambda t, y, g: cumprod_gradient(g, t, y, 1), tracing_mode="symbolic")(
            x, x.cumprod(1), torch.randn(3, length))
        return len(graph.graph.nodes)

    assert traced_size(16) == traced_size(4096) < 64


def test_the_cumulative_products_gradient_differentiates_again_where_no_element_is_zero() -> None:
    x, seed, again = torch.rand(3, 7) + 0.5, torch.randn(3, 7), torch.randn(3, 7)
    seconds = []
    for cumprod in (lambda t: F.cumprod(t, 1), lambda t: torch.cumprod(t, 1)):
        leaf = x.clone().requires_grad_()
        (first,) = torch.autograd.grad(cumprod(leaf), leaf, seed, create_graph=True)
        seconds.append(torch.autograd.grad(first, leaf, again)[0])
    torch.testing.assert_close(*seconds, rtol=1e-5, atol=1e-5)
