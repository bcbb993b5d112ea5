"""CPU checks of the loss family: sm_90 builds and config heuristics of the cross-entropy kernels.

Compiling needs nvcc but no GPU.  TileLang caches compiled programs on disk,
so only the first run pays ~2 s per program.
"""

from __future__ import annotations

import re

import pytest
import torch

from tileops.kernels.fast_math import FAST_EXP2
from tileops.kernels.kernel_base import SM90_BUILD_TARGET
from tileops.kernels.loss import cross_entropy
from tileops.kernels.loss.cross_entropy import CrossEntropyBwdKernel, CrossEntropyFwdKernel, flat_rows
from tileops.kernels.loss.soft_cross_entropy import SoftCrossEntropyBwdKernel, SoftCrossEntropyFwdKernel
from tileops.kernels.sizes import max_vector, row_vector
from tests.toolchain import divisions_at_accesses, needs_nvcc, ptxas_report


@needs_nvcc
@pytest.mark.parametrize("kernel_cls", (CrossEntropyFwdKernel, CrossEntropyBwdKernel))
@pytest.mark.parametrize("V, dtype, label_smoothing", [
    (131072, torch.bfloat16, 0.0),
    (127, torch.float16, 0.1),
    (3, torch.float32, 0.2),
])
def test_builds_for_sm90(kernel_cls, V: int, dtype: torch.dtype, label_smoothing: float) -> None:
    kernel = kernel_cls(V, dtype, ignore_index=-100, label_smoothing=label_smoothing)
    built = kernel.build_all_for_sm90()
    # The main program and the batch program (the forward's total, the backward's kept-row count)
    # for every flag combination: the backward's main program has the reduction compiled in.  The
    # forward also has its one-block program for small means and sums.
    main = {f"main{dict(flags)}" if flags else "main" for flags in kernel_cls.main_flags}
    small = {f"small{ {'mean': mean} }" for mean in (False, True)} if kernel_cls is CrossEntropyFwdKernel else set()
    assert set(built) == main | {f"batch{dict(flags)}" for flags in kernel_cls.batch_flags} | small
    assert not any(divisions_at_accesses(program.get_kernel_source()) for program in built.values())
    assert len(built) == {CrossEntropyFwdKernel: 5, CrossEntropyBwdKernel: 7}[kernel_cls]
    # The forward's row program sums its exponentials with the one-instruction kind (``fast_math``).
    bodies = {name: program.get_kernel_source().split("__global__", 1)[1] for name, program in built.items()}
    fast = {name for name, body in bodies.items() if f"{FAST_EXP2}(" in body}
    assert fast == ({"main"} if kernel_cls is CrossEntropyFwdKernel else set())


@needs_nvcc
@pytest.mark.parametrize("soft", [False, True], ids=["index-targets", "soft-targets"])
@pytest.mark.parametrize("V, dtype", [(131072, torch.bfloat16), (4097, torch.float16), (3, torch.float32)])
def test_bwd_programs_read_all_their_logits_before_writing_a_gradient(V: int, dtype: torch.dtype, soft: bool) -> None:
    """``inplace_backward`` hands the program the logits as its output too: each thread must read
    its logits before it writes any gradient (and only where it read), as the programs do."""
    if soft:
        kernel = SoftCrossEntropyBwdKernel(V, dtype, target_dtype=torch.float32, label_smoothing=0.1)
    else:
        kernel = CrossEntropyBwdKernel(V, dtype, ignore_index=-100, label_smoothing=0.1)
    built = kernel.build_all_for_sm90()
    for flags in kernel.main_flags:
        source = built[f"main{dict(flags)}"].get_kernel_source()
        body = source[source.index("{", source.index("extern \"C\" __global__")):]
        reads = [m.start() for m in re.finditer(r"\bX\[|\(X \+", body)]
        writes = [m.start() for m in re.finditer(r"\bG\[|\(G \+", body)]
        assert reads and writes, flags
        assert max(reads) < min(writes), flags


