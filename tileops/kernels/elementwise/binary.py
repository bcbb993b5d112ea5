"""Binary elementwise ops with PyTorch broadcasting: add and multiply.

``forward(a, b, out)`` takes one of two layouts:

* **flat**: ``a``, ``b`` and ``out`` 1-D and contiguous, of one length
  (operands of one shape);
* **broadcast**: ``(D0, D1, D2)`` views (the op base folds any broadcast of
  any rank into at most three axes).  ``out`` has unit inner stride; each
  operand has inner stride 1, or 0 when it is constant along the innermost
  axis, and any outer strides (0 for a broadcast axis).  So a bias row, a
  per-row scale, a slice of a wider tensor or a scalar are read in place,
  never copied.

Extents and strides are TileLang symbolic values: one compiled program per
(layout, access width, operand pattern) serves every shape.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from tileops.kernels.elementwise import functions
from tileops.kernels.elementwise.base import (
    FLAT,
    ElementwiseKernel,
    ProgramSpec,
    launch_slices,
    max_vector,
    program_shape,
)
from tileops.kernels.elementwise.programs import MAX_GRID_YZ, MAX_LAUNCH_ELEMENTS, broadcast_program, flat_program
from tileops.kernels.kernel_base import torch_dtype_to_tl
from tileops.kernels.launch import ALIGNMENT, widest_access

__all__ = ["BroadcastKernel", "AddFwdKernel", "MulFwdKernel", "launch_boxes"]

BROADCAST = "broadcast"
TUNING_ROW_ELEMENTS = 4096

# (start, stop) along each of the three axes of one launch.
Box = Tuple[Tuple[int, int], Tuple[int, int], Tuple[int, int]]


def launch_boxes(D0: int, D1: int, D2: int, limit: int = MAX_LAUNCH_ELEMENTS) -> Iterator[Box]:
    """Cut ``(D0, D1, D2)`` into boxes of at most ``limit`` elements, cutting outer axes first."""
    if D1 * D2 <= limit:
        step = limit // (D1 * D2)
        for start in range(0, D0, step):
            yield (start, min(D0, start + step)), (0, D1), (0, D2)
        return
    for i0 in range(D0):
        if D2 <= limit:
            step = limit // D2
            for start in range(0, D1, step):
                yield (i0, i0 + 1), (start, min(D1, start + step)), (0, D2)
        else:
            for i1 in range(D1):
                for piece in launch_slices(D2, limit):
                    yield (i0, i0 + 1), (i1, i1 + 1), (piece.start, piece.stop)


def _stored_bytes(operand: torch.Tensor) -> int:
    """The bytes of memory a broadcast view reads: a bias row repeated over every row counts once."""
    return math.prod(n for n, stride in zip(operand.shape, operand.stride()) if stride != 0) * operand.element_size()


def _varies_inner(operand: torch.Tensor) -> bool:
    stride = operand.stride(2)
    if stride not in (0, 1):
        raise ValueError(f"broadcast operands need inner stride 0 or 1, got strides {operand.stride()}")
    return stride == 1


class BroadcastKernel(ElementwiseKernel):
    """``out = f(a, b)`` on flat or broadcast ``(D0, D1, D2)`` layouts (see the module docstring)."""

    wide_blocks = True  # an add or a product per element
    # Where memory is fast, a wide block's single load a thread leaves too few bytes in flight
    # for an SM (H200, bf16, median of 7 rounds in turns, µs, threads x loads 512 x 1 / 512 x 2
    # / 256 x 2 / torch.compile: a row scaled by a column 8192 x 16384 137.1 / 125.2 / 125.6 /
    # 126.5, a bias added 130.7 / 124.6 / 124.9 / 126.0).  256 x 2 keeps the block tile of
    # 512 x 1, so rows of 4096 still take the ``rows`` program.
    fast_memory_threads = 256
    fast_memory_unroll = 2

    def build_program(self, spec: ProgramSpec, config: Dict[str, Any]) -> Any:
        dtype = torch_dtype_to_tl(self.dtype)
        if spec[0] == FLAT:
            return flat_program(self.pointwise, dtype, vector=spec[1], **program_shape(config))
        if spec[0] == BROADCAST:
            _, vector, a_inner, b_inner, rows = spec
            return broadcast_program(self.pointwise, dtype, vector=vector, a_inner=a_inner, b_inner=b_inner,
                                     rows=rows, **program_shape(config))
        raise ValueError(f"{type(self).__name__}: unknown program {spec!r}")

    def typical_specs(self) -> List[ProgramSpec]:
        """Operands of one shape, and a row broadcast against a matrix (a bias), with rows of any
        width and of whole tiles."""
        vector = max_vector(self.dtype)
        return [(FLAT, vector), (BROADCAST, vector, True, True, False), (BROADCAST, vector, True, True, True)]

    def forward(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write ``f(a, b)`` into ``out`` and return it (layouts in the module docstring)."""
        if out.dim() == 1:
            self._flat(a, b, out)
        elif out.dim() == 3:
            self._broadcast(a, b, out)
        else:
            raise ValueError(f"{type(self).__name__}: expects 1-D or 3-D tensors, got out of shape {tuple(out.shape)}")
        return out

    def program_for(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> ProgramSpec:
        """The program ``forward(a, b, out)`` launches (tensors may live on any device)."""
        if out.dim() == 1:
            return FLAT, self.flat_vector((a, b, out))
        a_inner, b_inner = _varies_inner(a), _varies_inner(b)
        vector = max_vector(self.dtype)
        while out.shape[2] % vector:
            vector //= 2
        for tensor, varies in ((a, a_inner), (b, b_inner), (out, True)):
            if varies:
                vector = widest_access(tensor, tensor.stride(0) | tensor.stride(1), vector)
        return BROADCAST, vector, a_inner, b_inner, self._whole_tile_rows(out.shape, vector)

    def _whole_tile_rows(self, shape: Sequence[int], vector: int) -> bool:
        """Whether ``(D0, D1, D2)`` launches the ``rows`` program: every row a whole number of the
        configured block tiles (so also of a small call's narrower ones) and a grid that holds the rows."""
        D0, D1, D2 = shape
        tile = self.config["threads"] * self.config["unroll"] * vector
        return (0 < D2 <= MAX_LAUNCH_ELEMENTS and D2 % tile == 0 and 0 < D0 <= MAX_GRID_YZ
                and 0 < D1 <= MAX_GRID_YZ)

    def _flat(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        length = out.numel()
        launch = self.flat_launcher((a, b, out))
        if length <= MAX_LAUNCH_ELEMENTS:
            launch(a, b, out)
            return
        for piece in launch_slices(length, MAX_LAUNCH_ELEMENTS):
            launch(a[piece], b[piece], out[piece])

    def _broadcast(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        key = (a.stride(), b.stride(), out.shape, out.stride(), a.data_ptr() % ALIGNMENT, b.data_ptr() % ALIGNMENT,
               out.data_ptr() % ALIGNMENT, out.device.index)
        launch, a_inner, b_inner = self._launch_plans.get(key, lambda: self._broadcast_plan(a, b, out))
        # An operand constant along the innermost axis is passed as its (D0, D1) face.
        a_arg = a if a_inner else a[:, :, 0]
        b_arg = b if b_inner else b[:, :, 0]
        if out.numel() <= MAX_LAUNCH_ELEMENTS:
            launch(a_arg, b_arg, out)
            return
        for (s0, e0), (s1, e1), (s2, e2) in launch_boxes(*out.shape, MAX_LAUNCH_ELEMENTS):
            launch(a_arg[s0:e0, s1:e1, s2:e2] if a_inner else a_arg[s0:e0, s1:e1],
                   b_arg[s0:e0, s1:e1, s2:e2] if b_inner else b_arg[s0:e0, s1:e1],
                   out[s0:e0, s1:e1, s2:e2])

    def _broadcast_plan(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> Tuple[Any, bool, bool]:
        """(launcher, whether a and b vary along the innermost axis) of every call with this geometry."""
        spec = self.program_for(a, b, out)
        _, vector, a_inner, b_inner, _ = spec
        accesses = out.shape[0] * out.shape[1] * (out.shape[2] // vector)
        input_bytes = sum(_stored_bytes(operand) for operand, inner in ((a, a_inner), (b, b_inner)) if inner)
        return self.launcher(spec, accesses, out.device, input_bytes), a_inner, b_inner

    def tuning_inputs(self, rows: Optional[int] = None) -> Tuple[torch.Tensor, ...]:
        """Random flat operands of ``rows * 4096`` elements and a preallocated output."""
        length = (self.tuning_rows if rows is None else rows) * TUNING_ROW_ELEMENTS
        a = torch.randn(length, device="cuda", dtype=self.dtype)
        b = torch.randn(length, device="cuda", dtype=self.dtype)
        return a, b, torch.empty_like(a)


class AddFwdKernel(BroadcastKernel):
    """``y = a + b``; ``forward(a, b, out)``."""

    function = functions.ADD


class MulFwdKernel(BroadcastKernel):
    """``y = a * b``; ``forward(a, b, out)``."""

    function = functions.MUL
