"""Activations and their derivatives over flat tensors: relu, sigmoid, silu, gelu, exp.

Each kernel applies its ``PointwiseFn`` with the flat program: ``forward(x,
out)`` for a forward, ``forward(grad_y, x, out)`` for a backward, every
tensor 1-D and contiguous, of one length.  The length is symbolic, so one
compiled program per dtype (and access width) serves every shape.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from tileops.kernels.elementwise import functions
from tileops.kernels.elementwise.base import (
    FLAT, ElementwiseKernel, ProgramSpec, launch_slices, max_vector, program_shape,
)
from tileops.kernels.elementwise.functions import PointwiseFn
from tileops.kernels.elementwise.programs import MAX_LAUNCH_ELEMENTS, flat_program
from tileops.kernels.kernel_base import torch_dtype_to_tl

__all__ = [
    "MapKernel", "LightMapKernel", "ReluFwdKernel", "SigmoidFwdKernel", "SiluFwdKernel", "SiluBwdKernel",
    "GeluFwdKernel", "GeluBwdKernel", "ExpFwdKernel",
]

# Elements per row of the tensors the tuner times on (rows default to ``tuning_rows``).
TUNING_ROW_ELEMENTS = 4096


class MapKernel(ElementwiseKernel):
    """``out[i] = f(*inputs[i])`` over 1-D contiguous tensors of one length (see the module docstring)."""

    def build_program(self, spec: ProgramSpec, config: Dict[str, Any]) -> Any:
        layout, vector = spec
        if layout != FLAT:
            raise ValueError(f"{type(self).__name__}: unknown program {spec!r}")
        return flat_program(self.pointwise, torch_dtype_to_tl(self.dtype), vector=vector, **program_shape(config))

    def typical_specs(self) -> List[ProgramSpec]:
        return [(FLAT, max_vector(self.dtype))]

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        """Write ``f(*inputs)`` into ``out`` for ``tensors = (*inputs, out)`` and return ``out``."""
        self._check_count(tensors, self.pointwise.arity + 1)
        out = tensors[-1]
        length = out.numel()
        launch = self.flat_launcher(tensors)
        if length <= MAX_LAUNCH_ELEMENTS:
            launch(*tensors)
        else:
            for piece in launch_slices(length, MAX_LAUNCH_ELEMENTS):
                launch(*(t[piece] for t in tensors))
        return out

    def tuning_inputs(self, rows: Optional[int] = None) -> Tuple[torch.Tensor, ...]:
        """Random flat inputs of ``rows * 4096`` elements and a preallocated output."""
        length = (self.tuning_rows if rows is None else rows) * TUNING_ROW_ELEMENTS
        inputs = [torch.randn(length, device="cuda", dtype=self.dtype) for _ in range(self.pointwise.arity)]
        return (*inputs, torch.empty_like(inputs[0]))


class LightMapKernel(MapKernel):
    """A map whose math per element is light (a compare, an exponential and a division at
    most): half-precision calls take wide blocks of one load a thread, or on devices with fast
    memory (``device_traits``) 128-thread blocks.  (H200, bf16 8192 x 16384, median of 7 rounds
    in turns, µs, 512 / 256 / 128 threads of one load, then 512 threads of two, torch.compile:
    sigmoid 131.1 / 126.3 / 124.8 / 125.4, 126.3; exp 131.0 / 126.4 / 124.9 / 125.4, 126.5.)"""

    wide_blocks = True
    fast_memory_threads = 128
    fast_memory_unroll = 1


class ReluFwdKernel(LightMapKernel):
    """``y = max(x, 0)``; ``forward(x, out)``."""

    function = functions.RELU


class SigmoidFwdKernel(LightMapKernel):
    """``y = 1 / (1 + exp(-x))``; ``forward(x, out)``."""

    function = functions.SIGMOID


class SiluFwdKernel(LightMapKernel):
    """``y = x * sigmoid(x)``; ``forward(x, out)``."""

    function = functions.SILU


class SiluBwdKernel(MapKernel):
    """``grad_x = grad_y * silu'(x)``; ``forward(grad_y, x, out)``."""

    function = functions.SILU_BWD


class ExpFwdKernel(LightMapKernel):
    """``y = exp(x)``; ``forward(x, out)``."""

    function = functions.EXP


class _GeluKernel(MapKernel):
    """A GELU kernel for one approximation (``none``: erf, or ``tanh``)."""

    op_params = ("approximate",)

    # ``sm_threads`` of the erf form (see ``ElementwiseKernel.sm_threads``); the tanh form gained nothing.
    erf_sm_threads = 0

    def __init__(self, dtype: torch.dtype, *, approximate: str = "none", config: Optional[Dict[str, Any]] = None,
                 tune: bool = False) -> None:
        self.approximate = approximate
        self._function = self._function_for(approximate, dtype.itemsize == 2)
        self.sm_threads = self.erf_sm_threads if approximate == "none" else 0
        super().__init__(dtype, config=config, tune=tune)

    @staticmethod
    def _function_for(approximate: str, half_precision: bool) -> PointwiseFn:
        raise NotImplementedError

    @property
    def pointwise(self) -> PointwiseFn:
        return self._function


class GeluFwdKernel(_GeluKernel):
    """``y = gelu(x)``; ``forward(x, out)``."""

    # H100, bf16 8192 x 16384, µs (median of 5 rounds in turns; torch.compile 203.4): no cap 189.3,
    # 1024 threads an SM 189.1, 1536 184.1, 2048 179.6 (32 registers, no spills).
    erf_sm_threads = 2048

    @staticmethod
    def _function_for(approximate: str, half_precision: bool) -> PointwiseFn:
        return functions.gelu_fn(approximate, half_precision)


class GeluBwdKernel(_GeluKernel):
    """``grad_x = grad_y * gelu'(x)``; ``forward(grad_y, x, out)``."""

    # H100, bf16 8192 x 16384, µs (as for the forward; torch.compile 283.7, eager 264.0): no cap
    # (80 registers) 274.1, 1024 threads an SM 267.9, 1536 262.4, 2048 265.2.
    erf_sm_threads = 1536

    @staticmethod
    def _function_for(approximate: str, half_precision: bool) -> PointwiseFn:
        return functions.gelu_bwd_fn(approximate, half_precision)
