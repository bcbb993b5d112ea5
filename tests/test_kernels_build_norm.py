"""CPU checks of the norm family's kernels: program choice, launch sizing and sm_90 builds.

Compiling needs nvcc but no GPU.  TileLang caches compiled programs on disk,
so only the first run pays ~3-5 s per program (eight programs here).
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tileops.kernels.norm import backward, layer_norm, rms_norm, rows
from tileops.kernels.device_traits import has_fast_memory, memory_is_fast, peak_memory_gbps
from tileops.kernels.norm.backward import CLUSTER, COLUMN_SUM, RESIDENT, STREAMED, ClusterLayout, NormBwdKernel
from tileops.kernels.norm.fused_add_rms_norm import FusedAddRMSNormFwdKernel
from tileops.kernels.norm.layer_norm import LayerNormBwdKernel, LayerNormFwdKernel
from tileops.kernels.norm.rms_norm import RMSNormFwdKernel
from tileops.kernels.norm.rms_norm_bwd import FusedAddRMSNormBwdKernel, RMSNormBwdKernel
from tileops.kernels.norm.rows import RowLayout, StreamLayout, resident_layout
from tests.toolchain import divisions_at_accesses, needs_nvcc, ptxas_report

SM90 = {"kind": "cuda", "arch": "sm_90"}


# ---- program choice -------------------------------------------------------------------------------


@pytest.mark.parametrize("classes, N, dtype, threads, per_thread", [
    ((LayerNormFwdKernel, FusedAddRMSNormFwdKernel, RMSNormFwdKernel), 4096, torch.bfloat16, 256, 16),
    ((LayerNormFwdKernel, FusedAddRMSNormFwdKernel, RMSNormFwdKernel), 16384, torch.bfloat16, 1024, 16),
    ((FusedAddRMSNormFwdKernel, RMSNormFwdKernel), 32768, torch.bfloat16, 1024, 32),
    ((LayerNormFwdKernel, FusedAddRMSNormFwdKernel, RMSNormFwdKernel), 4097, torch.float32, 1024, 5),
    ((LayerNormFwdKernel, FusedAddRMSNormFwdKernel, RMSNormFwdKernel), 1, torch.float16, 1, 1),
])
def test_forward_rows_fit_in_registers(classes, N, dtype, threads, per_thread) -> None:
    for cls in classes:
        layout = cls(N, dtype).layout()
        assert isinstance(layout, RowLayout)
        assert (layout.row_threads, layout.per_thread) == (threads, per_thread)
        assert layout.block_threads >= 128 and layout.block_threads % layout.row_threads == 0


H100_SXM = SimpleNamespace(memory_clock_rate=2_619_000, memory_bus_width=5120, multi_processor_count=132)
H200 = SimpleNamespace(memory_clock_rate=3_201_000, memory_bus_width=6016, multi_processor_count=132)  # as reported


def test_fast_memory_is_told_apart_by_its_peak_an_sm() -> None:
    assert peak_memory_gbps(H100_SXM) == pytest.approx(3352.3, abs=0.1)
    assert peak_memory_gbps(H200) == pytest.approx(4814.3, abs=0.1)
    assert not memory_is_fast(H100_SXM) and memory_is_fast(H200)
    # A device that does not report its memory is planned for as an H100.
    assert peak_memory_gbps(SimpleNamespace(multi_processor_count=132)) is None
    assert not memory_is_fast(SimpleNamespace(memory_clock_rate=0, memory_bus_width=6144, multi_processor_count=132))
    if not torch.cuda.is_available():
        assert not has_fast_memory()


@pytest.mark.parametrize("fast", [False, True], ids=["h100", "fast-memory"])
def test_fast_memory_keeps_two_blocks_an_sm_on_long_rows(monkeypatch: pytest.MonkeyPatch, fast: bool) -> None:
    """Where the memory is fast, RMSNorm holds a row on at most 512 threads (streaming longer
    ones, and half-precision rows of 16384 or more on 1024 threads, two vectors in flight each,
    with L2 hints; half-precision rows of up to 8192 on 256) and LayerNorm streams rows of 32 KiB or more in quarter-row chunks (holding
    shorter ones to fewer registers); shorter rows and the fused residual add keep the H100's
    layouts."""
    for module in (rms_norm, layer_norm):
        monkeypatch.setattr(module, "has_fast_memory", lambda: fast)
    rms = {N: RMSNormFwdKernel(N, torch.bfloat16).layout() for N in (8192, 16384, 32768)}
    assert rms[8192] == RowLayout(8192, 8, 256 if fast else 512, 256 if fast else 512)
    assert RMSNormFwdKernel(5120, torch.bfloat16).layout() == RowLayout(5120, 8, 256 if fast else 512,
                                                                        256 if fast else 512)
    assert RMSNormFwdKernel(8200, torch.float16).layout() == RowLayout(8200, 8, 512 if fast else 1024,
                                                                       512 if fast else 1024)
    assert RMSNormFwdKernel(4096, torch.bfloat16).layout() == RowLayout(4096, 8, 256, 256)
    assert FusedAddRMSNormFwdKernel(8192, torch.bfloat16).layout() == RowLayout(8192, 8, 512, 512)
    assert rms[16384] == (StreamLayout(16384, 8, 1024, 2) if fast else RowLayout(16384, 8, 1024, 1024))
    assert rms[32768] == (StreamLayout(32768, 8, 1024, 2) if fast else RowLayout(32768, 8, 1024, 1024))
    assert RMSNormFwdKernel(16384, torch.float32).layout() == RowLayout(16384, 4, 512 if fast else 1024,
                                                                        512 if fast else 1024)
    assert RMSNormFwdKernel(32768, torch.bfloat16).config["stream_hints"] == int(fast)
    assert RMSNormFwdKernel(32768, torch.float32).layout() == (StreamLayout(32768, 4, 512, 2) if fast
                                                               else RowLayout(32768, 4, 1024, 1024))
    assert RMSNormFwdKernel(32768, torch.float32).config["stream_hints"] == 0
    assert FusedAddRMSNormFwdKernel(65536, torch.bfloat16).config["stream_hints"] == 0
    assert RMSNormFwdKernel(8192, torch.float32).layout() == RowLayout(8192, 4, 512 if fast else 1024,
                                                                       512 if fast else 1024)
    for N in (16384, 32768):
        assert FusedAddRMSNormFwdKernel(N, torch.bfloat16).layout() == RowLayout(N, 8, 1024, 1024)

    layer = {(N, dtype): LayerNormFwdKernel(N, dtype).layout()
             for N, dtype in ((8192, torch.bfloat16), (16384, torch.bfloat16), (32768, torch.bfloat16),
                              (65536, torch.bfloat16), (8192, torch.float32), (4096, torch.float32))}
    assert layer[8192, torch.bfloat16] == RowLayout(8192, 8, 512, 512)
    assert layer[4096, torch.float32] == RowLayout(4096, 4, 512, 512)
    if fast:
        assert layer[16384, torch.bfloat16] == StreamLayout(16384, 8, 256, 2)
        assert layer[32768, torch.bfloat16] == StreamLayout(32768, 8, 512, 2)
        assert layer[65536, torch.bfloat16] == StreamLayout(65536, 8, 1024, 2)
        assert layer[8192, torch.float32] == StreamLayout(8192, 4, 256, 2)
    else:
        assert layer[16384, torch.bfloat16] == RowLayout(16384, 8, 1024, 1024)
        assert layer[32768, torch.bfloat16] == StreamLayout(32768, 8, 1024, 1)
        assert layer[65536, torch.bfloat16] == StreamLayout(65536, 8, 1024, 1)
        assert layer[8192, torch.float32] == RowLayout(8192, 4, 1024, 1024)
    for N in (4096, 8192):
        assert RMSNormFwdKernel(N, torch.bfloat16).config == rms_norm.rms_norm_default_config(N, torch.bfloat16,
                                                                                              fast)
        layer_config = LayerNormFwdKernel(N, torch.bfloat16).config
        assert layer_config == layer_norm.layer_norm_fwd_default_config(N, torch.bfloat16, fast)
        # Rows held in registers keep the H100's layout; fast memory caps their registers only.
        assert {**layer_config, "resident_blocks_per_sm": 0} == layer_norm.layer_norm_fwd_default_config(
            N, torch.bfloat16)
    held = {(N, dtype): LayerNormFwdKernel(N, dtype).config["resident_blocks_per_sm"]
            for N, dtype in ((4096, torch.bfloat16), (8192, torch.bfloat16), (4096, torch.float32),
                             (32768, torch.bfloat16))}
    # Streamed rows (32768 bf16 on fast memory) have no resident program to hold.
    assert held == ({(4096, torch.bfloat16): 6, (8192, torch.bfloat16): 3, (4096, torch.float32): 4,
                     (32768, torch.bfloat16): 0} if fast else dict.fromkeys(held, 0))


@pytest.mark.parametrize("fast", [False, True], ids=["h100", "fast-memory"])
def test_fast_memory_layer_norm_backward_keeps_a_block_a_row_group(monkeypatch: pytest.MonkeyPatch,
                                                                    fast: bool) -> None:
    """Where memory is fast, LayerNorm's backward rows of 4096 take a 256-thread block each, four an
    SM, where an H100 folds two row groups into a 512-thread block; RMSNorm folds on both."""
    monkeypatch.setattr(backward, "has_fast_memory", lambda: fast)
    for dtype in (torch.bfloat16, torch.float16):
        kernel = LayerNormBwdKernel(4096, dtype)
        layout = kernel.layout()
        assert layout == RowLayout(4096, 8, 256, 256 if fast else 512)
        assert kernel.blocks_per_sm(layout) == (4 if fast else 2)
        assert kernel.folds(layout)  # the partial sums still live in shared memory, added per block
        assert RMSNormBwdKernel(4096, dtype).layout() == RowLayout(4096, 8, 256, 512)


@pytest.mark.parametrize("fast", [False, True], ids=["h100", "fast-memory"])
def test_fast_memory_backward_rows_with_idle_lanes_keep_a_block_a_row_group(monkeypatch: pytest.MonkeyPatch,
                                                                             fast: bool) -> None:
    """Rows of 2880 or 3584 leave lanes idle in their last column group (256 lanes of two 16-byte
    vectors hold 4096): where memory is fast each row group has a block of its own, four an SM;
    rows that fill their groups (2048, 4096) still fold two or four groups a block."""
    monkeypatch.setattr(backward, "has_fast_memory", lambda: fast)
    for cls in (RMSNormBwdKernel, FusedAddRMSNormBwdKernel):
        for N in (2880, 3584):
            kernel = cls(N, torch.bfloat16)
            layout = kernel.layout()
            assert layout.has_tail and layout.row_threads == 256
            assert layout.block_threads == (256 if fast else 512)
            assert kernel.blocks_per_sm(layout) == (4 if fast else 2)
            assert kernel.folds(layout)  # shared-memory sums, written as whole vectors
            # Tuning still times the other layouts: a block per group, two a block, four a block.
            tried = {cls(N, torch.bfloat16, config=config).layout().block_threads
                     for config in kernel.autotune_configs}
            assert tried == {256, 512, 1024}
        for N, lanes in ((2048, 128), (4096, 256)):
            assert cls(N, torch.bfloat16).layout() == RowLayout(N, 8, lanes, 512)
    # A float16 fused add keeps a block per row group everywhere (see ``norm_bwd_default_config``).
    assert FusedAddRMSNormBwdKernel(4096, torch.float16).layout().block_threads == 256


def test_longer_forward_rows_are_streamed() -> None:
    for cls in (LayerNormFwdKernel, FusedAddRMSNormFwdKernel, RMSNormFwdKernel):
        assert isinstance(cls(65536, torch.bfloat16).layout(), StreamLayout)
        assert isinstance(cls(65537, torch.float32).layout(), StreamLayout)
    # LayerNorm holds at most two 16-byte vectors of a row per thread.
    assert LayerNormFwdKernel(32768, torch.bfloat16).layout() == StreamLayout(32768, 8, 1024, 1)
    assert isinstance(LayerNormFwdKernel(16384, torch.float32).layout(), StreamLayout)


@pytest.mark.parametrize("cls, N, dtype, program, in_registers, in_shared", [
    (RMSNormBwdKernel, 1024, torch.bfloat16, RESIDENT, True, (0,)),
    (LayerNormBwdKernel, 1024, torch.float32, RESIDENT, True, (0, 0)),
    (RMSNormBwdKernel, 4096, torch.bfloat16, RESIDENT, False, (4096,)),
    (LayerNormBwdKernel, 4096, torch.float32, RESIDENT, False, (4096, 4096)),
    # Slots come in whole column groups (1024 lanes x 1 column for an odd N).
    (LayerNormBwdKernel, 4097, torch.float32, RESIDENT, False, (5120, 5120)),
    (RMSNormBwdKernel, 16384, torch.bfloat16, RESIDENT, False, (16384,)),
    (LayerNormBwdKernel, 16384, torch.bfloat16, RESIDENT, False, (16384, 16384)),
    (RMSNormBwdKernel, 32768, torch.bfloat16, STREAMED, False, (32768,)),
    # 212 KiB of shared memory: the weight's sums and the bias's first 5 column groups of 512 x 8.
    (LayerNormBwdKernel, 32768, torch.bfloat16, STREAMED, False, (32768, 20480)),
    (RMSNormBwdKernel, 32768, torch.float32, STREAMED, False, (32768,)),
    (RMSNormBwdKernel, 65537, torch.float16, STREAMED, False, (54272,)),
])
def test_backward_programs_and_where_partial_sums_live(cls, N, dtype, program, in_registers, in_shared) -> None:
    kernel = cls(N, dtype)
    assert kernel.main_program() == program
    assert kernel.partials_in_registers(kernel.layout()) == in_registers
    assert kernel.smem_slots(kernel.layout()) == in_shared
    keys = [(name, dict(shape)) for name, shape in kernel.program_keys()]
    assert keys[:2] == [(program, {"direct": False, "has_weight": True, "strided": False}), (COLUMN_SUM, {})]
    # A single row writes the gradients directly when its partial sums never leave the chip.
    on_chip = in_registers or all(slots >= N for slots in in_shared) or kernel.register_groups(kernel.layout())[-1]
    direct = [(program, {"direct": True, "has_weight": True, "strided": False})] if on_chip else []
    # Streamed rows that split over a cluster have its program too: both ways for few rows, and
    # into partials over the wider clusters of many RMSNorm rows.
    few, many = kernel.config["cluster_ctas"], kernel.config["many_rows_ctas"]
    split = [(CLUSTER, {"ctas": few, "direct": d, "has_weight": True, "strided": False}) for d in (False, True)
             if kernel.split_layout()]
    split += [(CLUSTER, {"ctas": many, "direct": False, "has_weight": True, "strided": False})] if kernel.split_layout(ctas=many) else []
    assert keys[2:] == direct + split


@pytest.mark.parametrize("cls, N, dtype, in_registers", [
    # The bias's last 3 column groups of 512 x 8 (24 sums a thread) do not fit in shared memory.
    (LayerNormBwdKernel, 32768, torch.bfloat16, (0, 3)),
    (RMSNormBwdKernel, 32768, torch.bfloat16, (0,)),
    (LayerNormBwdKernel, 4096, torch.bfloat16, (0, 0)),  # resident: all in shared memory
    (RMSNormBwdKernel, 65537, torch.float16, (0,)),  # 33 steps a row: too many to unroll
])
def test_streamed_partial_sums_past_shared_memory_go_to_registers(cls, N, dtype, in_registers) -> None:
    kernel = cls(N, dtype)
    assert kernel.register_groups(kernel.layout()) == in_registers


def test_backward_launches_as_many_row_groups_as_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(NormBwdKernel, "sm_count", lambda self, device: 132)
    resident = RMSNormBwdKernel(4096, torch.bfloat16)  # 256 threads a row, 1024 threads per SM
    assert resident.partial_rows(4 * 132 * 8, torch.device("cpu")) == 4 * 132
    assert resident.partial_rows(3, torch.device("cpu")) == 4  # whole blocks of two row groups
    tiny = LayerNormBwdKernel(3, torch.float32)  # many rows per block; whole blocks only
    layout = tiny.layout()
    assert tiny.partial_rows(1, torch.device("cpu")) == layout.rows_per_block
    wide = RMSNormBwdKernel(32768, torch.bfloat16)  # streamed, 128 KiB of partial sums: one block per SM
    assert wide.partial_rows(132 * 62, torch.device("cpu")) == 132


@pytest.mark.parametrize("cls, N, dtype, groups_per_block", [
    (LayerNormBwdKernel, 4096, torch.bfloat16, 2),  # 256 lanes a row, 512 threads a block
    (RMSNormBwdKernel, 2048, torch.float16, 4),  # 128 lanes a row
    (LayerNormBwdKernel, 2048, torch.float32, 2),  # float32 LayerNorm keeps four elements a thread in registers
    (RMSNormBwdKernel, 8192, torch.bfloat16, 1),  # 512 lanes a row: a block is one row group
    (LayerNormBwdKernel, 16384, torch.bfloat16, 1),  # 1024 lanes, 128 KiB of sums
    (RMSNormBwdKernel, 256, torch.bfloat16, 4),  # sums in registers: four rows a block, a partials row each
])
def test_resident_row_groups_of_a_block_fold_their_shared_memory_sums(monkeypatch: pytest.MonkeyPatch,
                                                                       cls, N, dtype, groups_per_block) -> None:
    monkeypatch.setattr(NormBwdKernel, "sm_count", lambda self, device: 132)
    kernel = cls(N, dtype)
    layout = kernel.layout()
    assert layout.rows_per_block == groups_per_block
    # Shared-memory sums fold, even a single group's (its sums are then written as whole vectors).
    folds = not kernel.partials_in_registers(layout)
    assert kernel.folds(layout) == folds
    device = torch.device("cpu")
    for rows in (1, 3, 529, 16384):
        groups = kernel.partial_rows(rows, device)
        assert kernel.buffer_rows(rows, device) == (groups // groups_per_block if folds else groups)
    # Every group's sums are in the block's shared memory, and the blocks that fit leave room for them.
    if folds:
        smem = 4 * sum(kernel.smem_slots(layout)) * groups_per_block
        assert all(slots >= N for slots in kernel.smem_slots(layout))
        assert kernel.blocks_per_sm(layout) * smem <= 220 * 1024
    # Without folding, each group has a block of its own again.
    single = cls(N, dtype, config={**kernel.default_config, "fold_threads": 0}).layout()
    assert single.rows_per_block == (1 if folds else groups_per_block)
    if folds:
        assert cls(N, dtype, config={**kernel.default_config, "fold_threads": 0}).folds(single)


@pytest.mark.parametrize("rows", [1, 131, 132, 133, 527, 528, 529, 8192, 16384, 32768, 32769, 10**6])
@pytest.mark.parametrize("cls, N, dtype", [
    (RMSNormBwdKernel, 4096, torch.bfloat16),  # resident, one row a block
    (LayerNormBwdKernel, 3, torch.float32),  # resident, many rows a block
    (RMSNormBwdKernel, 32768, torch.bfloat16),  # streamed
])
def test_backward_row_groups_share_the_rows_evenly(monkeypatch: pytest.MonkeyPatch, rows, cls, N, dtype) -> None:
    """No more groups than fit at once, and no fewer row steps than with every slot filled:
    dropping groups the last step would leave almost idle takes no step more."""
    monkeypatch.setattr(NormBwdKernel, "sm_count", lambda self, device: 132)
    kernel = cls(N, dtype)
    layout = kernel.layout()
    rows_per_block = getattr(layout, "rows_per_block", 1)
    slots = kernel.blocks_per_sm(layout) * 132 * rows_per_block
    groups = kernel.partial_rows(rows, torch.device("cpu"))
    assert groups % rows_per_block == 0
    assert groups <= max(slots, rows_per_block)
    assert -(-rows // groups) == -(-rows // min(slots, max(rows, 1)))
    # Fewer groups sit out the last step than there are steps (times a block's rows, for
    # the rounding up to whole blocks): with every slot filled, 529 rows over 528 groups
    # would leave 527 of them idle.
    steps = -(-rows // groups)
    idle = groups - (rows - (steps - 1) * groups)
    assert idle < steps * rows_per_block


def test_resident_layout_owns_every_column_once() -> None:
    for N in (1, 3, 127, 4096, 4097, 32768):
        layout = resident_layout(N, torch.bfloat16, 16)
        columns = sorted((j * layout.row_threads + lane) * layout.vector + k
                         for lane in range(layout.row_threads) for j in range(layout.vecs)
                         for k in range(layout.vector)
                         if (j * layout.row_threads + lane) * layout.vector < N)
        assert columns == list(range(N))


def test_unknown_config_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown config keys"):
        LayerNormFwdKernel(64, torch.float16, config={"threads": 64})


# ---- builds for sm_90 -----------------------------------------------------------------------------------


def _source(kernel: Any, name: str, **shape: Any) -> str:
    source = kernel.compile_program(name, tuple(sorted(shape.items())), target=SM90).get_kernel_source()
    assert not divisions_at_accesses(source), name
    return source


def _signature(source: str) -> str:
    """The kernel's parameter list (past any device functions of its prelude)."""
    start = source.index("__global__")
    return source[start:source.index("{", start)]


