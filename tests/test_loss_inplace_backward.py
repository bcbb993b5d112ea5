"""Cross-entropy's ``inplace_backward`` on the CPU: the gradient lands in the logits' memory,
autograd refuses whatever else saved the logits, and traced graphs stay out of place.

The kernel path runs with a stand-in for the backward program that, like the program,
reads each element before writing it; the reference path runs as it is."""

from typing import Any, Callable, List, Tuple

import pytest
import torch
import torch.nn.functional as F

from tileops import functional as tf
from tileops.ops import CrossEntropyFwdOp, SoftCrossEntropyFwdOp
from tileops.ops.op_base import KERNEL

V, ROWS, HIDDEN = 33, 6, 8
REDUCTIONS = ("none", "mean", "sum")


class _BackwardStandIn:
    """The backward program's arithmetic with torch, recording where it read and wrote."""

    def __init__(self, op: Any) -> None:
        self.op = op
        self.launches: List[Tuple[int, int]] = []

    def kept_rows(self, target: torch.Tensor, out: torch.Tensor) -> None:
        out.fill_(float((target != self.op.ignore_index).sum()))

    def forward(self, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, grad_loss: torch.Tensor,
                grad_lse: torch.Tensor, kept: torch.Tensor, grad: torch.Tensor, *, per_row: bool,
                has_grad_lse: bool, mean: bool) -> None:
        self.launches.append((logits.data_ptr(), grad.data_ptr()))
        kept_rows = target != self.op.ignore_index
        scale = (grad_loss if per_row else grad_loss.expand(target.shape)).float() / (kept[0] if mean else 1)
        scale = torch.where(kept_rows, scale, 0.0)
        softmax = torch.exp(logits.float() - lse[:, None])
        onehot = F.one_hot(torch.where(kept_rows, target, 0), self.op.V).float()
        smoothing = self.op.label_smoothing
        value = (scale + (grad_lse if has_grad_lse else 0))[:, None] * softmax
        grad.copy_(value - scale[:, None] * ((1 - smoothing) * onehot + smoothing / self.op.V))


def _on_stand_in(fwd: CrossEntropyFwdOp) -> _BackwardStandIn:
    """Route ``fwd``'s backward op through the kernel path, with the stand-in as its kernel."""
    bwd = fwd.backward_op()
    stand_in = _BackwardStandIn(bwd)
    bwd._route = lambda *tensors: KERNEL
    bwd._device_kernel = lambda device: stand_in
    return stand_in


def _lm_head_inputs(seed: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A language-model head's hidden states and weight (both leaves) and targets, some ignored."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(ROWS, HIDDEN, generator=generator, requires_grad=True)
    weight = torch.randn(V, HIDDEN, generator=generator, requires_grad=True)
    target = torch.randint(0, V, (ROWS,), generator=generator)
    target[::3] = -100
    return hidden, weight, target


def _lm_head_step(fwd: Callable[..., Any], seed: int, **kwargs: Any) -> Tuple[torch.Tensor, ...]:
    """The head's loss step: logits = hidden @ weight.T, then the loss and its backward.
    Returns the logits (as left after the step) and both parameters' gradients."""
    hidden, weight, target = _lm_head_inputs(seed)
    logits = hidden @ weight.T
    loss = fwd(logits, target, **kwargs)
    loss.backward(torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape))
    return logits.detach(), hidden.grad, weight.grad


def _expected_gradient(seed: int, reduction: str, label_smoothing: float) -> torch.Tensor:
    """The logits' gradient of the same step through PyTorch's own loss."""
    hidden, weight, target = _lm_head_inputs(seed)
    logits = (hidden @ weight.T).detach().requires_grad_()
    loss = F.cross_entropy(logits, target, reduction=reduction, label_smoothing=label_smoothing)
    loss.backward(torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape))
    return logits.grad


