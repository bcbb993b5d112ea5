"""CPU checks of the elementwise family: sm_90 builds, per-element formulas, and the family bases' layouts.

Compiling needs nvcc but no GPU; TileLang caches compiled programs on disk,
so only the first run pays ~3-5 s per program (six programs here).  The
formulas are checked by evaluating each ``PointwiseFn`` with PyTorch standing
in for TileLang; the op bases are checked with a stand-in kernel that
computes with PyTorch on the views it is given and records them.
"""

from __future__ import annotations

import math
import re
import types
from typing import Dict, List, Optional, Tuple

import pytest
import torch

from tileops.kernels.cache_hints import CACHE_HINT_PRELUDE, HINTED_MIN_MIB
from tileops.kernels.elementwise import base, functions
from tileops.kernels.fast_math import FAST_EXP2
from tileops.kernels.elementwise.base import (
    ElementwiseKernel,
    elementwise_autotune_configs,
    elementwise_default_config,
    hinted_config,
    is_small_call,
    launch_slices,
    one_access_config,
    program_shape,
    small_call_vector,
)
from tileops.kernels.elementwise.binary import AddFwdKernel, MulFwdKernel, launch_boxes
from tileops.kernels.elementwise.gated import (
    GeluAndMulBwdKernel,
    GeluAndMulFwdKernel,
    SiluAndMulBwdKernel,
    SiluAndMulFwdKernel,
    gated_vector,
)
from tileops.kernels.elementwise.programs import broadcast_program, flat_program, gated_program
from tileops.kernels.elementwise.unary import (
    ExpFwdKernel, GeluBwdKernel, GeluFwdKernel, ReluFwdKernel, SigmoidFwdKernel, SiluBwdKernel, SiluFwdKernel,
)
from tileops.kernels.kernel_base import Kernel
from tileops.kernels.launch import widest_access
from tileops.ops.elementwise.base import (
    BinaryElementwiseOp,
    GatedElementwiseOp,
    UnaryElementwiseOp,
    expanded_strides,
    fold_broadcast,
    row_view,
)
from tests.toolchain import divisions_at_accesses, needs_nvcc, ptxas_report

SM90 = {"kind": "cuda", "arch": "sm_90"}


# ---- builds for sm_90: every layout at least once ------------------------------------------


LAYOUTS = pytest.mark.parametrize(
    "kernel, spec",
    [
        (SiluFwdKernel(torch.bfloat16), ("flat", 8)),
        (SiluFwdKernel(torch.float32), ("flat", 4)),
        (GeluBwdKernel(torch.float16, approximate="tanh"), ("flat", 8)),
        (SiluAndMulFwdKernel(22016, torch.bfloat16), ("gated", 8)),
        (GeluAndMulBwdKernel(254, torch.float32), ("gated", 1)),
        (GeluAndMulBwdKernel(8192, torch.float32), ("gated", 4)),
        (AddFwdKernel(torch.bfloat16), ("broadcast", 8, True, True, False)),
        (MulFwdKernel(torch.float32), ("broadcast", 4, True, False, False)),
        (AddFwdKernel(torch.bfloat16), ("broadcast", 8, True, True, True)),
        (MulFwdKernel(torch.float32), ("broadcast", 4, True, False, True)),
    ],
    ids=["silu-flat-bf16", "silu-flat-fp32", "gelu-tanh-bwd-flat-fp16", "silu-and-mul-gated-bf16",
         "gelu-and-mul-bwd-odd-h-fp32", "gelu-and-mul-bwd-fp32",
         "add-broadcast-bf16", "mul-row-scale-fp32", "add-broadcast-rows-bf16", "mul-row-scale-rows-fp32"],
)


@needs_nvcc
@LAYOUTS
def test_elementwise_programs_build_for_sm90(kernel: ElementwiseKernel, spec) -> None:
    source = kernel.compile_program(spec, target=SM90).get_kernel_source()
    assert "__global__" in source
    # Addresses are 64-bit, so tensors over 2**31 elements are addressed correctly.
    assert "(int64_t)" in source
    if spec[1] * kernel.dtype.itemsize == 16:
        # 16-byte loads, and 16-byte stores of the results (float32 math written straight into
        # a vectorized store loop was lowered to one 4-byte store an element).
        output = "DX" if spec[0] == "gated" and kernel.backward else "Y"
        assert re.search(r"\*\((uint4|float4)\*\)\(\w+ \+ .*\) = \*\((uint4|float4)\*\)\(\w+ \+", source)
        assert re.search(rf"\*\((uint4|float4)\*\)\({output} \+", source), "the results are stored 16 bytes at a time"


@needs_nvcc
@LAYOUTS
def test_hinted_programs_load_their_16_byte_vectors_with_evict_last(kernel: ElementwiseKernel, spec) -> None:
    """Every streamed input vector of a hinted program carries the hint; narrower loads take none,
    so there the hinted program is the plain one."""
    plain = kernel.compile_program(spec, target=SM90).get_kernel_source()
    hinted = kernel.compile_program(spec, hinted_config(kernel.config), target=SM90).get_kernel_source()
    assert "tileops_load_evict_last(" not in plain
    if spec[1] * kernel.dtype.itemsize < 16:
        assert hinted.replace(CACHE_HINT_PRELUDE, "") == plain.replace(CACHE_HINT_PRELUDE, "")
        return
    calls = len(re.findall(r"\btileops_load_evict_last\(", hinted))
    assert calls >= (1 if spec[0] == "broadcast" and not all(spec[2:4]) else kernel.pointwise.arity)
    output = "DX" if spec[0] == "gated" and kernel.backward else "Y"
    assert re.search(rf"\*\((uint4|float4)\*\)\({output} \+", hinted), "the results are stored 16 bytes at a time"


