"""L2 bases of the loss family: the CUDA path of cross-entropy, forward and backward.

The forward kernel writes a float32 loss and logsumexp per row; the reduction
(sum, or mean over rows whose target is not ``ignore_index``) is a float32 sum
over those ``N`` values, cast to the logits' dtype as PyTorch returns it, in
one more launch.  The backward is one launch that reads the logits once and
writes the gradient once, whatever the reduction: each row's coefficient is
formed in the kernel from ``grad_loss``, the target and ``grad_lse``; a
``mean`` first counts the kept rows (one more, one-block launch).  Beside the
gradient, a call allocates at most that one float32 count.

A forward built with ``inplace_backward`` has its eager backward write the
gradient over the logits and return it in their memory: each element is read
and then written by the same thread, so the program is the same one with its
output aliased to its input, and a training step holds one ``[N, V]`` tensor
fewer.  The logits' version counter moves, so autograd refuses any other
backward that saved them (and a second backward through this one) instead of
reading the gradient as logits.  A traced graph never aliases: a custom op's
output must be fresh memory, so there the backward is the out-of-place one.

The soft-target ops take class probabilities ``[N, V]`` (any float dtype) and
optional class weights instead of indices.  Their forward returns float32 (the
kernel's per-row losses, or their sum or mean over rows, in one more launch),
and saves each row's ``lse`` and target mass for the backward, one launch that
reads the logits and the targets once and writes the gradient once (or, with
``inplace_backward``, writes it over the logits as above).  The manifest marks
the targets and weights constant: a call refuses them when they require grad.
"""

import math
from typing import Optional, Tuple

import torch

from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import aligned_rows, on_device
from tileops.ops.op_base import KERNEL, Op

__all__ = ["CrossEntropyFwdBase", "CrossEntropyBwdBase", "SoftCrossEntropyFwdBase", "SoftCrossEntropyBwdBase"]


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

    # The row count is symbolic: ``_device_kernel`` names the kernel by ``(device index,)``.
    kernels_keyed_by_launch = True

    def _device_kernel(self, device: torch.device) -> Kernel:
        key = next(iter(self.kernel_map))
        return self._kernel(key, (device.index,))


class _InplaceBackwardFwd(Op):
    """A forward whose ``inplace_backward`` has its eager backward write over the logits (the
    Bwd op's ``into_logits``); the backward's tensors are its Bwd op's inputs."""

    inplace_backward: bool

    def _plain_backward(self, *tensors: Optional[torch.Tensor]) -> torch.Tensor:
        if self.inplace_backward:
            return self.backward_op().into_logits(*tensors)
        return super()._plain_backward(*tensors)


