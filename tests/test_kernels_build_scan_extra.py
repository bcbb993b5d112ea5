"""CPU checks of the reverse (cumsum gradient) and product (cumprod) scans.

Builds for sm_90 (nvcc, no GPU), the programs of every candidate config (TIR
only), the launch plan, and the scan family base and ops on CPU tensors.
TileLang caches compiled programs on disk, so only the first run pays for
compiling.
"""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

import pytest
import torch

from tileops.kernels.kernel_base import SM90_BUILD_TARGET, Kernel
from tileops.kernels.scan.cumprod import CumprodFwdKernel
from tileops.kernels.scan.cumsum import (
    COLUMN_SCAN,
    COLUMN_SUMS,
    LOOKBACK_ROW_SCAN,
    ROW_SCAN,
    SEGMENT_SUMS,
    SPLIT_COLUMN_SCAN,
    SPLIT_ROW_SCAN,
    CumsumBwdKernel,
    CumsumFwdKernel,
    _build_program,
    cumsum_autotune_configs,
)
from tileops.ops.scan.base import ScanOp
from tests.toolchain import divisions_at_accesses, needs_nvcc


def _global_symbols(source: str) -> List[str]:
    return re.findall(r"__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(", source)


# ---- builds for sm_90 ------------------------------------------------------------------------


@needs_nvcc
def test_reverse_scan_builds_every_program_for_sm90() -> None:
    kernel = CumsumBwdKernel(65537, torch.bfloat16)
    built = kernel.build_all_for_sm90(inner=5)
    assert set(built) == {ROW_SCAN, SEGMENT_SUMS, SPLIT_ROW_SCAN, f"{COLUMN_SCAN}_8"}
    lookback = CumsumBwdKernel(65544, torch.float16, config={"lookback": 1})
    built["lookback"] = lookback.compile_program(LOOKBACK_ROW_SCAN, target=SM90_BUILD_TARGET)
    for name, compiled in built.items():
        source = compiled.get_kernel_source()
        # 64-bit offsets (tensors over 2**31 elements); a symbol that tells profiles it is the reverse scan.
        assert "(int64_t)" in source
        assert not divisions_at_accesses(source), name
        assert all(symbol.startswith("cumsum_reverse_") for symbol in _global_symbols(source)), name


@needs_nvcc
def test_product_scan_builds_for_sm90() -> None:
    # Few long rows take the look-back scan; with it off, the split scan.
    kernel = CumprodFwdKernel(262144, torch.float32)
    built = {name: kernel.compile_program(name, target=SM90_BUILD_TARGET) for name in kernel.programs_for((3, 262144))}
    built[f"{COLUMN_SCAN}_32x4"] = kernel.compile_program(f"{COLUMN_SCAN}_32x4", target=SM90_BUILD_TARGET)
    assert set(built) == {LOOKBACK_ROW_SCAN, f"{COLUMN_SCAN}_32x4"}
    half = CumprodFwdKernel(262144, torch.bfloat16, config={"lookback": 0})
    assert half.programs_for((3, 262144)) == [SEGMENT_SUMS, SPLIT_ROW_SCAN]
    built.update({name: half.compile_program(name, target=SM90_BUILD_TARGET) for name in half.programs_for((3, 262144))})
    for compiled in built.values():
        source = compiled.get_kernel_source()
        assert all(symbol.startswith("cumprod_") for symbol in _global_symbols(source))
        assert " * " in source


@needs_nvcc
def test_reverse_row_scan_keeps_16_byte_accesses() -> None:
    """Rows of whole vectors: every global load and store of the reverse scan is a 16-byte vector."""
    source = CumsumBwdKernel(4096, torch.bfloat16).build_for_sm90().get_kernel_source()
    assert "*(uint4*)(X" in source and "*(uint4*)(Y" in source
    assert "X[" not in source and "Y[" not in source


# How the generated CUDA trades float32 results: across a warp, or between neighbouring lanes.
WARP_TRADE = "__shfl_sync((uint)4294967295, vals["
PAIR_TRADE = "__shfl_xor_sync((uint)4294967295, condval, 1"


