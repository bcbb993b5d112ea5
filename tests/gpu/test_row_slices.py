"""Norm and scan ops on row slices of wider tensors (one head of a fused projection, the residual
half of a packed buffer): the programs read them in place, through their row stride, and give
bitwise what they give on a contiguous copy of the same values (the look-back scan, whose carries
are added in whatever order they were published, within rounding).

Sizes cover every row program: resident and streamed norm rows, a cluster of blocks per row,
single-row backward launches, the plain, split and look-back row scans, and odd widths whose
accesses are narrower than 16 bytes.
"""

import math
from typing import Any, Callable, List, Tuple

import pytest
import torch

import tileops.ops

pytestmark = pytest.mark.gpu

PAD = 64  # elements before and after each slice: keeps row starts 16-byte aligned and strides odd-free


def _slice(rows: Tuple[int, ...], N: int, dtype: torch.dtype, generator: torch.Generator,
           positive: bool = False) -> torch.Tensor:
    wide = torch.randn(*rows, N + 2 * PAD, generator=generator)
    if positive:  # products of values near 1 stay finite over long rows
        wide = 1 + 0.01 * wide
    view = wide.to(device="cuda", dtype=dtype)[..., PAD:PAD + N]
    assert view.is_contiguous() == (math.prod(rows) == 1)  # one row is contiguous at any offset
    return view


def _same_as_contiguous(call: Callable[..., Any], *inputs: torch.Tensor) -> None:
    sliced = call(*inputs)
    copied = call(*(t.contiguous() if t.dim() > 1 else t for t in inputs))
    sliced = sliced if isinstance(sliced, tuple) else (sliced,)
    copied = copied if isinstance(copied, tuple) else (copied,)
    for mine, reference in zip(sliced, copied):
        assert mine.is_contiguous()
        assert torch.equal(mine, reference)


NORM_CASES: List[Tuple[Tuple[int, ...], int, torch.dtype]] = [
    ((4, 300), 4096, torch.bfloat16),   # resident rows
    ((257,), 127, torch.float16),       # odd width: 2-byte accesses
    ((64,), 32768, torch.bfloat16),     # streamed forward; backward split over clusters
    ((3,), 65536, torch.float32),       # streamed
    ((1,), 4096, torch.bfloat16),       # backward: one launch writes the gradients
    ((1100,), 24576, torch.bfloat16),   # backward: many rows over clusters
    ((257,), 4097, torch.float32),      # odd width, scalar accesses
]


@pytest.mark.parametrize("rows, N, dtype", NORM_CASES, ids=lambda v: str(v))
def test_norm_ops_read_row_slices_in_place(rows: Tuple[int, ...], N: int, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(N)
    x, grad_y, residual = (_slice(rows, N, dtype, generator) for _ in range(3))
    weight = torch.randn(N, generator=generator).to(device="cuda", dtype=dtype)
    bias = torch.randn(N, generator=generator).to(device="cuda", dtype=dtype)
    ops = {name: getattr(tileops.ops, name)(N=N, dtype=dtype, eps=1e-5)
           for name in ("RMSNormFwdOp", "RMSNormBwdOp", "LayerNormFwdOp", "LayerNormBwdOp", "FusedAddRMSNormFwdOp")}
    _same_as_contiguous(ops["RMSNormFwdOp"], x, weight)
    _same_as_contiguous(ops["LayerNormFwdOp"], x, weight, bias)
    _same_as_contiguous(ops["FusedAddRMSNormFwdOp"], x, residual, weight)
    _same_as_contiguous(ops["RMSNormBwdOp"], grad_y, x, weight)
    _same_as_contiguous(ops["LayerNormBwdOp"], grad_y, x, weight)
    # And against the float64 reference, so that "the same" is also right.
    expected = torch.nn.functional.rms_norm(x.double(), (N,), weight.double(), 1e-5)
    tolerance = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(ops["RMSNormFwdOp"](x, weight).double(), expected, atol=tolerance, rtol=tolerance)


SCAN_CASES: List[Tuple[Tuple[int, ...], int, torch.dtype]] = [
    ((64,), 262144, torch.bfloat16),    # few long rows: the look-back scan
    ((8,), 65537, torch.float32),       # split row scan, scalar accesses
    ((5, 200), 4096, torch.float16),    # the plain row scan
    ((100,), 3, torch.float32),         # a thread per row
]


@pytest.mark.parametrize("rows, N, dtype", SCAN_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("name", ["CumsumFwdOp", "CumsumBwdOp", "CumprodFwdOp"])
def test_row_scans_read_row_slices_in_place(name: str, rows: Tuple[int, ...], N: int, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(N)
    x = _slice(rows, N, dtype, generator, positive=name == "CumprodFwdOp")
    op = getattr(tileops.ops, name)(N=N, dim=-1, dtype=dtype)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # the split scan: a fixed order of additions
    try:
        _same_as_contiguous(op, x)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    # The look-back scan (few long rows) adds whichever carries were published when a tile
    # looked back, so its last bits may differ run to run: within two units of the largest value.
    mine, reference = op(x).float(), op(x.contiguous()).float()
    tolerance = 2 * torch.finfo(dtype).eps * reference.abs().max().item()
    torch.testing.assert_close(mine, reference, rtol=0, atol=tolerance)