@pytest.mark.parametrize("kernel_path", [False, True], ids=["reference", "kernel"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_the_gradient_lands_in_the_logits_and_the_parameters_train_as_before(kernel_path: bool,
                                                                             reduction: str) -> None:
    ops = {inplace: CrossEntropyFwdOp(V=V, dtype=torch.float32, reduction=reduction, label_smoothing=0.1,
                                      inplace_backward=inplace) for inplace in (False, True)}
    stand_ins = {inplace: _on_stand_in(op) for inplace, op in ops.items()} if kernel_path else {}

    def loss_of(op: CrossEntropyFwdOp) -> Callable[..., torch.Tensor]:
        return lambda logits, target: op(logits, target)[0]

    kept_logits, *kept_grads = _lm_head_step(loss_of(ops[False]), seed=1)
    overwritten, *grads = _lm_head_step(loss_of(ops[True]), seed=1)
    for got, expected in zip(grads, kept_grads):
        torch.testing.assert_close(got, expected)
    expected_gradient = _expected_gradient(1, reduction, 0.1)
    torch.testing.assert_close(overwritten, expected_gradient)
    assert not torch.allclose(kept_logits, expected_gradient)  # out of place, the logits stay
    if kernel_path:
        # Out of place the program writes elsewhere; in place it writes over what it reads.
        (read, written), = stand_ins[False].launches
        assert read != written
        (read, written), = stand_ins[True].launches
        assert read == written


@pytest.mark.parametrize("kernel_path", [False, True], ids=["reference", "kernel"])
def test_a_leaf_keeps_the_gradient_in_its_own_memory(kernel_path: bool) -> None:
    op = CrossEntropyFwdOp(V=V, dtype=torch.float32, reduction="sum", inplace_backward=True)
    if kernel_path:
        _on_stand_in(op)
    logits = torch.randn(ROWS, V, requires_grad=True)
    target = torch.randint(0, V, (ROWS,))
    expected = torch.func.grad(lambda x: F.cross_entropy(x, target, reduction="sum"))(logits.detach().clone())
    op(logits, target)[0].backward()
    assert logits.grad.data_ptr() == logits.data_ptr()  # kept as it came, not copied
    torch.testing.assert_close(logits.grad, expected)


def test_the_functional_form_takes_the_option() -> None:
    _, *kept_grads = _lm_head_step(tf.cross_entropy, seed=2)
    overwritten, *grads = _lm_head_step(tf.cross_entropy, seed=2, inplace_backward=True)
    for got, expected in zip(grads, kept_grads):
        torch.testing.assert_close(got, expected)
    torch.testing.assert_close(overwritten, _expected_gradient(2, "mean", 0.0))


@pytest.mark.parametrize("kernel_path", [False, True], ids=["reference", "kernel"])
def test_another_backward_that_saved_the_logits_fails_loudly(kernel_path: bool) -> None:
    op = CrossEntropyFwdOp(V=V, dtype=torch.float32, inplace_backward=True)
    if kernel_path:
        _on_stand_in(op)
    z = torch.randn(ROWS, V, requires_grad=True)
    logits = z * 2
    target = torch.randint(0, V, (ROWS,))
    # sin saves its input. Recorded before the loss, its backward runs after the loss's
    # (autograd runs the later of two ready nodes first), when the logits hold the gradient.
    aux = logits.sin().sum()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (op(logits, target)[0] + aux).backward()


def test_a_backward_that_read_the_logits_before_they_were_overwritten_is_right() -> None:
    op = CrossEntropyFwdOp(V=V, dtype=torch.float32, inplace_backward=True)
    z = torch.randn(ROWS, V, requires_grad=True)
    target = torch.randint(0, V, (ROWS,))
    logits = z * 2
    before = logits.detach().clone()
    # Recorded after the loss, sin's backward reads the logits before the loss's overwrites them.
    (op(logits, target)[0] + logits.sin().sum()).backward()
    torch.testing.assert_close(z.grad, 2 * (_grad_of_mean_loss(before, target) + before.cos()))


def test_a_second_backward_through_the_loss_fails_loudly() -> None:
    op = CrossEntropyFwdOp(V=V, dtype=torch.float32, inplace_backward=True)
    logits = torch.randn(ROWS, V).mul(2).requires_grad_()
    loss = op(logits, torch.randint(0, V, (ROWS,)))[0]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_logits_the_program_cannot_overwrite_in_place_get_the_gradient_copied_in() -> None:
    op = CrossEntropyFwdOp(V=V, dtype=torch.float32, inplace_backward=True)
    stand_in = _on_stand_in(op)
    z = torch.randn(V, ROWS, requires_grad=True)
    logits = (z * 1).T  # a transposed view: the program reads a contiguous copy
    target = torch.randint(0, V, (ROWS,))
    expected = _grad_of_mean_loss(logits.detach().clone(), target)
    op(logits, target)[0].backward()
    (read, written), = stand_in.launches
    assert read == written != logits.data_ptr()  # the copy takes the gradient in place
    torch.testing.assert_close(logits.detach(), expected)
    torch.testing.assert_close(z.grad, expected.T * 1)


@pytest.mark.parametrize("kernel_path", [False, True], ids=["reference", "kernel"])
def test_expanded_logits_get_the_gradient_in_a_new_tensor(kernel_path: bool) -> None:
    # One row broadcast over the batch (stride 0): its memory cannot hold one gradient per row.
    op = CrossEntropyFwdOp(V=V, dtype=torch.float32, inplace_backward=True)
    if kernel_path:
        _on_stand_in(op)
    row = torch.randn(1, V)
    logits = row.expand(ROWS, V).requires_grad_()
    target = torch.randint(0, V, (ROWS,))
    expected = _grad_of_mean_loss(logits.detach().contiguous(), target)
    op(logits, target)[0].backward()
    torch.testing.assert_close(logits.grad, expected)
    torch.testing.assert_close(logits.detach(), row.expand(ROWS, V))  # the logits are as they were


def test_a_traced_graph_computes_out_of_place() -> None:
    op = CrossEntropyFwdOp(V=V, dtype=torch.float32, inplace_backward=True)
    z = torch.randn(ROWS, V, requires_grad=True)
    target = torch.randint(0, V, (ROWS,))

    def step(z: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = z * 2
        return op(logits, target)[0], logits

    loss, logits = torch.compile(step, fullgraph=True, backend="aot_eager")(z)
    before = logits.detach().clone()
    loss.backward()
    torch.testing.assert_close(logits.detach(), before)
    torch.testing.assert_close(z.grad, 2 * _grad_of_mean_loss(before, target))


def test_a_double_backward_computes_out_of_place() -> None:
    op = CrossEntropyFwdOp(V=V, dtype=torch.float32, inplace_backward=True)
    logits = torch.randn(ROWS, V).requires_grad_()
    target = torch.randint(0, V, (ROWS,))
    before = logits.detach().clone()
    (grad,) = torch.autograd.grad(op(logits, target)[0], logits, create_graph=True)
    torch.testing.assert_close(logits.detach(), before)
    torch.testing.assert_close(grad, _grad_of_mean_loss(before, target))


def _grad_of_mean_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.func.grad(lambda x: F.cross_entropy(x, target))(logits)


@pytest.mark.parametrize("wrapping", ["save_on_cpu", "checkpoint"])
def test_saved_tensor_hooks_and_checkpointing_give_the_same_gradients(wrapping: str) -> None:
    """Offloaded or recomputed logits reach the backward as new tensors: the gradient is
    written over those, and the parameters' gradients are those of the out-of-place loss."""
    op = CrossEntropyFwdOp(V=V, dtype=torch.float32, inplace_backward=True)
    hidden = torch.randn(ROWS, HIDDEN, requires_grad=True)
    weight = torch.randn(V, HIDDEN, requires_grad=True)
    target = torch.randint(0, V, (ROWS,))

    def head_loss(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return op(h @ w.T, target)[0]

    if wrapping == "save_on_cpu":
        with torch.autograd.graph.save_on_cpu():
            loss = head_loss(hidden, weight)
    else:
        loss = torch.utils.checkpoint.checkpoint(head_loss, hidden, weight, use_reentrant=False)
    got = torch.autograd.grad(loss, (hidden, weight))
    expected = torch.autograd.grad(F.cross_entropy(hidden @ weight.T, target), (hidden, weight))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


class _SoftBackwardStandIn:
    """The soft-target backward program's arithmetic with torch, recording where it read and wrote."""

    def __init__(self, op: Any) -> None:
        self.op = op
        self.launches: List[Tuple[int, int]] = []

    def forward(self, logits: torch.Tensor, probabilities: torch.Tensor, weight: torch.Tensor, lse: torch.Tensor,
                mass: torch.Tensor, grad_loss: torch.Tensor, grad_lse: torch.Tensor, grad: torch.Tensor, *,
                per_row: bool, has_grad_lse: bool, mean: bool, weighted: bool) -> None:
        self.launches.append((logits.data_ptr(), grad.data_ptr()))
        scale = (grad_loss if per_row else grad_loss.expand(lse.shape)) / (lse.numel() if mean else 1)
        smoothing = self.op.label_smoothing
        mixed = (probabilities.float() * (1 - smoothing) + smoothing / self.op.V) * (weight if weighted else 1)
        softmax = torch.exp(logits.float() - lse[:, None])
        grad.copy_((scale * mass + (grad_lse if has_grad_lse else 0))[:, None] * softmax - scale[:, None] * mixed)


@pytest.mark.parametrize("kernel_path", [False, True], ids=["reference", "kernel"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_soft_targets_write_the_gradient_over_the_logits_too(kernel_path: bool, reduction: str) -> None:
    """``SoftCrossEntropyFwdOp(inplace_backward=True)``: an lm head's step gives its parameters the
    out-of-place gradients, and the logits end up holding PyTorch's gradient of them."""
    generator = torch.Generator().manual_seed(4)
    probabilities = torch.softmax(torch.randn(ROWS, V, generator=generator), -1)
    weight = torch.rand(V, generator=generator) + 0.5
    ops = {inplace: SoftCrossEntropyFwdOp(V=V, dtype=torch.float32, reduction=reduction, label_smoothing=0.1,
                                          inplace_backward=inplace) for inplace in (False, True)}
    stand_ins = {}
    for inplace, op in ops.items():
        if kernel_path:
            bwd = op.backward_op()
            stand_ins[inplace] = _SoftBackwardStandIn(bwd)
            bwd._route = lambda *tensors: KERNEL
            bwd._device_kernel = lambda device, target_dtype, stand_in=stand_ins[inplace]: stand_in

    def loss_of(op: SoftCrossEntropyFwdOp) -> Callable[..., torch.Tensor]:
        return lambda logits, target: op(logits, probabilities, weight)[0]

    kept_logits, *kept_grads = _lm_head_step(loss_of(ops[False]), seed=3)
    overwritten, *grads = _lm_head_step(loss_of(ops[True]), seed=3)
    for got, expected in zip(grads, kept_grads):
        torch.testing.assert_close(got, expected)
    hidden, head, _ = _lm_head_inputs(3)
    logits = (hidden @ head.T).detach().requires_grad_()
    loss = F.cross_entropy(logits, probabilities, weight, reduction=reduction, label_smoothing=0.1)
    loss.backward(torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape))
    torch.testing.assert_close(overwritten, logits.grad)
    assert not torch.allclose(kept_logits, logits.grad)
    if kernel_path:
        (read, written), = stand_ins[False].launches
        assert read != written
        (read, written), = stand_ins[True].launches
        assert read == written
