"""Gated activations of GLU MLPs: ``y = act(x[..., :H]) * x[..., H:]`` and their backward.

``N = 2H`` (the width of ``x``'s last axis) is fixed at construction; rows are
a TileLang symbolic dimension, so one compiled program per access width
serves every row count.  Tensors are 2-D row views whose rows may be strided
(a slice of a wider tensor needs no copy) but whose elements are contiguous:

* forward: ``forward(x (R, N), out (R, H))``
* backward: ``forward(grad_y (R, H), x (R, N), out (R, N))``, writing
  ``[grad_y * up * act'(gate), grad_y * act(gate)]``.

The access width is the widest power of two (up to 16 bytes) that divides
``H`` and keeps every address and row stride of the call aligned.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from tileops.kernels.elementwise import functions
from tileops.kernels.elementwise.base import ElementwiseKernel, ProgramSpec, max_vector, program_shape
from tileops.kernels.launch import access_alignment, widest_access
from tileops.kernels.elementwise.functions import PointwiseFn
from tileops.kernels.elementwise.programs import MAX_LAUNCH_ELEMENTS, gated_program
from tileops.kernels.kernel_base import torch_dtype_to_tl

__all__ = [
    "GatedKernel", "SiluAndMulFwdKernel", "SiluAndMulBwdKernel", "GeluAndMulFwdKernel", "GeluAndMulBwdKernel",
    "gated_vector",
]

GATED = "gated"


def gated_vector(H: int, dtype: torch.dtype) -> int:
    """The widest access (elements) that divides ``H``: no vector straddles two rows or the two halves."""
    vector = max_vector(dtype)
    while H % vector:
        vector //= 2
    return vector


class GatedKernel(ElementwiseKernel):
    """A gated activation over rows of width ``N = 2H`` (see the module docstring).

    Args:
        N: width of ``x``'s last axis (even), fixed at construction.
        dtype: dtype of every tensor (float16, bfloat16, float32).
        config: explicit ``{"threads", "unroll"}`` (keys may be partial).
        tune: pick the fastest of ``autotune_configs`` on the current GPU.
    """

    op_params = ("N",)

    def __init__(self, N: int, dtype: torch.dtype, *, config: Optional[Dict[str, Any]] = None,
                 tune: bool = False) -> None:
        if N < 2 or N % 2:
            raise ValueError(f"{type(self).__name__}: N (2H) must be even and positive, got {N}")
        if N > MAX_LAUNCH_ELEMENTS:
            raise ValueError(f"{type(self).__name__}: rows of {N} elements exceed one launch ({MAX_LAUNCH_ELEMENTS})")
        self.N = int(N)
        super().__init__(dtype, config=config, tune=tune)

    @property
    def H(self) -> int:  # noqa: N802 - the manifest's name for half the row
        return self.N // 2

    @property
    def backward(self) -> bool:
        return self.pointwise.arity == 3

    def build_program(self, spec: ProgramSpec, config: Dict[str, Any]) -> Any:
        layout, vector = spec
        if layout != GATED:
            raise ValueError(f"{type(self).__name__}: unknown program {spec!r}")
        return gated_program(self.pointwise, self.N, torch_dtype_to_tl(self.dtype), vector=vector,
                             **program_shape(config))

    def typical_specs(self) -> List[ProgramSpec]:
        return [(GATED, gated_vector(self.H, self.dtype))]

    def call_vector(self, tensors: Tuple[torch.Tensor, ...]) -> int:
        """The access width these 2-D row views allow."""
        vector = gated_vector(self.H, self.dtype)
        for tensor in tensors:
            vector = widest_access(tensor, tensor.stride(0), vector)
        return vector

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        """Write the result for ``tensors = (*inputs, out)`` (2-D row views) into ``out`` and return it."""
        self._check_count(tensors, 3 if self.backward else 2)
        out = tensors[-1]
        rows = out.shape[0]
        # The access width follows the addresses and row strides: the launcher is remembered
        # per (rows, their alignment, device).
        launch = self._launch_plans.get((GATED, rows, access_alignment(tensors, (0,)), out.get_device()),
                                        lambda: self._launcher_for(tensors))
        rows_per_launch = MAX_LAUNCH_ELEMENTS // self.N
        if rows <= rows_per_launch:
            launch(*tensors)
        else:
            for start in range(0, rows, rows_per_launch):
                launch(*(t[start:start + rows_per_launch] for t in tensors))
        return out

    def _launcher_for(self, tensors: Tuple[torch.Tensor, ...]) -> Any:
        vector = self.call_vector(tensors)
        out = tensors[-1]
        return self.launcher((GATED, vector), out.shape[0] * (self.H // vector), out.device)

    def tuning_inputs(self, rows: Optional[int] = None) -> Tuple[torch.Tensor, ...]:
        """Random ``x`` (and ``grad_y``) of ``rows`` rows and a preallocated output."""
        rows = self.tuning_rows if rows is None else rows
        x = torch.randn(rows, self.N, device="cuda", dtype=self.dtype)
        if not self.backward:
            return x, torch.empty(rows, self.H, device="cuda", dtype=self.dtype)
        grad_y = torch.randn(rows, self.H, device="cuda", dtype=self.dtype)
        return grad_y, x, torch.empty_like(x)


class SiluAndMulFwdKernel(GatedKernel):
    """``y = silu(gate) * up``; ``forward(x, out)``."""

    function = functions.SILU_AND_MUL
    wide_blocks = True  # see GeluAndMulFwdKernel


class SiluAndMulBwdKernel(GatedKernel):
    """``grad_x = [grad_y * up * silu'(gate), grad_y * silu(gate)]``; ``forward(grad_y, x, out)``."""

    function = functions.SILU_AND_MUL_BWD


class _GeluAndMulKernel(GatedKernel):
    """A gated GELU kernel for one approximation (``none``: erf, or ``tanh``)."""

    op_params = ("N", "approximate")
    # ``sm_threads`` of the erf form (see ``ElementwiseKernel.sm_threads``).
    erf_sm_threads = 0
    # Whether the tanh form takes ``ElementwiseKernel.wide_blocks``.
    tanh_wide_blocks = False
    # Whether the erf form takes ``ElementwiseKernel.hinted_loads``.
    erf_hinted_loads = True

    def __init__(self, N: int, dtype: torch.dtype, *, approximate: str = "none",
                 config: Optional[Dict[str, Any]] = None, tune: bool = False) -> None:
        self.approximate = approximate
        self._function = self._function_for(approximate, dtype.itemsize == 2)
        self.sm_threads = self.erf_sm_threads if approximate == "none" else 0
        self.wide_blocks = self.tanh_wide_blocks and approximate == "tanh"
        self.hinted_loads = self.erf_hinted_loads or approximate != "none"
        super().__init__(N, dtype, config=config, tune=tune)

    @staticmethod
    def _function_for(approximate: str, half_precision: bool) -> PointwiseFn:
        raise NotImplementedError

    @property
    def pointwise(self) -> PointwiseFn:
        return self._function


class GeluAndMulFwdKernel(_GeluAndMulKernel):
    """``y = gelu(gate) * up``; ``forward(x, out)``."""

    # ``wide_blocks`` of the tanh form: its forward, and SiLU's, ran one load a thread in 512-thread
    # blocks faster than two in 128 (H100, bf16 16384 x 22016, median of 7 rounds in turns, µs,
    # 128 x 2 / 512 x 1 / torch.compile: tanh GELU 350.8 / 349.8 / 350.2, SiLU 350.5 / 349.7 /
    # 350.0), while the erf form's heavier math lost 10 % (349.8 -> 383.5).
    tanh_wide_blocks = True

    @staticmethod
    def _function_for(approximate: str, half_precision: bool) -> PointwiseFn:
        return functions.gelu_and_mul_fn(approximate, half_precision)


class GeluAndMulBwdKernel(_GeluAndMulKernel):
    """``grad_x = [grad_y * up * gelu'(gate), grad_y * gelu(gate)]``; ``forward(grad_y, x, out)``."""

    # H100, bf16 16384 x 11008, µs (median of 5 rounds in turns; torch.compile 1216.5): no cap (96
    # registers) 629.4, 1024 threads an SM 591.1 (64 registers), 1536 654.0 and 2048 824.5 (spills).
    erf_sm_threads = 1024
    # Under that cap the hinted loads' registers spill (16 bytes in bf16, 8 in fp16; sm_90 ptxas).
    erf_hinted_loads = False

    @staticmethod
    def _function_for(approximate: str, half_precision: bool) -> PointwiseFn:
        return functions.gelu_and_mul_bwd_fn(approximate, half_precision)
