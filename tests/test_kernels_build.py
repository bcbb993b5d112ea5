"""CPU checks of the RMSNorm and cumsum kernels: builds for sm_90, config heuristics, family bases.

Compiling needs nvcc but no GPU.  TileLang caches compiled programs on disk,
so only the first run pays the ~3-5 s per program.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest
import torch

from tileops.kernels.kernel_base import SM90_BUILD_TARGET, Kernel
from tileops.kernels.norm.rms_norm import (
    RESIDENT_CAP,
    RESIDENT_HINTED,
    RMSNormFwdKernel,
    rms_norm_default_config,
)
from tileops.kernels.norm.rows import RowLayout, StreamLayout
from tileops.kernels.scan.cumsum import (
    COLUMN_SCAN,
    COLUMN_SUMS,
    LOOKBACK_ROW_SCAN,
    ROW_SCAN,
    SEGMENT_SUMS,
    SPLIT_COLUMN_SCAN,
    SPLIT_ROW_SCAN,
    CumsumFwdKernel,
    column_layouts,
    column_program_name,
    SHARED_BYTES_PER_SM,
    cumsum_autotune_configs,
    cumsum_default_config,
    lookback_layout,
    lookback_resident_blocks,
)
from tileops.ops.norm.base import NormOp
from tileops.ops.scan.base import ScanOp
from tests.toolchain import divisions_at_accesses, needs_nvcc

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SIZES = (1, 2, 3, 7, 8, 127, 128, 1000, 4096, 4097, 8192, 32767, 32768, 32769, 65537, 131072, 262144)


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


# ---- builds for sm_90 ------------------------------------------------------------------------
# A couple of sizes per dtype family, covering both RMSNorm program shapes and
# every cumsum program, while keeping the (first, uncached) run short.


@needs_nvcc
@pytest.mark.parametrize(
    "N, dtype",
    [(4096, torch.bfloat16), (127, torch.float16), (65537, torch.float32)],
    ids=["4096-bf16-resident", "127-fp16-odd", "65537-fp32-streamed"],
)
def test_rms_norm_builds_for_sm90(N: int, dtype: torch.dtype) -> None:
    kernel = RMSNormFwdKernel(N, dtype)
    compiled = kernel.build_for_sm90()
    source = compiled.get_kernel_source()
    assert "__global__" in source
    # Global offsets are 64-bit, so tensors over 2**31 elements are addressed correctly.
    assert "(int64_t)" in source
    if N % 8 == 0:  # rows of a strided input are still read 16 bytes at a time
        assert all("*(uint4*)" in line for line in source.splitlines() if "* LDX)" in line)
        assert "* LDX)" in source


@needs_nvcc
def test_cumsum_builds_every_program_for_sm90() -> None:
    kernel = CumsumFwdKernel(65537, torch.bfloat16)
    assert kernel.split_segments > 1
    built = kernel.build_all_for_sm90(inner=5)
    assert set(built) == {ROW_SCAN, SEGMENT_SUMS, SPLIT_ROW_SCAN, f"{COLUMN_SCAN}_8"}
    built[f"{COLUMN_SCAN}_32x8"] = kernel.compile_program(f"{COLUMN_SCAN}_32x8", target=SM90_BUILD_TARGET)
    columns = CumsumFwdKernel(4096, torch.bfloat16).build_all_for_sm90(inner=64)
    assert set(columns) == {
        ROW_SCAN, f"{COLUMN_SCAN}_8x8", f"{COLUMN_SCAN}_4x8", f"{COLUMN_SUMS}_4x8", f"{SPLIT_COLUMN_SCAN}_4x8"
    }
    built.update({f"{name} (64 columns)": compiled for name, compiled in columns.items()})
    lookback = CumsumFwdKernel(65544, torch.float16, config={"lookback": 1})
    built["lookback"] = lookback.compile_program(LOOKBACK_ROW_SCAN, target=SM90_BUILD_TARGET)
    for name, compiled in built.items():
        source = compiled.get_kernel_source()
        assert "(int64_t)" in source
        assert not divisions_at_accesses(source), name
        if COLUMN_SCAN not in name and COLUMN_SUMS not in name:  # row programs read rows at any stride
            assert "int64_t LDX" in source, name
    # The look-back scan stages rows at any stride through 16-byte asynchronous copies.
    staged = [line for line in built["lookback"].get_kernel_source().splitlines() if "(&(X[" in line]
    assert staged and all("cp_async_gs<16>" in line and "LDX" in line for line in staged)
    # A block reduces each tile a step ahead: its first tile's total is published before the loop,
    # and each step publishes the next tile's before it looks back for the current one, with two
    # block barriers a step (the warp totals', the look-back's).
    before, loop = built["lookback"].get_kernel_source().split("for (int step = 0;", 1)
    assert "AtomicStore(" in before and "AtomicLoad(" not in before
    assert loop.index("AtomicStore(") < loop.index("AtomicLoad(")
    assert loop.count("__syncthreads()") == 3  # the two a step, and the one before the block's arrival


@needs_nvcc
@pytest.mark.parametrize(
    "N, dtype", [(3, torch.float32), (4096, torch.float16)], ids=["3-fp32-thread-per-row", "4096-fp16"]
)
def test_cumsum_row_scan_builds_for_sm90(N: int, dtype: torch.dtype) -> None:
    assert "__global__" in CumsumFwdKernel(N, dtype).build_for_sm90().get_kernel_source()


# ---- programs of every candidate config (TIR only, no nvcc) --------------------------------------


@pytest.mark.parametrize("N", [3, 4097, 65537])
def test_every_rms_norm_candidate_builds_a_program(N: int) -> None:
    pytest.importorskip("tilelang")
    kernel = RMSNormFwdKernel(N, torch.bfloat16, config=rms_norm_default_config(N, torch.bfloat16))
    for config in kernel.autotune_configs:
        assert kernel.program(**config) is not None


@pytest.mark.parametrize("N, dtype, hinted", [
    (8, torch.float32, True), (4096, torch.bfloat16, True), (5120, torch.float16, True),
    (32768, torch.float32, True), (4097, torch.float32, False), (65537, torch.bfloat16, False),
], ids=["8-fp32", "4096-bf16", "5120-fp16-tail", "32768-fp32", "4097-fp32-narrow", "65537-bf16-streamed"])
def test_rms_norm_builds_a_hinted_program_where_its_loads_take_the_hint(N: int, dtype: torch.dtype,
                                                                       hinted: bool) -> None:
    programs = RMSNormFwdKernel(N, dtype).build_all_for_sm90()
    hinted_programs = [program for name, program in programs.items() if name.startswith(RESIDENT_HINTED)]
    assert len(hinted_programs) == int(hinted)
    for program in hinted_programs:
        assert "tileops_load_evict_last(" in program.get_kernel_source().split("__global__", 1)[1]


@pytest.mark.parametrize("N", [3, 65537])
def test_every_cumsum_candidate_builds_its_programs(N: int) -> None:
    pytest.importorskip("tilelang")
    from tileops.kernels.scan.cumsum import _build_program

    for config in cumsum_autotune_configs(N, torch.float32):
        names = set(CumsumFwdKernel(N, torch.float32, config=config).program_names(inner=33))
        names |= set(CumsumFwdKernel(N, torch.float32, config=config).program_names(inner=128))
        names |= set(CumsumFwdKernel(N, torch.float32, config={**config, "lookback": 1}).program_names())
        for name in names:
            assert _build_program(name, N, "float32", config) is not None


# ---- heuristics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", SIZES)
def test_rms_norm_default_layout_is_valid(N: int, dtype: torch.dtype) -> None:
    layout = RMSNormFwdKernel(N, dtype).layout()
    if N <= 1024 * RESIDENT_CAP:
        # Resident: the lanes of a row cover it, each holding few elements, in blocks of 128+ threads.
        assert isinstance(layout, RowLayout)
        assert _pow2(layout.row_threads) and layout.row_threads <= 1024
        assert layout.row_threads * layout.per_thread >= N and layout.per_thread <= RESIDENT_CAP
        assert layout.block_threads >= 128 and layout.block_threads % layout.row_threads == 0
    else:
        assert layout == StreamLayout(N, layout.vector, 512, 2)


def test_rms_norm_default_config_uses_full_vectors_for_aligned_rows() -> None:
    config = rms_norm_default_config(4096, torch.bfloat16)
    assert config == {"per_thread": 16, "stream_threads": 512, "stream_unroll": 2, "hinted_min_mib": 160,
                      "stream_hints": 0}
    assert RMSNormFwdKernel(4096, torch.bfloat16).layout() == RowLayout(4096, 8, 256, 256)
    # Short rows share a block instead of idling most of its threads.
    assert RMSNormFwdKernel(127, torch.float16).layout().rows_per_block > 1
    # Rows past the register budget are streamed.
    assert isinstance(RMSNormFwdKernel(262144, torch.bfloat16).layout(), StreamLayout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [1, 127, 4096, 32768, 65537, 262144])
def test_rms_norm_candidates_start_with_the_heuristic_and_are_unique(N: int, dtype: torch.dtype) -> None:
    kernel = RMSNormFwdKernel(N, dtype)
    candidates = kernel.autotune_configs
    assert candidates[0] == rms_norm_default_config(N, dtype)
    assert len(candidates) == len({tuple(sorted(c.items())) for c in candidates})
    for config in candidates:
        layout = kernel.layout(config)
        assert layout.row_threads <= 1024 if isinstance(layout, RowLayout) else layout.threads <= 1024


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", SIZES)
def test_cumsum_default_config_is_valid(N: int, dtype: torch.dtype) -> None:
    config = cumsum_default_config(N, dtype)
    threads, items, row_threads = config["threads"], config["items"], config["row_threads"]
    assert _pow2(threads) and 32 <= threads <= 1024
    assert _pow2(row_threads) and row_threads <= threads
    assert 1 <= items <= 2 * 16 // dtype.itemsize
    # A chunk covers the row or the row loops over whole chunks of 256 threads.
    assert row_threads * items >= N or row_threads == 256
    if config["segments"] > 1:
        chunks = -(-N // (row_threads * items))
        assert chunks >= 4 and config["segments"] <= chunks


def test_cumsum_cuts_long_rows_only() -> None:
    short = CumsumFwdKernel(4096, torch.bfloat16)
    assert short.program_names() == [ROW_SCAN] and short.split_segments == 1
    assert CumsumFwdKernel(2048, torch.bfloat16, config={"lookback": 1}).program_names() == [ROW_SCAN]
    long_rows = CumsumFwdKernel(262144, torch.bfloat16)
    assert long_rows.config["split_max_rows"] >= 64
    assert long_rows.program_names() == [ROW_SCAN, LOOKBACK_ROW_SCAN]
    assert long_rows.programs_for((64, 262144)) == [LOOKBACK_ROW_SCAN]
    # Deterministic calls take the split scan, whose additions come in a fixed order.
    assert long_rows.split_segments > 1
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert long_rows.programs_for((64, 262144)) == [SEGMENT_SUMS, SPLIT_ROW_SCAN]
    finally:
        torch.use_deterministic_algorithms(previous)
    split = CumsumFwdKernel(262144, torch.bfloat16, config={"lookback": 0})
    assert split.program_names() == [ROW_SCAN, SEGMENT_SUMS, SPLIT_ROW_SCAN]
    # The look-back scan stages whole 16-byte vectors: other row lengths take the split scan.
    odd = CumsumFwdKernel(65537, torch.bfloat16, config={"lookback": 1})
    assert odd.program_names() == [ROW_SCAN, SEGMENT_SUMS, SPLIT_ROW_SCAN] and odd.split_segments > 1


def test_cumsum_lookback_keeps_every_block_resident() -> None:
    """The look-back blocks must all run at once: their staging fits an SM's shared memory
    and the launch bound, for every candidate config."""
    for dtype in (torch.bfloat16, torch.float32):
        for N in (65544, 262144, 1 << 21):
            for config in cumsum_autotune_configs(N, dtype):
                kernel = CumsumFwdKernel(N, dtype, config=config)
                if LOOKBACK_ROW_SCAN not in kernel.program_names():
                    continue
                per_tile, tiles = lookback_layout(
                    N, config["threads"], config["items"], config["segments"], dtype.itemsize,
                    config["lookback_stages"],
                )
                resident = lookback_resident_blocks(
                    N, config["threads"], config["items"], config["segments"], dtype.itemsize,
                    config["lookback_stages"], config["blocks_per_sm"],
                )
                staging = config["lookback_stages"] * per_tile * config["threads"] * config["items"] * dtype.itemsize
                assert resident >= 1 and resident * (staging + 1024) <= SHARED_BYTES_PER_SM
                assert resident <= max(1, config["blocks_per_sm"]) and resident * config["threads"] <= 2048
                assert tiles * per_tile * config["threads"] * config["items"] >= N


def test_column_layouts_follow_inner_extent() -> None:
    # One column a thread, in one tile as wide as the columns up to a warp.
    assert column_layouts(2) == [(2, 1)]
    assert column_layouts(5) == [(8, 1)]
    assert column_layouts(33) == [(32, 1)]
    assert column_layouts(4100) == [(32, 1)]
    assert column_layouts(40) == [(32, 1)]  # 5 vectors: a power of two of them or a warp, else single columns
    # Rows of whole 16-byte vectors read a vector per thread, in tiles from a warp of vectors down to 4.
    assert column_layouts(4096) == [(32, 8), (16, 8), (8, 8), (4, 8)]
    assert column_layouts(4096, elem_bytes=4) == [(32, 4), (16, 4), (8, 4), (4, 4)]
    assert column_layouts(64) == [(8, 8), (4, 8)]
    assert column_layouts(16) == [(2, 8)]  # narrower than 4 vectors: the row is the tile
    assert column_program_name(32, 8) == f"{COLUMN_SCAN}_32x8"
    assert column_program_name(8, 1, COLUMN_SUMS) == f"{COLUMN_SUMS}_8"


@pytest.mark.parametrize(
    "shape, dtype, plan",
    [
        ((8, 4096, 4096), torch.bfloat16, (32, 8, 1)),  # a warp of vectors already gives 128 blocks
        ((16, 4096, 1024), torch.bfloat16, (16, 8, 1)),  # narrower tiles for 128 blocks
        ((64, 4096, 64), torch.bfloat16, (4, 8, 1)),
        ((64, 4096, 64), torch.float32, (8, 4, 1)),
        ((4, 32768, 256), torch.bfloat16, (4, 8, 8)),  # 32 blocks at best: the axis in 8 segments
        ((3, 65537, 16), torch.bfloat16, (2, 8, 65)),  # one chunk a segment at most
        ((1, 300, 64), torch.bfloat16, (4, 8, 1)),  # one chunk: nothing to cut
        ((1, 65537, 3), torch.float32, (4, 1, 0)),  # single columns: transposed rows
        ((5, 3000, 40), torch.float32, (32, 1, 0)),
        ((1, 1000, 3), torch.float32, (4, 1, 1)),  # too short to be worth transposing
    ],
)
def test_column_plan_fills_the_gpu(shape, dtype, plan) -> None:
    outer, N, inner = shape
    assert CumsumFwdKernel(N, dtype)._column_plan(outer, inner) == plan


def test_unknown_config_keys_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown config keys"):
        RMSNormFwdKernel(4096, torch.float16, config={"bogus": 1})
    with pytest.raises(TypeError):
        CumsumFwdKernel(16, torch.int32)


# ---- family bases with a stand-in kernel (CPU tensors) ------------------------------------------


class _RecordingKernel(Kernel):
    """Computes with PyTorch and records each launch's argument shapes."""

    launches: List[Tuple[Tuple[int, ...], ...]] = []

    def __init__(self, N: int, dtype: torch.dtype, **params: object) -> None:
        self.N = N
        self.params = params
        super().__init__(dtype, config={})

    @property
    def default_config(self) -> Dict[str, int]:
        return {}

    def forward(self, *tensors: torch.Tensor) -> None:
        type(self).launches.append(tuple(tuple(t.shape) for t in tensors))
        for tensor in tensors:
            assert tensor.is_contiguous() and tensor.data_ptr() % 16 == 0
            # The programs read a 2-D tensor's first stride as the distance between its rows.
            assert tensor.dim() != 2 or tensor.stride(0) == tensor.shape[1], tensor.stride()
        if len(tensors) == 3:  # rms norm: x, weight, out
            x, weight, out = tensors
            out.copy_(torch.nn.functional.rms_norm(x.float(), (self.N,), weight.float(), self.params["eps"]))
        else:  # cumsum: x, out as (rows, N) or (outer, N, inner)
            x, out = tensors
            out.copy_(torch.cumsum(x.float(), dim=1))


