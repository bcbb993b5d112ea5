"""The norm family on the GPU: RMSNorm backward, LayerNorm forward and backward, fused add + RMSNorm
forward and backward.

* every manifest case of the five ops (workloads, odd sizes, ranks 1-4,
  strided and empty inputs) against the float64 reference;
* gradients through the forward ops' autograd against ``torch.autograd`` of
  the float64 forward reference, over many rows (so the weight and bias
  gradients sum thousands of partials), odd hidden sizes up to 65537 (resident
  and streamed programs, partial sums in registers, shared or global memory),
  and with LayerNorm's weight and bias absent;
* the backward ops called directly give what autograd gave (row slices of a wider ``grad_y``
  read in place give the same);
* tensors of more than 2**31 elements.

``python -m tests.gpu.norm_warmup`` compiles every program these tests launch
in parallel first, so the tests find them in TileLang's cache.
"""

import math
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
import torch

from tests.op_checks import assert_close, build_op, check_against_reference, manifest_cases

pytestmark = pytest.mark.gpu

OPS = ("RMSNormBwdOp", "LayerNormFwdOp", "LayerNormBwdOp", "FusedAddRMSNormFwdOp", "FusedAddRMSNormBwdOp")
# Workloads up to 2**25 elements (the larger ones, whose random inputs take seconds to draw on the
# CPU, are checked against the same float64 reference by ``benchmarks.norm_timing``).
MANIFEST_CASES = [case for name in OPS for case in manifest_cases(name, max_numel=1 << 25)]
ODD_SIZES = (1, 3, 127, 4097, 65537)
# (rows, N, dtype): many rows (long column sums), odd sizes, the streamed programs.
GRAD_CASES: List[Tuple[int, int, torch.dtype]] = [
    (4096, 256, torch.float32),
    (3000, 4096, torch.bfloat16),
    (513, 16384, torch.bfloat16),
    (64, 32768, torch.bfloat16),
    (257, 1, torch.float32),
    (257, 3, torch.float16),
    (257, 127, torch.bfloat16),
    (257, 4097, torch.float32),
    (5, 4097, torch.bfloat16),
    (5, 65537, torch.float16),
    (3, 65537, torch.float32),
    # One row: the row launch writes the gradients itself when its partial sums stay on chip
    # (shared memory, registers, streamed with the bias's last sums in registers); not at 65537.
    (1, 4096, torch.bfloat16),
    (1, 1024, torch.float32),
    (1, 32768, torch.bfloat16),
    (1, 65537, torch.float16),
    # A few long rows, each split over a cluster of blocks (the slices of 20000 end in a tail group).
    (200, 20000, torch.float32),
    (3, 65536, torch.bfloat16),
    # Streamed rows, several to a row group (more rows than groups, and than ``cluster_rows``);
    # the half-precision ones split over clusters of 4 and 2 blocks (``many_rows_ctas``; the
    # slices of 12288 end in a tail group).
    (1100, 65536, torch.float16),
    (1100, 24576, torch.bfloat16),
    (1100, 20000, torch.float32),
    (1500, 32768, torch.bfloat16),
]
# Resident rows whose last column group leaves lanes idle (256 lanes of two vectors hold 4096), which
# take a block per row group where memory is fast and fold two a block elsewhere.
RAGGED_GRAD_CASES: List[Tuple[int, int, torch.dtype]] = [
    (1000, 2880, torch.bfloat16),
    (777, 3584, torch.float16),
]
# Streamed rows whose backward is run under both schedules (see ``stream_overlap``).
SCHEDULE_CASES = GRAD_CASES[-2:]
# Which affine tensors LayerNorm gets, (weight, bias); every combination on a few cases.
AFFINES = [(True, True), (False, False), (True, False), (False, True)]
AFFINE_CASES = [GRAD_CASES[1], GRAD_CASES[3], GRAD_CASES[6], GRAD_CASES[9], GRAD_CASES[11], GRAD_CASES[13],
                GRAD_CASES[-1]]
LAYER_GRAD_CASES = [(*case, (True, True)) for case in GRAD_CASES + RAGGED_GRAD_CASES] + [
    (*case, affine) for case in AFFINE_CASES for affine in AFFINES[1:]]