class CrossEntropyFwdBase(_InplaceBackwardFwd, _CrossEntropyOp):
    """``(loss, lse)`` of logits ``[N, V]`` and targets ``[N]``."""

    def _run_kernel(self, logits: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        rows = logits.shape[0]
        device = logits.device
        lse = torch.empty(rows, dtype=torch.float32, device=device)
        if self.reduction == "none":
            loss = torch.empty(rows, dtype=torch.float32, device=device)
        elif rows:
            loss = torch.empty((), dtype=logits.dtype, device=device)
        else:
            # As PyTorch: an empty sum is 0, and its mean 0 / 0 = NaN.
            loss = torch.full((), math.nan if self.reduction == "mean" else 0.0, dtype=logits.dtype, device=device)
        if rows:
            target = target.contiguous()
            mean = self.reduction == "mean"
            # A row slice of a wider buffer (a padded vocabulary) is read in place.
            logit_rows = aligned_rows(logits, self.V)
            with on_device(device):
                kernel = self._device_kernel(device)
                if self.reduction == "none":
                    kernel(logit_rows, target, loss, lse)
                elif kernel.takes_small_total(rows):
                    kernel.small_total(logit_rows, target, lse, loss.view(1), mean=mean)
                else:
                    loss_rows = torch.empty(rows, dtype=torch.float32, device=device)
                    kernel(logit_rows, target, loss_rows, lse)
                    kernel.total(loss_rows, target, loss.view(1), mean=mean)
        return loss.to(logits.dtype), lse


class _LogitsGradient(Op):
    """A Bwd op whose inputs are ``(grad_loss, grad_lse, logits, *saved)`` and whose program
    reads each logit before it writes that element's gradient, so it may write over the logits.

    Subclasses define ``_launch(grad_loss, grad_lse, logit_rows, *saved, grad_rows)``: the
    gradient of the non-empty ``logit_rows`` (aligned ``(N, V)`` rows) into ``grad_rows``."""

    V: int

    def _run_kernel(self, grad_loss: torch.Tensor, grad_lse: Optional[torch.Tensor], logits: torch.Tensor,
                    *saved: Optional[torch.Tensor]) -> torch.Tensor:
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        if grad_logits.numel():
            self._launch(grad_loss, grad_lse, aligned_rows(logits, self.V), *saved, grad_logits)
        return grad_logits

    def into_logits(self, grad_loss: torch.Tensor, grad_lse: Optional[torch.Tensor], logits: torch.Tensor,
                    *saved: Optional[torch.Tensor]) -> torch.Tensor:
        """``grad_logits`` written over ``logits`` and returned in their memory: the eager backward
        of a forward built with ``inplace_backward`` (see the module docstring).

        The result is a new tensor object over that memory, not ``logits`` itself: autograd
        copies a gradient it finds referenced elsewhere before keeping it as a leaf's ``.grad``,
        and keeps this one as it is.  Logits the program cannot read in place (a transposed
        view, say) are read from a copy, which takes the gradient in place and is copied back,
        so the result is the same on every path and device.  Logits whose elements share memory
        (an expanded view) cannot hold one gradient each: they get a new tensor instead."""
        if _shares_elements(logits):
            return self._eager(grad_loss, grad_lse, logits, *saved)
        self._overwrite(grad_loss, grad_lse, logits, *saved)
        return logits.detach()

    def _overwrite(self, grad_loss: torch.Tensor, grad_lse: Optional[torch.Tensor], logits: torch.Tensor,
                   *saved: Optional[torch.Tensor]) -> None:
        if self._route(grad_loss, grad_lse, logits, *saved) != KERNEL:
            logits.copy_(self._reference_in_float32(grad_loss, grad_lse, logits, *saved))
            return
        if not logits.numel():
            return
        rows = aligned_rows(logits, self.V)
        self._launch(grad_loss, grad_lse, rows, *saved, rows)
        if rows.data_ptr() == logits.data_ptr():
            torch.autograd.graph.increment_version(logits)  # copy_ below moves it itself
        else:
            logits.copy_(rows)


def _shares_elements(tensor: torch.Tensor) -> bool:
    """Whether two elements of ``tensor`` lie at one address: an axis of stride 0 and more than one
    element, the overlap that writing into a tensor refuses."""
    return any(stride == 0 and size > 1 for stride, size in zip(tensor.stride(), tensor.shape))


class CrossEntropyBwdBase(_LogitsGradient, _CrossEntropyOp):
    """``grad_logits`` from ``grad_loss``, an optional ``grad_lse`` and what the forward saved."""

    def _launch(self, grad_loss: torch.Tensor, grad_lse: Optional[torch.Tensor], logit_rows: torch.Tensor,
                target: torch.Tensor, lse: torch.Tensor, grad_rows: torch.Tensor) -> None:
        """The gradient of the non-empty ``logit_rows`` into ``grad_rows`` (which may be them)."""
        device = logit_rows.device
        target = target.contiguous()
        lse = lse.contiguous()
        mean = self.reduction == "mean"
        # The loss's gradient is c * (softmax - smoothed target), with c each row's share of
        # grad_loss (0 for ignored rows; a mean divides by the kept rows); lse's is grad_lse *
        # softmax.  The program forms c itself; arguments a call does not read get ``lse``.
        kept = torch.empty(1, dtype=torch.float32, device=device) if mean else lse[:1]
        with on_device(device):
            kernel = self._device_kernel(device)
            if mean:
                kernel.kept_rows(target, kept)
            kernel.forward(logit_rows, target, lse, grad_loss.contiguous().reshape(-1),
                           lse if grad_lse is None else grad_lse.contiguous(), kept, grad_rows,
                           per_row=self.reduction == "none", has_grad_lse=grad_lse is not None, mean=mean)


class _SoftCrossEntropyOp(_CrossEntropyOp):
    """Kernel construction shared by the soft-target cross-entropy ops: a kernel per device and
    targets' dtype (``(device index, dtype)``; a tuning example, which gives shapes alone, takes
    targets of the logits' dtype)."""

    def _build_kernel(self, key: str, *input_shapes: Tuple[int, ...]) -> Kernel:
        launch = input_shapes[0]
        target_dtype = launch[1] if len(launch) == 2 and isinstance(launch[1], torch.dtype) else self.dtype
        return self.kernel_map[key](self.V, self.dtype, target_dtype=target_dtype,
                                    label_smoothing=self.label_smoothing, tune=self.tune)

    def _device_kernel(self, device: torch.device, target_dtype: torch.dtype) -> Kernel:
        key = next(iter(self.kernel_map))
        return self._kernel(key, (device.index, target_dtype))


class SoftCrossEntropyFwdBase(_InplaceBackwardFwd, _SoftCrossEntropyOp):
    """``(loss, lse, mass)`` of logits and target probabilities ``[N, V]`` and optional class weights ``[V]``."""

    def _run_kernel(self, logits: torch.Tensor, probabilities: torch.Tensor,
                    weight: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self.V:  # no classes: PyTorch's lse of nothing (-inf) and its mean of 0 / 0 rows
            return self._reference_in_float32(logits, probabilities, weight)
        rows = logits.shape[0]
        device = logits.device
        loss_rows = torch.empty(rows, dtype=torch.float32, device=device)
        lse = torch.empty(rows, dtype=torch.float32, device=device)
        mass = torch.empty(rows, dtype=torch.float32, device=device)
        if rows:
            with on_device(device):
                kernel = self._device_kernel(device, probabilities.dtype)
                kernel.forward(aligned_rows(logits, self.V), aligned_rows(probabilities, self.V),
                               lse if weight is None else weight.contiguous(), loss_rows, lse, mass,
                               weighted=weight is not None)
        # As PyTorch: the mean is over rows (an empty one is NaN), weighted or not.
        if self.reduction == "none":
            return loss_rows, lse, mass
        return (loss_rows.sum() if self.reduction == "sum" else loss_rows.mean()), lse, mass


class SoftCrossEntropyBwdBase(_LogitsGradient, _SoftCrossEntropyOp):
    """``grad_logits`` from ``grad_loss``, an optional ``grad_lse`` and what the forward saved."""

    def _launch(self, grad_loss: torch.Tensor, grad_lse: Optional[torch.Tensor], logit_rows: torch.Tensor,
                probabilities: torch.Tensor, weight: Optional[torch.Tensor], lse: torch.Tensor, mass: torch.Tensor,
                grad_rows: torch.Tensor) -> None:
        """The gradient of the non-empty ``logit_rows`` into ``grad_rows`` (which may be them)."""
        device = logit_rows.device
        lse = lse.contiguous()
        with on_device(device):
            kernel = self._device_kernel(device, probabilities.dtype)
            # Arguments a call does not read get ``lse``.
            kernel.forward(logit_rows, aligned_rows(probabilities, self.V),
                           lse if weight is None else weight.contiguous(), lse, mass.contiguous(),
                           grad_loss.contiguous().reshape(-1), lse if grad_lse is None else grad_lse.contiguous(),
                           grad_rows, per_row=self.reduction == "none", has_grad_lse=grad_lse is not None,
                           mean=self.reduction == "mean", weighted=weight is not None)