def assert_strided_reads_are_16_bytes(source: str, *strides: str) -> None:
    """Inputs read in place address rows through their symbolic stride, with 16-byte accesses still
    (plain, or the hinted loads of ``cache_hints``, which move 16 bytes)."""
    for stride in strides:
        reads = [line for line in source.splitlines() if f"* {stride})" in line]
        assert reads, f"no read through {stride}"
        assert all("*(uint4*)" in line or "tileops_load_evict_" in line for line in reads), reads


@needs_nvcc
@pytest.mark.parametrize("cls, N, dtype, shape", [
    (LayerNormFwdKernel, 4096, torch.bfloat16, {"has_weight": True, "has_bias": True}),
    (LayerNormFwdKernel, 65536, torch.bfloat16, {"has_weight": False, "has_bias": True}),
    (FusedAddRMSNormFwdKernel, 4096, torch.bfloat16, {}),
    (FusedAddRMSNormFwdKernel, 65537, torch.float32, {}),
], ids=["layer-fwd-4096-resident", "layer-fwd-65536-streamed", "fused-add-4096-resident", "fused-add-65537-streamed"])
def test_forward_programs_build_for_sm90(cls, N, dtype, shape) -> None:
    kernel = cls(N, dtype)
    source = _source(kernel, kernel.main_program(), **shape)
    assert "__global__" in source
    assert "int64_t" in source  # 64-bit offsets: tensors over 2**31 elements are addressed correctly
    if kernel.N % 8 == 0 and kernel.dtype == torch.bfloat16:
        assert_strided_reads_are_16_bytes(source, "LDX", *(("LDR",) if cls is FusedAddRMSNormFwdKernel else ()))
    hinted = kernel.hinted_program()
    assert (hinted is not None) == isinstance(kernel.layout(), RowLayout)
    assert "tileops_load_evict_" not in source  # calls under hinted_min_mib load plainly
    if hinted is not None:
        # Larger calls' resident rows load every input with evict_last (see cache_hints.HINTED_MIN_MIB).
        hinted_source = _source(kernel, hinted, **shape)
        assert "tileops_load_evict_last((&(xb[" in hinted_source
        assert ("tileops_load_evict_last((&(rb[" in hinted_source) == (cls is FusedAddRMSNormFwdKernel)