FUSED_SIZES = ODD_SIZES + (4096, 32768)
FUSED_DTYPES = (torch.bfloat16, torch.float32)
# Fused add + RMSNorm training: every backward program (resident with partial sums in registers and
# in shared memory, streamed, split over clusters for few rows and for many), one-row launches.
# float16 rows of 2048 and 4096 take a block a row group (its fold spills; see ``norm_bwd_default_config``).
FUSED_GRAD_CASES = [GRAD_CASES[i] for i in (0, 1, 2, 3, 5, 7, 9, 11, 13, 16, 19, 20)] + [
    (3000, 4096, torch.float16), (133, 2048, torch.float16), (1, 4096, torch.float16)] + RAGGED_GRAD_CASES


def _op(name: str, N: int, dtype: torch.dtype, eps: float = 1e-5):
    import tileops.ops

    return getattr(tileops.ops, name)(N=N, dtype=dtype, eps=eps)


def _randn(*shape: int, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=torch.float32).to(device="cuda", dtype=dtype)


# ---- the manifest's cases ----------------------------------------------------------------------


@pytest.mark.parametrize("case", MANIFEST_CASES, ids=lambda case: f"{case.op}-{case}")
def test_matches_manifest_reference(case):
    check_against_reference(case, device="cuda")
    if case.label != "empty":
        assert build_op(case).last_backend == "kernel"


# ---- gradients against autograd -------------------------------------------------------------------


def _leaves(tensors: List[Optional[torch.Tensor]], dtype: Optional[torch.dtype] = None) -> List[Optional[torch.Tensor]]:
    return [None if t is None else t.detach().to(dtype or t.dtype).requires_grad_() for t in tensors]


def _check_grads(ours: List[Optional[torch.Tensor]], wide: List[Optional[torch.Tensor]], dtype: torch.dtype) -> None:
    for mine, theirs in zip(ours, wide):
        if mine is None:
            continue
        assert mine.grad is not None
        assert_close(mine.grad, theirs.grad, dtype)


@pytest.mark.parametrize("rows, N, dtype", GRAD_CASES + RAGGED_GRAD_CASES, ids=str)
def test_rms_norm_gradients_match_autograd(rows, N, dtype):
    generator = torch.Generator().manual_seed(rows + N)
    x, weight = _randn(rows, N, dtype=dtype, generator=generator), _randn(N, dtype=dtype, generator=generator)
    grad = _randn(rows, N, dtype=dtype, generator=generator)
    fwd = _op("RMSNormFwdOp", N, dtype, eps=1e-6)
    ours = _leaves([x, weight])
    fwd(*ours).backward(grad)
    wide = _leaves([x, weight], torch.float64)
    torch.nn.functional.rms_norm(wide[0], (N,), wide[1], 1e-6).backward(grad.double())
    _check_grads(ours, wide, dtype)
    direct = _op("RMSNormBwdOp", N, dtype, eps=1e-6)(grad, x, weight)
    torch.testing.assert_close(direct[0], ours[0].grad, rtol=0, atol=0)
    torch.testing.assert_close(direct[1], ours[1].grad, rtol=0, atol=0)


@pytest.mark.parametrize("rows, N, dtype, affine", LAYER_GRAD_CASES, ids=str)
def test_layer_norm_gradients_match_autograd(rows, N, dtype, affine):
    generator = torch.Generator().manual_seed(rows * 7 + N)
    # An offset mean: the variance must not cancel.
    x = (_randn(rows, N, dtype=torch.float32, generator=generator) * 2 + 3).to(dtype)
    weight = _randn(N, dtype=dtype, generator=generator) if affine[0] else None
    bias = _randn(N, dtype=dtype, generator=generator) if affine[1] else None
    grad = _randn(rows, N, dtype=dtype, generator=generator)
    fwd = _op("LayerNormFwdOp", N, dtype)
    ours = _leaves([x, weight, bias])
    y = fwd(*ours)
    assert_close(y, torch.nn.functional.layer_norm(x.double(), (N,), _double(weight), _double(bias), 1e-5), dtype)
    y.backward(grad)
    wide = _leaves([x, weight, bias], torch.float64)
    torch.nn.functional.layer_norm(wide[0], (N,), wide[1], wide[2], 1e-5).backward(grad.double())
    _check_grads(ours, wide, dtype)
    direct = _op("LayerNormBwdOp", N, dtype)(grad, x, weight)
    torch.testing.assert_close(direct[0], ours[0].grad, rtol=0, atol=0)
    if weight is not None:
        torch.testing.assert_close(direct[1], ours[1].grad, rtol=0, atol=0)
    if bias is not None:
        torch.testing.assert_close(direct[2], ours[2].grad, rtol=0, atol=0)


