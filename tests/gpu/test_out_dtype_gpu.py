"""Half-precision inputs written to float32 in one pass (the ops' ``out_dtype``, the functional
forms' ``dtype``), by every program of the softmax and scan kernels, and by the sums, means and
2-norms.

Each result is checked against the float64 reference, allowing the error the float32 kernels
make on the same values (``x.float()``): the fused call reads the same numbers and computes in
float32 too.  Its memory is checked as well: an output and the kernels' partials, no float32
copy of the input."""

import math
from typing import Callable, Dict, List, Set, Tuple

import pytest
import torch

import tileops.functional as F
from tests.op_checks import assert_close
from tileops.kernels.device_traits import has_fast_memory
from tileops.ops import CumprodFwdOp, CumsumFwdOp, L2NormFwdOp, LogSoftmaxFwdOp, MeanFwdOp, SoftmaxFwdOp, SumFwdOp
from tileops.ops.softmax.base import kernel_view

pytestmark = pytest.mark.gpu

HALF = [torch.bfloat16, torch.float16]
# (shape, dim, transposed): the input has ``shape``, in reversed memory order if ``transposed``.
Case = Tuple[Tuple[int, ...], int, bool]

# Fused rows (with a tail, and a single row), staged rows, clustered rows (fewer and more than a
# wave), long rows held by several blocks, longer rows cut into segments, whole columns, columns
# cut into segments, and a transposed input (copied once).
SOFTMAX_CASES: List[Case] = [((3, 127), -1, False), ((1, 4096), -1, False), ((1024, 16384), -1, False),
                             ((40, 65536), -1, False), ((200, 65536), -1, False), ((64, 262144), -1, False),
                             ((2, 1 << 21), -1, False), ((64, 4096, 64), 1, False), ((2, 4096, 3), 1, False),
                             ((5, 7, 33), 0, True)]
SOFTMAX_PROGRAMS = {"row_fused", "row_cluster", "row_held", "row_stats", "row_apply", "column_fused",
                    "column_stats", "column_apply"}
# Rows that devices with fast memory stage in shared memory.
STAGED_PROGRAMS = {"row_staged", "row_cluster_staged"}

# Rows, the look-back scan of few long rows, column tiles, columns cut into segments, single
# columns scanned as transposed rows, a transposed input.
SCAN_CASES: List[Case] = [((3, 127), -1, False), ((64, 262144), -1, False), ((256, 1024, 64), 1, False),
                          ((4, 4096, 64), 1, False), ((2, 4096, 3), 1, False), ((4, 5, 6), 0, True)]
SCAN_PROGRAM_PREFIXES = ("row_scan", "lookback_row_scan", "column_scan_", "column_sums_", "split_column_scan_")

# Row scans by how a thread's float32 results reach memory (``row_scan_program``): rows a warp or
# more wide (whole chunks traded across the warp, then a tail), rows of 8 and 2 threads (lanes
# paired), rows of one thread, rows of eight chunks (direct stores) and of four (traded), and the
# look-back scan; each also under deterministic algorithms, where the few long rows take the
# split scan.
SCAN_STORE_CASES: List[Case] = [((130, 2056), -1, False), ((9, 64), -1, False), ((7, 16), -1, False),
                                ((6, 8), -1, False), ((200, 8192), -1, False), ((64, 8192), -1, False),
                                ((64, 262144), -1, False)]

# (shape, dims): rows, long rows cut into segments, columns, a middle axis, everything, two axes.
REDUCTION_CASES = [((3, 127), (-1,)), ((64, 262144), (-1,)), ((4096, 64), (0,)), ((64, 4096, 64), (1,)),
                   ((4096, 4097), None), ((6, 5, 300), (0, 2))]

SOFTMAXES: Dict[str, Tuple[Callable, Callable, type]] = {
    "softmax": (F.softmax, torch.softmax, SoftmaxFwdOp),
    "log_softmax": (F.log_softmax, torch.log_softmax, LogSoftmaxFwdOp),
}
SCANS: Dict[str, Tuple[Callable, Callable, type]] = {
    "cumsum": (F.cumsum, torch.cumsum, CumsumFwdOp),
    "cumprod": (F.cumprod, torch.cumprod, CumprodFwdOp),
}
SUMS: Dict[str, Tuple[Callable, Callable, type]] = {
    "sum": (F.sum, torch.sum, SumFwdOp),
    "mean": (F.mean, torch.mean, MeanFwdOp),
    "l2_norm": (F.l2_norm, lambda x, dim, **k: torch.linalg.vector_norm(x, 2, dim, **k), L2NormFwdOp),
}


def _input(name: str, shape: Tuple[int, ...], dtype: torch.dtype, seed: int, transposed: bool = False) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape[::-1] if transposed else shape, generator=generator)
    # Products of 262144 factors stay in range near 1; softmaxes get a spread of exponents.
    x = (1 + 0.002 * x if name == "cumprod" else 4 * x).to(device="cuda", dtype=dtype)
    return x.permute(*reversed(range(x.ndim))) if transposed else x


def _check_one_pass(name: str, fn: Callable, reference: Callable, x: torch.Tensor, dim: object) -> None:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = fn(x, dim, dtype=torch.float32)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert y.dtype == torch.float32 and y.shape == reference(x, dim).shape and y.is_contiguous()
    # The output, a transposed input's copy and partials; a float32 copy of x would add its own size.
    allowed = y.numel() * 4 + (0 if x.is_contiguous() else x.numel() * x.element_size()) + (2 << 20)
    assert extra <= allowed, f"{name} {tuple(x.shape)}: {extra} bytes allocated, at most {allowed} expected"
    expected = reference(x.double(), dim)
    own = fn(x.float(), dim)
    assert_close(y, expected, torch.float32, slack=(own.double() - expected).abs().max().item())