class _Norm(NormOp):
    def __init__(self, N: int) -> None:
        super().__init__()
        self.N, self.dtype, self.eps, self.tune = N, torch.float32, 1e-6, False
        self.kernel_map = {"rms_norm_fwd": _RecordingKernel}


class _Scan(ScanOp):
    def __init__(self, N: int, dim: int) -> None:
        super().__init__()
        self.N, self.dim, self.dtype, self.tune = N, dim, torch.float32, False
        self.kernel_map = {"cumsum_fwd": _RecordingKernel}


@pytest.mark.parametrize("make_op", [lambda: _Norm(8), lambda: _Scan(8, -1)], ids=["norm", "scan"])
def test_a_single_row_of_a_wider_buffer_reaches_the_kernel_with_its_width_as_row_stride(make_op) -> None:
    # A (1, 8) slice of a (1, 11) buffer is contiguous with a first stride of 11, which a program
    # would read as the rows' distance (and refuse, 11 being no multiple of its vector).
    op = make_op()
    x = torch.randn(1, 11)[:, :8]
    assert x.is_contiguous() and x.stride(0) == 11
    y = op._run_kernel(x, torch.randn(8)) if isinstance(op, _Norm) else op._run_kernel(x)
    assert y.shape == (1, 8)


def test_norm_base_views_rows_and_reuses_one_kernel() -> None:
    _RecordingKernel.launches = []
    op = _Norm(8)
    weight = torch.randn(8)
    for shape in [(8,), (3, 8), (2, 5, 8)]:
        x = torch.randn(shape)
        y = op._run_kernel(x, weight)
        assert y.shape == x.shape
        torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (8,), weight, 1e-6))
    assert [launch[0] for launch in _RecordingKernel.launches] == [(1, 8), (3, 8), (10, 8)]
    assert len(op._kernel_cache) == 1


