"""L2 base of the norm family: the CUDA path of normalisations over the last axis.

A norm op commits its hidden size ``N`` (the last axis) at construction; all
leading axes fold into one row axis, which the kernels take as a TileLang
symbolic dimension, so one kernel per device serves every input shape.
Row inputs are read in place when their rows have unit stride and lie a
multiple of the kernels' access width apart from a 16-byte aligned start (a
row slice of a wider tensor, such as one head of a fused projection); any
other layout (a transpose, every other element) is copied once.  Outputs
are contiguous.

* ``NormOp``: RMSNorm forward (and the shared machinery).
* ``LayerNormOp``: LayerNorm forward with optional weight and bias.
* ``FusedAddNormOp``: residual add fused with RMSNorm, two outputs.
* ``NormBwdOp``: RMSNorm and LayerNorm backward (``grad_x`` and the affine gradients).
* ``FusedAddNormBwdOp``: backward of the fused residual add and RMSNorm.
"""

from typing import Optional, Tuple

import torch

from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import aligned_contiguous, aligned_rows, on_device, rows_and_output
from tileops.kernels.sizes import MAX_EXTENT
from tileops.ops.op_base import Op

__all__ = ["NormOp", "LayerNormOp", "FusedAddNormOp", "NormBwdOp", "FusedAddNormBwdOp"]


class NormOp(Op):
    """Shared forward flow of the norm family (``RMSNormFwdOp`` and kin).

    L3 ops set ``N``, ``dtype``, ``eps``, ``tune`` and ``kernel_map``, and call
    ``_run_kernel`` once every check has passed with CUDA tensors.
    """

    N: int
    eps: float
    tune: bool

    # The kernel_map entry this family's forward launches.
    kernel_key = "rms_norm_fwd"

    def _build_kernel(self, key: str, *input_shapes: Tuple[int, ...]) -> Kernel:
        return self.kernel_map[key](self.N, self.dtype, eps=self.eps, tune=self.tune)

    # Rows are symbolic: ``_run_kernel`` names the kernel by ``(device index,)``.
    kernels_keyed_by_launch = True

    def _rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """A row input as the kernels read it: ``(rows, N)`` in place when its memory allows, else a copy."""
        return aligned_rows(tensor, self.N)

    def _run_kernel(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``y`` shaped like ``x``: the kernel on ``x`` viewed as ``(rows, N)``."""
        x_rows, y, y_rows = rows_and_output(x, self.N)
        rows = x_rows.shape[0]
        if rows == 0:
            return y
        weight = aligned_contiguous(weight)
        device = x.device
        kernel = self._kernel(self.kernel_key, (device.index,))
        with on_device(device):
            if rows <= MAX_EXTENT:
                kernel.forward(x_rows, weight, y_rows)
            else:
                # Slices start at a multiple of the row stride, so they stay as
                # aligned as the kernel's vector accesses need.
                for start in range(0, rows, MAX_EXTENT):
                    stop = min(rows, start + MAX_EXTENT)
                    kernel.forward(x_rows[start:stop], weight, y_rows[start:stop])
        return y


def _rows_view(tensor: torch.Tensor, N: int) -> torch.Tensor:
    """A contiguous tensor seen as ``(rows, N)`` (no view needed for 2-D inputs)."""
    return tensor if tensor.ndim == 2 else tensor.view(-1, N)


def _optional_aligned(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if tensor is None else aligned_contiguous(tensor)


class LayerNormOp(NormOp):
    """LayerNorm forward: ``forward(x, weight=None, bias=None)``."""

    kernel_key = "layer_norm_fwd"

    def _run_kernel(self, x: torch.Tensor, weight: Optional[torch.Tensor],
                    bias: Optional[torch.Tensor]) -> torch.Tensor:
        """``y`` shaped like ``x``."""
        x_rows, y, y_rows = rows_and_output(x, self.N)
        if y.numel() == 0:
            return y
        device = x.device
        kernel = self._kernel(self.kernel_key, (device.index,))
        with on_device(device):
            kernel.forward(x_rows, _optional_aligned(weight), _optional_aligned(bias), y_rows)
        return y


class FusedAddNormOp(NormOp):
    """Residual add fused with RMSNorm: ``forward(x, residual, weight) -> (y, residual_out)``."""

    kernel_key = "fused_add_rms_norm_fwd"

    def _run_kernel(self, x: torch.Tensor, residual: torch.Tensor,
                    weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        x_rows, y, y_rows = rows_and_output(x, self.N)
        residual_out = torch.empty_like(y)
        if y.numel() == 0:
            return y, residual_out
        device = x.device
        kernel = self._kernel(self.kernel_key, (device.index,))
        with on_device(device):
            kernel.forward(x_rows, self._rows(residual), aligned_contiguous(weight), y_rows,
                           _rows_view(residual_out, self.N))
        return y, residual_out


class NormBwdOp(NormOp):
    """Backward of RMSNorm or LayerNorm: ``forward(grad_y, x, weight)``.

    Returns ``grad_x`` shaped like ``x``, then the gradients of the affine
    parameters (``grad_weight``; LayerNorm also ``grad_bias``), each ``(N,)``
    and summed over every row.  A LayerNorm ``weight`` may be ``None``.
    """

    @property
    def kernel_key(self) -> str:  # type: ignore[override]
        """The one kernel of a backward op."""
        return next(iter(self.kernel_map))

    def _run_kernel(self, grad_y: torch.Tensor, x: torch.Tensor,
                    weight: Optional[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
        return self._backward_rows((grad_y,), x, _optional_aligned(weight))

    def _backward_rows(self, gradients: Tuple[torch.Tensor, ...], x: torch.Tensor,
                       weight: Optional[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
        """The kernel on the row gradients it takes (each read in place when its memory allows)
        and ``x``: ``grad_x`` shaped like ``x``, then the per-column gradients."""
        device = x.device
        x_rows, grad_x, grad_x_rows = rows_and_output(x, self.N)
        accumulators = self.kernel_map[self.kernel_key].accumulators
        if grad_x.numel() == 0:  # sums over no rows
            return (grad_x, *(x.new_zeros(self.N) for _ in range(accumulators)))
        kernel = self._kernel(self.kernel_key, (device.index,))
        grads = [torch.empty(self.N, dtype=x.dtype, device=device) for _ in range(accumulators)]
        with on_device(device):
            kernel.forward(*(self._rows(g) for g in gradients), x_rows, weight, grad_x_rows, *grads)
        return (grad_x, *grads)


class FusedAddNormBwdOp(NormBwdOp):
    """Backward of ``FusedAddNormOp``: ``forward(grad_y, grad_residual_out, residual_out, weight)``.

    Returns ``grad_x`` shaped like ``residual_out`` and ``grad_weight`` ``(N,)``.  ``x`` and
    ``residual`` reach both outputs only through their sum ``residual_out``, so ``grad_x`` is the
    gradient of each: the normalization's gradient of the sum plus ``grad_residual_out``.
    """

    def _run_kernel(self, grad_y: torch.Tensor, grad_residual_out: torch.Tensor, residual_out: torch.Tensor,
                    weight: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return self._backward_rows((grad_y, grad_residual_out), residual_out, aligned_contiguous(weight))