@pytest.mark.parametrize("kernel, spec, inputs", [
    (SiluFwdKernel(torch.bfloat16), ("flat", 8), 1),
    (SiluBwdKernel(torch.float32), ("flat", 4), 2),
    (SiluAndMulBwdKernel(8192, torch.bfloat16), ("gated", 8), 3),
], ids=["flat", "flat-bwd-fp32", "gated-bwd"])
def test_calls_take_the_hint_from_hinted_min_mib_of_input_on(kernel, spec, inputs) -> None:
    """Every access of the flat and gated programs loads a vector of each input."""
    per_access = spec[1] * kernel.dtype.itemsize * inputs
    least = -(-(kernel.config["hinted_min_mib"] << 20) // per_access)
    assert kernel.streamed_bytes(spec, least) >= kernel.config["hinted_min_mib"] << 20
    assert kernel.streamed_bytes(spec, least - 1) < kernel.config["hinted_min_mib"] << 20
    assert kernel.call_programs(spec, least, 132)[0] == (spec, hinted_config(kernel.config))
    assert kernel.call_programs(spec, least - 1, 132)[0] == (spec, kernel.config)
    # 8-byte accesses take no hint, however large the call.
    assert not kernel.hints_call((spec[0], spec[1] // 2, *spec[2:]), 1 << 40)


@pytest.mark.parametrize("operand, hinted", [("row-scale", False), ("bias-row", False), ("same-shape", True)])
def test_broadcast_calls_count_each_operands_memory_once(operand: str, hinted: bool) -> None:
    """A bias row or a per-row scale adds its own few bytes to the call's input, not the output's
    size: a bias added to 96 MiB stays under the threshold, as the 96 MiB alone would."""
    kernel = AddFwdKernel(torch.bfloat16, config={})
    chosen: List[Dict[str, int]] = []
    kernel.compile_program = lambda spec, config=None, target="auto": chosen.append(dict(config)) or object()
    kernel.sm_count = lambda device: 132
    rows, width = 6144, 8192  # bf16: 96 MiB
    # Operands as the op folds them into (D0, D1, D2) views.
    a = torch.empty(rows, width, dtype=torch.bfloat16).view(1, rows, width)
    b = {"row-scale": lambda: torch.empty(rows, 1, dtype=torch.bfloat16).view(1, rows, 1).expand(1, rows, width),
         "bias-row": lambda: torch.empty(width, dtype=torch.bfloat16).view(1, 1, width).expand(1, rows, width),
         "same-shape": lambda: torch.empty(rows, width, dtype=torch.bfloat16).view(1, rows, width)}[operand]()
    kernel._broadcast_plan(a, b, torch.empty(1, rows, width, dtype=torch.bfloat16))
    assert chosen[-1].get("hinted", False) == hinted


def test_erf_gated_gelu_backward_takes_no_hint() -> None:
    """Under its register cap the hinted loads would spill; its tanh form has no cap and takes the hint."""
    erf, tanh = (GeluAndMulBwdKernel(8192, torch.bfloat16, approximate=form) for form in ("none", "tanh"))
    assert not erf.hints_call(("gated", 8), 1 << 40) and tanh.hints_call(("gated", 8), 1 << 40)
    assert all(not config.get("hinted") for _, config in erf.typical_programs())
    assert any(config.get("hinted") for _, config in tanh.typical_programs())


@needs_nvcc
def test_build_all_for_sm90_builds_the_typical_programs() -> None:
    built = SiluFwdKernel(torch.bfloat16).build_all_for_sm90()
    # The default config (wide blocks: one 16-byte access a thread), the smallest calls'
    # program (one 4-byte access a thread) and the largest calls' (hinted loads).
    assert list(built) == [(("flat", 8), 1, False), (("flat", 2), 1, False), (("flat", 8), 1, True)]
    assert "uint4" in built[(("flat", 8), 1, False)].get_kernel_source()
    assert "512" in built[(("flat", 8), 1, False)].get_kernel_source()
    assert "tileops_load_evict_last(" not in built[(("flat", 8), 1, False)].get_kernel_source()
    assert "tileops_load_evict_last(" in built[(("flat", 8), 1, True)].get_kernel_source()
    assert not any(divisions_at_accesses(program.get_kernel_source()) for program in built.values())


def test_small_calls_take_one_narrower_access_a_thread() -> None:
    config = {"threads": 256, "unroll": 2}
    # Up to a block of one access a thread per SM: one access a thread.
    assert is_small_call(config, 132 * 256, 132) and is_small_call(config, 1, 132)
    assert is_small_call({"threads": 128, "unroll": 1}, 1, 132)
    # In blocks of 128 threads where the configured ones are a multiple of that.
    assert one_access_config(config) == {"threads": 128, "unroll": 1}
    assert one_access_config({"threads": 64, "unroll": 4}) == {"threads": 64, "unroll": 1}
    assert one_access_config({"threads": 160, "unroll": 2}) == {"threads": 160, "unroll": 1}
    assert not is_small_call(config, 132 * 256 + 1, 132)
    # Accesses narrow while the call still fits a block per SM, down to 4 bytes.
    assert small_call_vector(8, 4096, 132 * 256, 2) == 2
    assert small_call_vector(8, 132 * 256 // 2, 132 * 256, 2) == 4
    assert small_call_vector(8, 132 * 256, 132 * 256, 2) == 8
    assert small_call_vector(4, 1, 132 * 256, 4) == 1
    assert small_call_vector(1, 1, 132 * 256, 2) == 1
    kernel = GeluAndMulBwdKernel(8192, torch.bfloat16)
    assert kernel.small_call_spec(("gated", 8), 8 * 512, 132) == ("gated", 2)
    assert kernel.call_programs(("gated", 8), 8 * 512, 132) == [
        (("gated", 8), {"threads": 128, "unroll": 2, "sm_threads": 1024, "hinted_min_mib": HINTED_MIN_MIB}),
        (("gated", 2), {"threads": 128, "unroll": 1, "sm_threads": 1024, "hinted_min_mib": HINTED_MIN_MIB})]


@needs_nvcc
def test_whole_tile_rows_take_their_row_from_the_grid() -> None:
    """No division by a symbolic extent and no bounds check precedes the loads."""
    spec, config = ("broadcast", 2, True, True, True), {"threads": 256, "unroll": 1}
    source = AddFwdKernel(torch.bfloat16).compile_program(spec, config, target=SM90).get_kernel_source()
    assert "/ D1" not in source and "% D1" not in source and "/ (D2" not in source
    assert "blockIdx.y" in source and "blockIdx.z" in source
    assert "if (" not in source


@pytest.mark.parametrize("shape, vector, rows", [
    ((1, 8, 4096), 8, True),        # a bias on 8 rows: 512 vectors a row, two tiles of 128 x 2
    ((1, 8192, 16384), 8, True),
    ((1, 8, 4104), 8, False),       # rows not a whole number of tiles
    ((1, 70000, 4096), 8, False),   # more rows than a grid axis holds
    ((70000, 1, 4096), 8, False),
    ((5, 3, 1024), 2, True),        # narrower accesses: tiles of 128 x 2 x 2 elements
    ((1, 8, 0), 8, False),
])
def test_broadcasts_launch_the_rows_program_on_whole_tile_rows(shape, vector, rows) -> None:
    kernel = AddFwdKernel(torch.bfloat16)
    assert kernel._whole_tile_rows(shape, vector) is rows


def test_every_program_layout_is_valid_tir() -> None:
    pytest.importorskip("tilelang")
    for config in map(program_shape, elementwise_autotune_configs(torch.bfloat16)[:3]):
        assert flat_program(functions.RELU, "bfloat16", vector=8, **config) is not None
        assert gated_program(functions.SILU_AND_MUL_BWD, 6, "float16", vector=1, **config) is not None
        assert broadcast_program(functions.ADD, "float32", vector=2, a_inner=False, b_inner=True, **config) is not None
        assert broadcast_program(functions.MUL, "float32", vector=2, a_inner=True, b_inner=False, rows=True,
                                 **config) is not None


def test_bad_programs_are_rejected() -> None:
    pytest.importorskip("tilelang")
    with pytest.raises(ValueError, match="vector must be a power of two"):
        flat_program(functions.EXP, "float32", vector=3, threads=256, unroll=4)
    with pytest.raises(ValueError, match="vector 8 must divide H = 127"):
        gated_program(functions.SILU_AND_MUL, 254, "bfloat16", vector=8, threads=256, unroll=4)
    with pytest.raises(ValueError, match="at least one operand varies"):
        broadcast_program(functions.MUL, "float32", vector=1, threads=128, unroll=1, a_inner=False, b_inner=False)
    with pytest.raises(ValueError, match="N \\(2H\\) must be even"):
        SiluAndMulFwdKernel(7, torch.float32)
    with pytest.raises(TypeError):
        SiluFwdKernel(torch.int32)
    with pytest.raises(ValueError, match="approximate must be one of"):
        GeluBwdKernel(torch.float32, approximate="erf")
    with pytest.raises(ValueError, match="unknown config keys"):
        SiluFwdKernel(torch.float32, config={"block": 3})


def test_configs_and_widths() -> None:
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for wide in (False, True):
            candidates = elementwise_autotune_configs(dtype, wide_blocks=wide)
            assert candidates[0] == elementwise_default_config(dtype, wide_blocks=wide)
            assert len(candidates) == len({tuple(sorted(c.items())) for c in candidates})
    assert gated_vector(11008, torch.bfloat16) == 8 and gated_vector(127, torch.bfloat16) == 1
    assert gated_vector(4098, torch.float32) == 2
    base = torch.empty(64, dtype=torch.bfloat16)
    assert widest_access(base, 0, 8) == 8
    assert widest_access(base[1:], 0, 8) == 1
    assert widest_access(base[4:], 0, 8) == 4
    assert widest_access(base, 12, 8) == 4


def test_small_call_tiles_divide_the_configured_tiles() -> None:
    """``BroadcastKernel._whole_tile_rows`` checks rows against the configured block tile and
    relies on a small call's tile (its blocks, one access a thread, a narrower access) dividing it."""
    kernel = AddFwdKernel(torch.bfloat16)
    for config in kernel.autotune_configs + [{"threads": 96, "unroll": 2, "sm_threads": 0}]:
        small = one_access_config(config)
        for vector in (8, 4, 2, 1):
            tile = config["threads"] * config["unroll"] * vector
            for accesses in (1, 4096, 132 * config["threads"]):
                small_vector = small_call_vector(vector, accesses, 132 * config["threads"], 2)
                assert tile % (small["threads"] * small["unroll"] * small_vector) == 0, (config, vector, accesses)


def test_light_kernels_take_wide_blocks_in_half_precision() -> None:
    """Light math in half precision: 512 threads of one 16-byte access; heavier math (the erf
    gated GELU forward, the backwards), and float32, keep 128-thread blocks (see
    ``elementwise_default_config``)."""
    for kernel in (SiluFwdKernel(torch.bfloat16), AddFwdKernel(torch.float16), MulFwdKernel(torch.bfloat16),
                   SiluAndMulFwdKernel(8192, torch.bfloat16),
                   GeluAndMulFwdKernel(8192, torch.float16, approximate="tanh")):
        assert (kernel.config["threads"], kernel.config["unroll"]) == (512, 1), type(kernel).__name__
    for kernel in (SiluFwdKernel(torch.float32), AddFwdKernel(torch.float32), SiluAndMulFwdKernel(8192, torch.float32)):
        assert (kernel.config["threads"], kernel.config["unroll"]) == (128, 1), type(kernel).__name__
    for kernel in (GeluFwdKernel(torch.bfloat16), GeluBwdKernel(torch.bfloat16),
                   GeluAndMulFwdKernel(8192, torch.bfloat16), SiluAndMulBwdKernel(8192, torch.bfloat16),
                   GeluAndMulBwdKernel(8192, torch.bfloat16, approximate="tanh")):
        assert (kernel.config["threads"], kernel.config["unroll"]) == (128, 2), type(kernel).__name__


def test_fast_memory_gives_half_precision_binary_blocks_two_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where memory is fast, half-precision adds and products keep two loads of each input in
    flight a thread, in 256-thread blocks whose tile is the H100 layout's (so a bias over rows of
    4096 still takes the ``rows`` program, in small calls too); float32 and the gated kernels keep
    their layouts."""
    monkeypatch.setattr(base, "has_fast_memory", lambda: True)
    for kernel in (AddFwdKernel(torch.bfloat16), MulFwdKernel(torch.float16)):
        assert (kernel.config["threads"], kernel.config["unroll"]) == (256, 2), type(kernel).__name__
        assert one_access_config(kernel.config) == {**kernel.config, "threads": 128, "unroll": 1}
        assert kernel.program_for(torch.empty(8, 1, 4096, dtype=kernel.dtype),
                                  torch.empty(4096, dtype=kernel.dtype).expand(8, 1, 4096),
                                  torch.empty(8, 1, 4096, dtype=kernel.dtype))[-1]
    assert (AddFwdKernel(torch.float32).config["threads"], AddFwdKernel(torch.float32).config["unroll"]) == (128, 1)
    assert SiluAndMulFwdKernel(8192, torch.bfloat16).config["threads"] == 512
    monkeypatch.setattr(base, "has_fast_memory", lambda: False)
    assert AddFwdKernel(torch.bfloat16).config["unroll"] == 1


@pytest.mark.parametrize("kernel_class", [ReluFwdKernel, SigmoidFwdKernel, SiluFwdKernel, ExpFwdKernel])
def test_fast_memory_gives_light_maps_narrow_blocks(monkeypatch: pytest.MonkeyPatch, kernel_class: type) -> None:
    """Where memory is fast, half-precision maps of light math take 128-thread blocks of one
    load; elsewhere, and in float32, they keep their wide blocks, and heavier maps never change."""
    monkeypatch.setattr(base, "has_fast_memory", lambda: False)
    slow = {dtype: kernel_class(dtype).config for dtype in (torch.bfloat16, torch.float16, torch.float32)}
    heavy = SiluBwdKernel(torch.bfloat16).config
    assert (slow[torch.bfloat16]["threads"], slow[torch.bfloat16]["unroll"]) == (512, 1)
    monkeypatch.setattr(base, "has_fast_memory", lambda: True)
    for dtype in (torch.bfloat16, torch.float16):
        fast = kernel_class(dtype).config
        assert fast == {**slow[dtype], "threads": 128, "unroll": 1}, dtype
        assert one_access_config(fast)["threads"] == 128
    assert kernel_class(torch.float32).config == slow[torch.float32]
    assert SiluBwdKernel(torch.bfloat16).config == heavy


def test_launches_stay_within_int32_extents() -> None:
    assert [(s.start, s.stop) for s in launch_slices(10, 4)] == [(0, 4), (4, 8), (8, 10)]
    assert list(launch_boxes(5, 2, 3, 12)) == [((0, 2), (0, 2), (0, 3)), ((2, 4), (0, 2), (0, 3)),
                                               ((4, 5), (0, 2), (0, 3))]
    assert list(launch_boxes(2, 5, 4, 8)) == [((0, 1), (0, 2), (0, 4)), ((0, 1), (2, 4), (0, 4)),
                                              ((0, 1), (4, 5), (0, 4)), ((1, 2), (0, 2), (0, 4)),
                                              ((1, 2), (2, 4), (0, 4)), ((1, 2), (4, 5), (0, 4))]
    boxes = list(launch_boxes(1, 2, 20, 8))
    assert boxes[:3] == [((0, 1), (0, 1), (0, 8)), ((0, 1), (0, 1), (8, 16)), ((0, 1), (0, 1), (16, 20))]
    assert all((b[0][1] - b[0][0]) * (b[1][1] - b[1][0]) * (b[2][1] - b[2][0]) <= 8 for b in boxes)


# ---- the per-element formulas, evaluated with PyTorch in place of TileLang --------------------


def _flushed_exp2(x: torch.Tensor) -> torch.Tensor:
    """``ex2.approx.ftz``'s results (up to its rounding): below float32's normal range, zero."""
    y = torch.exp2(x)
    return torch.where(y < torch.finfo(torch.float32).tiny, torch.zeros_like(y), y)


def _torch_language(dtype: torch.dtype = torch.float64) -> types.SimpleNamespace:
    """The few TileLang expression builders the formulas use, as PyTorch functions on ``dtype``."""
    externs = {FAST_EXP2: _flushed_exp2}
    return types.SimpleNamespace(
        float32=float, exp=torch.exp, erf=torch.erf, tanh=torch.tanh, fast_rcp=torch.reciprocal, abs=torch.abs,
        **{"__exp": torch.exp},
        call_extern=lambda result_dtype, name, *args: externs[name](*args),
        if_then_else=lambda cond, a, b: torch.where(cond, torch.as_tensor(a, dtype=dtype),
                                                    torch.as_tensor(b, dtype=dtype)),
    )


def _gelu_grad(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return torch.ops.aten.gelu_backward(torch.ones_like(x), x, approximate=approximate)


X = torch.linspace(-12.0, 12.0, 2001, dtype=torch.float64)
G = torch.randn(2001, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
U = torch.randn(2001, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
FORMULAS = [
    (functions.RELU, (X,), (torch.relu(X),)),
    (functions.SIGMOID, (X,), (torch.sigmoid(X),)),
    (functions.SILU, (X,), (torch.nn.functional.silu(X),)),
    (functions.EXP, (X,), (torch.exp(X),)),
    (functions.SILU_BWD, (G, X), (torch.ops.aten.silu_backward(G, X),)),
    (functions.ADD, (G, X), (G + X,)),
    (functions.MUL, (G, X), (G * X,)),
    (functions.SILU_AND_MUL, (X, U), (torch.nn.functional.silu(X) * U,)),
    (functions.SILU_AND_MUL_BWD, (G, X, U), (torch.ops.aten.silu_backward(G * U, X), G * torch.nn.functional.silu(X))),
] + [
    entry
    for approximate in functions.GELU_APPROXIMATIONS
    for entry in (
        (functions.gelu_fn(approximate), (X,), (torch.nn.functional.gelu(X, approximate=approximate),)),
        (functions.gelu_bwd_fn(approximate), (G, X), (G * _gelu_grad(X, approximate),)),
        (functions.gelu_and_mul_fn(approximate), (X, U), (torch.nn.functional.gelu(X, approximate=approximate) * U,)),
        (functions.gelu_and_mul_bwd_fn(approximate), (G, X, U),
         (G * U * _gelu_grad(X, approximate), G * torch.nn.functional.gelu(X, approximate=approximate))),
    )
]


@pytest.mark.parametrize("fn, inputs, expected", FORMULAS, ids=[f.name for f, _, _ in FORMULAS])
def test_formulas_match_pytorch(fn, inputs, expected) -> None:
    got = fn.apply(_torch_language(), *inputs)
    assert len(got) == fn.outputs == len(expected) and len(inputs) == fn.arity
    assert fn.prelude == ""
    for value, reference in zip(got, expected):
        torch.testing.assert_close(torch.as_tensor(value, dtype=torch.float64), reference, rtol=1e-12, atol=1e-12)


def _exact_gelu(x: torch.Tensor) -> torch.Tensor:
    """x Phi(x) through erfc: PyTorch's 0.5 x (1 + erf(x / sqrt 2)) cancels below x = -5 even in float64."""
    return x * 0.5 * torch.erfc(-x / math.sqrt(2.0))


def _exact_gelu_grad(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * torch.erfc(-x / math.sqrt(2.0)) + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


# The half-precision erf GELUs take the fitted normal CDF: evaluated exactly, a GELU is within
# 4e-7 of the exact one, relatively (the CDF's tail is within 3.5e-7), and a derivative within
# 2e-7 absolutely (scaled by the factors beside it; it crosses zero near x = -0.75).
HALF_GELUS = [
    (functions.gelu_fn("none", True), (X,), (_exact_gelu(X),), (0.0,)),
    (functions.gelu_bwd_fn("none", True), (G, X), (G * _exact_gelu_grad(X),), (G,)),
    (functions.gelu_and_mul_fn("none", True), (X, U), (_exact_gelu(X) * U,), (0.0,)),
    (functions.gelu_and_mul_bwd_fn("none", True), (G, X, U),
     (G * U * _exact_gelu_grad(X), G * _exact_gelu(X)), (G * U, 0.0)),
]


@pytest.mark.parametrize("fn, inputs, expected, factors", HALF_GELUS, ids=[f.name for f, *_ in HALF_GELUS])
def test_half_precision_gelus_take_the_fitted_cdf(fn, inputs, expected, factors) -> None:
    assert FAST_EXP2 in fn.prelude and FAST_EXP2 not in functions.gelu_fn("none").prelude
    got = fn.apply(_torch_language(), *inputs)
    for value, reference, factor in zip(got, expected, factors):
        error = (torch.as_tensor(value, dtype=torch.float64) - reference).abs()
        assert torch.all(error <= 4e-7 * reference.abs() + 2e-7 * torch.as_tensor(factor).abs()), fn.name


def _ordinal(values: torch.Tensor) -> torch.Tensor:
    """The position of each 16-bit float among the finite values in order (-0 and +0 alike)."""
    bits = values.view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_gelu_rounds_as_close_as_pytorch(dtype: torch.dtype) -> None:
    """Every finite value of ``dtype``, the fitted GELU in float32 (the hardware's exponential
    flushing below the normal range) and rounded to ``dtype``: the exact GELU rounded, or a
    neighbour of it (or zero where the exponential flushed), and no more often off than
    PyTorch's own float32 GELU."""
    x = torch.arange(-(2 ** 15), 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    x = x[torch.isfinite(x)]
    exact = _exact_gelu(x.double()).to(dtype)
    got = functions.gelu_fn("none", True).apply(_torch_language(torch.float32), x.float())[0].to(dtype)
    pytorch = torch.nn.functional.gelu(x.float()).to(dtype)
    flushed = (got == 0) & (exact.double().abs() < 4 * torch.finfo(torch.float32).tiny)
    assert torch.all(((_ordinal(got) - _ordinal(exact)).abs() <= 1) | flushed)
    assert int((got != exact).sum()) <= int((pytorch != exact).sum())


def test_formulas_keep_nan_and_large_inputs_finite() -> None:
    T = _torch_language()
    special = torch.tensor([float("nan"), -1e4, 1e4, -0.0], dtype=torch.float64)
    assert torch.isnan(functions.RELU.apply(T, special)[0][0])
    assert functions.SIGMOID.apply(T, special)[0][1:].tolist() == [0.0, 1.0, 0.5]
    assert functions.SILU.apply(T, special)[0][1:3].tolist() == [-0.0, 1e4]


# ---- the family bases: layouts handed to the kernels (CPU tensors, stand-in kernels) -----------


class _RecordingKernel(Kernel):
    """Computes ``f`` with PyTorch on the tensors it is given, after checking the layout contract."""

    launches: List[Tuple[Tuple[Tuple[int, ...], Tuple[int, ...]], ...]] = []
    compute = staticmethod(lambda *inputs: inputs[0])
    op_params: Tuple[str, ...] = ()

    def __init__(self, dtype: torch.dtype, tune: bool = False, **params: object) -> None:
        self.params = params
        super().__init__(dtype, config={})

    @property
    def default_config(self) -> Dict[str, int]:
        return {}

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        type(self).launches.append(tuple((tuple(t.shape), tuple(t.stride())) for t in tensors))
        *inputs, out = tensors
        assert out.stride(-1) == 1 or out.shape[-1] == 1
        for tensor in inputs:
            assert tensor.dim() == out.dim() and tensor.stride(-1) in (0, 1)
        out.copy_(type(self).compute(*inputs, **self.params))
        return out


def _recording(compute, op_params: Tuple[str, ...] = ()) -> type:
    return type("Recording", (_RecordingKernel,), {"compute": staticmethod(compute), "op_params": op_params,
                                                    "launches": []})


class _Unary(UnaryElementwiseOp):
    def __init__(self) -> None:
        super().__init__()
        self.dtype, self.tune = torch.float64, False
        self.kernel_map = {"f": _recording(lambda x: x * 2)}


class _Gated(GatedElementwiseOp):
    def __init__(self, N: int) -> None:
        super().__init__()
        self.N, self.dtype, self.tune = N, torch.float64, False

        def compute(*inputs: torch.Tensor, N: int) -> torch.Tensor:
            x = inputs[-1]
            if len(inputs) == 1:
                return x[:, : N // 2] * x[:, N // 2:]
            return torch.cat((inputs[0], inputs[0] * 2), dim=1)

        self.kernel_map = {"g": _recording(compute, ("N",))}


class _Binary(BinaryElementwiseOp):
    def __init__(self) -> None:
        super().__init__()
        self.dtype, self.tune = torch.float64, False
        self.kernel_map = {"add": _recording(lambda a, b: a + b)}


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64)


def test_unary_base_flattens_and_copies_only_non_contiguous_inputs() -> None:
    op = _Unary()
    x = _randn(3, 4, 5)
    torch.testing.assert_close(op._run_kernel(x), x * 2)
    strided = _randn(4, 10)[:, ::2]
    y = op._run_kernel(strided)
    torch.testing.assert_close(y, strided * 2)
    assert y.is_contiguous()
    assert [launch[0][0] for launch in op.kernel_map["f"].launches] == [(60,), (20,)]
    torch.testing.assert_close(op._run_kernel(torch.tensor(3.0, dtype=torch.float64)), torch.tensor(6.0,
                                                                                               dtype=torch.float64))
    assert op._run_kernel(_randn(0, 3)).shape == (0, 3)
    assert len(op.kernel_map["f"].launches) == 3  # nothing launched for the empty input
    assert len(op._kernel_cache) == 1  # one kernel for every shape


def test_row_view_keeps_strided_rows_in_place() -> None:
    wide = _randn(4, 3, 20)
    view = row_view(wide[..., 2:18], 16)
    assert view.shape == (12, 16) and view.stride() == (20, 1) and view.data_ptr() == wide[..., 2:].data_ptr()
    assert row_view(_randn(3, 16)[:, ::2], 8).is_contiguous()
    assert row_view(_randn(6, 8).t(), 6).is_contiguous()
    assert row_view(_randn(1, 8)[:, :6], 6).stride() == (6, 1)


def test_gated_base_forward_and_backward_rows() -> None:
    op = _Gated(8)
    x = _randn(2, 3, 12)[..., 2:10]  # strided rows
    torch.testing.assert_close(op._run_kernel(x), x[..., :4] * x[..., 4:])
    launch = op.kernel_map["g"].launches[-1]
    assert launch[0] == ((6, 8), (12, 1)) and launch[1] == ((6, 4), (4, 1))
    grad = _randn(2, 3, 4)
    torch.testing.assert_close(op._run_kernel(grad, x), torch.cat((grad, grad * 2), -1))
    assert op._run_kernel(_randn(0, 8)).shape == (0, 4)


@pytest.mark.parametrize(
    "a_shape, b_shape, folded",
    [
        ((8, 16), (16,), [(1, (0, 0)), (8, (16, 0)), (16, (1, 1))]),
        ((8, 16), (8, 1), [(1, (0, 0)), (8, (16, 1)), (16, (1, 0))]),
        ((2, 3, 4), (2, 1, 4), [(2, (12, 4)), (3, (4, 0)), (4, (1, 1))]),
        ((7,), (), [(1, (0, 0)), (1, (0, 0)), (7, (1, 0))]),
        ((4, 1, 5), (3, 1), [(4, (5, 0)), (3, (0, 1)), (5, (1, 0))]),
        ((2, 3, 4), (2, 3, 4), [(2, (4, 4)), (3, (8, 8)), (4, (1, 1))]),
    ],
)
def test_binary_base_folds_broadcasts_into_three_axes(a_shape, b_shape, folded) -> None:
    op = _Binary()
    a, b = _randn(*a_shape), _randn(*b_shape)
    if a_shape == b_shape:
        a = a.transpose(0, 1).contiguous().transpose(0, 1)  # same shape, not contiguous: the folded path
        b = b.transpose(0, 1).contiguous().transpose(0, 1)
    y = op._run_kernel(a, b)
    torch.testing.assert_close(y, a + b)
    launch = op.kernel_map["add"].launches[-1]
    sizes = tuple(size for size, _ in folded)
    assert launch[0] == (sizes, tuple(s[0] for _, s in folded))
    assert launch[1] == (sizes, tuple(s[1] for _, s in folded))


def test_binary_base_copies_only_what_the_kernel_cannot_read() -> None:
    op = _Binary()
    kernel = op.kernel_map["add"]
    same = _randn(5, 6)
    torch.testing.assert_close(op._run_kernel(same, same), same * 2)
    assert kernel.launches[-1][0] == ((30,), (1,))  # flat
    transposed = _randn(6, 5).t()
    ones = torch.ones(5, 1, dtype=torch.float64)
    torch.testing.assert_close(op._run_kernel(transposed, ones), transposed + 1)
    assert kernel.launches[-1][0] == ((1, 5, 6), (0, 6, 1))  # the transpose was copied
    wide = _randn(5, 10)
    torch.testing.assert_close(op._run_kernel(wide[:, :6], same), wide[:, :6] + same)
    assert kernel.launches[-1][0] == ((1, 5, 6), (0, 10, 1))  # a slice read in place
    expanded_a, expanded_b = _randn(4, 1).expand(4, 6), _randn(4, 1).expand(4, 6)
    torch.testing.assert_close(op._run_kernel(expanded_a, expanded_b), expanded_a + expanded_b)
    five_axes_a, five_axes_b = _randn(3, 1, 4, 1, 5), _randn(1, 2, 1, 6, 1)
    torch.testing.assert_close(op._run_kernel(five_axes_a, five_axes_b), five_axes_a + five_axes_b)
    assert kernel.launches[-1][0] == ((720,), (1,))  # materialized, then flat
    assert op._run_kernel(_randn(0, 3), _randn(3)).shape == (0, 3)
    assert op._run_kernel(_randn(1, 1), torch.tensor(2.0, dtype=torch.float64)).shape == (1, 1)


def test_fold_broadcast_drops_unit_axes_and_merges_neighbours() -> None:
    def strides(out_shape: Tuple[int, ...], *operands: torch.Tensor) -> List[Tuple[int, ...]]:
        return [expanded_strides(t.shape, t.stride(), out_shape) for t in operands]

    a, b = _randn(2, 1, 3, 4), _randn(3, 4)
    for got, operand in zip(strides((2, 1, 3, 4), a, b), (a, b)):  # size-1 axes of the output never fold
        assert [step for axis, step in enumerate(got) if axis != 1] == \
            [step for axis, step in enumerate(operand.expand(2, 1, 3, 4).stride()) if axis != 1]
    assert fold_broadcast((2, 1, 3, 4), strides((2, 1, 3, 4), a, b)) == [(2, (12, 0)), (12, (1, 1))]
    folded = fold_broadcast((2, 5, 3), strides((2, 5, 3), _randn(2, 5, 3), _randn(1, 5, 1)))
    assert math.prod(size for size, _ in folded) == 30


def test_one_kernel_serves_every_shape_of_a_device() -> None:
    op = _Binary()
    for a, b in ((_randn(3, 4), _randn(4)), (_randn(100), _randn(100)), (_randn(2, 3, 5), _randn(3, 1))):
        torch.testing.assert_close(op._run_kernel(a, b), a + b)
    assert list(op._kernel_cache) == [("add", (None,))]  # keyed by the device index alone (a CPU tensor's is None)


# ---- the whole CUDA path on the CPU: every program emulated with PyTorch ----------------------
# The emulation checks each launch's arguments against what the program assumes (ranks, unit
# inner strides, alignment of every vector access, the launch-size limit), then computes the
# program's result with the same formulas, so the op bases' views and the kernels' width and
# launch choices are tested on the GPU tests' own cases without a GPU.


def _aligned(tensor: torch.Tensor, vector: int, strides: Tuple[int, ...] = ()) -> bool:
    return tensor.data_ptr() % (vector * tensor.element_size()) == 0 and all(s % vector == 0 for s in strides)


def _emulated_launcher(kernel: ElementwiseKernel, spec, accesses: int, device: torch.device,
                       input_bytes: Optional[int] = None) -> object:
    from tileops.kernels.elementwise import programs

    fn, language = kernel.pointwise, _torch_language()

    def launch(*tensors: torch.Tensor) -> None:
        *inputs, out = tensors
        assert out.numel() <= programs.MAX_LAUNCH_ELEMENTS and all(t.dtype == kernel.dtype for t in tensors)
        layout, vector = spec[0], spec[1]
        # The launcher was told the call's size in the program's work items (one access each), which
        # picks its config: never fewer than this launch (a piece of a call, or all of it) covers.
        work = out.numel() // 2 if layout == "gated" and kernel.backward else out.numel()
        assert accesses >= -(-work // vector), (accesses, work, vector)
        assert device == out.device
        wide = [t.double() for t in inputs]
        if layout == "flat":
            assert all(t.dim() == 1 and t.is_contiguous() and t.numel() == out.numel() for t in tensors)
            assert all(_aligned(t, vector) for t in tensors)
            out.copy_(fn.apply(language, *wide)[0])
        elif layout == "gated":
            H = kernel.N // 2
            assert H % vector == 0 and out.is_contiguous()
            assert all(t.dim() == 2 and t.stride(1) == 1 and _aligned(t, vector, (t.stride(0),)) for t in tensors)
            x = wide[-1]
            out.copy_(torch.cat(fn.apply(language, *wide[:-1], x[:, :H], x[:, H:]), 1))
        else:
            _, _, a_inner, b_inner, rows = spec
            assert out.dim() == 3 and out.stride(2) == 1 and out.shape[2] % vector == 0
            if rows:  # every row whole tiles (at least a block of one access a thread), rows within the grid
                assert out.shape[2] % (kernel.config["threads"] * vector) == 0
                assert max(out.shape[:2]) <= programs.MAX_GRID_YZ
            assert _aligned(out, vector, out.stride()[:2])
            values = []
            for tensor, value, inner in zip(inputs, wide, (a_inner, b_inner)):
                if inner:
                    assert tensor.dim() == 3 and tensor.stride(2) == 1 and _aligned(tensor, vector, tensor.stride()[:2])
                    values.append(value)
                else:
                    assert tensor.dim() == 2
                    values.append(value[:, :, None].expand(out.shape))
            out.copy_(fn.apply(language, *values)[0])

    return launch


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ElementwiseKernel, "launcher", _emulated_launcher)


def _gpu_cases():
    from tests.gpu import test_elementwise as cases

    return cases


def _check_kernel_path(op, inputs: List[torch.Tensor]) -> None:
    from tests.op_checks import assert_close

    out = op._run_kernel(*inputs)
    assert out.is_contiguous()
    assert_close(out, op.reference(*(t.double() for t in inputs)), inputs[0].dtype)


def test_emulated_backward_and_broadcast_cases(emulated: None) -> None:
    cases = _gpu_cases()
    for fwd, params, shape, dtype in cases.GRAD_CASES:
        static = cases.static_params(fwd, shape)
        x, grad = torch.randn(shape).to(dtype), torch.randn(cases.grad_shape(fwd, shape)).to(dtype)
        _check_kernel_path(cases.build(fwd, dtype, **static, **params), [x])
        _check_kernel_path(cases.build(cases.bwd_name(fwd), dtype, **static, **params), [grad, x])
    for name in ("AddFwdOp", "MulFwdOp"):
        for a_shape, b_shape, dtype in cases.BROADCASTS:
            _check_kernel_path(cases.build(name, dtype), [torch.randn(a_shape).to(dtype), torch.randn(b_shape).to(dtype)])


def test_emulated_view_cases(emulated: None) -> None:
    cases = _gpu_cases()
    for _, name, params, make in cases.VIEW_CASES:
        inputs = make("cpu")
        _check_kernel_path(cases.build(name, inputs[0].dtype, **params), inputs)


def test_emulated_launches_split_large_tensors(emulated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from tileops.kernels.elementwise import binary, gated, programs, unary

    for module in (programs, unary, gated, binary):
        monkeypatch.setattr(module, "MAX_LAUNCH_ELEMENTS", 1 << 12)
    cases = _gpu_cases()
    bf16 = torch.bfloat16
    _check_kernel_path(cases.build("SiluFwdOp", bf16), [torch.randn(3 * 4096 + 5).to(bf16)])
    _check_kernel_path(cases.build("SiluAndMulFwdOp", bf16, N=256), [torch.randn(50, 256).to(bf16)])
    _check_kernel_path(cases.build("SiluAndMulBwdOp", bf16, N=256), [torch.randn(50, 128).to(bf16),
                                                                     torch.randn(50, 256).to(bf16)])
    _check_kernel_path(cases.build("AddFwdOp", torch.float32), [torch.randn(3 * 4096 + 5), torch.randn(1)])
    _check_kernel_path(cases.build("AddFwdOp", torch.float32), [torch.randn(3, 5000), torch.randn(5000)])
    _check_kernel_path(cases.build("MulFwdOp", torch.float32), [torch.randn(4, 3, 700), torch.randn(4, 1, 700)])
    _check_kernel_path(cases.build("MulFwdOp", torch.float32), [torch.randn(3, 5000), torch.randn(3, 5000)])


def test_binary_layouts_are_remembered_per_geometry_and_read_each_call_in_place() -> None:
    op = _Binary()
    kernel = op.kernel_map["add"]
    wide = _randn(5, 12)
    cases = [(_randn(5, 6), _randn(6)), (_randn(6, 5).t(), torch.ones(5, 1, dtype=torch.float64)),
             (_randn(3, 1, 4, 1, 5), _randn(1, 2, 1, 6, 1)), (_randn(4, 1).expand(4, 6), _randn(4, 1).expand(4, 6))]
    for a, b in cases:
        first = op._run_kernel(a, b)
        views = kernel.launches[-1]
        if a.is_contiguous():
            a.copy_(torch.randn_like(a))
        torch.testing.assert_close(op._run_kernel(a, b), a + b)  # the remembered layout, new values
        assert kernel.launches[-1][:2] == views[:2]
        assert first.shape == (a + b).shape
    remembered = len(op._layouts)
    assert remembered == len(cases)
    # One geometry at two offsets into the same storage: each call reads its own elements.
    for start in (0, 3, 6):
        torch.testing.assert_close(op._run_kernel(wide[:, start:start + 6], wide[0, :6]),
                                   wide[:, start:start + 6] + wide[0, :6])
    assert len(op._layouts) == remembered + 1


def test_launchers_are_remembered_per_config_and_a_new_config_forgets_them() -> None:
    kernel = SiluFwdKernel(dtype=torch.bfloat16, config=elementwise_default_config(torch.bfloat16))
    compiled: List[Tuple[object, Dict[str, int]]] = []

    def compile_program(spec, config=None, target="auto"):
        compiled.append((spec, dict(config)))
        return object()

    kernel.compile_program = compile_program
    kernel.sm_count = lambda device: 132
    device = torch.device("cpu")
    large = 1 << 20  # accesses enough for the configured program, not the small-call one (16 MiB)
    first = kernel.launcher(("flat", 8), large, device)
    assert kernel.launcher(("flat", 8), large, device) is first and len(compiled) == 1
    kernel.config = {**kernel.config, "unroll": 1 if kernel.config["unroll"] != 1 else 2}
    assert kernel.launcher(("flat", 8), large, device) is not first
    assert len(compiled) == 2 and compiled[1][1] == kernel.config
    # A call past hinted_min_mib launches (and remembers) the hinted program beside the plain one.
    largest = (kernel.config["hinted_min_mib"] << 20) // 16
    hinted = kernel.launcher(("flat", 8), largest, device)
    assert kernel.launcher(("flat", 8), largest, device) is hinted
    assert kernel.launcher(("flat", 8), large, device) is not hinted
    assert len(compiled) == 3 and compiled[2][1] == hinted_config(kernel.config)
    # A small call: one narrow access a thread, never hinted.
    kernel.launcher(("flat", 8), 1, device)
    assert compiled[3] == (("flat", 2), one_access_config(kernel.config))


def test_emulated_remembered_launchers_follow_each_calls_alignment(emulated: None) -> None:
    """Kernels remember a call's launcher per length (or rows), alignment and device: the same
    op and sizes at an address, or a row stride, that allows only narrower accesses get a
    narrower program (the emulation asserts every access's alignment)."""
    cases = _gpu_cases()
    bf16 = torch.bfloat16
    base = torch.randn(2 * 4096 + 8).to(bf16)
    relu, add = cases.build("ReluFwdOp", bf16), cases.build("AddFwdOp", bf16)
    for offset in (0, 1, 0, 2, 4):  # 16-byte aligned, then 2-, 4- and 8-byte aligned starts
        x = base[offset:offset + 4096]
        _check_kernel_path(relu, [x])
        _check_kernel_path(add, [x, base[8:8 + 4096]])
    gated = cases.build("SiluAndMulFwdOp", bf16, N=256)
    wide = torch.randn(6, 512 + 8).to(bf16)
    for x in (wide[:, :256], wide[:, 1:257], torch.randn(6, 256).to(bf16), wide[:, 2:258]):
        _check_kernel_path(gated, [x])
    rows = torch.randn(6 * 257).to(bf16).view(6, 257)[:, :256]  # a row stride of 257 elements
    _check_kernel_path(gated, [rows])


@needs_nvcc
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("make, blocks", [
    (lambda dtype: GeluFwdKernel(dtype), 16),
    (lambda dtype: GeluBwdKernel(dtype), 12),
    (lambda dtype: GeluAndMulBwdKernel(8192, dtype), 8),
], ids=["gelu", "gelu_bwd", "gelu_and_mul_bwd"])
def test_erf_gelu_programs_leave_room_for_their_blocks_without_spilling(make, blocks, dtype, tmp_path) -> None:
    """The register cap (``sm_threads``) reaches the compiler as launch bounds, and every typical
    program fits under it in registers."""
    kernel = make(dtype)
    assert kernel.config["sm_threads"] == blocks * kernel.config["threads"]
    for spec, config in kernel.typical_programs():
        source = kernel.compile_program(spec, config, target=SM90).get_kernel_source()
        assert f"__launch_bounds__({config['threads']}, {blocks})" in source
        report = ptxas_report(source, str(tmp_path))
        assert report["spill_bytes"] == 0 and report["registers"] <= 65536 // (blocks * config["threads"])


@needs_nvcc
def test_tanh_gelu_and_other_functions_keep_the_compilers_register_choice() -> None:
    for kernel in (GeluFwdKernel(torch.bfloat16, approximate="tanh"), SiluFwdKernel(torch.bfloat16),
                   SiluAndMulFwdKernel(8192, torch.bfloat16)):
        assert kernel.config["sm_threads"] == 0
        spec, config = kernel.typical_programs()[0]
        assert f"__launch_bounds__({config['threads']}, 1)" in kernel.compile_program(
            spec, config, target=SM90).get_kernel_source()


@needs_nvcc
@pytest.mark.parametrize("make", [
    lambda dtype: GeluFwdKernel(dtype), lambda dtype: GeluBwdKernel(dtype),
    lambda dtype: GeluAndMulFwdKernel(8192, dtype), lambda dtype: GeluAndMulBwdKernel(8192, dtype),
], ids=["gelu", "gelu_bwd", "gelu_and_mul", "gelu_and_mul_bwd"])
def test_erf_gelus_take_the_fitted_cdf_in_half_precision_and_erff_in_float32(make) -> None:
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        kernel = make(dtype)
        spec, config = kernel.typical_programs()[0]
        body = kernel.compile_program(spec, config, target=SM90).get_kernel_source().split("__global__", 1)[1]
        assert ("erff(" in body) == (dtype == torch.float32), dtype
        assert (f"{FAST_EXP2}(" in body) == (dtype != torch.float32), dtype