@needs_nvcc
@pytest.mark.parametrize("N, dtype, merged", [(4096, torch.bfloat16, True), (8192, torch.float32, True),
                                              (3, torch.float32, True), (5120, torch.bfloat16, False),
                                              (4097, torch.float16, False), (127, torch.bfloat16, False)])
def test_layer_norm_resident_rows_reduce_both_moments_at_one_barrier(N: int, dtype: torch.dtype,
                                                                     merged: bool) -> None:
    """The resident forward merges each lane's (mean, squared deviations) over the row in one
    reduction where the lanes hold equal shares: one barrier where a row spans warps, none within
    a warp, and no division.  Rows with a tail take the mean, then the centred squares, in two."""
    kernel = LayerNormFwdKernel(N, dtype)
    layout = kernel.layout()
    assert isinstance(layout, RowLayout) and layout.has_tail != merged
    source = _source(kernel, layer_norm.RESIDENT, has_weight=True, has_bias=True)
    reductions = 1 if merged else 2
    assert source.count("__syncthreads()") == (reductions if layout.row_threads > 32 else 0)
    shuffles = [line for line in source.splitlines() if "__shfl_xor_sync" in line]
    assert len(shuffles) == reductions * (2 if layout.row_threads > 32 else 1) * (layout.row_threads > 1)
    assert " / " not in source.split("__global__", 1)[1]


