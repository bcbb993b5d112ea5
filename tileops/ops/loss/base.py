"""L2 bases of the loss family: the CUDA path of cross-entropy, forward and backward.

The forward kernel writes a float32 loss and logsumexp per row; the reduction
(sum, or mean over rows whose target is not ``ignore_index``) is a float32 sum
over those ``N`` values, cast to the logits' dtype as PyTorch returns it.  The
backward turns ``grad_loss`` and the reduction into one float32 coefficient
per row (the kernel adds ``grad_lse``), so its kernel reads the logits once and
writes the gradient once, whatever the reduction.
"""

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
        if rows:
            with on_device(device):
                self._device_kernel(device)(aligned_contiguous(logits), target.contiguous(), loss_rows, lse)
        return self._reduce(loss_rows, target).to(logits.dtype), lse

    def _reduce(self, loss_rows: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.reduction == "none":
            return loss_rows
        total = loss_rows.sum()
        if self.reduction == "sum":
            return total
        # As PyTorch: 0 / 0 = NaN when every target is ignored.
        return total / (target != self.ignore_index).sum()


class CrossEntropyBwdBase(_CrossEntropyOp):
    """``grad_logits`` from ``grad_loss``, an optional ``grad_lse`` and what the forward saved."""

    def _run_kernel(self, grad_loss: torch.Tensor, grad_lse: Optional[torch.Tensor], logits: torch.Tensor,
                    target: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        if grad_logits.numel() == 0:
            return grad_logits
        target_coef = self._target_coefficients(grad_loss, target)
        if grad_lse is None:
            grad_lse = torch.zeros_like(target_coef)
        device = logits.device
        with on_device(device):
            self._device_kernel(device)(aligned_contiguous(logits), target.contiguous(), lse.contiguous(),
                                        grad_lse.contiguous(), target_coef, grad_logits)
        return grad_logits

    def _target_coefficients(self, grad_loss: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Each row's share ``c`` of ``grad_loss`` (0 for ignored rows), float32 ``[N]``.

        The loss's gradient is ``c * (softmax - smoothed target)``; ``lse``'s is
        ``grad_lse * softmax``, which the kernel adds.
        """
        kept = target != self.ignore_index
        scale = grad_loss.float()
        if self.reduction == "mean":
            scale = scale / kept.sum()
        return (scale * kept).contiguous()  # broadcasts a scalar grad_loss to [N]
