"""CPU checks of the softmax family: sm_90 builds, config heuristics and the family base's views.

Compiling needs nvcc but no GPU.  TileLang caches compiled programs on disk,
so only the first run pays ~3-5 s per program (ten programs here).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest
import torch

from tileops.kernels.cache_hints import HINTED_MIN_MIB
from tileops.kernels.kernel_base import Kernel
from tileops.kernels.softmax.log_softmax import LogSoftmaxBwdKernel, LogSoftmaxFwdKernel
from tileops.kernels.softmax.softmax import (
    COLUMN_APPLY,
    COLUMN_FUSED,
    COLUMN_STATS,
    ROW_APPLY,
    ROW_CLUSTER,
    ROW_CLUSTER_STAGED,
    ROW_FUSED,
    ROW_HELD,
    ROW_STAGED,
    ROW_STATS,
    SoftmaxBwdKernel,
    SoftmaxFwdKernel,
    build_program,
    column_cluster_size,
    column_tile,
    fused_column_params,
    fused_elements_cap,
    row_cluster_size,
    row_vector,
    softmax_autotune_configs,
    softmax_default_config,
    staged_fits,
    windows_fit,
)
from tileops.kernels.softmax import softmax as softmax_module
from tileops.kernels.launch import int32_launch_ranges
from tileops.kernels.sizes import max_vector
from tileops.kernels.windows import window_count
from tileops.ops.softmax.base import SoftmaxFamilyOp, kernel_view
from tests.toolchain import divisions_at_accesses, needs_nvcc, ptxas_report

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SIZES = (1, 2, 3, 7, 8, 127, 128, 1000, 4096, 4097, 8192, 32768, 32769, 65536, 65537, 262144)
KERNELS = (SoftmaxFwdKernel, SoftmaxBwdKernel, LogSoftmaxFwdKernel, LogSoftmaxBwdKernel)


# ---- builds for sm_90: every program of every variant at least once --------------------------


@needs_nvcc
@pytest.mark.parametrize(
    "kernel_cls, N, dtype, outer, inner, expected",
    [
        (SoftmaxFwdKernel, 4096, torch.bfloat16, 64, 64, {ROW_FUSED, COLUMN_FUSED}),
        (LogSoftmaxFwdKernel, 4096, torch.float32, 64, 16, {ROW_FUSED, COLUMN_FUSED}),
        (SoftmaxBwdKernel, 1000, torch.bfloat16, 200, 8, {ROW_FUSED, COLUMN_FUSED}),
        (LogSoftmaxBwdKernel, 127, torch.float16, 4, 5, {ROW_FUSED, COLUMN_STATS, COLUMN_APPLY}),
        (LogSoftmaxFwdKernel, 65537, torch.float32, 1, 1, {ROW_HELD}),
        (SoftmaxFwdKernel, 1 << 21, torch.bfloat16, 1, 1, {ROW_STATS, ROW_APPLY}),
        (SoftmaxBwdKernel, 262144, torch.bfloat16, 1, 1, {ROW_STATS, ROW_APPLY}),
        (SoftmaxBwdKernel, 262144, torch.bfloat16, 64, 1, {ROW_CLUSTER}),
        (LogSoftmaxBwdKernel, 100003, torch.float32, 64, 1, {ROW_CLUSTER}),
    ],
    ids=["softmax-fwd-4096-bf16", "log-fwd-4096-fp32", "softmax-bwd-1000-bf16-resident", "log-bwd-127-fp16",
         "log-fwd-65537-fp32-held", "softmax-fwd-2m-bf16-split", "softmax-bwd-256k-bf16-split",
         "softmax-bwd-256k-bf16-cluster",
         "log-bwd-100003-fp32-cluster"],
)
def test_softmax_kernels_build_for_sm90(kernel_cls, N: int, dtype: torch.dtype, outer: int, inner: int,
                                        expected) -> None:
    kernel = kernel_cls(N, dtype)
    specs = kernel.program_specs(1, outer=outer) if inner == 1 else (
        kernel.program_specs(1) + kernel.program_specs(inner, outer=outer))
    assert {name for name, _ in specs} == expected
    for name, params in specs:
        source = kernel.compile_program(name, params, target={"kind": "cuda", "arch": "sm_90"}).get_kernel_source()
        assert "__global__" in source
        # Global offsets are 64-bit, so tensors over 2**31 elements are addressed correctly.
        assert "(int64_t)" in source
        assert not divisions_at_accesses(source), name
        width = dict(params).get("vector", dict(params).get("cvec"))
        if width * dtype.itemsize == 16:
            # Aligned inputs get 16-byte accesses.
            assert "uint4" in source or "float4" in source


@needs_nvcc
@pytest.mark.parametrize("kernel_cls", [SoftmaxFwdKernel, SoftmaxBwdKernel], ids=str)
def test_two_step_loads_keep_the_row_in_l2_for_the_second_read(kernel_cls, tmp_path) -> None:
    # The stats program's 16-byte loads keep their lines in L2 (evict_last); the apply program's,
    # their last use, let them go first (evict_first).  Narrower accesses and a config without
    # hints load plainly.
    expected = {ROW_STATS: "tileops_load_evict_last(", ROW_APPLY: "tileops_load_evict_first("}
    assert softmax_default_config(262144, torch.bfloat16, kernel_cls.variant.backward)["split_cache_hints"] == (
        0 if kernel_cls.variant.backward else 1)
    for hints in (1, 0):
        # The forward's rows of 262144 take the held program by default.
        kernel = kernel_cls(262144, torch.bfloat16, config={"split_cache_hints": hints, "held_threads": 0})
        for name, params in kernel.program_specs(1):
            source = kernel.compile_program(name, params, target={"kind": "cuda", "arch": "sm_90"}).get_kernel_source()
            body = source[source.index("__global__"):]
            loads = body.count(expected[name])
            assert (loads > 0) == bool(hints), (name, hints)
            assert "tileops_load_" not in body.replace(expected[name], "")
            if hints:
                assert ptxas_report(source, str(tmp_path))["spill_bytes"] == 0
    # Odd rows: 2-byte accesses.
    narrow = kernel_cls(262143, torch.bfloat16, config={"split_cache_hints": 1, "held_threads": 0})
    for name, params in narrow.program_specs(1):
        source = narrow.compile_program(name, params, target={"kind": "cuda", "arch": "sm_90"}).get_kernel_source()
        assert "tileops_load_" not in source[source.index("__global__"):]


@needs_nvcc
@pytest.mark.parametrize("outer, N, expected", [
    (64, 4096, {COLUMN_FUSED: ("tileops_load_evict_last(", "tileops_load_evict_first(")}),
    (4, 32768, {COLUMN_STATS: ("tileops_load_evict_last(",), COLUMN_APPLY: ("tileops_load_evict_first(",)}),
], ids=["fused", "two-step"])
def test_backward_columns_keep_the_axis_in_l2_for_the_second_read(outer: int, N: int, expected, tmp_path) -> None:
    assert softmax_default_config(N, torch.bfloat16, True)["column_cache_hints"] == 1
    assert softmax_default_config(N, torch.bfloat16, False)["column_cache_hints"] == 0
    for kernel_cls in (SoftmaxBwdKernel, SoftmaxFwdKernel):
        kernel = kernel_cls(N, torch.bfloat16, config={"column_cache_hints": 1})
        specs = kernel.program_specs(64, outer=outer)
        assert {name for name, _ in specs} == set(expected)
        for name, params in specs:
            source = kernel.compile_program(name, params, target={"kind": "cuda", "arch": "sm_90"}).get_kernel_source()
            body = source[source.index("__global__"):]
            for call in ("tileops_load_evict_last(", "tileops_load_evict_first("):
                assert (call in body) == (call in expected[name]), (kernel_cls, name, call)
            assert ptxas_report(source, str(tmp_path))["spill_bytes"] == 0


@needs_nvcc
@pytest.mark.parametrize("kernel_cls", [SoftmaxFwdKernel, LogSoftmaxFwdKernel], ids=str)
def test_forward_columns_hint_calls_that_fit_in_l2_on_fast_memory(kernel_cls, monkeypatch) -> None:
    # 64 x 4096 x 64 bf16 (32 MiB) takes the hinted fused column program, 16 x 32768 x 64 (64 MiB)
    # the plain one; elsewhere, and with the hint on every call already, no call takes it.
    monkeypatch.setattr(softmax_module, "has_fast_memory", lambda: True)
    kernel = kernel_cls(4096, torch.bfloat16)
    assert kernel.config["column_hinted_max_mib"] == 32
    (small,) = kernel.program_specs(64, outer=64)
    assert small[0] == COLUMN_FUSED and dict(small[1])["hinted"] == 1
    body = kernel.compile_program(*small, target={"kind": "cuda", "arch": "sm_90"}).get_kernel_source()
    assert "tileops_load_evict_last(" in body[body.index("__global__"):]
    large = kernel_cls(32768, torch.bfloat16).program_specs(64, outer=16)
    assert [name for name, _ in large] == [COLUMN_FUSED] and "hinted" not in dict(large[0][1])
    unhinted = kernel_cls(4096, torch.bfloat16, config={"column_hinted_max_mib": 0}).program_specs(64, outer=64)
    assert "hinted" not in dict(unhinted[0][1])
    assert "hinted" not in dict(kernel_cls(4096, torch.bfloat16, config={"column_cache_hints": 1})
                                .program_specs(64, outer=64)[0][1])
    assert SoftmaxBwdKernel(4096, torch.bfloat16).config["column_hinted_max_mib"] == 0
    monkeypatch.setattr(softmax_module, "has_fast_memory", lambda: False)
    assert "hinted" not in dict(kernel_cls(4096, torch.bfloat16).program_specs(64, outer=64)[0][1])


# ---- row clusters ------------------------------------------------------------------------------


@needs_nvcc
@pytest.mark.parametrize("kernel_cls, N, outer, program, key, on, off, by_default", [
    (SoftmaxBwdKernel, 4096, 1 << 15, ROW_FUSED, "row_hinted_min_mib", 0, 1 << 20, True),
    (SoftmaxFwdKernel, 32768, 1 << 13, ROW_FUSED, "row_hinted_min_mib", 0, 1 << 20, True),  # 1024 threads, 512 MiB
    (SoftmaxFwdKernel, 4096, 1 << 13, ROW_FUSED, "row_hinted_min_mib", 0, 1 << 20, False),  # 64 MiB
    (LogSoftmaxBwdKernel, 65536, 1 << 10, ROW_CLUSTER, "cluster_cache_hints", 1, 0, False),
], ids=str)
def test_row_hints_mark_every_16_byte_row_load(kernel_cls, N: int, outer: int, program: str, key: str, on: int,
                                                off: int, by_default: bool, tmp_path) -> None:
    # With the hint, every whole 16-byte vector of each input carries evict_last and a row's
    # registers still hold it without spilling; without it, the programs load plainly.  Fused
    # rows take it by default from HINTED_MIN_MIB of input on.
    for config, hints in (({key: on}, True), ({key: off}, False), ({}, by_default)):
        kernel = kernel_cls(N, torch.bfloat16, config=config)
        (spec,) = kernel.program_specs(1, outer=outer)
        assert spec[0] == program
        source = kernel.compile_program(*spec, target={"kind": "cuda", "arch": "sm_90"}).get_kernel_source()
        body = source[source.index("__global__"):]
        inputs = 2 if kernel_cls.variant.backward else 1
        assert body.count("tileops_load_evict_last(") == (inputs if hints else 0), body
        assert "tileops_load_evict_first(" not in body
        if hints:
            assert ptxas_report(source, str(tmp_path))["spill_bytes"] == 0


@needs_nvcc
@pytest.mark.parametrize("kernel_cls, N, dtype, threads, cluster", [
    (SoftmaxFwdKernel, 262144, torch.bfloat16, 1024, 8),
    (SoftmaxFwdKernel, 131072, torch.bfloat16, 512, 8),
    (LogSoftmaxFwdKernel, 65537, torch.float16, 512, 8),
    (LogSoftmaxFwdKernel, 65536, torch.bfloat16, 512, 4),
    (SoftmaxBwdKernel, 262144, torch.bfloat16, 1024, 8),
    (LogSoftmaxBwdKernel, 131072, torch.float32, 1024, 8),
    (SoftmaxBwdKernel, 40000, torch.float32, 1024, 4),
    (LogSoftmaxBwdKernel, 40000, torch.bfloat16, 256, 8),
    (SoftmaxBwdKernel, 50257, torch.bfloat16, 256, 8),
], ids=str)
def test_row_clusters_hold_their_rows_in_registers(kernel_cls, N: int, dtype: torch.dtype, threads: int,
                                                    cluster: int, tmp_path) -> None:
    # 512-thread blocks are built to fit two an SM, 256-thread ones four: 64 registers a thread at most.
    kernel = kernel_cls(N, dtype, config={"cluster_threads": threads, "cluster_min_blocks": 1024 // threads,
                                          "cluster_stages": 0})
    assert kernel.row_cluster() == cluster
    (spec,) = kernel.program_specs(1, outer=1 << 10)
    # Odd rows whose windows fit take them (``windows_fit``): 65537 in the forward.
    windows = N % max_vector(dtype) != 0 and kernel_cls is LogSoftmaxFwdKernel
    vector = max_vector(dtype) if windows else row_vector(N, dtype)
    assert spec == (ROW_CLUSTER, (("vector", vector), ("cluster", cluster)) + ((("windowed", 1),) if windows else ()))
    source = kernel.compile_program(*spec, target={"kind": "cuda", "arch": "sm_90"}).get_kernel_source()
    # Each block stores its partial result into every block of its cluster, after waiting for the
    # arrival each block made when it started, and the full barrier comes before anything is read.
    body = source[source.index("__global__ void __launch_bounds__"):]
    # Rows run along the grid's x axis, so more than 65535 of them launch.
    assert "blockIdx.y" not in body
    assert body.index("cluster_arrive_relaxed()") < body.index("cluster_wait()")
    assert body.index("cluster_wait()") < body.index("tileops_store_to_peer(") < body.index("cluster_sync()")
    # Peers write the exchange buffer while this block may still reduce in its scratch, so the
    # buffer is static shared memory, apart from the dynamic pool.
    assert f"__shared__ __align__(16) float gathered[{2 * cluster}]" in body
    assert f"__launch_bounds__({threads}, {1024 // threads})" in body
    report = ptxas_report(source, str(tmp_path))
    assert report["spill_bytes"] == 0, report


def test_fast_memory_stages_forward_rows_of_two_block_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where memory is fast, forward rows that two 1024-thread blocks hold take the row cluster
    staged program once the rows give each cluster of a wave (66 on 132 SMs) two; fewer rows,
    rows of larger clusters, float32 rows whose two stages do not fit, narrower accesses and
    backward rows keep the row cluster program."""
    sm_count = 132
    monkeypatch.setattr(softmax_module, "has_fast_memory", lambda: True)
    for kernel_cls in (SoftmaxFwdKernel, LogSoftmaxFwdKernel):
        for N, dtype in ((65536, torch.bfloat16), (49160, torch.bfloat16), (60000, torch.float16),
                         (40000, torch.float32)):
            kernel = kernel_cls(N, dtype)
            assert kernel.config["cluster_stages"] == 2 and kernel.least_staged_cluster_rows(sm_count) == 132
            vector = row_vector(N, dtype)
            assert kernel.row_programs(132, vector, sm_count) == ((ROW_CLUSTER_STAGED,),
                                                                  (("vector", vector), ("cluster", 2)))
            assert kernel.row_programs(131, vector, sm_count)[0] == (ROW_CLUSTER,)
            assert kernel.row_programs(1 << 10, vector // 2, sm_count)[0] == (ROW_CLUSTER,)
        for N, dtype in ((131072, torch.bfloat16), (65536, torch.float32), (65537, torch.bfloat16)):
            assert kernel_cls(N, dtype).row_programs(1 << 10, row_vector(N, dtype), sm_count)[0] == (ROW_CLUSTER,)
        # One row ahead, float32 rows of 65536 fit.
        assert kernel_cls(65536, torch.float32, config={"cluster_stages": 1}).row_programs(
            1 << 10, 4, sm_count)[0] == (ROW_CLUSTER_STAGED,)
    for kernel_cls in (SoftmaxBwdKernel, LogSoftmaxBwdKernel):
        assert kernel_cls(65536, torch.bfloat16).config["cluster_stages"] == 0
        staged = kernel_cls(65536, torch.bfloat16, config={"cluster_stages": 2})
        assert staged.row_programs(1 << 10, 8, sm_count)[0] == (ROW_CLUSTER,)
    monkeypatch.setattr(softmax_module, "has_fast_memory", lambda: False)
    assert SoftmaxFwdKernel(65536, torch.bfloat16).row_programs(1 << 10, 8, sm_count)[0] == (ROW_CLUSTER,)


# (N, dtype, softmax backward's layout, log-softmax backward's layout) on fast memory:
# (threads, blocks an SM) of their row clusters.
BACKWARD_LAYOUTS_ON_FAST_MEMORY = [
    (40000, torch.bfloat16, (256, 4), (256, 4)),
    (50257, torch.bfloat16, (256, 4), (256, 4)),
    (57344, torch.bfloat16, (256, 4), (256, 4)),  # 3.5 vectors a thread in 1024-thread blocks
    (65536, torch.bfloat16, (1024, 1), (256, 4)),  # 4 whole vectors a thread
    (49152, torch.bfloat16, (1024, 1), (256, 4)),  # 3
    (128256, torch.bfloat16, (512, 2), (512, 2)),  # too long for eight 256-thread blocks
    (131072, torch.bfloat16, (1024, 1), (512, 2)),
    (262144, torch.bfloat16, (1024, 1), (1024, 1)),
    (65536, torch.float32, (1024, 1), (512, 2)),
    (40000, torch.float32, (512, 2), (512, 2)),
    (32769, torch.float16, (256, 4), (256, 4)),
]


@pytest.mark.parametrize("N, dtype, softmax_layout, log_layout", BACKWARD_LAYOUTS_ON_FAST_MEMORY, ids=str)
def test_fast_memory_backward_clusters_take_the_narrowest_blocks_that_hold_a_row(
        monkeypatch: pytest.MonkeyPatch, N: int, dtype: torch.dtype, softmax_layout: Tuple[int, int],
        log_layout: Tuple[int, int]) -> None:
    """Where memory is fast, the backwards' row clusters take the narrowest blocks (256, 512 or
    1024 threads, 1024 threads an SM) whose cluster holds a row; the softmax backward keeps
    1024-thread blocks where they give every thread whole 16-byte vectors.  Each layout needs
    as many rows as 1024-thread blocks did to take clusters (one such block an SM), and other
    devices keep 1024-thread blocks."""
    sm_count = 132
    monkeypatch.setattr(softmax_module, "has_fast_memory", lambda: True)
    for kernel_cls, layout in ((SoftmaxBwdKernel, softmax_layout), (LogSoftmaxBwdKernel, log_layout)):
        kernel = kernel_cls(N, dtype)
        assert (kernel.config["cluster_threads"], kernel.config["cluster_min_blocks"]) == layout, kernel_cls
        assert kernel.row_cluster() == row_cluster_size(N, dtype, True, layout[0])
        wide = kernel_cls(N, dtype, config={"cluster_threads": 1024, "cluster_min_blocks": 1})
        least = kernel.least_cluster_rows(sm_count)
        assert least == wide.least_cluster_rows(sm_count) == -(-sm_count // wide.row_cluster())
        vector = row_vector(N, dtype)
        assert kernel.row_programs(least, vector, sm_count) == ((ROW_CLUSTER,), (
            ("vector", vector), ("cluster", kernel.row_cluster())))
        assert kernel.row_programs(least - 1, vector, sm_count)[0] == (ROW_STATS, ROW_APPLY)
    monkeypatch.setattr(softmax_module, "has_fast_memory", lambda: False)
    for kernel_cls in (SoftmaxBwdKernel, LogSoftmaxBwdKernel):
        config = kernel_cls(N, dtype).config
        assert (config["cluster_threads"], config["cluster_min_blocks"]) == (1024, 1)


@needs_nvcc
@pytest.mark.parametrize("kernel_cls", [SoftmaxFwdKernel, LogSoftmaxFwdKernel])
@pytest.mark.parametrize("N, dtype, stages", [(65536, torch.bfloat16, 2), (60000, torch.float16, 1),
                                              (40000, torch.float32, 2)], ids=str)
def test_staged_row_clusters_build_for_sm90(kernel_cls, N: int, dtype: torch.dtype, stages: int, tmp_path) -> None:
    """Each block of a two-block cluster copies its share of the rows ahead with cp.async and
    exchanges its pair once a row, into one of two halves of the exchange buffer by the row's
    parity, with one full cluster barrier a row; the first row's stores wait on the arrival each
    block made when it started."""
    kernel = kernel_cls(N, dtype, config={"cluster_stages": stages})
    spec = (ROW_CLUSTER_STAGED, (("vector", row_vector(N, dtype)), ("cluster", 2)))
    source = kernel.compile_program(*spec, target={"kind": "cuda", "arch": "sm_90"}).get_kernel_source()
    body = source[source.index("__global__ void __launch_bounds__"):]
    assert "__launch_bounds__(1024, 1)" in body and "int blocks)" in body
    assert "tl::cp_async_gs<16>" in body and f"tl::cp_async_wait<{stages - 1}>()" in body
    assert "__shared__ __align__(16) float gathered[8]" in body
    loop = body[body.index("for (int step = 0;"):]
    assert body.index("cluster_arrive_relaxed()") < body.index("cluster_wait()") < body.index("for (int step = 0;")
    assert loop.count("cluster_sync()") == 1 and "cluster_wait()" not in loop
    assert loop.index("tileops_store_to_peer(") < loop.index("cluster_sync()")
    assert "(step & 1) * 4" in loop
    report = ptxas_report(source, str(tmp_path))
    assert report["registers"] <= 64 and report["spill_bytes"] == 0, report


def test_row_clusters_take_the_rows_that_fill_the_gpu() -> None:
    sm_count = 132
    for kernel_cls in (SoftmaxBwdKernel, LogSoftmaxBwdKernel):
        kernel = kernel_cls(262144, torch.bfloat16)
        assert kernel.row_programs(17, 8, sm_count)[0] == (ROW_CLUSTER,)  # 17 rows x 8 blocks >= 132
        assert kernel.row_programs(16, 8, sm_count)[0] == (ROW_STATS, ROW_APPLY)
        # Rows that fit one block stay fused, whatever the row count.
        assert kernel_cls(32768, torch.bfloat16).row_programs(1 << 16, 8, sm_count)[0] == (ROW_FUSED,)
    # The forward's 512-thread clusters hold 131072 bfloat16 elements at most; its longer rows take the
    # two steps unless its config gives it 1024-thread blocks.
    assert SoftmaxFwdKernel(131072, torch.bfloat16).row_cluster() == 8
    assert SoftmaxFwdKernel(131072, torch.bfloat16).row_programs(17, 8, sm_count)[0] == (ROW_CLUSTER,)
    assert SoftmaxFwdKernel(262144, torch.bfloat16).row_programs(1024, 8, sm_count)[0] == (ROW_HELD,)
    clustered = SoftmaxFwdKernel(262144, torch.bfloat16, config={"cluster_threads": 1024})
    assert clustered.row_programs(1024, 8, sm_count)[0] == (ROW_CLUSTER,)
    # One block's rows never split: no clusters at all.
    assert SoftmaxBwdKernel(262144, torch.bfloat16, config={"max_cluster": 1}).row_cluster() is None


@needs_nvcc
@pytest.mark.parametrize("kernel_cls", [SoftmaxFwdKernel, LogSoftmaxFwdKernel])
@pytest.mark.parametrize("N, dtype, held", [(262144, torch.bfloat16, 22), (65537, torch.float32, 9),
                                            (100000, torch.float16, 9)], ids=str)
def test_held_rows_build_for_sm90(kernel_cls, N: int, dtype: torch.dtype, held: int, tmp_path) -> None:
    """A held row's blocks publish one 64-bit word each, back off while they wait for their row's
    words, and reset the workspace for the next launch; the registers hold the shares (no spills
    at 64 registers, four 256-thread blocks an SM)."""
    kernel = kernel_cls(N, dtype)
    vector = row_vector(N, dtype)
    spec = kernel.row_programs(16, vector, 132)  # too few rows for row clusters
    assert spec == ((ROW_HELD,), (("vector", vector), ("held", held)))
    program = kernel.compile_program(ROW_HELD, spec[1], target={"kind": "cuda", "arch": "sm_90"})
    source = program.get_kernel_source()
    body = source[source.index("__global__ void __launch_bounds__"):]
    assert "__launch_bounds__(256, 4)" in body
    assert body.count("AtomicStore(") == 1 and body.count("AtomicAddRet(") == 1 and "__nanosleep(" in body
    assert body.index("AtomicStore(") < body.index("__nanosleep(") < body.index("AtomicAddRet((&(Control[0])), 1)")
    report = ptxas_report(source, str(tmp_path))
    assert report["registers"] <= 64 and report["spill_bytes"] == 0, report


def test_held_rows_take_the_forwards_few_long_rows() -> None:
    """Forward rows too long for a block and too few for row clusters take the held program where a
    row needs at most as many blocks as there are SMs and as a block has threads; backwards never."""
    sm_count = 132
    kernel = SoftmaxFwdKernel(262144, torch.bfloat16)
    assert kernel.row_held(sm_count) == 22 == -(-262144 // (256 * 48))
    for rows in (1, 16, 64, 1024):
        assert kernel.row_programs(rows, 8, sm_count) == ((ROW_HELD,), (("vector", 8), ("held", 22)))
    assert kernel.row_held(21) is None  # more blocks a row than SMs
    assert SoftmaxFwdKernel(1 << 21, torch.bfloat16).row_held(sm_count) is None  # 171 blocks
    narrow = SoftmaxFwdKernel(1 << 20, torch.bfloat16, config={"held_threads": 64, "held_min_blocks": 16})
    assert narrow.row_held(sm_count) is None  # 342 blocks, more than a block has threads
    wide = SoftmaxFwdKernel(1 << 21, torch.bfloat16, config={"held_threads": 512, "held_min_blocks": 2})
    assert wide.row_held(sm_count) == 86
    off = SoftmaxFwdKernel(262144, torch.bfloat16, config={"held_threads": 0})
    assert off.row_programs(64, 8, sm_count)[0] == (ROW_STATS, ROW_APPLY)
    # Rows a row cluster takes keep it; rows one block holds stay fused.
    assert SoftmaxFwdKernel(131072, torch.bfloat16).row_programs(17, 8, sm_count)[0] == (ROW_CLUSTER,)
    assert SoftmaxFwdKernel(131072, torch.bfloat16).row_programs(16, 8, sm_count)[0] == (ROW_HELD,)
    assert SoftmaxFwdKernel(6144, torch.bfloat16, config={"row_threads": 64, "block_threads": 64}).row_held(
        sm_count) is None
    for kernel_cls in (SoftmaxBwdKernel, LogSoftmaxBwdKernel):
        assert kernel_cls(262144, torch.bfloat16).row_held(sm_count) is None
        assert kernel_cls(262144, torch.bfloat16).row_programs(16, 8, sm_count)[0] == (ROW_STATS, ROW_APPLY)
    with pytest.raises(ValueError, match="held_threads"):
        build_program(ROW_HELD, 262144, torch.bfloat16, kernel.variant, {**kernel.config, "held_threads": 96},
                      (("vector", 8), ("held", 22)))


def test_fast_memory_stages_forward_rows_that_take_a_whole_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where memory is fast, forward rows held by a whole 1024-thread block take the row staged
    program (one row ahead, the log-softmax two); backward rows, narrower rows, rows read in
    narrower vectors and devices without fast memory keep the fused program."""
    sm_count = 132
    monkeypatch.setattr(softmax_module, "has_fast_memory", lambda: True)
    for kernel_cls in (SoftmaxFwdKernel, LogSoftmaxFwdKernel):
        for N, dtype in ((32768, torch.bfloat16), (16384, torch.float16), (20000, torch.bfloat16),
                         (24576, torch.float32)):
            kernel = kernel_cls(N, dtype)
            assert kernel.config["row_stages"] == (2 if kernel.variant.log else 1), (N, dtype)
            vector = row_vector(N, dtype)
            assert kernel.row_programs(8192, vector, sm_count) == ((ROW_STAGED,), (("vector", vector),))
            # A misaligned call's narrower accesses cannot be cp.async copies of 16 bytes.
            assert kernel.row_programs(8192, vector // 2, sm_count)[0] == (ROW_FUSED,)
        assert kernel_cls(4096, torch.bfloat16).config["row_stages"] == 0
        # The program ``build_for_sm90`` checks is the one such calls launch: it takes the grid.
        assert [param.name for param in kernel_cls(32768, torch.bfloat16).program().params][-1] == "blocks"
        assert kernel_cls(262144, torch.bfloat16).row_programs(1024, 8, sm_count)[0] == (ROW_HELD,)
    # Two float32 rows of 32768 take 256 KiB: the log-softmax's stay fused, the softmax's are staged.
    assert LogSoftmaxFwdKernel(32768, torch.float32).config["row_stages"] == 0
    assert SoftmaxFwdKernel(32768, torch.float32).config["row_stages"] == 1
    for kernel_cls in (SoftmaxBwdKernel, LogSoftmaxBwdKernel):
        assert kernel_cls(32768, torch.bfloat16).config["row_stages"] == 0
        staged = kernel_cls(32768, torch.bfloat16, config={"row_stages": 1})
        assert staged.row_programs(8192, 8, sm_count)[0] == (ROW_FUSED,)
    monkeypatch.setattr(softmax_module, "has_fast_memory", lambda: False)
    assert SoftmaxFwdKernel(32768, torch.bfloat16).config["row_stages"] == 0
    assert "blocks" not in [param.name for param in SoftmaxFwdKernel(32768, torch.bfloat16).program().params]
    assert SoftmaxFwdKernel(32768, torch.bfloat16).row_programs(8192, 8, sm_count)[0] == (ROW_FUSED,)


def test_staged_rows_fit_in_shared_memory() -> None:
    assert staged_fits(32768, torch.bfloat16, 1024, 2)  # 128 KiB
    assert staged_fits(32768, torch.float32, 1024, 1) and not staged_fits(32768, torch.float32, 1024, 2)
    assert staged_fits(49152, torch.bfloat16, 1024, 2) and not staged_fits(49152, torch.bfloat16, 1024, 3)
    # Rows are staged in whole vectors of every thread: 20000 takes 3 x 8192 elements (48 KiB in
    # bfloat16), 49153 float32 elements 13 x 4096 (208 KiB).
    assert staged_fits(20000, torch.bfloat16, 1024, 4) and not staged_fits(20000, torch.bfloat16, 1024, 5)
    assert staged_fits(49152, torch.float32, 1024, 1) and not staged_fits(49153, torch.float32, 1024, 1)
    candidates = softmax_autotune_configs(32768, torch.float32)
    assert {config["row_stages"] for config in candidates} == {0, 1}
    assert all(config["row_stages"] == 0 for config in softmax_autotune_configs(32768, torch.float32, True))


@needs_nvcc
@pytest.mark.parametrize("kernel_cls", [SoftmaxFwdKernel, LogSoftmaxFwdKernel])
@pytest.mark.parametrize("N, dtype, stages", [(32768, torch.bfloat16, 1), (32768, torch.bfloat16, 2),
                                              (20000, torch.bfloat16, 1), (16384, torch.float32, 1)], ids=str)
def test_staged_rows_build_for_sm90(kernel_cls, N: int, dtype: torch.dtype, stages: int, tmp_path) -> None:
    """The staged program copies each thread's 16-byte vectors with cp.async, keeps ``stages`` rows
    in flight, and holds a row in the registers of one block an SM as the fused program does."""
    kernel = kernel_cls(N, dtype, config={"row_stages": stages})
    vector = row_vector(N, dtype)
    source = kernel.compile_program(ROW_STAGED, (("vector", vector),), target={"kind": "cuda", "arch": "sm_90"}
                                    ).get_kernel_source()
    body = source[source.index("__global__ void __launch_bounds__"):]
    assert "__launch_bounds__(1024, 1)" in body and "int blocks)" in body
    assert "tl::cp_async_gs<16>" in body and f"tl::cp_async_wait<{stages - 1}>()" in body
    # The copy of the row ``stages`` turns ahead is issued after this row's maximum read ``a``.
    loop = body[body.index("for (int step = 0;"):]
    assert loop.index("max(st[0]") < loop.index("tl::cp_async_gs<16>")
    report = ptxas_report(source, str(tmp_path))
    # 64 registers at most (1024 threads); the log-softmax spills a few bytes one row ahead.
    assert report["registers"] <= 64 and report["spill_bytes"] <= 32, report


def test_row_cluster_sizes() -> None:
    # A thread holds at most 32 elements: 1024-thread blocks, clusters of at most 8.
    assert row_cluster_size(65537, torch.bfloat16, False, 1024) == 4
    assert row_cluster_size(262144, torch.bfloat16, False, 1024) == 8
    assert row_cluster_size(262145, torch.bfloat16, False, 1024) is None
    assert row_cluster_size(131072, torch.float32, True, 1024) == 8  # 16 float32 of each backward input
    assert row_cluster_size(131073, torch.float32, True, 1024) is None
    assert row_cluster_size(32769, torch.bfloat16, True, 512) == 4
    assert row_cluster_size(262144, torch.bfloat16, False, 1024, most=4) is None


# ---- every candidate config builds its programs (TIR only, no nvcc) ---------------------------


@pytest.mark.parametrize("N", [3, 4096, 65537])
def test_every_candidate_builds_its_programs(N: int) -> None:
    pytest.importorskip("tilelang")
    for kernel_cls in (SoftmaxFwdKernel, SoftmaxBwdKernel):
        for config in softmax_autotune_configs(N, torch.bfloat16, kernel_cls.variant.backward)[:4]:
            kernel = kernel_cls(N, torch.bfloat16, config=config)
            for name, params in kernel.program_specs(1):
                assert build_program(name, N, torch.bfloat16, kernel.variant, kernel.config, params) is not None


# ---- heuristics ----------------------------------------------------------------------------------


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", SIZES)
def test_default_config_is_valid(N: int, dtype: torch.dtype, backward: bool) -> None:
    config = softmax_default_config(N, dtype, backward)
    for key in ("row_threads", "block_threads", "cluster_threads", "split_threads", "column_threads"):
        assert _pow2(config[key]) and config[key] <= 1024
    assert config["max_cluster"] == 8
    assert (config["cluster_threads"], config["cluster_min_blocks"]) == ((1024, 1) if backward else (512, 2))
    assert config["block_threads"] >= max(config["row_threads"], 128)
    assert N % row_vector(N, dtype) == 0 and row_vector(N, dtype) * dtype.itemsize <= 16


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [2100, 4096, 4097, 4104, 6000, 8000, 8192, 12288, 16384, 20000, 32000])
def test_fused_rows_past_a_power_of_two_keep_their_threads_busy(N: int, dtype: torch.dtype, backward: bool) -> None:
    # A row of a block or more: every thread holds whole vectors of it, as many as the
    # heuristic's target (two, or one for the half-precision backward), and the row takes the
    # most threads that do; a row just past a power of two no longer gets twice the threads,
    # most of them holding one vector.  A forward row read in windows counts windows, four a
    # thread at least (``WINDOWED_ROW_WINDOWS``).
    config = softmax_default_config(N, dtype, backward)
    threads, vector = config["row_threads"], max_vector(dtype)
    target = 1 if backward and dtype.itemsize == 2 else 2
    held = N // vector
    if config["row_windows"] and N % vector:
        target, held = softmax_module.WINDOWED_ROW_WINDOWS, window_count(N, vector)
    if threads < 1024:
        assert held // threads >= target
        assert held // (2 * threads) < target
        assert -(-N // threads) <= fused_elements_cap(dtype, backward)


def test_fused_rows_layouts() -> None:
    # Rows a power-of-two multiple of the target keep their layouts, rows past one of a block or
    # more halve them, and rows that share a block keep the fewest threads that hold them (a row
    # read one element at a time, 127 wide: 8 elements a thread forward, 4 backward).
    bf16 = torch.bfloat16
    assert [softmax_default_config(n, bf16)["row_threads"] for n in (100, 127, 1000, 1500, 2100, 4096, 4104, 6000,
                                                                     8192, 12288, 32768)] \
        == [8, 16, 64, 128, 128, 256, 256, 256, 512, 512, 1024]
    assert [softmax_default_config(n, bf16, True)["row_threads"] for n in (127, 4096, 4104, 8192, 8200)] \
        == [32, 512, 512, 1024, 1024]
    assert [softmax_default_config(n, torch.float32)["row_threads"] for n in (100, 4096, 4104, 8192)] \
        == [16, 512, 512, 1024]


def test_rows_fuse_while_they_fit_in_registers() -> None:
    # The benchmark shapes stay in registers: one read, one write.
    assert SoftmaxFwdKernel(4096, torch.bfloat16, config=softmax_default_config(4096, torch.bfloat16)).fused()
    assert SoftmaxFwdKernel(32768, torch.bfloat16, config=softmax_default_config(32768, torch.bfloat16)).fused()
    assert SoftmaxBwdKernel(32768, torch.bfloat16,
                            config=softmax_default_config(32768, torch.bfloat16, True)).fused()
    assert SoftmaxFwdKernel(49152, torch.float16, config=softmax_default_config(49152, torch.float16)).fused()
    # Past 48 elements a thread the half-precision forward spills: such rows split into clusters.
    assert not SoftmaxFwdKernel(49153, torch.float16, config=softmax_default_config(49153, torch.float16)).fused()
    # Longer rows take the two-step programs.
    assert not SoftmaxFwdKernel(65537, torch.bfloat16, config=softmax_default_config(65537, torch.bfloat16)).fused()
    assert not SoftmaxBwdKernel(65536, torch.float32,
                                config=softmax_default_config(65536, torch.float32, True)).fused()
    assert fused_elements_cap(torch.bfloat16, False) == 48 and fused_elements_cap(torch.float32, True) == 16


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [1, 127, 4096, 32768, 65537, 262144])
def test_candidates_start_with_the_heuristic_and_are_unique(N: int, dtype: torch.dtype) -> None:
    for backward in (False, True):
        candidates = softmax_autotune_configs(N, dtype, backward)
        assert candidates[0] == softmax_default_config(N, dtype, backward)
        assert len(candidates) == len({tuple(sorted(c.items())) for c in candidates})
        # Tuning times rows: every candidate keeps the column programs' keys of the heuristic.
        column_keys = [key for key in candidates[0] if "column" in key]
        assert column_keys and all(c[key] == candidates[0][key] for c in candidates for key in column_keys)
        # Each row hint is tried only where the heuristic runs the programs it changes.
        default = candidates[0]
        fused = -(-N // default["row_threads"]) <= fused_elements_cap(dtype, backward)
        flipped = {key for c in candidates for key in ("row_hinted_min_mib", "cluster_cache_hints")
                   if c[key] != default[key]}
        assert flipped == ({"row_hinted_min_mib"} if fused else {"cluster_cache_hints"})


def test_column_tile_follows_inner_extent() -> None:
    assert column_tile(2, 2) == 1
    assert column_tile(5, 1) == 8
    assert column_tile(64, 8) == 8
    assert column_tile(4096, 8) == 32


@pytest.mark.parametrize("program, N, kernel_cls, changed, message", [
    (ROW_FUSED, 16, SoftmaxFwdKernel, {"row_threads": 48}, "row_threads must be a power of two"),
    (ROW_FUSED, 16, SoftmaxFwdKernel, {"max_cluster": 16}, "max_cluster must be a power of two"),
    (ROW_FUSED, 16, SoftmaxFwdKernel, {"row_stages": -1}, "row_stages must be at least 0"),
    (ROW_FUSED, 16, SoftmaxFwdKernel, {"cluster_stages": -1}, "cluster_stages must be at least 0"),
    (ROW_STAGED, 16, SoftmaxFwdKernel, {"row_stages": 1}, "row staged program holds one row a block"),
    (ROW_STAGED, 4096, SoftmaxBwdKernel, {"row_stages": 1}, "row staged program holds one row a block"),
])
def test_bad_program_configs_are_rejected(program, N, kernel_cls, changed, message) -> None:
    config = {**softmax_default_config(N, torch.float16), **changed}
    with pytest.raises(ValueError, match=message):
        build_program(program, N, torch.float16, kernel_cls.variant, config, (("vector", 8),))


def test_bad_configs_and_dtypes_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown config keys"):
        SoftmaxFwdKernel(4096, torch.float16, config={"bogus": 1})
    with pytest.raises(TypeError):
        SoftmaxFwdKernel(16, torch.int32)
    with pytest.raises(ValueError):
        LogSoftmaxFwdKernel(0, torch.float32)


# ---- the family base: views instead of copies (CPU tensors, stand-in kernel) ----------------------


class _RecordingKernel(Kernel):
    """Computes with PyTorch on the views it is given and records each launch."""

    launches: List[Tuple[Tuple[Tuple[int, ...], Tuple[int, ...]], ...]] = []

    def __init__(self, N: int, dtype: torch.dtype, **params: object) -> None:
        self.N = N
        super().__init__(dtype, config={})

    @property
    def default_config(self) -> Dict[str, int]:
        return {}

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        type(self).launches.append(tuple((tuple(t.shape), tuple(t.stride())) for t in tensors))
        *inputs, out = tensors
        for tensor in tensors:
            assert tensor.stride(-1) == 1 and tensor.dim() in (2, 3)
        assert out.is_contiguous()
        out.copy_(torch.softmax(inputs[0].double(), dim=1))
        return out


class _Softmax(SoftmaxFamilyOp):
    def __init__(self, N: int, dim: int) -> None:
        super().__init__()
        self.N, self.dim, self.dtype, self.tune = N, dim, torch.float64, False
        self.kernel_map = {"softmax_fwd": _RecordingKernel}


def _run(x: torch.Tensor, dim: int):
    _RecordingKernel.launches = []
    op = _Softmax(x.shape[dim], dim)
    y = op._run_kernel(x)
    torch.testing.assert_close(y, torch.softmax(x, dim))
    assert y.shape == x.shape and y.is_contiguous()
    return _RecordingKernel.launches, op


@pytest.mark.parametrize(
    "shape, dim, launched",
    [
        ((7,), 0, (1, 7)),
        ((3, 7), -1, (3, 7)),
        ((3, 7), 0, (1, 3, 7)),
        ((2, 3, 4), 1, (2, 3, 4)),
        ((2, 3, 4), -3, (1, 2, 12)),
        ((2, 3, 1), 1, (2, 3)),
        ((2, 1, 5, 1), 2, (2, 5)),
    ],
)
def test_base_views_rows_or_outer_n_inner(shape: Tuple[int, ...], dim: int, launched: Tuple[int, ...]) -> None:
    launches, op = _run(torch.randn(shape, dtype=torch.float64), dim)
    assert [launch[0][0] for launch in launches] == [launched]
    assert len(op._kernel_cache) == 1


def test_row_slices_and_column_slices_are_not_copied() -> None:
    wide = torch.randn(6, 40, dtype=torch.float64)
    launches, _ = _run(wide[:, 3:35], -1)  # rows of 32 with a row stride of 40
    assert launches[0][0] == ((6, 32), (40, 1))
    block = torch.randn(4, 9, 16, dtype=torch.float64)
    launches, _ = _run(block[:, 1:8, :10], 1)  # (outer, N, inner) = (4, 7, 10), strides (144, 16, 1)
    assert launches[0][0] == ((4, 7, 10), (144, 16, 1))
    expanded = torch.randn(1, 12, dtype=torch.float64).expand(5, 12)
    launches, _ = _run(expanded, -1)  # broadcast rows: stride 0, still no copy
    assert launches[0][0] == ((5, 12), (0, 1))


def test_layouts_without_a_unit_stride_view_are_copied() -> None:
    every_other = torch.randn(4, 16, dtype=torch.float64)[:, ::2]
    launches, _ = _run(every_other, -1)
    assert launches[0][0] == ((4, 8), (8, 1))
    padded = torch.randn(3, 4, 2, dtype=torch.float64)[..., 0]  # (3, 4) with strides (8, 2): no unit stride
    launches, _ = _run(padded, 0)
    assert launches[0][0] == ((1, 3, 4), (12, 4, 1))


def test_transposes_are_copied_and_outputs_are_contiguous() -> None:
    transposed = torch.randn(5, 4, dtype=torch.float64).t()  # (4, 5), strides (1, 4)
    launches, _ = _run(transposed, 0)
    assert launches[0][0] == ((1, 4, 5), (20, 5, 1))
    _RecordingKernel.launches = []
    assert _Softmax(5, 1)._run_kernel(transposed).is_contiguous()


def test_a_size_one_axis_of_any_stride_reaches_the_kernel_with_unit_stride() -> None:
    column = torch.randn(1, 4, dtype=torch.float64).t()  # (4, 1), strides (1, 4): contiguous
    assert column.is_contiguous() and column.stride(-1) == 4
    launches, _ = _run(column, -1)
    assert all(stride[-1] == 1 for _, stride in launches[0])


def test_backward_inputs_get_their_own_views() -> None:
    g = torch.randn(3, 20, dtype=torch.float64)[:, :16]
    y = torch.randn(3, 16, dtype=torch.float64)
    view_g, view_y = kernel_view(g, 1), kernel_view(y, 1)
    assert view_g.stride() == (20, 1) and view_y.stride() == (16, 1)
    assert view_g.data_ptr() == g.data_ptr()
    every_other = torch.randn(4, 6, dtype=torch.float64)[:, ::2]
    assert kernel_view(every_other, 1).stride() == (3, 1)
    assert kernel_view(every_other, 1).data_ptr() != every_other.data_ptr()  # a copy


def test_empty_inputs_launch_nothing() -> None:
    launches, _ = _run(torch.randn(0, 7, dtype=torch.float64), -1)
    assert launches == []
    launches, _ = _run(torch.randn(3, 0, 5, dtype=torch.float64)[:, :, :0], 0)
    assert launches == []


def test_launch_ranges_respect_int32_extents() -> None:
    assert int32_launch_ranges((2**31 + 5, 4), "softmax") == ((0, 2**31 - 1), (2**31 - 1, 2**31 + 5))
    assert int32_launch_ranges((2**31 - 1, 4), "softmax") is None
    assert int32_launch_ranges((10, 3, 2**30), "softmax") == tuple((i, i + 1) for i in range(10))
    assert int32_launch_ranges((2, 3, 2**30 - 1), "softmax") is None
    # Scan column programs number 32 inner positions a block: 2**25 numbers an outer index here.
    assert int32_launch_ranges((63, 3, 2**30), "scan", 32) is None
    assert int32_launch_ranges((65, 3, 2**30), "scan", 32) == ((0, 63), (63, 65))
    with pytest.raises(ValueError, match="softmax: 2147483648 elements follow the axis"):
        int32_launch_ranges((1, 3, 2**31), "softmax")
    # An op's layout holds the ranges of its kernel view.
    rows = torch.empty((2, 2**30 + 3, 4), device="meta")  # (2**31 + 6, 4) rows
    assert _Softmax(4, -1)._call_layout((rows,)).ranges == ((0, 2**31 - 1), (2**31 - 1, 2**31 + 6))
    assert _Softmax(4, -1)._call_layout((rows[:1],)).ranges is None
    with pytest.raises(ValueError, match="softmax: 2147483648 elements follow the axis"):
        _Softmax(4, 0)._call_layout((torch.empty((4, 2**31), device="meta"),))


def test_only_the_softmax_forward_keeps_exponentials_in_registers() -> None:
    pytest.importorskip("tilelang")
    from tileops.kernels.softmax.softmax import CACHED_EXP_ELEMENTS

    def script(kernel_cls, N: int, **config: int) -> str:
        kernel = kernel_cls(N, torch.bfloat16, config={**softmax_default_config(N, torch.bfloat16), **config})
        return build_program(ROW_FUSED, N, torch.bfloat16, kernel.variant, kernel.config, (("vector", 8),)).script()

    cached = f"e = T.sblock_alloc_buffer(({CACHED_EXP_ELEMENTS},), scope=\"local\")"
    assert softmax_default_config(32768, torch.bfloat16)["cache_exp"] == 1
    assert cached in script(SoftmaxFwdKernel, 32768)  # 32 elements a thread
    assert cached not in script(SoftmaxFwdKernel, 32768, cache_exp=0)
    assert cached not in script(LogSoftmaxFwdKernel, 32768)
    # 64 elements a thread exceed the budget: the exponentials are recomputed instead.
    assert "e = T.sblock_alloc_buffer" not in script(SoftmaxFwdKernel, 65536)
    assert "T.annotate_min_blocks_per_sm" not in script(SoftmaxFwdKernel, 4096)


@pytest.mark.parametrize("N, dtype, outer, inner, cvec, expected", [
    (4096, torch.bfloat16, 64, 64, 8, (8, 512)),  # 64 blocks of 512 KiB
    (4096, torch.bfloat16, 8, 512, 8, (8, 512)),
    (4096, torch.bfloat16, 512, 8, 8, (1, 256)),  # one vector wide: half the threads
    (4096, torch.bfloat16, 1, 1024, 8, (2, 512)),  # narrower tiles give the blocks
    (8192, torch.bfloat16, 64, 64, 8, (4, 512)),  # narrower tiles keep a block's bytes
    (32768, torch.bfloat16, 16, 64, 8, None),  # too long for 64 blocks: two steps
    (32768, torch.bfloat16, 4, 64, 8, None),
    (4096, torch.bfloat16, 4, 64, 8, None),  # too few columns
    (3000, torch.float32, 48, 8, 4, (2, 512)),
])
def test_fused_columns_when_whole_columns_fill_the_gpu(N, dtype, outer, inner, cvec, expected) -> None:
    params = fused_column_params(N, dtype, outer, inner, cvec, 132, 512)
    if expected is None:
        assert params is None
    else:
        assert params == (("col_threads", expected[0]), ("cvec", cvec), ("threads", expected[1]), ("cluster", 1))


@pytest.mark.parametrize("N, dtype, outer, inner, cvec, expected", [
    (4096, torch.bfloat16, 64, 64, 8, (8, 2)),  # 128 blocks: one wave of one block an SM
    (4096, torch.bfloat16, 1, 1024, 8, (8, 4)),  # the widest tile, in clusters, instead of narrower ones
    (8192, torch.bfloat16, 64, 64, 8, (8, 2)),  # a block's bytes counted per block of the cluster
    (32768, torch.bfloat16, 16, 64, 8, (8, 8)),  # two steps without clusters
    (8192, torch.bfloat16, 8, 256, 8, (8, 4)),
    (1031, torch.bfloat16, 2, 256, 8, (8, 8)),  # as many as a block for every four SMs needs
    (4096, torch.bfloat16, 512, 8, 8, (1, 1)),  # enough blocks without
    (4096, torch.bfloat16, 64, 64, 4, (8, 1)),  # 128 blocks of 8-byte tiles already
    (256, torch.bfloat16, 1, 1024, 8, (8, 4)),  # every block keeps a lane step: 64 positions
    (32768, torch.bfloat16, 4, 64, 8, None),  # even eight blocks a column group are too few
    (9000, torch.bfloat16, 2, 64, 8, None),  # narrower tiles take no clusters
])
def test_fused_column_clusters_cut_the_axis(N, dtype, outer, inner, cvec, expected) -> None:
    params = fused_column_params(N, dtype, outer, inner, cvec, 132, 512, max_cluster=8)
    if expected is None:
        assert params is None
    else:
        assert (dict(params)["col_threads"], dict(params)["cluster"]) == expected


@pytest.mark.parametrize("blocks, N, most, expected", [
    (64, 4096, 8, 2),  # spread while the launch stays one wave
    (64, 4096, 1, 1),
    (16, 4096, 8, 4),  # spread no further than four
    (16, 32768, 8, 8),  # as many as the bytes need
    (16, 32768, 4, 4),
    (2, 1031, 8, 8),  # as many as a block for every four SMs needs
    (16, 200, 8, 2),  # 100 positions a block, not 50
    (100, 4096, 8, 1),
])
def test_column_cluster_size(blocks: int, N: int, most: int, expected: int) -> None:
    # 64 bf16 columns a block (128 bytes a position), 64 lanes, 132 SMs.
    assert column_cluster_size(blocks, N, 128, 64, 132, most) == expected


@needs_nvcc
@pytest.mark.parametrize("fast_memory", [False, True], ids=["slow_memory", "fast_memory"])
@pytest.mark.parametrize("kernel_cls", [SoftmaxFwdKernel, SoftmaxBwdKernel, LogSoftmaxFwdKernel, LogSoftmaxBwdKernel],
                         ids=str)
def test_column_cluster_program_builds_for_sm90(kernel_cls, fast_memory, tmp_path, monkeypatch) -> None:
    # The middle axis of 64 x 4096 x 64 cut between two blocks: launched as a cluster, the
    # blocks' column states stored into each other's shared memory, and no spills, with four
    # vectors a thread in flight, or on fast memory eight.
    monkeypatch.setattr(softmax_module, "has_fast_memory", lambda: fast_memory)
    kernel = kernel_cls(4096, torch.bfloat16)
    assert kernel.config["fused_column_unroll"] == (8 if fast_memory else 4)
    specs = kernel.program_specs(64, outer=64)
    assert [(name, dict(params)["cluster"]) for name, params in specs] == [(COLUMN_FUSED, 2)]
    source = kernel.compile_program(*specs[0], target={"kind": "cuda", "arch": "sm_90"}).get_kernel_source()
    body = source[source.index("__global__ void __launch_bounds__"):]
    assert body.index("cluster_arrive_relaxed()") < body.index("cluster_wait()")
    assert body.index("cluster_wait()") < body.index("tileops_store_to_peer(") < body.index("cluster_sync()")
    # Each block's 64 columns: the maximum and sum of the forward, the sum of the backward.
    parts = 1 if kernel_cls.variant.backward else 2
    assert f"__shared__ __align__(16) float gathered[{2 * parts * 64}]" in body
    assert ptxas_report(source, str(tmp_path))["spill_bytes"] == 0
    single = kernel_cls(4096, torch.bfloat16, config={"column_cluster": 1})
    name, params = single.program_specs(64, outer=64)[0]
    assert dict(params)["cluster"] == 1
    assert "tileops_store_to_peer(" not in single.compile_program(
        name, params, target={"kind": "cuda", "arch": "sm_90"}).get_kernel_source()


def test_column_plan_follows_the_outer_extent() -> None:
    kernel = SoftmaxBwdKernel(4096, torch.bfloat16)
    many = torch.empty(64, 4096, 64, dtype=torch.bfloat16)
    few = torch.empty(4, 4096, 64, dtype=torch.bfloat16)
    assert [name for name, _ in kernel.programs_for(many, many, many)] == [COLUMN_FUSED]
    assert [name for name, _ in kernel.programs_for(few, few, few)] == [COLUMN_STATS, COLUMN_APPLY]


def test_call_layouts_are_derived_once_per_geometry() -> None:
    op = _Softmax(16, -1)
    _RecordingKernel.launches = []
    for _ in range(3):
        x = torch.randn(3, 16, dtype=torch.float64)
        torch.testing.assert_close(op._run_kernel(x), torch.softmax(x, 1))
    assert len(op._layouts) == 1
    sliced = torch.randn(3, 20, dtype=torch.float64)[:, :16]  # the same shape with other strides: its own layout
    torch.testing.assert_close(op._run_kernel(sliced), torch.softmax(sliced, 1))
    batched = torch.randn(2, 3, 16, dtype=torch.float64)
    torch.testing.assert_close(op._run_kernel(batched), torch.softmax(batched, 2))
    assert len(op._layouts) == 3
    assert [launch[0] for launch in _RecordingKernel.launches[-2:]] == [((3, 16), (20, 1)), ((6, 16), (16, 1))]


def _recorded_plans(kernel: SoftmaxFwdKernel, monkeypatch: pytest.MonkeyPatch) -> List[Tuple[str, object]]:
    """Stand-in launchers on ``kernel``: each launch records its program and shape parameters."""
    launched: List[Tuple[str, object]] = []

    def launcher(name: str, params: object):
        return lambda *tensors: launched.append((name, params))

    monkeypatch.setattr(kernel, "_launcher", launcher)
    monkeypatch.setattr(kernel, "sm_count", lambda device: 132)  # two-step launches size their partials by it
    return launched


def test_fused_rows_take_the_hint_from_row_hinted_min_mib_on(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = SoftmaxFwdKernel(64, torch.bfloat16, config={"row_hinted_min_mib": 1})
    launched = _recorded_plans(kernel, monkeypatch)
    rows = kernel.least_hinted_rows()
    assert rows == (1 << 20) // (64 * 2)
    for count in (rows - 1, rows, rows - 1, 2 * rows):
        x = torch.empty(count, 64, dtype=torch.bfloat16)
        kernel(x, torch.empty_like(x))
    assert launched == [(ROW_FUSED, (("vector", 8), ("hinted", hinted))) for hinted in (0, 1, 0, 1)]
    # Narrower accesses load without a hint, however many rows.
    shifted = torch.empty(rows * 64 + 8, dtype=torch.bfloat16)[1:rows * 64 + 1].view(rows, 64)
    kernel(shifted, torch.empty(rows, 64, dtype=torch.bfloat16))
    assert launched[-1] == (ROW_FUSED, (("vector", 1), ("hinted", 0)))
    # The backward's rows count both inputs.
    assert SoftmaxBwdKernel(64, torch.bfloat16).least_hinted_rows() == (HINTED_MIN_MIB << 20) // (64 * 2 * 2)


def test_launch_plans_follow_each_calls_alignment(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = SoftmaxFwdKernel(64, torch.bfloat16)
    launched = _recorded_plans(kernel, monkeypatch)
    flat = torch.empty(3 * 64 + 8, dtype=torch.bfloat16)
    aligned, shifted = flat[:192].view(3, 64), flat[1:193].view(3, 64)  # the same strides, 2 bytes apart
    assert aligned.data_ptr() % 16 == 0
    for x in (aligned, shifted, aligned, flat[4:196].view(3, 64)):
        kernel(x, torch.empty(3, 64, dtype=torch.bfloat16))
    assert launched == [(ROW_FUSED, (("vector", vector), ("hinted", 0))) for vector in (8, 1, 8, 4)]
    assert len(kernel._launch_plans) == 3 + 2  # three alignments, whether rows fuse, the fewest hinted rows
    columns = torch.empty(4, 64, 16, dtype=torch.bfloat16)
    kernel(columns, torch.empty_like(columns))
    kernel(columns[:2], torch.empty(2, 64, 16, dtype=torch.bfloat16))  # another outer extent: its own plan
    assert [name for name, _ in launched[4:]] == [name for name, _ in kernel.programs_for(columns, columns)] + [
        name for name, _ in kernel.programs_for(columns[:2], columns[:2])]


# ---- rows no 16-byte access can start, in windows ----------------------------------------------


def test_odd_rows_take_windows_where_every_row_starts_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = SoftmaxFwdKernel(127, torch.bfloat16, config={"row_windows": 1})
    launched = _recorded_plans(kernel, monkeypatch)
    windowed = (ROW_FUSED, (("vector", 8), ("hinted", 0), ("windowed", 1)))
    buffer = torch.empty(4 * 136 + 8, dtype=torch.bfloat16)
    assert buffer.data_ptr() % 16 == 0
    calls = [
        (buffer[:4 * 127].view(4, 127), windowed),  # contiguous
        (buffer[:4 * 135].view(4, 135)[:, :127], windowed),  # rows 135 apart: 8 more than the output's
        (buffer[:4 * 130].view(4, 130)[:, :127], (ROW_FUSED, (("vector", 1), ("hinted", 0)))),  # 3 more
        (buffer[1:4 * 127 + 1].view(4, 127), (ROW_FUSED, (("vector", 1), ("hinted", 0)))),  # a start mid-window
        (buffer[:130].view(1, 130)[:, :127], windowed),  # one row: its stride is never stepped
    ]
    for x, _ in calls:
        kernel(x, torch.empty(x.shape, dtype=torch.bfloat16))
    assert launched == [plan for _, plan in calls]
    # An output that starts mid-window, as the input does not, reads element by element too.
    kernel(calls[0][0], torch.empty(4 * 127 + 1, dtype=torch.bfloat16)[1:].view(4, 127))
    assert launched[-1] == (ROW_FUSED, (("vector", 1), ("hinted", 0)))
    # Rows a 16-byte access can start never take windows.
    aligned = SoftmaxFwdKernel(128, torch.bfloat16)
    assert not aligned.windows_allowed([torch.empty(4, 128, dtype=torch.bfloat16)] * 2)


def test_odd_rows_of_a_wider_output_take_its_windows() -> None:
    """A float32 output of bfloat16 rows: windows of four elements, 8 bytes of the input."""
    kernel = SoftmaxFwdKernel(4097, torch.bfloat16, out_dtype=torch.float32)
    x = torch.empty(64, 4097, dtype=torch.bfloat16)
    (_, params), = kernel.programs_for(x, torch.empty(64, 4097))
    assert dict(params)["vector"] == 4 and dict(params)["windowed"] == 1


def test_windows_fit_the_registers_of_the_rows_threads() -> None:
    # A row's windows may take a vector more a thread than its elements.
    assert windows_fit(127, torch.bfloat16, False, 8, 8, 48)  # 17 windows, three a thread
    assert not windows_fit(127, torch.bfloat16, False, 4, 8, 32)  # five a thread
    # The backward keeps a vector of room: 50257 bf16 in 8 x 256 threads would hold 32 of 32.
    assert windows_fit(50257, torch.bfloat16, False, 2048, 8, 32)
    assert not windows_fit(50257, torch.bfloat16, True, 2048, 8, 32)
    backward = SoftmaxBwdKernel(50257, torch.bfloat16)
    (_, params), = backward.program_specs(1, outer=1 << 10)
    assert "windowed" not in dict(params) and dict(params)["vector"] == 1
    forward = SoftmaxFwdKernel(50257, torch.bfloat16)
    (name, params), = forward.program_specs(1, outer=1 << 10)
    assert name == ROW_CLUSTER and dict(params)["windowed"] == 1


@needs_nvcc
@pytest.mark.parametrize("kernel_cls, N, dtype, outer, out_dtype", [
    (SoftmaxFwdKernel, 127, torch.bfloat16, 4096, None),
    (SoftmaxFwdKernel, 127, torch.bfloat16, 4096, torch.float32),
    (LogSoftmaxFwdKernel, 1001, torch.float32, 4096, None),
    (SoftmaxBwdKernel, 4097, torch.bfloat16, 4096, None),
    (LogSoftmaxBwdKernel, 37, torch.float16, 4096, None),
    (SoftmaxFwdKernel, 50257, torch.bfloat16, 256, None),
    (LogSoftmaxBwdKernel, 65537, torch.float16, 256, None),
], ids=str)
def test_windowed_programs_move_16_bytes_and_spill_nothing(kernel_cls, N: int, dtype: torch.dtype, outer: int,
                                                          out_dtype, tmp_path) -> None:
    kernel = kernel_cls(N, dtype, out_dtype=out_dtype, config={"row_windows": 1})
    (name, params), = kernel.program_specs(1, outer=outer)
    assert dict(params)["windowed"] == 1
    source = kernel.compile_program(name, params, target={"kind": "cuda", "arch": "sm_90"}).get_kernel_source()
    body = source[source.index("__global__ void __launch_bounds__"):]
    # The rows are read through flat views, from the window each starts in.
    assert ("XF" in body or "GF" in body) and "skew" in body
    # Whole windows: one 16-byte access of the output (of the input too, where it is as wide).
    assert body.count("*(uint4*)(") + body.count("*(float4*)(") >= (1 if out_dtype else 2)
    assert not divisions_at_accesses(source), name
    report = ptxas_report(source, str(tmp_path))
    assert report["spill_bytes"] == 0, report


def test_windows_by_default_where_they_pay() -> None:
    """Forward rows a block or more wide whose threads each take four windows or more, and the
    forward's row clusters, read odd rows in windows; shorter rows and the backwards read them an
    element at a time, a short row's threads holding 8 elements (forward) or 4 (backward)."""
    layouts = {(N, backward): (config["row_threads"], config["row_windows"])
               for N in (127, 2049, 4097, 6001, 12289, 50257) for backward in (False, True)
               for config in [softmax_default_config(N, torch.bfloat16, backward)]}
    assert layouts == {
        (127, False): (16, 0), (127, True): (32, 0),
        (2049, False): (128, 0), (2049, True): (256, 0),
        (4097, False): (128, 1), (4097, True): (512, 0),
        (6001, False): (128, 1), (6001, True): (512, 0),
        (12289, False): (512, 1), (12289, True): (1024, 0),
        (50257, False): (1024, 1), (50257, True): (1024, 0),
    }
    # Rows a 16-byte access can start keep their layouts.
    assert softmax_default_config(4104, torch.bfloat16)["row_threads"] == 256
    assert softmax_default_config(100, torch.bfloat16)["row_threads"] == 8