# Rows far from zero, (rows, N, dtype, mean, spread): float32 rows a thousand spreads out, where a
# variance taken as mean(x**2) - mean**2 would keep about 6 % of its value (1e6 - 1e6 in float32),
# and half-precision rows a hundred out.  Resident rows with and without a tail, streamed rows.
FAR_ROWS = [(64, 4096, torch.float32, 1000.0, 1.0), (37, 4097, torch.float32, 1000.0, 1.0),
            (64, 4096, torch.bfloat16, 1024.0, 10.0), (5, 127, torch.float16, 1024.0, 10.0),
            (16, 32768, torch.bfloat16, 1024.0, 10.0), (9, 65537, torch.float32, 1000.0, 1.0)]


@pytest.mark.parametrize("rows, N, dtype, mean, spread", FAR_ROWS, ids=str)
def test_layer_norm_forward_of_rows_far_from_zero(rows, N, dtype, mean, spread):
    """The moments of rows far from zero do not cancel: the output matches the float64 reference
    within what float32 rounding of the inputs' magnitude allows (eight times mean * 2**-23 a spread)."""
    generator = torch.Generator().manual_seed(rows + N)
    x = (_randn(rows, N, dtype=torch.float32, generator=generator) * spread + mean).to(dtype)
    weight, bias = _randn(N, dtype=dtype, generator=generator), _randn(N, dtype=dtype, generator=generator)
    y = _op("LayerNormFwdOp", N, dtype)(x, weight, bias)
    expected = torch.nn.functional.layer_norm(x.double(), (N,), weight.double(), bias.double(), 1e-5)
    if dtype == torch.float32:
        scale = expected.abs().max().item()
        torch.testing.assert_close(y.double(), expected, rtol=0, atol=8 * mean / spread * 2.0**-23 * scale)
    else:
        assert_close(y, expected, dtype)


def schedule_kernels(N: int, dtype: torch.dtype) -> List[Any]:
    """The LayerNorm and RMSNorm backward kernels for ``N``, with the next row summed during the
    write walk and without."""
    from tileops.kernels.norm.layer_norm import LayerNormBwdKernel
    from tileops.kernels.norm.rms_norm_bwd import RMSNormBwdKernel

    return [cls(N, dtype, eps=1e-5, config={"stream_overlap": overlap, "many_rows_ctas": 0})
            for cls in (LayerNormBwdKernel, RMSNormBwdKernel) for overlap in (0, 1)]


@pytest.mark.parametrize("rows, N, dtype", SCHEDULE_CASES, ids=str)
def test_streamed_backward_schedules_agree(rows, N, dtype):
    """Both schedules add the same terms in the same order: their results are bitwise equal."""
    generator = torch.Generator().manual_seed(rows + 3 * N)
    x = (_randn(rows, N, dtype=torch.float32, generator=generator) * 2 + 3).to(dtype)
    weight, grad = _randn(N, dtype=dtype, generator=generator), _randn(rows, N, dtype=dtype, generator=generator)
    results = []
    for kernel in schedule_kernels(N, dtype):
        assert kernel.main_program() == "norm_bwd_streamed" and not kernel.split_ctas(rows)
        grads = [torch.empty_like(x)] + [torch.empty(N, device="cuda", dtype=dtype) for _ in range(kernel.accumulators)]
        kernel.forward(grad, x, weight, *grads)
        results.append(grads)
    layer_apart, layer_overlap, rms_apart, rms_overlap = results
    for apart, overlap in ((layer_apart, layer_overlap), (rms_apart, rms_overlap)):
        for mine, theirs in zip(overlap, apart):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    wide = _leaves([x, weight], torch.float64)
    torch.nn.functional.rms_norm(wide[0], (N,), wide[1], 1e-5).backward(grad.double())
    for mine, theirs in zip(rms_overlap, wide):
        assert_close(mine, theirs.grad, dtype)


