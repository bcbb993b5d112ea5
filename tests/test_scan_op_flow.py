"""The scan ops' CUDA flow on the CPU, with a stand-in kernel: row inputs reach the row programs in
place when their memory allows (row slices of wider tensors) and as aligned contiguous copies
otherwise; scans along other axes see contiguous ``(outer, N, inner)`` columns."""

from typing import List, Tuple

import pytest
import torch

from tileops.ops import CumsumBwdOp, CumsumFwdOp

N = 24


class _StandInKernel:
    """Scans axis 1 of the views with torch and records what it was handed."""

    def __init__(self, reverse: bool = False) -> None:
        self.reverse = reverse
        self.views: List[Tuple[Tuple[int, ...], Tuple[int, ...], int]] = []

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and y.is_contiguous()
        self.views.append((tuple(x.shape), x.stride(), x.data_ptr()))
        y.copy_(x.flip(1).cumsum(1).flip(1) if self.reverse else x.cumsum(1))
        return y


def _layouts() -> List[Tuple[str, torch.Tensor, bool]]:
    storage = torch.randn(5 * 3 * N + 1)
    return [
        ("contiguous", torch.randn(5, 3, N), True),
        ("row-slice", torch.randn(5, 3, 2 * N)[..., N:], True),
        ("trailing-size-1-axes", torch.randn(5, 3, 2 * N, 1)[:, :, :N], True),
        ("transposed", torch.randn(3, 5, N).transpose(0, 1), False),
        ("misaligned-start", storage[1:].view(5, 3, N), False),
        ("every-other-element", torch.randn(5, 3, 2 * N)[..., ::2], False),
    ]


@pytest.mark.parametrize("name, x, in_place", _layouts(), ids=[layout[0] for layout in _layouts()])
@pytest.mark.parametrize("reverse", [False, True], ids=["cumsum", "cumsum-bwd"])
def test_row_scans_read_rows_in_place_when_their_memory_allows(name: str, x: torch.Tensor, in_place: bool,
                                                                 reverse: bool) -> None:
    dim = 2
    op = (CumsumBwdOp if reverse else CumsumFwdOp)(N=N, dim=dim, dtype=torch.float32)
    kernel = _StandInKernel(reverse)
    op._kernel = lambda key, *shapes: kernel
    y = op._run_kernel(x)
    expected = x.flip(dim).cumsum(dim).flip(dim) if reverse else x.cumsum(dim)
    torch.testing.assert_close(y, expected)
    assert y.is_contiguous() and y.shape == x.shape
    (shape, _, address), = kernel.views
    assert shape == (15, N)
    assert (address == x.data_ptr()) == in_place


def test_scans_along_a_middle_axis_see_contiguous_columns() -> None:
    x = torch.randn(4, N, 6)[:, :, 1:5]
    op = CumsumFwdOp(N=N, dim=1, dtype=torch.float32)
    kernel = _StandInKernel()
    op._kernel = lambda key, *shapes: kernel
    torch.testing.assert_close(op._run_kernel(x), x.cumsum(1))
    assert kernel.views[0][:2] == ((4, N, 4), (N * 4, 4, 1))
