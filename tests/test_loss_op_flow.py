"""The cross-entropy ops' CUDA flow on the CPU, with a stand-in kernel: which launches each
reduction takes, what reaches them, and the empty-batch results."""

import math
from typing import Any, List

import pytest
import torch
import torch.nn.functional as F

from tileops.kernels.loss.cross_entropy import SMALL_TOTAL_ELEMENTS
from tileops.ops import CrossEntropyBwdOp, CrossEntropyFwdOp


class _StandInKernel:
    """Computes what the programs compute, with torch, and records each launch."""

    def __init__(self, V: int) -> None:
        self.V = V
        self.calls: List[Any] = []

    def __call__(self, *args: torch.Tensor) -> None:
        self.calls.append("main")
        if len(args) == 4:  # forward: logits, target, loss_rows, lse
            logits, target, loss_rows, lse = args
            lse.copy_(torch.logsumexp(logits.float(), -1))
            loss_rows.copy_(lse - logits.float().gather(1, target[:, None])[:, 0])

    def total(self, loss_rows: torch.Tensor, target: torch.Tensor, out: torch.Tensor, *, mean: bool) -> None:
        self.calls.append(("total", mean))
        out.fill_(loss_rows.sum() / (target.numel() if mean else 1))

    def takes_small_total(self, rows: int) -> bool:
        return rows * self.V <= SMALL_TOTAL_ELEMENTS

    def small_total(self, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, *,
                    mean: bool) -> None:
        self.calls.append(("small", mean))
        lse.copy_(torch.logsumexp(logits.float(), -1))
        loss_rows = lse - logits.float().gather(1, target[:, None])[:, 0]
        out.fill_(loss_rows.sum() / (target.numel() if mean else 1))

    def kept_rows(self, target: torch.Tensor, out: torch.Tensor) -> None:
        self.calls.append("kept_rows")

    def forward(self, *args: torch.Tensor, per_row: bool, has_grad_lse: bool, mean: bool) -> None:
        self.calls.append(("main", per_row, has_grad_lse, mean))


def _with_stand_in(op: Any) -> _StandInKernel:
    kernel = _StandInKernel(op.V)
    op._device_kernel = lambda device: kernel
    return kernel


@pytest.mark.parametrize("V", [7, SMALL_TOTAL_ELEMENTS // 5 + 1])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_each_reduction_takes_its_launches(reduction: str, V: int) -> None:
    logits, target = torch.randn(5, V), torch.randint(0, V, (5,))
    fwd = CrossEntropyFwdOp(V=V, dtype=torch.float32, reduction=reduction)
    kernel = _with_stand_in(fwd)
    loss, lse = fwd._run_kernel(logits, target)
    torch.testing.assert_close(loss, F.cross_entropy(logits, target, reduction=reduction))
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1))
    # A mean or sum over few logits is one launch of the one-block program.
    small = 5 * V <= SMALL_TOTAL_ELEMENTS
    mean = reduction == "mean"
    assert kernel.calls == (["main"] if reduction == "none" else [("small", mean)] if small else ["main", ("total", mean)])

    bwd = CrossEntropyBwdOp(V=V, dtype=torch.float32, reduction=reduction)
    kernel = _with_stand_in(bwd)
    grad_loss = torch.ones(5) if reduction == "none" else torch.tensor(1.0)
    assert bwd._run_kernel(grad_loss, None, logits, target, lse).shape == logits.shape
    # The reduction is compiled into the backward's program; only a mean counts the kept rows first.
    main = ("main", reduction == "none", False, reduction == "mean")
    assert kernel.calls == (["kept_rows", main] if reduction == "mean" else [main])


@pytest.mark.parametrize("reduction, expected", [("none", (0,)), ("sum", 0.0), ("mean", math.nan)])
def test_an_empty_batch_launches_nothing(reduction: str, expected: Any) -> None:
    fwd = CrossEntropyFwdOp(V=7, dtype=torch.float16, reduction=reduction)
    kernel = _with_stand_in(fwd)
    loss, lse = fwd._run_kernel(torch.empty(0, 7, dtype=torch.float16), torch.empty(0, dtype=torch.int64))
    assert kernel.calls == [] and loss.dtype == torch.float16 and lse.shape == (0,)
    if reduction == "none":
        assert loss.shape == expected
    else:
        torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float16), equal_nan=True)


class _RecordingKernel(_StandInKernel):
    """Also records the address of the logits each launch reads."""

    def __init__(self, V: int) -> None:
        super().__init__(V)
        self.logits_addresses: List[int] = []

    def __call__(self, *args: torch.Tensor) -> None:
        self.logits_addresses.append(args[0].data_ptr())
        super().__call__(*args)

    def forward(self, logits: torch.Tensor, *args: torch.Tensor, **flags: bool) -> None:
        self.logits_addresses.append(logits.data_ptr())
        super().forward(logits, *args, **flags)


@pytest.mark.parametrize("name, padded_width, start, in_place", [
    ("padded-vocabulary", 64 + 16, 0, True),
    ("row-stride-off-the-access-width", 64 + 3, 0, False),
    ("misaligned-start", 64 + 16, 1, False),
])
def test_logits_sliced_from_a_padded_vocabulary_are_read_in_place(name: str, padded_width: int, start: int,
                                                                   in_place: bool) -> None:
    V = 64
    logits = torch.randn(6, padded_width)[:, start:start + V]
    target = torch.randint(0, V, (6,))
    for op in (CrossEntropyFwdOp(V=V, dtype=torch.float32, reduction="none"),
               CrossEntropyBwdOp(V=V, dtype=torch.float32, reduction="none")):
        op._device_kernel = lambda device, kernel=_RecordingKernel(V): kernel
        kernel = op._device_kernel(None)
        if isinstance(op, CrossEntropyFwdOp):
            loss, _ = op._run_kernel(logits, target)
            torch.testing.assert_close(loss, F.cross_entropy(logits, target, reduction="none"))
        else:
            op._run_kernel(torch.ones(6), None, logits, target, torch.logsumexp(logits, -1))
        assert (kernel.logits_addresses == [logits.data_ptr()]) == in_place, name