# (rows, N, dtype) of resident LayerNorm backward rows of 256 lanes whose partial sums live in
# shared memory (those that fold two row groups into a block): whole vectors, a tail vector, and
# more rows than a launch has row groups.
TIER_CASES = [(4099, 4096, torch.bfloat16), (513, 2568, torch.float16), (1000, 3000, torch.bfloat16),
              (77, 2048, torch.float32)]


@pytest.mark.parametrize("rows, N, dtype", TIER_CASES, ids=str)
def test_layer_norm_backward_layouts_of_both_memory_tiers(rows, N, dtype):
    """The H100's layout (two row groups folded into a block) and the fast-memory one (a block per
    row group, ``norm_bwd_default_config``), each pinned, on whatever GPU runs the test."""
    from tileops.kernels.norm.backward import FOLD_THREADS
    from tileops.kernels.norm.layer_norm import LayerNormBwdKernel

    generator = torch.Generator().manual_seed(rows + N)
    x = (_randn(rows, N, dtype=torch.float32, generator=generator) * 2 + 3).to(dtype)
    weight, bias = _randn(N, dtype=dtype, generator=generator), _randn(N, dtype=dtype, generator=generator)
    grad = _randn(rows, N, dtype=dtype, generator=generator)
    wide = _leaves([x, weight, bias], torch.float64)
    torch.nn.functional.layer_norm(wide[0], (N,), wide[1], wide[2], 1e-5).backward(grad.double())
    layouts = set()
    for fold_threads in (FOLD_THREADS, 0):
        kernel = LayerNormBwdKernel(N, dtype, eps=1e-5, config={"fold_threads": fold_threads})
        layouts.add(kernel.layout())
        grads = [torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)]
        kernel.forward(grad, x, weight, *grads)
        for mine, theirs in zip(grads, wide):
            assert_close(mine, theirs.grad, dtype)
    assert len(layouts) == 2, layouts


# (rows, N, dtype, config) of rows split over clusters whose blocks stage the next row in shared
# memory: 1024-thread slices (with a tail group at 24576; four blocks a row at 65536 fp16) and,
# pinned, 512-thread slices two blocks an SM.  More rows than clusters, so that some clusters'
# last step lies past the last row.
STAGE_CASES = [(1100, 24576, torch.bfloat16, {}), (1100, 65536, torch.float16, {}),
               (1500, 32768, torch.bfloat16, {"many_rows_ctas": 4})]