@pytest.mark.parametrize("V, dtype, expected", [
    (131072, torch.bfloat16, 8), (32000, torch.bfloat16, 8), (4097, torch.float16, 1),
    (262144, torch.float32, 4), (6, torch.float32, 2), (1, torch.bfloat16, 1),
])
def test_vector_width_keeps_rows_aligned(V: int, dtype: torch.dtype, expected: int) -> None:
    assert row_vector(V, dtype) == expected


@pytest.mark.parametrize("kernel_cls, long_config, llama2_config, fixed", [
    (CrossEntropyFwdKernel, {"threads": 512, "unroll": 8}, {"threads": 256, "unroll": 8}, {"blocks_per_sm": 0}),
    (CrossEntropyBwdKernel, {"threads": 256, "unroll": 4}, {"threads": 256, "unroll": 4},
     {"blocks_per_sm": 4, "hinted_min_classes": 65536}),
])
def test_default_configs_cover_short_and_long_rows(kernel_cls, long_config, llama2_config, fixed) -> None:
    short = kernel_cls(3, torch.float32, config={}).config
    assert short == {"threads": 32, "unroll": 1, **fixed}
    assert kernel_cls(262144, torch.bfloat16, config={}).config == {**long_config, **fixed}
    assert kernel_cls(32000, torch.bfloat16, config={}).config == {**llama2_config, **fixed}
    assert all(c["threads"] >= 32 for c in kernel_cls(4097, torch.float16, config={}).autotune_configs)


@needs_nvcc
@pytest.mark.parametrize("V, dtype, hinted", [
    (32000, torch.bfloat16, False), (65536, torch.bfloat16, True), (131072, torch.float32, True),
    (65537, torch.bfloat16, True),  # rows of odd length are read in windows, whole ones hinted
])
def test_bwd_hints_long_rows_and_launches_each_rows_tiles_together(V: int, dtype: torch.dtype, hinted: bool,
                                                                    tmp_path) -> None:
    """The backward loads the logits of rows of ``hinted_min_classes`` or more with ``evict_last``
    (within its four blocks an SM, unspilled), and its grid is one axis, a row's tiles consecutive
    blocks (the soft-target backward's too)."""
    flags = (("has_grad_lse", True), ("mean", True), ("per_row", False))

    def source(kernel, extra_flags=()) -> str:
        return kernel.program_builds(SM90_BUILD_TARGET)[f"main{dict(flags + extra_flags)}"]().get_kernel_source()

    hinted_source = source(CrossEntropyBwdKernel(V, dtype, label_smoothing=0.1))
    body = hinted_source.split("__global__", 1)[1]
    assert ("tileops_load_evict_last(" in body) == hinted
    assert ptxas_report(hinted_source, str(tmp_path))["spill_bytes"] == 0
    assert "blockIdx.y" not in body
    plain = CrossEntropyBwdKernel(V, dtype, label_smoothing=0.1, config={"hinted_min_classes": 0})
    assert "tileops_load_evict_last(" not in source(plain)
    soft = SoftCrossEntropyBwdKernel(V, dtype, target_dtype=dtype, label_smoothing=0.1)
    assert "blockIdx.y" not in source(soft, (("weighted", True),))


@needs_nvcc
@pytest.mark.parametrize("V, soft", [(32000, False), (131072, False), (262144, False), (32000, True)], ids=str)
def test_fast_memory_forward_rows_keep_several_blocks_an_sm(monkeypatch: pytest.MonkeyPatch, tmp_path, V: int,
                                                            soft: bool) -> None:
    """Where memory is fast, a forward row (of soft targets: a short one) takes at most 256 threads
    and four vectors in flight, in few enough registers that several blocks share an SM (one block
    of 512 threads and eight vectors, 116 registers each, left its SM's memory idle while it
    reduced its row)."""
    monkeypatch.setattr(cross_entropy, "has_fast_memory", lambda: True)
    # Long rows of soft targets keep their layout.
    assert SoftCrossEntropyFwdKernel(131072, torch.bfloat16, target_dtype=torch.bfloat16).config == {
        "threads": 512, "unroll": 8, "blocks_per_sm": 0}
    if soft:
        kernel = SoftCrossEntropyFwdKernel(V, torch.bfloat16, target_dtype=torch.bfloat16)
    else:
        kernel = CrossEntropyFwdKernel(V, torch.bfloat16)
    assert kernel.config == {"threads": 256, "unroll": 4, "blocks_per_sm": 0}
    mains = [program for name, program in kernel.build_all_for_sm90().items() if name.startswith("main")]
    assert mains
    for program in mains:
        report = ptxas_report(program.get_kernel_source(), str(tmp_path))
        assert report["spill_bytes"] == 0 and report["registers"] * 256 * 3 <= 65536, report
    # The backwards keep their layouts.
    assert CrossEntropyBwdKernel(V, torch.bfloat16).config == {"threads": 256, "unroll": 4, "blocks_per_sm": 4,
                                                                "hinted_min_classes": 65536}
    assert SoftCrossEntropyBwdKernel(V, torch.bfloat16, target_dtype=torch.bfloat16).config["threads"] == 256