def test_rms_norm_row_program_follows_hinted_min_mib() -> None:
    """Resident calls take the hinted program from ``hinted_min_mib`` on (0: every call), streamed
    rows never (they have none), whatever the order the plans are asked for in."""
    kernel = RMSNormFwdKernel(4096, torch.bfloat16)
    threshold = kernel.config["hinted_min_mib"] << 20
    assert [kernel.row_program(size) for size in (threshold, threshold - 1, 0)] == [
        rms_norm.RESIDENT_HINTED, rms_norm.RESIDENT, rms_norm.RESIDENT]
    every = RMSNormFwdKernel(4096, torch.bfloat16, config={"hinted_min_mib": 0})
    assert every.row_program(0) == rms_norm.RESIDENT_HINTED
    streamed = RMSNormFwdKernel(262144, torch.bfloat16)
    assert streamed.row_program(1 << 40) == streamed.row_program(0) == rms_norm.STREAMED
    assert FusedAddRMSNormFwdKernel(4096, torch.float32).row_program(threshold) == "fused_add_rms_norm_resident_hinted"


@needs_nvcc
def test_layer_norm_large_calls_take_the_program_held_to_more_blocks_an_sm(monkeypatch: pytest.MonkeyPatch) -> None:
    """On fast memory, resident LayerNorm calls of ``HELD_MIN_MIB`` or more (and the hinted ones)
    take a program whose registers let six 256-thread blocks share an SM; smaller calls keep the
    compiler's choice, which a single row runs faster with."""
    monkeypatch.setattr(layer_norm, "has_fast_memory", lambda: True)
    kernel = LayerNormFwdKernel(4096, torch.bfloat16)
    held_min = layer_norm.HELD_MIN_MIB << 20
    assert kernel.row_program(held_min - 1) == layer_norm.RESIDENT
    assert kernel.row_program(held_min) == layer_norm.RESIDENT_HELD
    assert kernel.row_program(kernel.config["hinted_min_mib"] << 20) == layer_norm.RESIDENT_HINTED
    shape = {"has_weight": True, "has_bias": True}
    assert "__launch_bounds__(256, 1)" in _source(kernel, layer_norm.RESIDENT, **shape)
    for name in (layer_norm.RESIDENT_HELD, layer_norm.RESIDENT_HINTED):
        assert "__launch_bounds__(256, 6)" in _source(kernel, name, **shape)
    assert LayerNormFwdKernel(4096, torch.bfloat16, config={**kernel.config, "resident_blocks_per_sm": 0}
                              ).row_program(held_min) == layer_norm.RESIDENT


def test_row_moments_need_lanes_of_equal_shares() -> None:
    with pytest.raises(ValueError, match="unequal shares"):
        rows.row_moments_macro(None, resident_layout(5120, torch.bfloat16, 16))


@needs_nvcc
@pytest.mark.parametrize("N", [16384, 65536])
def test_fast_memory_forward_programs_build_for_sm90(N: int) -> None:
    """The layouts devices with fast memory take: RMSNorm's half-precision rows of 16384 or more
    streamed, two blocks an SM, LayerNorm's quarter-row chunks."""
    rms = RMSNormFwdKernel(N, torch.bfloat16, config=rms_norm.rms_norm_default_config(N, torch.bfloat16, True))
    layer = LayerNormFwdKernel(N, torch.bfloat16,
                               config=layer_norm.layer_norm_fwd_default_config(N, torch.bfloat16, True))
    assert isinstance(layer.layout(), StreamLayout)
    for kernel, shape in ((rms, {}), (layer, {"has_weight": True, "has_bias": True})):
        source = _source(kernel, kernel.main_program(), **shape)
        assert "__global__" in source and "int64_t" in source
        assert_strided_reads_are_16_bytes(source, "LDX")
        # Streamed RMSNorm rows keep their first pass's lines in L2 for the second (LayerNorm's plain).
        streamed_rms = kernel is rms and isinstance(rms.layout(), StreamLayout)
        if streamed_rms:  # two 1024-thread blocks an SM: 32 registers a thread
            assert "__launch_bounds__(1024, 2)" in source
        body = source.split("__global__", 1)[1]
        first_pass, second_pass = body.split("__syncthreads()", 1) if streamed_rms else (body, body)
        assert ("tileops_load_evict_last((&(xb[" in first_pass) == streamed_rms
        assert ("tileops_load_evict_first((&(xb[" in second_pass) == streamed_rms
        assert "tileops_load_evict_first" not in first_pass and "tileops_load_evict_last" not in second_pass


@needs_nvcc
@pytest.mark.parametrize("cls", [RMSNormFwdKernel, LayerNormFwdKernel, FusedAddRMSNormFwdKernel])
@pytest.mark.parametrize("N, dtype, fast", [(4096, torch.bfloat16, True), (4096, torch.float32, True),
                                            (32768, torch.bfloat16, True), (32768, torch.bfloat16, False)])
def test_forward_programs_hold_their_rows_without_spilling(monkeypatch: pytest.MonkeyPatch, cls, N, dtype, fast,
                                                           tmp_path) -> None:
    """Every program a forward call may launch keeps its values in registers, the ones held to
    more blocks an SM (``resident_blocks_per_sm``, the streamed RMSNorm's two blocks) included."""
    for module in (rms_norm, layer_norm):
        monkeypatch.setattr(module, "has_fast_memory", lambda: fast)
    for name, program in cls(N, dtype).build_all_for_sm90().items():
        assert ptxas_report(program.get_kernel_source(), str(tmp_path))["spill_bytes"] == 0, name