@needs_nvcc
@pytest.mark.parametrize("N, program, trade", [
    (4096, ROW_SCAN, WARP_TRADE),  # two chunks a row
    (64, ROW_SCAN, PAIR_TRADE),  # rows of eight threads
    (262144, LOOKBACK_ROW_SCAN, WARP_TRADE),
    (32768, ROW_SCAN, None),  # sixteen chunks a row: direct stores
], ids=str)
def test_float32_results_of_half_rows_are_traded_into_whole_sector_stores(N: int, program: str,
                                                                          trade: object) -> None:
    """bf16 in, float32 out: the lanes trade results where that measured faster, and every store
    of the output stays a 16-byte vector; a bf16 output trades nothing."""
    source = CumsumFwdKernel(N, torch.bfloat16, out_dtype=torch.float32).build_all_for_sm90()[program]
    source = source.get_kernel_source()
    body = source[source.index("__global__"):]
    if trade is None:
        assert WARP_TRADE not in body and "__shfl_xor_sync" not in body
    else:
        assert trade in body
    assert "*(float4*)(Y" in body and not re.search(r"\bY\[", body)
    plain = CumsumFwdKernel(N, torch.bfloat16).build_all_for_sm90()[program].get_kernel_source()
    assert WARP_TRADE not in plain and PAIR_TRADE not in plain


@needs_nvcc
def test_forward_program_keeps_its_symbol() -> None:
    source = CumsumFwdKernel(127, torch.float16).build_for_sm90().get_kernel_source()
    assert _global_symbols(source) == ["cumsum_row_scan_kernel"] * len(_global_symbols(source))


# ---- programs of every candidate config (TIR only, no nvcc) --------------------------------------


@pytest.mark.parametrize("combine, reverse", [("add", True), ("mul", False), ("mul", True)])
@pytest.mark.parametrize("N", [3, 65537])
def test_every_candidate_builds_its_programs(N: int, combine: str, reverse: bool) -> None:
    pytest.importorskip("tilelang")
    for config in cumsum_autotune_configs(N, torch.bfloat16):
        names = set(CumsumFwdKernel(N, torch.bfloat16, config=config).program_names(inner=33))
        names |= set(CumsumFwdKernel(N, torch.bfloat16, config=config).program_names(inner=128))
        names |= set(CumsumFwdKernel(N, torch.bfloat16, config={**config, "lookback": 1}).program_names())
        for name in names:
            assert _build_program(name, N, "bfloat16", config, combine=combine, reverse=reverse) is not None


def test_unknown_combine_is_rejected() -> None:
    pytest.importorskip("tilelang")
    with pytest.raises(ValueError, match="combine must be one of"):
        _build_program(ROW_SCAN, 16, "float32", CumsumFwdKernel(16, torch.float32).config, combine="max")


# ---- kernels: operator, direction, launch plan, tuning identity ---------------------------------


def test_kernels_share_configs_and_differ_in_operator_and_direction() -> None:
    kernels = [cls(4096, torch.bfloat16) for cls in (CumsumFwdKernel, CumsumBwdKernel, CumprodFwdKernel)]
    assert [(k.combine, k.reverse) for k in kernels] == [("add", False), ("add", True), ("mul", False)]
    assert kernels[0].config == kernels[1].config == kernels[2].config


def test_tuned_configs_are_kept_apart_per_kernel() -> None:
    from tileops.tuning.kernels import kernel_invocation

    keys = {kernel_invocation(cls(4096, torch.bfloat16)).op_id for cls in (CumsumFwdKernel, CumsumBwdKernel, CumprodFwdKernel)}
    assert len(keys) == 3


@pytest.mark.parametrize(
    "N, shape, expected",
    [
        (4096, (32768, 4096), [ROW_SCAN]),
        (262144, (64, 262144), [LOOKBACK_ROW_SCAN]),
        (262144, (4096, 262144), [ROW_SCAN]),
        (4096, (64, 4096, 64), [f"{COLUMN_SCAN}_4x8"]),  # the tile narrowed for 128 blocks
        (32768, (4, 32768, 256), [f"{COLUMN_SUMS}_4x8", f"{SPLIT_COLUMN_SCAN}_4x8"]),  # the axis cut
        (4096, (8, 4096, 4096), [f"{COLUMN_SCAN}_32x8"]),
        (65537, (1, 65537, 3), [SEGMENT_SUMS, SPLIT_ROW_SCAN]),  # few columns: transposed rows
        (4097, (3, 4097, 1), [ROW_SCAN]),
    ],
)
def test_programs_for_follows_the_launch_plan(N: int, shape: Tuple[int, ...], expected: List[str]) -> None:
    assert CumsumBwdKernel(N, torch.bfloat16).programs_for(shape) == expected


