"""L2 bases of the loss family: the CUDA path of cross-entropy, forward and backward.

The forward kernel writes a float32 loss and logsumexp per row; the reduction
(sum, or mean over rows whose target is not ``ignore_index``) is a float32 sum
over those ``N`` values, cast to the logits' dtype as PyTorch returns it, in
one more launch.  The backward first turns ``grad_loss`` and the reduction
into one float32 coefficient per row (one launch, which also places
``grad_lse`` or zeros beside them; the kernel adds ``grad_lse``), so its main
kernel reads the logits once and writes the gradient once, whatever the
reduction.
"""

import math
from typing import Hashable, Optional, Tuple

import torch

from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import aligned_contiguous, on_device
from tileops.ops.op_base import Op

__all__ = ["CrossEntropyFwdBase", "CrossEntropyBwdBase"]


class _CrossEntropyOp(Op):
    """Kernel construction and cache shared by the cross-entropy ops.

    L3 ops set ``V``, ``dtype``, ``ignore_index``, ``label_smoothing``,
    ``reduction``, ``tune`` and a one-entry ``kernel_map``.
    """

    V: int
    ignore_index: int
    label_smoothing: float
    reduction: str
    tune: bool

    def _build_kernel(self, key: str, *input_shapes: Tuple[int, ...]) -> Kernel:
        return self.kernel_map[key](self.V, self.dtype, ignore_index=self.ignore_index,
                                    label_smoothing=self.label_smoothing, tune=self.tune)

    def _cache_key(self, *input_shapes: Tuple[int, ...]) -> Hashable:
        # The row count is symbolic in the programs: only the device picks the kernel.
        return input_shapes[0]

    def _device_kernel(self, device: torch.device) -> Kernel:
        key = next(iter(self.kernel_map))
        return self._kernel(key, (device.index,))


class CrossEntropyFwdBase(_CrossEntropyOp):
    """``(loss, lse)`` of logits ``[N, V]`` and targets ``[N]``."""

    def _run_kernel(self, logits: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        rows = logits.shape[0]
        device = logits.device
        loss_rows = torch.empty(rows, dtype=torch.float32, device=device)
        lse = torch.empty(rows, dtype=torch.float32, device=device)
        if self.reduction == "none":
            loss = loss_rows
        elif rows:
            loss = torch.empty((), dtype=logits.dtype, device=device)
        else:
            # As PyTorch: an empty sum is 0, and its mean 0 / 0 = NaN.
            loss = torch.full((), math.nan if self.reduction == "mean" else 0.0, dtype=logits.dtype, device=device)
        if rows:
            target = target.contiguous()
            with on_device(device):
                kernel = self._device_kernel(device)
                kernel(aligned_contiguous(logits), target, loss_rows, lse)
                if self.reduction != "none":
                    kernel.total(loss_rows, target, loss.view(1), mean=self.reduction == "mean")
        return loss.to(logits.dtype), lse


class CrossEntropyBwdBase(_CrossEntropyOp):
    """``grad_logits`` from ``grad_loss``, an optional ``grad_lse`` and what the forward saved."""

    def _run_kernel(self, grad_loss: torch.Tensor, grad_lse: Optional[torch.Tensor], logits: torch.Tensor,
                    target: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        if grad_logits.numel() == 0:
            return grad_logits
        device = logits.device
        target = target.contiguous()
        # Row 0: each row's share c of grad_loss (0 for ignored rows); row 1: grad_lse, or 0.
        # The loss's gradient is c * (softmax - smoothed target); lse's is grad_lse * softmax.
        coefficients = torch.empty((2, target.numel()), dtype=torch.float32, device=device)
        if grad_lse is not None:
            grad_lse = grad_lse.contiguous()
        with on_device(device):
            kernel = self._device_kernel(device)
            kernel.coefficients(grad_loss.contiguous(), grad_lse, target, coefficients,
                                mean=self.reduction == "mean", per_row=self.reduction == "none")
            kernel(aligned_contiguous(logits), target, lse.contiguous(), coefficients[1], coefficients[0],
                   grad_logits)
        return grad_logits