@needs_nvcc
@pytest.mark.parametrize("cls, N, dtype, has_weight", [
    (RMSNormBwdKernel, 1024, torch.bfloat16, True),
    (LayerNormBwdKernel, 16384, torch.bfloat16, True),
    (LayerNormBwdKernel, 32768, torch.bfloat16, False),
    (LayerNormBwdKernel, 4096, torch.bfloat16, False),
], ids=["rms-bwd-1024-partials-in-registers", "layer-bwd-16384-partials-in-shared-memory",
        "layer-bwd-32768-streamed-no-weight", "layer-bwd-4096-folded-groups-no-weight"])
def test_backward_programs_build_for_sm90(cls, N, dtype, has_weight) -> None:
    kernel = cls(N, dtype)
    source = _source(kernel, kernel.main_program(), direct=False, has_weight=has_weight, strided=False)
    assert "__global__" in source and "int64_t" in source
    assert "LDX" not in source  # contiguous calls walk rows at a constant stride
    strided = _source(kernel, kernel.main_program(), direct=False, has_weight=has_weight, strided=True)
    assert_strided_reads_are_16_bytes(strided, "LDG", "LDX")
    assert "atomic" not in source.lower()  # partial sums have one owner each
    layout = kernel.layout()
    threads = layout.block_threads if isinstance(layout, RowLayout) else layout.threads
    assert f"__launch_bounds__({threads}, {kernel.blocks_per_sm(layout)})" in source
    assert "__global__" in _source(kernel, COLUMN_SUM)


@pytest.mark.parametrize("fast", [False, True], ids=["h100", "fast-memory"])
def test_float16_fused_add_backward_keeps_a_block_a_row_group(monkeypatch: pytest.MonkeyPatch, fast: bool) -> None:
    """Folded, the fused add's float16 backward spills (see ``norm_bwd_default_config``): its rows of
    4096 take a 256-thread block each on any memory, where bfloat16 folds two groups a block."""
    monkeypatch.setattr(backward, "has_fast_memory", lambda: fast)
    assert FusedAddRMSNormBwdKernel(4096, torch.float16).layout() == RowLayout(4096, 8, 256, 256)
    assert FusedAddRMSNormBwdKernel(4096, torch.bfloat16).layout() == RowLayout(4096, 8, 256, 512)
    assert FusedAddRMSNormBwdKernel(8192, torch.float16).layout() == RowLayout(8192, 8, 512, 512)


@pytest.mark.parametrize("fast", [False, True], ids=["h100", "fast-memory"])
def test_bfloat16_backward_widens_by_word_where_it_pays(monkeypatch: pytest.MonkeyPatch, fast: bool) -> None:
    """Widening by word keeps more float32 values live (see ``NormBwdKernel.widening_pays``): not
    for the fused add's resident rows, nor for rows split over clusters whose blocks stage the
    next row early (RMSNorm's on fast memory); never for other dtypes."""
    monkeypatch.setattr(backward, "has_fast_memory", lambda: fast)

    def widens(cls, N, dtype=torch.bfloat16):
        return cls(N, dtype).config["widen_by_word"] == 1

    for N in (1024, 4096, 8192, 32768):
        assert widens(LayerNormBwdKernel, N)
        assert not widens(LayerNormBwdKernel, N, torch.float16) and not widens(RMSNormBwdKernel, N, torch.float32)
    assert widens(RMSNormBwdKernel, 4096) and not widens(FusedAddRMSNormBwdKernel, 4096)
    assert widens(FusedAddRMSNormBwdKernel, 32768)
    assert widens(RMSNormBwdKernel, 32768) == (not fast)
    # The tuner weighs the other choice.
    kernel = RMSNormBwdKernel(4096, torch.bfloat16)
    assert {**kernel.default_config, "widen_by_word": 0} in kernel.autotune_configs
    assert all(config["widen_by_word"] == 0 for config in RMSNormBwdKernel(4096, torch.float16).autotune_configs)


@needs_nvcc
@pytest.mark.parametrize("widen", [0, 1])
def test_widened_backward_reads_bfloat16_by_whole_words(widen: int) -> None:
    """Every element the widened program reads from a bfloat16 row buffer goes through the prelude's
    word function; by cast, none do; float16 ignores the key."""
    kernel = RMSNormBwdKernel(4096, torch.bfloat16, config={"widen_by_word": widen})
    source = _source(kernel, RESIDENT, direct=False, has_weight=True, strided=False)
    assert ("tileops_bf16_at(" in source) == bool(widen)
    half = _source(RMSNormBwdKernel(4096, torch.float16, config={"widen_by_word": widen}), RESIDENT,
                   direct=False, has_weight=True, strided=False)
    assert "tileops_bf16_at" not in half


def _global_stores(source: str) -> "list[str]":
    """How each store to the gradients or partial sums is written: its vector type, or ``scalar``."""
    pattern = r"\*\((uint4|uint2|uint1|float4|float2)\*\)\((?:DX|PW|PB) |\b(?:DX|PW|PB)\["
    return sorted(match.group(1) or "scalar" for match in re.finditer(pattern, source))


@needs_nvcc
@pytest.mark.parametrize("cls", [RMSNormBwdKernel, LayerNormBwdKernel, FusedAddRMSNormBwdKernel],
                         ids=["rms", "layer", "fused-add"])
@pytest.mark.parametrize("N", [4096, 32768])
def test_widening_keeps_every_program_s_vector_stores(monkeypatch: pytest.MonkeyPatch, cls, N: int) -> None:
    """TileLang does not vectorize a loop that calls an extern function: a widened element stored
    straight to memory would turn a program's vector stores into scalar ones (LayerNorm's one-row
    program did, which is why one-row launches keep the cast).  Every program a widened kernel
    launches stores as its by-cast build does."""
    monkeypatch.setattr(backward, "has_fast_memory", lambda: False)
    widened = cls(N, torch.bfloat16)
    by_cast = cls(N, torch.bfloat16, config={**widened.config, "widen_by_word": 0})
    programs = [(name, shape) for name, shape in widened.program_keys() if name != COLUMN_SUM]
    assert widened.config["widen_by_word"] == int(not (cls is FusedAddRMSNormBwdKernel and N == 4096))
    for name, shape in programs:
        sources = [kernel.compile_program(name, shape, target=SM90).get_kernel_source()
                   for kernel in (widened, by_cast)]
        # A single row's one launch keeps the cast (see ``NormBwdKernel.widens``).
        assert ("tileops_bf16_at(" in sources[0]) == (not dict(shape)["direct"] and widened.widens(widened.config))
        assert _global_stores(sources[0]) == _global_stores(sources[1]), (name, shape)
        assert _global_stores(sources[0]), (name, shape)


@needs_nvcc
# Fast memory changes the resident layout of LayerNorm's backward only.
@pytest.mark.parametrize("cls, fast", [(RMSNormBwdKernel, False), (FusedAddRMSNormBwdKernel, False),
                                       (LayerNormBwdKernel, False), (LayerNormBwdKernel, True)],
                         ids=["rms", "fused-add", "layer-h100", "layer-fast-memory"])
@pytest.mark.parametrize("N, dtype", [(4096, torch.bfloat16), (4096, torch.float16), (2048, torch.float16),
                                      (4096, torch.float32)])