def test_bwd_program_caps_registers_only_when_asked() -> None:
    """``blocks_per_sm`` becomes the kernel's minimum-blocks launch bound; 0 leaves registers to the compiler."""
    kernel = CrossEntropyBwdKernel(32000, torch.bfloat16)
    capped = kernel.program(blocks_per_sm=4).script()
    free = kernel.program(blocks_per_sm=0).script()
    assert "min_blocks_per_sm" in capped and "min_blocks_per_sm" not in free
    with pytest.raises(ValueError, match="blocks_per_sm"):
        CrossEntropyBwdKernel(8, torch.float32, config={"blocks_per_sm": -1})


def test_bad_construction_is_refused() -> None:
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        CrossEntropyFwdKernel(8, torch.float32, label_smoothing=1.5, config={})
    with pytest.raises(TypeError, match="dtype"):
        CrossEntropyBwdKernel(8, torch.int32, config={})
    with pytest.raises(ValueError, match="threads"):
        CrossEntropyFwdKernel(8, torch.float32, config={"threads": 48})


@needs_nvcc
@pytest.mark.parametrize("kernel_cls", (SoftCrossEntropyFwdKernel, SoftCrossEntropyBwdKernel))
@pytest.mark.parametrize("V, dtype, target_dtype, label_smoothing", [
    (131072, torch.bfloat16, torch.float32, 0.0),
    (127, torch.float16, torch.float16, 0.1),
    (3, torch.float32, torch.bfloat16, 0.2),
])
def test_soft_target_kernels_build_for_sm90(kernel_cls, V: int, dtype: torch.dtype, target_dtype: torch.dtype,
                                            label_smoothing: float) -> None:
    kernel = kernel_cls(V, dtype, target_dtype=target_dtype, label_smoothing=label_smoothing)
    built = kernel.build_all_for_sm90()
    # Weighted or not; the backward also for every reduction, with and without grad_lse.
    assert len(built) == {SoftCrossEntropyFwdKernel: 2, SoftCrossEntropyBwdKernel: 12}[kernel_cls]
    source = built[f"main{dict(kernel_cls.main_flags[-1])}"].get_kernel_source()
    assert "W[" in source or "(W +" in source  # the weighted program reads the class weights
    assert (f"{FAST_EXP2}(" in source.split("__global__", 1)[1]) == (kernel_cls is SoftCrossEntropyFwdKernel)


@pytest.mark.parametrize("dtype, target_dtype, expected", [
    (torch.bfloat16, torch.float32, 4), (torch.bfloat16, torch.bfloat16, 8), (torch.float32, torch.float16, 4),
])
def test_soft_target_kernels_read_both_rows_with_one_access_width(dtype, target_dtype, expected: int) -> None:
    kernel = SoftCrossEntropyFwdKernel(131072, dtype, target_dtype=target_dtype, config={})
    assert kernel._vector == expected
    assert kernel.static_signature()["target_dtype"] == str(target_dtype)[6:]
    with pytest.raises(TypeError, match="target_dtype"):
        SoftCrossEntropyFwdKernel(8, torch.float32, target_dtype=torch.int64)


