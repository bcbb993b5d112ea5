"""The norm ops' CUDA flow on the CPU, with a stand-in kernel: which row inputs reach the kernel
in place (row slices of wider tensors, broadcast rows) and which as aligned contiguous copies
(transposes, misaligned starts, row strides the accesses cannot step by), and the results."""

from typing import Any, Callable, List, Tuple

import pytest
import torch

from tileops.ops import FusedAddRMSNormBwdOp, FusedAddRMSNormFwdOp, LayerNormFwdOp, RMSNormBwdOp, RMSNormFwdOp

N = 16
EPS = 1e-6


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


class _StandInKernel:
    """Normalises rows with torch as the programs do, and records the row inputs it was handed."""

    def __init__(self, compute: Callable[..., None]) -> None:
        self.compute = compute
        self.rows: List[Tuple[Tuple[int, ...], Tuple[int, ...], int]] = []

    def forward(self, *tensors: Any) -> None:
        for tensor in tensors:
            if tensor is not None and tensor.dim() == 2:
                assert tensor.stride(1) == 1 and tensor.data_ptr() % 16 == 0
                self.rows.append((tuple(tensor.shape), tensor.stride(), tensor.data_ptr()))
        self.compute(*tensors)


def _with_stand_in(op: Any, compute: Callable[..., None]) -> _StandInKernel:
    kernel = _StandInKernel(compute)
    op._kernel = lambda key, *shapes: kernel
    return kernel


def _rms_forward(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> None:
    y.copy_(_rms(x) * weight)


def _layouts() -> List[Tuple[str, torch.Tensor, bool]]:
    """(name, x of shape (2, 3, N), read in place)."""
    wide = torch.randn(2, 3, 3 * N)
    storage = torch.randn(2 * 3 * N + 1)
    return [
        ("contiguous", torch.randn(2, 3, N), True),
        ("head-of-fused-projection", wide[..., N:2 * N], True),
        ("broadcast-rows", torch.randn(N).expand(2, 3, N), True),
        ("transposed-leading-axes", torch.randn(3, 2, N).transpose(0, 1), False),
        ("every-other-element", torch.randn(2, 3, 2 * N)[..., ::2], False),
        ("misaligned-start", storage[1:].view(2, 3, N), False),
        ("row-stride-off-the-access-width", torch.randn(2, 3, N + 1)[..., :N], False),
    ]


@pytest.mark.parametrize("name, x, in_place", _layouts(), ids=[layout[0] for layout in _layouts()])
def test_rms_norm_reads_rows_in_place_when_their_memory_allows(name: str, x: torch.Tensor, in_place: bool) -> None:
    op = RMSNormFwdOp(N=N, dtype=torch.float32, eps=EPS)
    kernel = _with_stand_in(op, _rms_forward)
    weight = torch.randn(N)
    y = op._run_kernel(x, weight)
    torch.testing.assert_close(y, _rms(x) * weight)
    assert y.is_contiguous() and y.shape == x.shape
    (shape, stride, address), _ = kernel.rows
    assert shape == (6, N)
    assert (address == x.data_ptr()) == in_place, (name, stride)


def test_fused_add_and_layer_norm_read_each_row_input_in_place() -> None:
    wide = torch.randn(4, 2 * N)
    x, residual, weight = wide[:, :N], wide[:, N:], torch.randn(N)
    fused = FusedAddRMSNormFwdOp(N=N, dtype=torch.float32, eps=EPS)

    def fused_forward(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, y: torch.Tensor,
                      residual_out: torch.Tensor) -> None:
        residual_out.copy_(x + residual)
        y.copy_(_rms(residual_out) * weight)

    kernel = _with_stand_in(fused, fused_forward)
    y, residual_out = fused._run_kernel(x, residual, weight)
    torch.testing.assert_close(residual_out, x + residual)
    torch.testing.assert_close(y, _rms(x + residual) * weight)
    assert [row[2] for row in kernel.rows[:2]] == [x.data_ptr(), residual.data_ptr()]
    assert [row[1] for row in kernel.rows[:2]] == [(2 * N, 1)] * 2

    layer = LayerNormFwdOp(N=N, dtype=torch.float32, eps=EPS)
    layer_kernel = _with_stand_in(layer, lambda x, w, b, y: y.copy_(torch.nn.functional.layer_norm(
        x, (N,), w, b, EPS)))
    torch.testing.assert_close(layer._run_kernel(x, weight, None),
                               torch.nn.functional.layer_norm(x, (N,), weight, None, EPS))
    assert layer_kernel.rows[0][2] == x.data_ptr()


def test_backward_reads_grad_y_and_x_in_place() -> None:
    wide = torch.randn(3, 5, 2 * N)
    grad_y, x, weight = wide[..., :N], wide[..., N:], torch.randn(N)
    op = RMSNormBwdOp(N=N, dtype=torch.float32, eps=EPS)

    def backward(grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, grad_x: torch.Tensor,
                 grad_weight: torch.Tensor) -> None:
        x_, w_ = x.clone().requires_grad_(), weight.clone().requires_grad_()
        torch.autograd.backward(_rms(x_) * w_, grad_y)
        grad_x.copy_(x_.grad)
        grad_weight.copy_(w_.grad)

    kernel = _with_stand_in(op, backward)
    grad_x, grad_weight = op._run_kernel(grad_y, x, weight)
    x_, w_ = x.clone().requires_grad_(), weight.clone().requires_grad_()
    torch.autograd.backward(_rms(x_) * w_, grad_y)
    torch.testing.assert_close(grad_x, x_.grad)
    torch.testing.assert_close(grad_weight, w_.grad)
    assert grad_x.is_contiguous()
    assert [row[2] for row in kernel.rows[:2]] == [grad_y.data_ptr(), x.data_ptr()]


def test_fused_add_backward_reads_both_gradients_and_the_sum_in_place() -> None:
    wide = torch.randn(3, 5, 3 * N)
    grad_y, grad_sum, total, weight = wide[..., :N], wide[..., N:2 * N], wide[..., 2 * N:], torch.randn(N)
    op = FusedAddRMSNormBwdOp(N=N, dtype=torch.float32, eps=EPS)

    def backward(grad_y: torch.Tensor, grad_sum: torch.Tensor, total: torch.Tensor, weight: torch.Tensor,
                 grad_x: torch.Tensor, grad_weight: torch.Tensor) -> None:
        total_, w_ = total.clone().requires_grad_(), weight.clone().requires_grad_()
        torch.autograd.backward(_rms(total_) * w_, grad_y)
        grad_x.copy_(total_.grad + grad_sum)
        grad_weight.copy_(w_.grad)

    kernel = _with_stand_in(op, backward)
    grad_x, grad_weight = op._run_kernel(grad_y, grad_sum, total, weight)
    total_, w_ = total.clone().requires_grad_(), weight.clone().requires_grad_()
    torch.autograd.backward(_rms(total_) * w_, grad_y)
    torch.testing.assert_close(grad_x, total_.grad + grad_sum)
    torch.testing.assert_close(grad_weight, w_.grad)
    assert grad_x.is_contiguous() and grad_x.shape == total.shape
    assert [row[2] for row in kernel.rows[:3]] == [grad_y.data_ptr(), grad_sum.data_ptr(), total.data_ptr()]
    empty = torch.empty(0, N)
    assert [tuple(t.shape) for t in op._run_kernel(empty, empty, empty, weight)] == [(0, N), (N,)]