def test_resident_backward_programs_hold_their_rows_without_spilling(monkeypatch: pytest.MonkeyPatch, cls, fast,
                                                                      N, dtype, tmp_path) -> None:
    """A resident backward row program under its default config keeps every value in registers:
    a spill puts local-memory loads in the row loop (the fused add's folded float16 program,
    32 bytes a thread, ran 17% behind bfloat16 on an H200)."""
    monkeypatch.setattr(backward, "has_fast_memory", lambda: fast)
    kernel = cls(N, dtype)
    assert isinstance(kernel.layout(), RowLayout)
    source = _source(kernel, kernel.main_program(), direct=False, has_weight=True, strided=False)
    assert ptxas_report(source, str(tmp_path))["spill_bytes"] == 0


@needs_nvcc
@pytest.mark.parametrize("N, dtype, program, shape", [
    (4096, torch.bfloat16, RESIDENT, {}),
    (32768, torch.bfloat16, STREAMED, {}),
    (32768, torch.bfloat16, CLUSTER, {"ctas": 2}),
], ids=["resident", "streamed", "cluster"])
def test_fused_add_backward_programs_read_the_sum_s_gradient_in_place(N, dtype, program, shape) -> None:
    """The gradient of the returned sum is a row input like ``grad_y``: strided reads of 16 bytes."""
    kernel = FusedAddRMSNormBwdKernel(N, dtype)
    assert program == CLUSTER or kernel.main_program() == program
    source = _source(kernel, program, direct=False, has_weight=True, strided=True, **shape)
    signature = _signature(source)
    assert signature.index(" G,") < signature.index(" R,") < signature.index(" X,")
    assert_strided_reads_are_16_bytes(source, "LDG", "LDR", "LDX")


@needs_nvcc
@pytest.mark.parametrize("cls, N", [(RMSNormBwdKernel, 4096), (LayerNormBwdKernel, 32768)],
                         ids=["rms-bwd-4096-resident", "layer-bwd-32768-streamed"])
def test_single_row_backward_programs_write_the_gradients_in_their_dtype(cls, N) -> None:
    kernel = cls(N, torch.bfloat16)
    source = _source(kernel, kernel.main_program(), direct=True, has_weight=True)
    signature = _signature(source)
    assert "float* __restrict__ PW" not in signature and "bfloat16_t* __restrict__ PW" in signature


# ---- host side of a launch (programs replaced by recorders) --------------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.calls: list = []

    def launcher(self, kernel: Any, name: str, shape: tuple = ()) -> Any:
        return lambda *args: self.calls.append((name, shape, args))