@needs_nvcc
@pytest.mark.parametrize("kernel_cls", (CrossEntropyFwdKernel, CrossEntropyBwdKernel))
@pytest.mark.parametrize("V, dtype", [(50257, torch.bfloat16), (32001, torch.float16), (4099, torch.float32)])
def test_rows_no_16_byte_access_can_start_are_read_in_windows(kernel_cls, V: int, dtype: torch.dtype,
                                                               tmp_path) -> None:
    """GPT-2's 50257 classes: a row's start is 16-byte aligned only every eighth row, so the rows are
    read (and the gradient written) through a flat view in aligned 16-byte windows, not one element
    at a time; only the windows that straddle a row's ends are read element by element."""
    kernel = kernel_cls(V, dtype, label_smoothing=0.1)
    assert kernel.windowed and kernel._vector == max_vector(dtype)
    source = next(iter(kernel.program_builds(SM90_BUILD_TARGET).values()))().get_kernel_source()
    body = source.split("__global__", 1)[1]
    assert "windowed" in body and re.search(r"\*\((uint4|float4)\*\)\(X \+ ", body)
    if kernel_cls is CrossEntropyBwdKernel:
        assert re.search(r"\*\((uint4|float4)\*\)\(G \+ ", body)
    assert ptxas_report(source, str(tmp_path))["spill_bytes"] == 0
    assert not kernel_cls(V - V % max_vector(dtype), dtype).windowed
    soft = {CrossEntropyFwdKernel: SoftCrossEntropyFwdKernel, CrossEntropyBwdKernel: SoftCrossEntropyBwdKernel}
    assert not soft[kernel_cls](V, dtype, target_dtype=dtype).windowed


def test_flat_rows_span_the_rows_and_the_gaps_between_them() -> None:
    buffer = torch.arange(20.0).view(4, 5)
    assert flat_rows(buffer[:, :3]).tolist() == list(range(18))
    assert flat_rows(buffer[1:2, 1:4]).tolist() == [6.0, 7.0, 8.0]
    assert flat_rows(buffer[1:2, 1:4]).data_ptr() == buffer[1:2, 1:4].data_ptr()


class _Recorder:
    def __init__(self) -> None:
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


def test_windowed_launches_take_flat_rows_and_row_strides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward hands the program the logits' flat view and row stride; the backward also the
    gradient's, reading from a contiguous copy the logits whose rows sit at other offsets into
    their windows than the gradient's rows."""
    recorder = _Recorder()
    for cls in (CrossEntropyFwdKernel, CrossEntropyBwdKernel):
        monkeypatch.setattr(cls, "_launcher", lambda self, **flags: recorder)
    V, rows = 13, 3
    padded = torch.randn(rows, 16, dtype=torch.bfloat16)
    logits, target = padded[:, :V], torch.zeros(rows, dtype=torch.int64)
    per_row = torch.empty(rows)
    CrossEntropyFwdKernel(V, torch.bfloat16).forward(logits, target, per_row, per_row)
    flat, _, _, _, stride = recorder.calls[-1]
    assert flat.shape == (2 * 16 + V,) and flat.data_ptr() == logits.data_ptr() and stride == 16

    backward = CrossEntropyBwdKernel(V, torch.bfloat16)
    grad = torch.empty(rows, V, dtype=torch.bfloat16)
    backward.forward(logits, target, per_row, per_row, per_row, per_row, grad)
    flat, *_, flat_grad, stride, grad_stride = recorder.calls[-1]
    assert (stride, grad_stride) == (V, V) and flat.data_ptr() != logits.data_ptr()  # 16 - 13: a copy
    assert torch.equal(flat.view(rows, V), logits) and flat_grad.data_ptr() == grad.data_ptr()
    wide = torch.randn(rows, 8 + V, dtype=torch.bfloat16)[:, :V]  # 21 - 13 = 8: the same offsets
    backward.forward(wide, target, per_row, per_row, per_row, per_row, grad)
    flat, *_, stride, grad_stride = recorder.calls[-1]
    assert flat.data_ptr() == wide.data_ptr() and (stride, grad_stride) == (8 + V, V)
    backward.forward(logits, target, per_row, per_row, per_row, per_row, logits)  # in place
    flat, *_, flat_grad, stride, grad_stride = recorder.calls[-1]
    assert flat.data_ptr() == flat_grad.data_ptr() == logits.data_ptr() and stride == grad_stride == 16
