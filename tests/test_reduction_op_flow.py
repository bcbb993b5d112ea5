"""The reduction ops' CUDA flow on the CPU, with a stand-in kernel: the views each layout
reaches the kernel as (rows or columns, in place or copied), the output shapes, and the
results over every set of axes."""

import itertools
from typing import Any, List, Optional, Sequence, Tuple

import pytest
import torch

from tileops.ops import AmaxFwdOp, SumFwdOp


class _StandInKernel:
    """Reduces the extent the programs reduce (axis 1 of a row or column view) with torch."""

    def __init__(self, reduce: Any) -> None:
        self.reduce = reduce
        self.views: List[Tuple[Tuple[int, ...], Tuple[int, ...], int]] = []

    def __call__(self, view: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        assert view.stride(-1) == 1, "the innermost axis of a view has unit stride"
        assert out.is_contiguous()
        self.views.append((tuple(view.shape), view.stride(), view.data_ptr()))
        out.copy_(self.reduce(view, 1))
        return out


def _with_stand_in(op: Any, reduce: Any) -> _StandInKernel:
    kernel = _StandInKernel(reduce)
    op._kernel = lambda key, *shapes: kernel
    return kernel


def _layouts(shape: Sequence[int]) -> List[Tuple[str, torch.Tensor]]:
    """The same values contiguous, as a slice of a wider tensor, and transposed."""
    base = torch.randn(shape, dtype=torch.float32)
    wider = torch.randn(*shape[:-1], shape[-1] + 3, dtype=torch.float32)[..., 1:shape[-1] + 1] if shape else base
    layouts = [("contiguous", base), ("sliced", wider)]
    if len(shape) >= 2:
        layouts.append(("transposed", torch.randn(*shape[::-1], dtype=torch.float32).transpose(0, -1)))
    return layouts


def _dim_choices(ndim: int) -> List[Optional[Tuple[int, ...]]]:
    axes = range(ndim)
    choices: List[Optional[Tuple[int, ...]]] = [None]
    for count in (1, 2):
        choices += [tuple(c) for c in itertools.combinations(axes, count)]
    return choices + ([(-1,)] if ndim else [])


@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (4, 6, 1), (2, 3, 4), (1, 5, 1, 3), (2, 1, 3, 4)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_every_axis_set_and_layout_matches_torch(shape: Tuple[int, ...], keepdim: bool) -> None:
    for dim, (name, x) in itertools.product(_dim_choices(len(shape)), _layouts(shape)):
        op = SumFwdOp(dtype=torch.float32, dim=None if dim is None else list(dim), keepdim=keepdim)
        _with_stand_in(op, lambda view, axis: view.sum(axis))
        expected = torch.sum(x, dim=dim, keepdim=keepdim)
        got = op._run_kernel(x)
        assert got.shape == expected.shape, (shape, dim, name)
        torch.testing.assert_close(got, expected, msg=f"{shape} dim={dim} {name}")


def test_contiguous_inputs_reach_the_kernel_in_place() -> None:
    op = SumFwdOp(dtype=torch.float32, dim=[-1])
    kernel = _with_stand_in(op, lambda view, axis: view.sum(axis))
    x = torch.randn(8, 16, dtype=torch.float32)
    op._run_kernel(x)
    op._run_kernel(x.view(2, 4, 16))
    assert [(shape, stride) for shape, stride, _ in kernel.views] == [((8, 16), (16, 1))] * 2
    assert kernel.views[0][2] == x.data_ptr()

    trailing_one = SumFwdOp(dtype=torch.float32, dim=[1])  # reduces rows, not columns
    kernel = _with_stand_in(trailing_one, lambda view, axis: view.sum(axis))
    z = torch.randn(8, 16, 1, dtype=torch.float32)
    torch.testing.assert_close(trailing_one._run_kernel(z), z.sum(1))
    assert kernel.views == [((8, 16), (16, 1), z.data_ptr())]

    middle = SumFwdOp(dtype=torch.float32, dim=[1])
    kernel = _with_stand_in(middle, lambda view, axis: view.sum(axis))
    y = torch.randn(3, 5, 4, dtype=torch.float32)
    torch.testing.assert_close(middle._run_kernel(y), y.sum(1))
    assert kernel.views == [((3, 5, 4), (20, 4, 1), y.data_ptr())]


def test_strided_rows_are_read_in_place() -> None:
    op = SumFwdOp(dtype=torch.float32, dim=[-1])
    kernel = _with_stand_in(op, lambda view, axis: view.sum(axis))
    wide = torch.randn(6, 20, dtype=torch.float32)
    torch.testing.assert_close(op._run_kernel(wide[:, 2:18]), wide[:, 2:18].sum(-1))
    assert kernel.views == [((6, 16), (20, 1), wide[:, 2:].data_ptr())]


def test_empty_inputs_launch_nothing() -> None:
    op = AmaxFwdOp(dtype=torch.float32, dim=[0])
    kernel = _with_stand_in(op, lambda view, axis: view.amax(axis))
    assert op._run_kernel(torch.randn(3, 0, dtype=torch.float32)).shape == (0,)
    total = SumFwdOp(dtype=torch.float32, dim=[1])
    _with_stand_in(total, lambda view, axis: view.sum(axis))
    torch.testing.assert_close(total._run_kernel(torch.randn(4, 0, dtype=torch.float32)),
                               torch.zeros(4, dtype=torch.float32))
    assert kernel.views == []


def test_layouts_are_remembered_per_geometry_and_read_each_call_in_place() -> None:
    op = SumFwdOp(dtype=torch.float32, dim=[0, 2])
    kernel = _with_stand_in(op, lambda view, axis: view.sum(axis))
    inputs = [torch.randn(3, 4, 5), torch.randn(5, 4, 3).transpose(0, 2), torch.randn(3, 4, 8)[..., 1:6]]
    for x in inputs * 2:
        torch.testing.assert_close(op._run_kernel(x), x.sum((0, 2)))
    assert len(op._layouts) == 3  # one geometry each; the second round reused them
    assert [view[:2] for view in kernel.views[3:]] == [view[:2] for view in kernel.views[:3]]
    wide = torch.randn(6, 40)
    rows = SumFwdOp(dtype=torch.float32, dim=[-1])
    row_kernel = _with_stand_in(rows, lambda view, axis: view.sum(axis))
    for start in (0, 5, 17):  # one geometry at three offsets into the same storage
        torch.testing.assert_close(rows._run_kernel(wide[:, start:start + 9]), wide[:, start:start + 9].sum(-1))
        assert row_kernel.views[-1][2] == wide[:, start:].data_ptr()  # read in place
    assert len(rows._layouts) == 1


def test_layout_memo_is_bounded_and_derives_once_per_key() -> None:
    from tileops.kernels.launch import LayoutMemo

    memo: LayoutMemo[int] = LayoutMemo(capacity=4)
    calls: List[int] = []

    def derive(value: int) -> Any:
        return lambda: calls.append(value) or value

    assert [memo.get(k, derive(k)) for k in (1, 2, 1, 2)] == [1, 2, 1, 2]
    assert calls == [1, 2]
    for key in range(10, 20):
        assert memo.get(key, derive(key)) == key
    assert len(memo) <= 4
    nothing: LayoutMemo[Any] = LayoutMemo()
    assert [nothing.get("k", lambda: calls.append(0)) for _ in range(3)] == [None] * 3
    assert calls.count(0) == 1  # ``None`` is a remembered value, not a miss