def stage_kernels(layer: bool, N: int, dtype: torch.dtype, config: Dict[str, int]) -> List[Any]:
    """The LayerNorm (``layer``) or RMSNorm backward kernel for ``N`` under ``config``, its cluster
    blocks loading each row themselves, staging it (``cluster_stage``) once the row sum is taken,
    and staging it as soon as every thread has read the stage (``cluster_stage_early``)."""
    from tileops.kernels.norm.layer_norm import LayerNormBwdKernel
    from tileops.kernels.norm.rms_norm_bwd import RMSNormBwdKernel

    cls = LayerNormBwdKernel if layer else RMSNormBwdKernel
    threads = 512 if config else 1024
    settings = [(0, 0), (threads, 0), (threads, 1)]
    return [cls(N, dtype, eps=1e-5, config={**config, "cluster_stage": stage, "cluster_stage_early": early})
            for stage, early in settings]


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("rows, N, dtype, config", STAGE_CASES, ids=str)
@pytest.mark.parametrize("layer", [True, False], ids=["layer", "rms"])
def test_cluster_backward_with_and_without_staged_rows(layer, rows, N, dtype, config, strided):
    """The cluster program with its blocks loading each row themselves and bulk-copying it ahead
    (``cluster_stage``), each pinned, on whatever GPU runs the test."""
    generator = torch.Generator().manual_seed(rows + N)
    pad = 64 if strided else 0
    x = (_randn(rows, N + pad, dtype=torch.float32, generator=generator) * 2 + 3).to(dtype)[:, :N]
    grad = _randn(rows, N + pad, dtype=dtype, generator=generator)[:, :N]
    weight = _randn(N, dtype=dtype, generator=generator)
    affine = [weight, _randn(N, dtype=dtype, generator=generator)] if layer else [weight]
    wide = _leaves([x, *affine], torch.float64)
    if layer:
        torch.nn.functional.layer_norm(wide[0], (N,), wide[1], wide[2], 1e-5).backward(grad.double())
    else:
        torch.nn.functional.rms_norm(wide[0], (N,), wide[1], 1e-5).backward(grad.double())
    for kernel in stage_kernels(layer, N, dtype, config):
        split = kernel.split_layout(ctas=kernel.split_ctas(rows))
        assert split is not None and split.threads == (512 if config else 1024)
        assert kernel.stages(split) == bool(kernel.config["cluster_stage"])
        grads = [torch.empty(rows, N, device="cuda", dtype=dtype)] + [torch.empty_like(t) for t in affine]
        # Twice into the same buffers: an early copy racing the stage's reads may not show every time.
        for _ in range(2):
            kernel.forward(grad, x, weight, *grads)
            for mine, theirs in zip(grads, wide):
                assert_close(mine, theirs.grad, dtype)