@pytest.mark.parametrize(
    "shape, segments",
    [((64, 4096, 64), 1), ((4, 32768, 256), 8)],  # a narrowed tile; the axis cut in 8
)
def test_column_forward_launches_its_plan_and_returns_out(shape: Tuple[int, ...], segments: int) -> None:
    outer, N, inner = shape
    kernel = CumsumFwdKernel(N, torch.bfloat16)
    launches: List[Tuple[str, Tuple[Tuple[int, ...], ...]]] = []
    kernel._launcher = lambda name: lambda *args: launches.append((name, tuple(tuple(a.shape) for a in args)))
    x = torch.zeros(shape, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    assert kernel.forward(x, out) is out
    assert [name for name, _ in launches] == kernel.programs_for(shape)
    view = (outer, N, inner // 8, 8)
    partial = (outer, segments, inner // 8, 8)
    expected = [(view, view)] if segments == 1 else [(view, partial), (view, partial, view)]
    assert [args for _, args in launches] == expected


# ---- the family base and the ops on CPU tensors ---------------------------------------------------


class _ReverseRecordingKernel(Kernel):
    """A reverse cumsum in PyTorch that records each launch's argument shapes."""

    launches: List[Tuple[Tuple[int, ...], ...]] = []

    def __init__(self, N: int, dtype: torch.dtype, **params: object) -> None:
        self.N = N
        super().__init__(dtype, config={})

    @property
    def default_config(self) -> Dict[str, int]:
        return {}

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> None:
        type(self).launches.append((tuple(x.shape), tuple(out.shape)))
        out.copy_(x.float().flip(1).cumsum(1).flip(1))


class _ReverseScan(ScanOp):
    def __init__(self, N: int, dim: int) -> None:
        super().__init__()
        self.N, self.dim, self.dtype, self.tune = N, dim, torch.float32, False
        self.kernel_map = {"cumsum_bwd": _ReverseRecordingKernel}


def test_scan_base_launches_the_ops_own_kernel() -> None:
    _ReverseRecordingKernel.launches = []
    op = _ReverseScan(5, 1)
    assert op.kernel_key == "cumsum_bwd"
    x = torch.randn(4, 5, 3)
    torch.testing.assert_close(op._run_kernel(x), x.flip(1).cumsum(1).flip(1))
    assert _ReverseRecordingKernel.launches == [((4, 5, 3), (4, 5, 3))]


@pytest.mark.parametrize("shape", [(3, 1), (4097, 1)])
def test_scan_base_scans_a_first_axis_with_one_column_as_a_row(shape: Tuple[int, ...]) -> None:
    _ReverseRecordingKernel.launches = []
    op = _ReverseScan(shape[0], 0)
    x = torch.randn(shape)
    torch.testing.assert_close(op._run_kernel(x), x.flip(0).cumsum(0).flip(0))
    assert _ReverseRecordingKernel.launches == [((1, shape[0]), (1, shape[0]))]


def test_ops_pick_their_kernels() -> None:
    from tileops.ops import CumprodFwdOp, CumsumBwdOp, CumsumFwdOp

    for cls, key, kernel in (
        (CumsumFwdOp, "cumsum_fwd", CumsumFwdKernel),
        (CumsumBwdOp, "cumsum_bwd", CumsumBwdKernel),
        (CumprodFwdOp, "cumprod_fwd", CumprodFwdKernel),
    ):
        op = cls(N=7, dtype=torch.bfloat16, dim=0)
        assert op.kernel_key == key and op.kernel_map[key] is kernel


def test_cumsum_backward_on_cpu_is_the_reverse_cumsum() -> None:
    from tileops.ops import CumsumFwdOp

    x = torch.randn(3, 7, 4, dtype=torch.float32, requires_grad=True)
    grad_y = torch.randn(3, 7, 4)
    op = CumsumFwdOp(N=7, dtype=torch.float32, dim=1)
    op(x).backward(grad_y)
    assert op.backward_op().last_backend == "reference"
    torch.testing.assert_close(x.grad, grad_y.flip(1).cumsum(1).flip(1))


def test_cumprod_gradient_is_autograd_of_the_reference() -> None:
    from tileops.ops import CumprodFwdOp

    x = torch.rand(4, 6, requires_grad=True)
    grad_y = torch.randn(4, 6)
    expected = x.detach().double().requires_grad_()
    torch.cumprod(expected, -1).backward(grad_y.double())
    op = CumprodFwdOp(N=6, dtype=torch.float32, dim=-1)
    y = op(x)
    torch.testing.assert_close(y, torch.cumprod(x, -1))
    y.backward(grad_y)
    torch.testing.assert_close(x.grad.double(), expected.grad, rtol=1e-5, atol=1e-6)