def _float32_kernel(op_cls: type, x: torch.Tensor, dim: int):
    """The kernel of the functional call's shared op, which reads ``x`` as it is and writes float32."""
    op = op_cls._shared_for(x, dim, torch.float32)
    kernel = op._kernel(op.kernel_key, (x.device.index,))
    assert kernel.result_dtype == torch.float32 and kernel.dtype == x.dtype
    return kernel


def _softmax_programs(op_cls: type, x: torch.Tensor, dim: int) -> Set[str]:
    kernel = _float32_kernel(op_cls, x, dim)
    view = kernel_view(x, dim % x.ndim)
    out = torch.empty(view.shape, dtype=torch.float32, device=x.device)
    return {name for name, _ in kernel.programs_for(view, out)}


def _scan_programs(op_cls: type, x: torch.Tensor, dim: int) -> Set[str]:
    kernel = _float32_kernel(op_cls, x, dim)
    axis = dim % x.ndim
    outer, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
    return set(kernel.programs_for((outer, x.shape[axis]) if inner == 1 else (outer, x.shape[axis], inner)))


def _run_cases(table: Dict[str, Tuple[Callable, Callable, type]], name: str, dtype: torch.dtype,
               cases: List[Case], programs_of: Callable[[type, torch.Tensor, int], Set[str]]) -> Set[str]:
    """Check every case of ``name`` in ``dtype``; the programs the cases launched."""
    fn, reference, op_cls = table[name]
    seen: Set[str] = set()
    for seed, (shape, dim, transposed) in enumerate(cases):
        x = _input(name, shape, dtype, seed, transposed)
        _check_one_pass(name, fn, reference, x, dim)
        seen |= programs_of(op_cls, x, dim)
    return seen


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(SOFTMAXES))
def test_softmaxes_write_float32_in_every_program(name: str, dtype: torch.dtype) -> None:
    seen = _run_cases(SOFTMAXES, name, dtype, SOFTMAX_CASES, _softmax_programs)
    expected = SOFTMAX_PROGRAMS | (STAGED_PROGRAMS if has_fast_memory() else set())
    assert expected <= seen, f"programs not run: {sorted(expected - seen)}"


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(SCANS))
def test_scans_write_float32_in_every_program(name: str, dtype: torch.dtype) -> None:
    seen = _run_cases(SCANS, name, dtype, SCAN_CASES, _scan_programs)
    for prefix in SCAN_PROGRAM_PREFIXES:
        assert any(program.startswith(prefix) for program in seen), f"no {prefix}* program ran: {sorted(seen)}"


@pytest.mark.parametrize("deterministic", [False, True], ids=["any", "deterministic"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(SCANS))
def test_row_scans_write_float32_from_every_store_layout(name: str, dtype: torch.dtype, deterministic: bool) -> None:
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        seen = _run_cases(SCANS, name, dtype, SCAN_STORE_CASES, _scan_programs)
    finally:
        torch.use_deterministic_algorithms(previous)
    expected = {"row_scan", "split_row_scan"} if deterministic else {"row_scan", "lookback_row_scan"}
    assert expected <= seen, f"programs not run: {sorted(expected - seen)}"


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(SUMS))
def test_sums_write_float32(name: str, dtype: torch.dtype) -> None:
    fn, reference, op_cls = SUMS[name]
    for seed, (shape, dims) in enumerate(REDUCTION_CASES):
        x = _input(name, shape, dtype, seed)
        _check_one_pass(name, fn, reference, x, dims)
        op = op_cls._shared_for(x, dims, False, torch.float32)
        assert op._kernel(op.kernel_key, (x.device.index, 2)).result_dtype == torch.float32


@pytest.mark.parametrize("name", sorted({**SOFTMAXES, **SCANS, **SUMS}))
def test_gradients_of_a_float32_output_reach_the_half_input(name: str) -> None:
    """The backward of the float32 output (in float32), then the gradient in the input's dtype."""
    fn, reference, _ = {**SOFTMAXES, **SCANS, **SUMS}[name]
    x = _input(name, (8, 4096), torch.bfloat16, 7).requires_grad_()
    y = fn(x, -1, dtype=torch.float32)
    grad = torch.rand(y.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(3)) + 0.5
    (gx,) = torch.autograd.grad(y, x, grad)
    if name in ("softmax", "log_softmax", "cumsum"):  # a Bwd kernel writes the bf16 gradient itself
        backward = {**SOFTMAXES, **SCANS}[name][2]._shared_for(x, -1, torch.float32).backward_op()
        assert (backward.dtype, backward.out_dtype) == (torch.float32, torch.bfloat16)
        assert backward._kernel(backward.kernel_key, (x.device.index,)).result_dtype == torch.bfloat16
    leaf = x.detach().double().requires_grad_()
    (expected,) = torch.autograd.grad(reference(leaf, -1), leaf, grad.double())
    assert gx.dtype == torch.bfloat16
    assert_close(gx, expected, torch.bfloat16)


@pytest.mark.parametrize("name", sorted(SOFTMAXES))
def test_a_float32_output_compiles_with_inductor(name: str) -> None:
    torch._dynamo.reset()
    fn, reference, _ = SOFTMAXES[name]
    compiled = torch.compile(lambda x: fn(x, -1, dtype=torch.float32), fullgraph=True)
    x = _input(name, (16, 4096), torch.bfloat16, 5)
    y = compiled(x)
    assert y.dtype == torch.float32
    assert_close(y, reference(x.double(), -1), torch.float32, slack=1e-6)