def _double(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if tensor is None else tensor.double()


@pytest.mark.parametrize("N", FUSED_SIZES)
@pytest.mark.parametrize("dtype", FUSED_DTYPES)
def test_fused_add_rms_norm_odd_sizes(N, dtype):
    generator = torch.Generator().manual_seed(N)
    op = _op("FusedAddRMSNormFwdOp", N, dtype, eps=1e-6)
    for rows in (1, 3, 129):
        x, residual = (_randn(rows, N, dtype=dtype, generator=generator) for _ in range(2))
        weight = _randn(N, dtype=dtype, generator=generator)
        y, residual_out = op(x, residual, weight)
        expected_y, expected_sum = op.reference(x.double(), residual.double(), weight.double())
        assert_close(y, expected_y, dtype)
        assert_close(residual_out, expected_sum, dtype)


@pytest.mark.parametrize("rows, N, dtype", FUSED_GRAD_CASES, ids=str)
def test_fused_add_rms_norm_gradients_match_autograd(rows, N, dtype):
    """Both addends get the gradient of their sum: the norm's, plus the returned sum's own."""
    generator = torch.Generator().manual_seed(rows + 5 * N)
    x, residual, grad_y, grad_sum = (_randn(rows, N, dtype=dtype, generator=generator) for _ in range(4))
    weight = _randn(N, dtype=dtype, generator=generator)
    ours = _leaves([x, residual, weight])
    y, residual_out = _op("FusedAddRMSNormFwdOp", N, dtype, eps=1e-6)(*ours)
    torch.autograd.backward((y, residual_out), (grad_y, grad_sum))
    wide = _leaves([x, residual, weight], torch.float64)
    total = wide[0] + wide[1]
    torch.autograd.backward((torch.nn.functional.rms_norm(total, (N,), wide[2], 1e-6), total),
                            (grad_y.double(), grad_sum.double()))
    _check_grads(ours, wide, dtype)
    torch.testing.assert_close(ours[1].grad, ours[0].grad, rtol=0, atol=0)
    backward = _op("FusedAddRMSNormBwdOp", N, dtype, eps=1e-6)
    direct = backward(grad_y, grad_sum, residual_out.detach(), weight)
    torch.testing.assert_close(direct[0], ours[0].grad, rtol=0, atol=0)
    torch.testing.assert_close(direct[1], ours[2].grad, rtol=0, atol=0)
    # Row slices of wider tensors, read in place where their stride keeps the accesses aligned.
    sliced = backward(torch.cat([grad_y, grad_y], -1)[:, :N], torch.cat([grad_sum, grad_y], -1)[:, :N],
                      residual_out.detach(), weight)
    for mine, theirs in zip(sliced, direct):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


# ---- the hinted resident programs of large calls ---------------------------------------------------


HINTED_SIZES = (8, 24, 4096, 5120, 8192)
HINTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def hinted_kernels(N: int, dtype: torch.dtype) -> Tuple[Any, Any]:
    """LayerNorm and the fused add with ``hinted_min_mib`` 0: every call takes the hinted resident
    program, as calls of that many MiB and more do by default.  LayerNorm keeps the layout an H100
    gets, where its rows are resident (a device with fast memory streams rows of 32 KiB)."""
    from tileops.kernels.norm.fused_add_rms_norm import FusedAddRMSNormFwdKernel
    from tileops.kernels.norm.layer_norm import LayerNormFwdKernel, layer_norm_fwd_default_config

    return (LayerNormFwdKernel(N, dtype, eps=1e-5, config={**layer_norm_fwd_default_config(N, dtype),
                                                           "hinted_min_mib": 0}),
            FusedAddRMSNormFwdKernel(N, dtype, eps=1e-6, config={"hinted_min_mib": 0}))


@pytest.mark.parametrize("padding", [0, 8], ids=["contiguous", "strided"])
@pytest.mark.parametrize("N", HINTED_SIZES)
@pytest.mark.parametrize("dtype", HINTED_DTYPES, ids=str)
def test_forward_hinted_programs(dtype, N, padding):
    layer, fused = hinted_kernels(N, dtype)
    generator = torch.Generator().manual_seed(N + padding)
    weight, bias = (_randn(N, dtype=dtype, generator=generator) for _ in range(2))
    for rows in (1, 3, 1000):
        x, residual = (_randn(rows, N + padding, dtype=dtype, generator=generator)[:, :N] for _ in range(2))
        y = torch.full((rows, N), float("nan"), device="cuda", dtype=dtype)
        for affine in ((weight, bias), (None, None)):
            layer(x, *affine, y)
            expected = torch.nn.functional.layer_norm(x.double(), (N,), *(_double(t) for t in affine), 1e-5)
            assert_close(y, expected, dtype)
        residual_out = torch.full_like(y, float("nan"))
        fused(x, residual, weight, y, residual_out)
        total = x.double() + residual.double()
        assert_close(residual_out, total, dtype)
        assert_close(y, torch.nn.functional.rms_norm(total, (N,), weight.double(), 1e-6), dtype)
    for kernel in (layer, fused):
        assert {key[0] for key in kernel._compiled} == {kernel.hinted_program()}


@pytest.mark.parametrize("op_name, inputs", [("LayerNormFwdOp", 1), ("FusedAddRMSNormFwdOp", 2)])
def test_forward_takes_the_hinted_program_from_hinted_min_mib_on(op_name, inputs):
    N, dtype = 4096, torch.bfloat16
    op = _op(op_name, N, dtype, eps=1e-6)
    kernel = op._kernel(op.kernel_key, (torch.cuda.current_device(),))
    threshold_rows = (kernel.config["hinted_min_mib"] << 20) // (inputs * N * dtype.itemsize)
    generator = torch.Generator().manual_seed(inputs)
    weight = _randn(N, dtype=dtype, generator=generator)
    for rows, hinted in ((threshold_rows - 1, False), (threshold_rows, True)):
        tensors = [torch.randn(rows, N, device="cuda", dtype=dtype) for _ in range(inputs)]
        out = op(*tensors, weight)
        assert (kernel.hinted_program() in {key[0] for key in kernel._compiled}) == hinted
        first = out[0] if inputs == 2 else out
        for row in (0, rows - 1):
            rows_in = [t[row : row + 1].double() for t in tensors]
            if inputs == 2:
                expected = torch.nn.functional.rms_norm(rows_in[0] + rows_in[1], (N,), weight.double(), 1e-6)
            else:
                expected = torch.nn.functional.layer_norm(rows_in[0], (N,), weight.double(), None, 1e-6)
            assert_close(first[row : row + 1], expected, dtype)
        del tensors, out, first


def test_layer_norm_fwd_without_affine_in_inference():
    N, dtype = 4097, torch.bfloat16
    generator = torch.Generator().manual_seed(1)
    x = _randn(33, N, dtype=dtype, generator=generator)
    bias = _randn(N, dtype=dtype, generator=generator)
    op = _op("LayerNormFwdOp", N, dtype)
    assert_close(op(x), torch.nn.functional.layer_norm(x.double(), (N,), None, None, 1e-5), dtype)
    assert_close(op(x, None, bias), torch.nn.functional.layer_norm(x.double(), (N,), None, bias.double(), 1e-5), dtype)


def test_layer_norm_trains_under_torch_compile():
    N, dtype = 1024, torch.bfloat16
    generator = torch.Generator().manual_seed(2)
    x = _randn(64, N, dtype=dtype, generator=generator).requires_grad_()
    weight = _randn(N, dtype=dtype, generator=generator).requires_grad_()
    op = _op("LayerNormFwdOp", N, dtype)
    compiled = torch.compile(lambda a, w: op(a, w), fullgraph=True, backend="aot_eager")
    compiled(x, weight).float().square().sum().backward()
    wide = _leaves([x, weight], torch.float64)
    torch.nn.functional.layer_norm(wide[0], (N,), wide[1], None, 1e-5).square().sum().backward()
    _check_grads([x, weight], wide, dtype)


# ---- more than 2**31 elements -------------------------------------------------------------------------

BIG_N = 4096
BIG_ROWS = 2**31 // BIG_N + 64


def _row_chunks(rows: int, size: int = 1 << 16) -> Iterator[slice]:
    for start in range(0, rows, size):
        yield slice(start, min(rows, start + size))


@pytest.mark.big_memory
def test_over_2_31_elements_forward_and_backward():
    dtype = torch.bfloat16
    x = torch.randn(BIG_ROWS, BIG_N, device="cuda", dtype=dtype)
    weight = torch.randn(BIG_N, device="cuda", dtype=dtype)
    tail = slice(BIG_ROWS - 100, BIG_ROWS)  # rows whose offsets pass 2**31
    y = _op("LayerNormFwdOp", BIG_N, dtype)(x, weight)
    expected = torch.nn.functional.layer_norm(x[tail].double(), (BIG_N,), weight.double(), None, 1e-5)
    assert_close(y[tail], expected, dtype)
    del y
    grad = torch.randn_like(x)
    grad_x, grad_weight = _op("RMSNormBwdOp", BIG_N, dtype, eps=1e-6)(grad, x, weight)
    wide = _leaves([x[tail], weight], torch.float64)
    torch.nn.functional.rms_norm(wide[0], (BIG_N,), wide[1], 1e-6).backward(grad[tail].double())
    assert_close(grad_x[tail], wide[0].grad, dtype)
    expected_grad_weight = torch.zeros(BIG_N, device="cuda", dtype=torch.float64)
    for rows in _row_chunks(BIG_ROWS):
        chunk = x[rows].double()
        expected_grad_weight += (grad[rows].double() * chunk
                                 * torch.rsqrt(chunk.square().mean(-1, keepdim=True) + 1e-6)).sum(0)
    assert_close(grad_weight, expected_grad_weight, dtype)
    # The fused add's backward: the same sums (bitwise), the sum's gradient added past 2**31 too.
    del grad_x
    fused_x, fused_weight = _op("FusedAddRMSNormBwdOp", BIG_N, dtype, eps=1e-6)(grad, grad, x, weight)
    assert_close(fused_x[tail], wide[0].grad + grad[tail].double(), dtype)
    torch.testing.assert_close(fused_weight, grad_weight, rtol=0, atol=0)
    assert math.prod(x.shape) > 2**31


# Row lengths of LayerNorm's backward past element 2**31: rows in blocks, and long rows.
BIG_LAYER_BWD_SIZES = (BIG_N, 32768)


@pytest.mark.big_memory
@pytest.mark.parametrize("N", BIG_LAYER_BWD_SIZES)
def test_layer_norm_backward_over_2_31_elements(N: int):
    """grad_x of the last rows against float64 autograd; grad_weight and grad_bias, which sum
    every row, against float64 sums."""
    dtype = torch.bfloat16
    rows = 2**31 // N + 64
    x = torch.randn(rows, N, device="cuda", dtype=dtype)
    grad = torch.randn_like(x)
    weight = torch.randn(N, device="cuda", dtype=dtype)
    grad_x, grad_weight, grad_bias = _op("LayerNormBwdOp", N, dtype)(grad, x, weight)
    tail = slice(rows - 100, rows)  # rows whose offsets pass 2**31
    wide = _leaves([x[tail], weight], torch.float64)
    torch.nn.functional.layer_norm(wide[0], (N,), wide[1], None, 1e-5).backward(grad[tail].double())
    assert_close(grad_x[tail], wide[0].grad, dtype)
    expected_grad_weight = torch.zeros(N, device="cuda", dtype=torch.float64)
    expected_grad_bias = torch.zeros_like(expected_grad_weight)
    for chunk_rows in _row_chunks(rows, (1 << 26) // N):
        chunk = x[chunk_rows].double()
        centred = chunk - chunk.mean(-1, keepdim=True)
        x_hat = centred * torch.rsqrt(centred.square().mean(-1, keepdim=True) + 1e-5)
        expected_grad_weight += (grad[chunk_rows].double() * x_hat).sum(0)
        expected_grad_bias += grad[chunk_rows].double().sum(0)
    assert_close(grad_weight, expected_grad_weight, dtype)
    assert_close(grad_bias, expected_grad_bias, dtype)
    assert math.prod(x.shape) > 2**31


@pytest.mark.big_memory
def test_fused_add_forward_over_2_31_elements():
    """The fused add's resident rows (hinted 16-byte loads) past 32-bit offsets: both outputs."""
    dtype = torch.bfloat16
    x = torch.randn(BIG_ROWS, BIG_N, device="cuda", dtype=dtype)
    residual = torch.randn_like(x)
    weight = torch.randn(BIG_N, device="cuda", dtype=dtype)
    tail = slice(BIG_ROWS - 100, BIG_ROWS)  # rows whose offsets pass 2**31
    y, residual_out = _op("FusedAddRMSNormFwdOp", BIG_N, dtype, eps=1e-6)(x, residual, weight)
    total = x[tail].double() + residual[tail].double()
    assert_close(residual_out[tail], total, dtype)
    assert_close(y[tail], torch.nn.functional.rms_norm(total, (BIG_N,), weight.double(), 1e-6), dtype)
    assert math.prod(x.shape) > 2**31


@pytest.mark.big_memory
def test_over_2_31_elements_rows_split_over_a_cluster():
    """The backward over many long rows splits each over a cluster (``many_rows_ctas``)."""
    from tileops.kernels.norm.rms_norm_bwd import RMSNormBwdKernel

    N, dtype = 32768, torch.bfloat16
    rows = 2**31 // N + 64
    assert RMSNormBwdKernel(N, dtype).split_ctas(rows) == 2
    x = torch.randn(rows, N, device="cuda", dtype=dtype)
    grad = torch.randn_like(x)
    weight = torch.randn(N, device="cuda", dtype=dtype)
    grad_x, grad_weight = _op("RMSNormBwdOp", N, dtype, eps=1e-6)(grad, x, weight)
    tail = slice(rows - 100, rows)  # rows whose offsets pass 2**31
    wide = _leaves([x[tail], weight], torch.float64)
    torch.nn.functional.rms_norm(wide[0], (N,), wide[1], 1e-6).backward(grad[tail].double())
    assert_close(grad_x[tail], wide[0].grad, dtype)
    expected_grad_weight = torch.zeros(N, device="cuda", dtype=torch.float64)
    for chunk_rows in _row_chunks(rows, 4096):
        chunk = x[chunk_rows].double()
        expected_grad_weight += (grad[chunk_rows].double() * chunk
                                 * torch.rsqrt(chunk.square().mean(-1, keepdim=True) + 1e-6)).sum(0)
    assert_close(grad_weight, expected_grad_weight, dtype)