def _record(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    from tileops.kernels.norm.rows import RowNormKernel

    recorder = _Recorder()
    monkeypatch.setattr(RowNormKernel, "launcher", lambda self, name, shape=(): recorder.launcher(self, name, shape))
    monkeypatch.setattr(NormBwdKernel, "sm_count", lambda self, device: 132)
    return recorder


def test_layer_norm_forward_launches_the_variant_of_the_affine_present(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _record(monkeypatch)
    kernel = LayerNormFwdKernel(64, torch.float32)
    x, bias, y = torch.randn(5, 64), torch.randn(64), torch.empty(5, 64)
    assert kernel.forward(x, None, bias, y) is y
    [(name, shape, args)] = recorder.calls
    assert name == kernel.main_program() and dict(shape) == {"has_weight": False, "has_bias": True}
    assert args[0] is x and args[1] is bias and args[2] is y


def test_backward_launches_rows_then_column_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _record(monkeypatch)
    kernel = LayerNormBwdKernel(4096, torch.bfloat16)
    grad_y, x = torch.randn(300, 4096, dtype=torch.bfloat16), torch.randn(300, 4096, dtype=torch.bfloat16)
    grad_x, grad_weight, grad_bias = torch.empty_like(x), torch.empty(4096, dtype=x.dtype), torch.empty(4096, dtype=x.dtype)
    kernel.forward(grad_y, x, None, grad_x, grad_weight, grad_bias)
    (rows_name, rows_shape, rows_args), *sums = recorder.calls
    assert rows_name == kernel.main_program() and dict(rows_shape) == {"direct": False, "has_weight": False, "strided": False}
    assert rows_args[0] is grad_y and rows_args[1] is x and rows_args[2] is grad_x
    partial_w, partial_b = rows_args[3], rows_args[4]
    assert partial_w.shape == partial_b.shape == (kernel.buffer_rows(300, x.device), 4096)
    assert partial_w.dtype == torch.float32
    [(sum_name, _, sum_args)] = sums
    assert sum_name == COLUMN_SUM and sum_args[1] is grad_weight and sum_args[2] is grad_bias
    assert sum_args[0].shape == (2, *partial_w.shape)
    assert sum_args[0][0].data_ptr() == partial_w.data_ptr() and sum_args[0][1].data_ptr() == partial_b.data_ptr()


@pytest.mark.parametrize("cls, N, dtype, direct", [
    (LayerNormBwdKernel, 4096, torch.bfloat16, True),  # resident, partial sums in shared memory
    (RMSNormBwdKernel, 1024, torch.bfloat16, True),  # resident, partial sums in registers
    (RMSNormBwdKernel, 256, torch.bfloat16, False),  # four rows a block: a row group each
    (LayerNormBwdKernel, 32768, torch.bfloat16, True),  # streamed, the bias's last sums in registers
    (RMSNormBwdKernel, 65537, torch.float16, False),  # streamed, some sums in the partials buffer
])
def test_backward_of_one_row_is_one_launch_when_its_sums_stay_on_chip(monkeypatch: pytest.MonkeyPatch,
                                                                     cls, N, dtype, direct) -> None:
    recorder = _record(monkeypatch)
    kernel = cls(N, dtype, config={"cluster_rows": 0, "many_rows_ctas": 0})  # no cluster split
    grad_y, x = torch.randn(1, N, dtype=dtype), torch.randn(1, N, dtype=dtype)
    grads = [torch.empty(N, dtype=dtype) for _ in range(kernel.accumulators)]
    kernel.forward(grad_y, x, torch.ones(N, dtype=dtype), torch.empty_like(x), *grads)
    if not direct:
        assert [name for name, _, _ in recorder.calls] == [kernel.main_program(), COLUMN_SUM]
        return
    [(name, shape, args)] = recorder.calls
    assert name == kernel.main_program() and dict(shape) == {"direct": True, "has_weight": True, "strided": False}
    for grad, view in zip(grads, args[4:]):
        assert view.shape == (1, N) and view.dtype == dtype and view.data_ptr() == grad.data_ptr()
    # Two rows take the row launch and the column sum again.
    recorder.calls.clear()
    two = torch.randn(2, N, dtype=dtype)
    kernel.forward(two, two, torch.ones(N, dtype=dtype), torch.empty_like(two), *grads)
    assert [name for name, _, _ in recorder.calls] == [kernel.main_program(), COLUMN_SUM]


def test_backward_of_no_rows_zeroes_the_affine_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _record(monkeypatch)
    kernel = RMSNormBwdKernel(8, torch.float32)
    grad_weight = torch.full((8,), float("nan"))
    empty = torch.empty(0, 8)
    kernel.forward(empty, empty, torch.ones(8), torch.empty(0, 8), grad_weight)
    assert recorder.calls == [] and torch.equal(grad_weight, torch.zeros(8))


# ---- rows split over a cluster --------------------------------------------------------------------


@pytest.mark.parametrize("cls, N, dtype, row_threads, in_registers, blocks_per_sm, many", [
    (LayerNormBwdKernel, 32768, torch.bfloat16, 256, True, 2, 2),  # 8 slices of 4096 columns
    (RMSNormBwdKernel, 32768, torch.float32, 512, True, 1, 0),  # 8 slices of 4096, 8 columns a lane
    (LayerNormBwdKernel, 131072, torch.bfloat16, 1024, False, 1, 8),  # 8 slices of 16384
    (RMSNormBwdKernel, 24576, torch.bfloat16, 256, True, 2, 2),  # 8 slices of 3072: a tail group
])
def test_few_long_rows_split_over_a_cluster(cls, N, dtype, row_threads, in_registers, blocks_per_sm, many) -> None:
    kernel = cls(N, dtype)
    split = kernel.split_layout()
    assert isinstance(kernel.layout(), StreamLayout)
    assert isinstance(split, ClusterLayout) and split.ctas == 8 and split.slice.N == N // 8
    assert split.slice.row_threads == row_threads and split.slice.rows_per_block == 1
    # A slice's partial sums live in its threads' registers when they are few (at most 32 a
    # thread, in blocks that leave a thread 128 registers), else whole in shared memory.
    assert kernel.partials_in_registers(split) == in_registers
    if in_registers:
        assert split.slice.per_thread * kernel.accumulators <= 32 and kernel.smem_slots(split) == (0,) * kernel.accumulators
        assert split.threads * kernel.blocks_per_sm(split) <= 512
    else:
        assert all(slots >= split.slice.N for slots in kernel.smem_slots(split))
        assert 4 * sum(kernel.smem_slots(split)) <= 212 * 1024
    assert kernel.blocks_per_sm(split) == blocks_per_sm
    assert kernel.split_ctas(1) == kernel.split_ctas(1024) == 8
    # More half-precision rows split over blocks of 1024 threads, 32 bytes of each tensor a thread.
    assert kernel.split_ctas(1025) == many
    if many:
        wide = kernel.split_layout(ctas=many)
        assert wide.threads == 1024 and wide.slice.per_thread * dtype.itemsize == 32
        assert not kernel.partials_in_registers(wide) and kernel.blocks_per_sm(wide) == 1


@pytest.mark.parametrize("cls, N, dtype", [
    (LayerNormBwdKernel, 4096, torch.bfloat16),  # resident rows: no split
    (RMSNormBwdKernel, 65537, torch.float16),  # slices would not be whole vectors
    (LayerNormBwdKernel, 262144, torch.bfloat16),  # slices of 32768 are too long for registers
])
def test_rows_that_do_not_split(cls, N, dtype) -> None:
    kernel = cls(N, dtype)
    assert kernel.split_layout() is None and kernel.split_ctas(1) == kernel.split_ctas(10**6) == 0
    assert cls(32768, torch.bfloat16, config={**cls(32768, torch.bfloat16).default_config,
                                              "cluster_ctas": 0}).split_layout() is None


def test_split_rows_launch_the_cluster_program(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _record(monkeypatch)
    kernel = LayerNormBwdKernel(32768, torch.bfloat16)
    grads = [torch.empty(32768, dtype=torch.bfloat16) for _ in range(2)]
    one = torch.randn(1, 32768, dtype=torch.bfloat16)
    kernel.forward(one, one, None, torch.empty_like(one), *grads)
    [(name, shape, args)] = recorder.calls
    assert name == CLUSTER and dict(shape) == {"ctas": 8, "direct": True, "has_weight": False, "strided": False}
    assert [view.data_ptr() for view in args[3:]] == [grad.data_ptr() for grad in grads]
    recorder.calls.clear()
    rows = torch.randn(1025, 32768, dtype=torch.bfloat16)  # past cluster_rows: streamed
    kernel.forward(rows[:200], rows[:200], torch.ones(32768, dtype=torch.bfloat16), torch.empty_like(rows[:200]),
                   *grads)
    (name, shape, args), (sum_name, _, sum_args) = recorder.calls
    assert name == CLUSTER and dict(shape) == {"ctas": 8, "direct": False, "has_weight": True, "strided": False}
    # 132 SMs hold 2 blocks of 256 threads each (partial sums in registers), 33 clusters of 8;
    # 200 rows take 7 steps, which 29 clusters do as well, each taking rows q, q + 29, ...
    assert args[4].shape == (29, 32768) and sum_name == COLUMN_SUM
    # Many rows split too, each over 2 blocks of 1024 threads, a block an SM: 66 clusters; 1025
    # rows take 16 steps, which 65 clusters do as well.
    recorder.calls.clear()
    kernel.forward(rows, rows, None, torch.empty_like(rows), *grads)
    (name, shape, args), (sum_name, _, _) = recorder.calls
    assert name == CLUSTER and dict(shape) == {"ctas": 2, "direct": False, "has_weight": False, "strided": False}
    assert args[3].shape == (65, 32768) and sum_name == COLUMN_SUM
    recorder.calls.clear()
    streamed = LayerNormBwdKernel(32768, torch.bfloat16, config={"many_rows_ctas": 0})
    streamed.forward(rows, rows, None, torch.empty_like(rows), *grads)
    assert [name for name, _, _ in recorder.calls] == [STREAMED, COLUMN_SUM]


@needs_nvcc
def test_cluster_program_builds_for_sm90() -> None:
    kernel = RMSNormBwdKernel(32768, torch.bfloat16)
    source = _source(kernel, CLUSTER, ctas=8, direct=False, has_weight=True, strided=False)
    assert_strided_reads_are_16_bytes(_source(kernel, CLUSTER, ctas=8, direct=False, has_weight=True, strided=True),
                                      "LDG", "LDX")
    # Sums swapped through distributed shared memory: stores from registers that count on the
    # receiving block's barrier, which each block waits on alone.
    body = source[source.index("__global__"):]
    assert "tileops_send_two(" in body and "tileops_send_four(" not in body and ".wait(" in body
    assert source.count("cluster_sync") == 2  # barriers set up, and no block leaving early
    # The row sum's is the only block barrier: no other thread reads what a thread writes to
    # shared memory but through the mbarriers.
    assert body.count("__syncthreads()") == 1
    assert "atomic" not in source.lower()
    split = kernel.split_layout()
    assert f"__launch_bounds__({split.threads}, {kernel.blocks_per_sm(split)})" in source
    # Many rows: slices of 16384 columns, a block of 1024 threads an SM, sums in shared memory.
    wide = _source(kernel, CLUSTER, ctas=2, direct=False, has_weight=True)
    assert "__launch_bounds__(1024, 1)" in wide and wide.count("__syncthreads()") == 1
    layer = _source(LayerNormBwdKernel(32768, torch.bfloat16), CLUSTER, ctas=2, direct=False, has_weight=True)
    assert "tileops_send_four(" in layer[layer.index("__global__"):]
    # LayerNorm's four sums are split among the lanes and broadcast back from one lane of each
    # group; RMSNorm's two take the plain xor reduction.
    assert "__shfl_sync(" in layer and "__shfl_sync(" not in wide


@pytest.mark.parametrize("fast", [False, True], ids=["h100", "fast-memory"])
@pytest.mark.parametrize("cls", [LayerNormBwdKernel, RMSNormBwdKernel, FusedAddRMSNormBwdKernel])
def test_fast_memory_stages_the_next_row_of_wide_cluster_slices(monkeypatch: pytest.MonkeyPatch, cls,
                                                                fast: bool) -> None:
    """Blocks of 1024 threads (many half-precision rows, slices of 16384) bulk-copy the next row into
    shared memory where memory is fast; blocks that hold it in registers (few rows, slices of 4096
    and 8192 on 256 and 512 threads) keep doing so."""
    monkeypatch.setattr(backward, "has_fast_memory", lambda: fast)
    for N, dtype in ((32768, torch.bfloat16), (65536, torch.float16)):
        kernel = cls(N, dtype)
        wide = kernel.split_layout(ctas=kernel.split_ctas(8192))
        assert wide.threads == 1024 and wide.slice.N == 16384
        assert kernel.stages(wide) == fast and not kernel.partials_in_registers(wide)
        assert kernel.blocks_per_sm(wide) == 1
        few = kernel.split_layout(ctas=kernel.split_ctas(1))
        assert few.threads == N // 128 and not kernel.stages(few)
    # Staging 512-thread slices moves their partial sums out of registers, and lets two blocks share
    # an SM: 64 KiB of LayerNorm partial sums and 32 KiB of stage each.
    kernel = LayerNormBwdKernel(32768, torch.bfloat16, config={"many_rows_ctas": 4, "cluster_stage": 512})
    four = kernel.split_layout(ctas=4)
    assert four.threads == 512 and kernel.stages(four) and not kernel.partials_in_registers(four)
    assert kernel.smem_slots(four) == (8192, 8192) and kernel.blocks_per_sm(four) == 2
    # A stage that does not fit next to the partial sums (float32 slices of 16384: 128 KiB each) is left out.
    wide32 = LayerNormBwdKernel(131072, torch.float32, config={"resident_row_bytes": 64, "cluster_stage": 1024})
    split = wide32.split_layout(ctas=8)
    assert split.threads == 1024 and not wide32.stages(split) and wide32.blocks_per_sm(split) == 1


@needs_nvcc
def test_a_cluster_program_follows_the_config_it_is_built_for() -> None:
    """A program built for a config other than the kernel's current one (here unstaged, 512-thread
    slices keeping their partial sums in registers) stages, and keeps its partial sums in shared
    memory, as that config says."""
    kernel = LayerNormBwdKernel(32768, torch.bfloat16, config={"cluster_stage": 0})
    staged = {**kernel.config, "many_rows_ctas": 4, "cluster_stage": 512}
    split = kernel.split_layout(staged, 4)
    assert kernel.partials_in_registers(split) and not kernel.partials_in_registers(split, staged)
    assert kernel.smem_slots(split, staged) == (8192, 8192) and kernel.blocks_per_sm(split, staged) == 2
    source = kernel.compile_program(CLUSTER, (("ctas", 4), ("direct", False), ("has_weight", True),
                                              ("strided", False)), config=staged, target=SM90).get_kernel_source()
    assert "tileops_bulk_load(" in source and "__launch_bounds__(512, 2)" in source


@needs_nvcc
@pytest.mark.parametrize("cls, copies", [(LayerNormBwdKernel, 3), (RMSNormBwdKernel, 2), (FusedAddRMSNormBwdKernel, 2)])
def test_staged_cluster_program_builds_for_sm90(cls, copies: int) -> None:
    kernel = cls(32768, torch.bfloat16, config={"cluster_stage": 1024})
    source = _source(kernel, CLUSTER, ctas=2, direct=False, has_weight=True, strided=False)
    assert "__launch_bounds__(1024, 1)" in source
    # One thread starts a row's copies (grad_y's and x's slices, and LayerNorm's shift) before the
    # loop and once in it; no thread loads either tensor itself.
    assert source.count("tileops_bulk_load(") == 1 + 2 * copies
    assert source.count("tileops_arrive_expecting(") == 1 + 2
    assert "(uint4*)(G +" not in source and "(uint4*)(X +" not in source
    assert "loaded[0].wait(" in source
    # RMSNorm's blocks load the weight's slice once, before the row loop (its write reads it
    # anyway); LayerNorm's and the fused add's reload it each row, as holding it would spill.
    before, loop = source.split("for (int it = 0;", 1)
    weight_loads = ("(uint4*)(W +" in before, "(uint4*)(W +" in loop)
    assert weight_loads == ((True, False) if cls is RMSNormBwdKernel else (False, True))
    # RMSNorm's blocks start the next row's copies before the row sum's barrier, once every thread
    # has arrived on the consumed barrier and thread 0 has fenced the async proxy; the others after.
    early = cls is RMSNormBwdKernel
    assert kernel.config["cluster_stage_early"] == int(early)
    copies_first = loop.index("tileops_bulk_load(") < loop.index("__syncthreads()")
    assert copies_first == early
    assert ("consumed[0].arrive()" in loop and "tl::fence_proxy_async()" in loop) == early
    plain = _source(cls(32768, torch.bfloat16, config={"cluster_stage": 0}), CLUSTER, ctas=2, direct=False,
                    has_weight=True, strided=False)
    assert "tileops_bulk_load" not in plain and "loaded" not in plain


@needs_nvcc
def test_a_single_row_launches_a_block_of_one_row_group() -> None:
    # Many rows fold two row groups of 256 threads into a block; a single row's launch takes one.
    kernel = LayerNormBwdKernel(4096, torch.bfloat16)
    assert kernel.layout().rows_per_block == 2 and kernel.writes_directly(1)
    assert "__launch_bounds__(256" in _source(kernel, RESIDENT, direct=True, has_weight=True)
    assert "__launch_bounds__(512" in _source(kernel, RESIDENT, direct=False, has_weight=True)


def test_tuning_weighs_the_split_of_many_rows_against_streaming() -> None:
    kernel = RMSNormBwdKernel(32768, torch.bfloat16)
    candidates = kernel.autotune_configs
    assert candidates[0] == kernel.default_config and kernel.split_ctas(kernel.tuning_rows) == 2
    streamed = [config for config in candidates if config["many_rows_ctas"] == 0]
    assert {**kernel.default_config, "many_rows_ctas": 0} in streamed
    assert {(config["stream_threads"], config["stream_unroll"]) for config in streamed} == {
        (512, 2), (512, 4), (1024, 1), (1024, 4)}
    # The clusters' blocks compete with and without staged rows, staged early and after the row sum.
    # (The same set whether the device's default stages or not.)
    assert {(config["cluster_stage"], config["cluster_stage_early"]) for config in candidates
            if config["many_rows_ctas"]} == {(0, 1), (1024, 0), (1024, 1)}
    # Float32 rows are streamed by default: no split candidates to add.
    assert all(config["many_rows_ctas"] == 0 for config in RMSNormBwdKernel(32768, torch.float32).autotune_configs)


@pytest.mark.parametrize("N, dtype, hinted", [
    (8, torch.float32, True), (4096, torch.bfloat16, True), (5120, torch.float16, True),
    (4097, torch.float32, False), (32768, torch.bfloat16, True),
], ids=["8-fp32", "4096-bf16", "5120-fp16-tail", "4097-fp32-narrow", "32768-bf16"])
@pytest.mark.parametrize("cls", [LayerNormFwdKernel, FusedAddRMSNormFwdKernel], ids=["layer", "fused-add"])
def test_forward_builds_a_hinted_program_where_its_loads_take_the_hint(cls, N: int, dtype: torch.dtype,
                                                                      hinted: bool) -> None:
    kernel = cls(N, dtype)
    hinted = hinted and not (cls is LayerNormFwdKernel and N == 32768)  # LayerNorm streams such rows
    programs = kernel.build_all_for_sm90()
    assert len(programs) == 1 + hinted
    assert (kernel.hinted_program() is not None) == hinted
    for name, program in programs.items():
        body = program.get_kernel_source().split("__global__", 1)[1]
        assert ("tileops_load_evict_last(" in body) == name.startswith(str(kernel.hinted_program()))
    # The call's input size picks the program: hinted_min_mib MiB and more take the hinted one.
    threshold = kernel.config["hinted_min_mib"] << 20
    assert kernel.row_program(threshold - 1) == kernel.main_program()
    assert kernel.row_program(threshold) == (kernel.hinted_program() if hinted else kernel.main_program())