def test_norm_base_handles_empty_non_contiguous_and_misaligned_inputs() -> None:
    _RecordingKernel.launches = []
    op = _Norm(8)
    weight = torch.randn(8)
    assert op._run_kernel(torch.randn(0, 8), weight).shape == (0, 8)
    assert _RecordingKernel.launches == []
    wide = torch.randn(4, 16)
    strided = wide[:, ::2]
    torch.testing.assert_close(
        op._run_kernel(strided, weight), torch.nn.functional.rms_norm(strided, (8,), weight, 1e-6)
    )
    misaligned = torch.randn(33)[1:].view(4, 8)
    assert misaligned.data_ptr() % 16
    torch.testing.assert_close(
        op._run_kernel(misaligned, weight), torch.nn.functional.rms_norm(misaligned, (8,), weight, 1e-6)
    )


@pytest.mark.parametrize(
    "shape, dim, launched",
    [
        ((7,), 0, (1, 7)),
        ((3, 7), -1, (3, 7)),
        ((3, 7), 0, (1, 3, 7)),
        ((2, 3, 4), 1, (2, 3, 4)),
        ((2, 3, 4), -3, (1, 2, 12)),
        ((2, 3, 1), 1, (2, 3)),
    ],
)
def test_scan_base_views_outer_n_inner(shape: Tuple[int, ...], dim: int, launched: Tuple[int, ...]) -> None:
    _RecordingKernel.launches = []
    op = _Scan(shape[dim], dim)
    x = torch.randn(shape)
    y = op._run_kernel(x)
    torch.testing.assert_close(y, torch.cumsum(x, dim))
    assert _RecordingKernel.launches == [(launched, launched)]


def test_scan_base_handles_empty_and_non_contiguous_inputs() -> None:
    _RecordingKernel.launches = []
    op = _Scan(5, 1)
    assert op._run_kernel(torch.randn(0, 5)).shape == (0, 5)
    assert _RecordingKernel.launches == []
    x = torch.randn(5, 4).t()  # (4, 5), not contiguous
    torch.testing.assert_close(op._run_kernel(x), torch.cumsum(x, 1))
