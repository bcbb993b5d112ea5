"""L2 base of the norm family: the CUDA path of normalisations over the last axis.

A norm op commits its hidden size ``N`` (the last axis) at construction; all
leading axes fold into one row axis, which the kernels take as a TileLang
symbolic dimension, so one kernel per device serves every input shape.
Inputs that are not contiguous (or not 16-byte aligned) are copied once;
outputs are contiguous.

* ``NormOp``: RMSNorm forward (and the shared machinery).
* ``LayerNormOp``: LayerNorm forward with optional weight and bias.
* ``FusedAddNormOp``: residual add fused with RMSNorm, two outputs.
* ``NormBwdOp``: RMSNorm and LayerNorm backward (``grad_x`` and the affine gradients).
"""

from typing import Hashable, Optional, Tuple

import torch

from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import aligned_contiguous, on_device
from tileops.kernels.sizes import MAX_EXTENT
from tileops.ops.op_base import Op

__all__ = ["NormOp", "LayerNormOp", "FusedAddNormOp", "NormBwdOp"]


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

    def _cache_key(self, *input_shapes: Tuple[int, ...]) -> Hashable:
        # Rows are symbolic in the kernel, so only the device decides which
        # kernel (and which tuned config) serves a call; ``_run_kernel`` passes
        # ``(device index,)`` as the only "shape".
        return input_shapes[0]

    def _run_kernel(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``y`` shaped like ``x``: the kernel on ``x`` viewed as ``(rows, N)``."""
        # Runs on every call: each step below is chosen for its host cost
        # (``empty_like`` of a contiguous tensor is contiguous and several times
        # cheaper than ``torch.empty(shape, ...)``; 2-D inputs need no views).
        x = aligned_contiguous(x)
        y = torch.empty_like(x)
        if x.ndim == 2:
            x_rows, y_rows = x, y
        else:
            x_rows, y_rows = x.view(-1, self.N), y.view(-1, self.N)
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
                # Slices start at a multiple of N elements, so they stay as
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
        x = aligned_contiguous(x)
        y = torch.empty_like(x)
        if x.numel() == 0:
            return y
        device = x.device
        kernel = self._kernel(self.kernel_key, (device.index,))
        with on_device(device):
            kernel.forward(_rows_view(x, self.N), _optional_aligned(weight), _optional_aligned(bias),
                           _rows_view(y, self.N))
        return y


class FusedAddNormOp(NormOp):
    """Residual add fused with RMSNorm: ``forward(x, residual, weight) -> (y, residual_out)``."""

    kernel_key = "fused_add_rms_norm_fwd"

    def _run_kernel(self, x: torch.Tensor, residual: torch.Tensor,
                    weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        x = aligned_contiguous(x)
        residual = aligned_contiguous(residual)
        y = torch.empty_like(x)
        residual_out = torch.empty_like(x)
        if x.numel() == 0:
            return y, residual_out
        device = x.device
        kernel = self._kernel(self.kernel_key, (device.index,))
        with on_device(device):
            kernel.forward(_rows_view(x, self.N), _rows_view(residual, self.N), aligned_contiguous(weight),
                           _rows_view(y, self.N), _rows_view(residual_out, self.N))
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
        x = aligned_contiguous(x)
        grad_y = aligned_contiguous(grad_y)
        device = x.device
        grad_x = torch.empty_like(x)
        accumulators = self.kernel_map[self.kernel_key].accumulators
        if x.numel() == 0:  # sums over no rows
            return (grad_x, *(x.new_zeros(self.N) for _ in range(accumulators)))
        kernel = self._kernel(self.kernel_key, (device.index,))
        grads = [torch.empty(self.N, dtype=x.dtype, device=device) for _ in range(accumulators)]
        with on_device(device):
            kernel.forward(_rows_view(grad_y, self.N), _rows_view(x, self.N), _optional_aligned(weight),
                           _rows_view(grad_x, self.N), *grads)
        return (grad_x, *grads)
