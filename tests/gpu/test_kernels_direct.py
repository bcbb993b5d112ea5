"""The RMSNorm and cumsum kernels launched directly on a GPU, against float64 PyTorch references.

Inputs are random (never zeros) and outputs are filled with NaN before each
launch, so an element the kernel does not write fails the comparison.

Tolerance: the reference is computed in float64, rounded to the output dtype,
and the kernel may differ from that by one unit in the last place of the
output dtype plus a relative error (fp32 1e-5, fp16 1e-3, bf16 1e-2); cumsum
adds an absolute term that grows with sqrt(N) (float32 accumulation along a
random walk).
"""

from __future__ import annotations

import logging
import math
from typing import Iterator

import pytest
import torch

from tileops.kernels.norm.rms_norm import RESIDENT_HINTED, STREAMED, RMSNormFwdKernel, rms_norm_default_config
from tileops.kernels.scan.cumprod import CumprodFwdKernel
from tileops.kernels.scan.cumsum import (
    COLUMN_SCAN,
    COLUMN_SUMS,
    LOOKBACK_ROW_SCAN,
    ROW_SCAN,
    SPLIT_COLUMN_SCAN,
    SPLIT_ROW_SCAN,
    CumsumBwdKernel,
    CumsumFwdKernel,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SIZES = (1, 3, 127, 4096, 4097, 65537, 262144)
ROWS = (1, 3, 1000)
RTOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
EPS = 1e-6

_kernels: dict = {}


def _kernel(cls, N: int, dtype: torch.dtype, **kwargs):
    """One kernel per (class, N, dtype) for the whole session, as an op would keep it."""
    key = (cls, N, dtype, repr(sorted(kwargs.items())))
    if key not in _kernels:
        _kernels[key] = cls(N, dtype, **kwargs)
    return _kernels[key]


def _ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``dtype`` at each of ``values`` (float64)."""
    magnitude = values.abs().clamp_min(torch.finfo(dtype).tiny)
    return torch.exp2(torch.floor(torch.log2(magnitude)) - MANTISSA_BITS[dtype])


# Elements compared at a time: whole-tensor float64 temporaries of the largest cases took
# gigabytes each, enough for a dozen parallel test workers to run the GPU out of memory.
CHECK_SLICE_ELEMENTS = 1 << 24


def _assert_matches(out: torch.Tensor, reference64: torch.Tensor, atol: float = 0.0) -> None:
    assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} outputs left unwritten (NaN)"
    if out.dim() == 0:
        _assert_slice_matches(out, reference64, atol, 0, out.numel())
        return
    rows = max(1, CHECK_SLICE_ELEMENTS // max(1, out[0].numel()))
    for start in range(0, out.shape[0], rows):
        _assert_slice_matches(out[start:start + rows], reference64[start:start + rows], atol, start, out.numel())


def _assert_slice_matches(out: torch.Tensor, reference64: torch.Tensor, atol: float, first_row: int,
                          total: int) -> None:
    dtype = out.dtype
    expected = reference64.to(dtype).double()
    allowed = _ulp(expected, dtype) + RTOL[dtype] * reference64.abs() + atol
    error = (out.double() - expected).abs()
    bad = error > allowed
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        where = (index[0] + first_row,) + index[1:] if index else index
        raise AssertionError(
            f"{int(bad.sum())} of {total} elements off (from row {first_row}); first at {where}: "
            f"got {out[index].item()}, expected {reference64[index].item()} "
            f"(allowed {allowed[index].item():.3g}); max error in those rows {error.max().item():.3g}"
        )


def _poisoned_like(x: torch.Tensor) -> torch.Tensor:
    return torch.full_like(x, float("nan"))


def _rms_norm_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * weight.double()


class _CompileCounter(logging.Handler):
    """Counts TileLang's "begins to compile" log records."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "compile" in record.getMessage():
            self.count += 1


@pytest.fixture
def compile_counter() -> Iterator[_CompileCounter]:
    counter = _CompileCounter()
    loggers = [logging.getLogger("tilelang"), logging.getLogger("tileops")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(counter)
        lg.setLevel(logging.INFO)
    yield counter
    for lg, level in zip(loggers, levels):
        lg.removeHandler(counter)
        lg.setLevel(level)


# ---- RMSNorm ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("N", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm(dtype: torch.dtype, N: int, rows: int) -> None:
    kernel = _kernel(RMSNormFwdKernel, N, dtype, eps=EPS)
    x = torch.randn(rows, N, device="cuda", dtype=dtype)
    weight = torch.randn(N, device="cuda", dtype=dtype)
    out = _poisoned_like(x)
    kernel(x, weight, out)
    torch.cuda.synchronize()
    _assert_matches(out, _rms_norm_reference(x, weight))


def _check_rows_apart(kernel: RMSNormFwdKernel, rows: int, N: int, dtype: torch.dtype, padding: int) -> None:
    """RMSNorm of ``rows`` rows of ``N`` lying ``N + padding`` elements apart, against the reference."""
    x = torch.randn(rows, N + padding, device="cuda", dtype=dtype)[:, :N]
    weight = torch.randn(N, device="cuda", dtype=dtype)
    out = _poisoned_like(x)
    kernel(x, weight, out)
    torch.cuda.synchronize()
    _assert_matches(out, _rms_norm_reference(x, weight))


@pytest.mark.parametrize("padding", [0, 8], ids=["contiguous", "strided"])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("N", (8, 24, 4096, 5120, 8192, 32768))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_hinted_program(dtype: torch.dtype, N: int, rows: int, padding: int) -> None:
    # hinted_min_mib 0: every call takes the hinted resident program, as large ones do by default;
    # the layout an H100 gets, where rows of 32768 are resident (fast memory streams them).
    kernel = _kernel(RMSNormFwdKernel, N, dtype, eps=EPS,
                     config={**rms_norm_default_config(N, dtype), "hinted_min_mib": 0})
    assert kernel.hinted_program() == RESIDENT_HINTED
    _check_rows_apart(kernel, rows, N, dtype, padding)
    assert any(key[0] == RESIDENT_HINTED for key in kernel._compiled)


@pytest.mark.parametrize("padding", [0, 8], ids=["contiguous", "strided"])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("N", (16384, 20000, 32768))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_rms_norm_fast_memory_streamed_rows(dtype: torch.dtype, N: int, rows: int, padding: int) -> None:
    # The layout of fast memory, on any GPU: rows streamed by 1024-thread blocks, two an SM.
    kernel = _kernel(RMSNormFwdKernel, N, dtype, eps=EPS, config=rms_norm_default_config(N, dtype, fast_memory=True))
    assert kernel.main_program() == STREAMED
    _check_rows_apart(kernel, rows, N, dtype, padding)


def test_rms_norm_takes_the_hinted_program_from_hinted_min_mib_on() -> None:
    kernel = RMSNormFwdKernel(4096, torch.bfloat16, eps=EPS)
    weight = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    threshold_rows = (kernel.config["hinted_min_mib"] << 20) // (4096 * 2)
    for rows, hinted in ((threshold_rows - 1, False), (threshold_rows, True)):
        x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
        out = _poisoned_like(x)
        kernel(x, weight, out)
        torch.cuda.synchronize()
        assert any(key[0] == RESIDENT_HINTED for key in kernel._compiled) == hinted
        for row in (0, rows - 1):
            _assert_matches(out[row : row + 1], _rms_norm_reference(x[row : row + 1], weight))
        del x, out


@pytest.mark.parametrize("N", [4096, 65537])
def test_rms_norm_new_row_count_does_not_recompile(N: int, compile_counter: _CompileCounter) -> None:
    kernel = _kernel(RMSNormFwdKernel, N, torch.bfloat16, eps=EPS)
    weight = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    warm = torch.randn(1000, N, device="cuda", dtype=torch.bfloat16)
    kernel(warm, weight, torch.empty_like(warm))
    compiled, compiles = len(kernel._compiled), compile_counter.count
    for rows in (7, 513, 2049):
        x = torch.randn(rows, N, device="cuda", dtype=torch.bfloat16)
        out = _poisoned_like(x)
        kernel(x, weight, out)
        _assert_matches(out, _rms_norm_reference(x, weight))
    assert len(kernel._compiled) == compiled
    assert compile_counter.count == compiles


@pytest.mark.big_memory
def test_rms_norm_over_2_31_elements() -> None:
    N = 32768
    rows = 2**31 // N + 1  # 2**31 + N elements
    kernel = _kernel(RMSNormFwdKernel, N, torch.bfloat16, eps=EPS)
    x = torch.randn(rows, N, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    out = _poisoned_like(x)
    kernel(x, weight, out)
    torch.cuda.synchronize()
    # Rows on both sides of element 2**31, and the first.
    for row in (0, rows // 2, rows - 2, rows - 1):
        _assert_matches(out[row : row + 1], _rms_norm_reference(x[row : row + 1], weight))
    del x, out
    torch.cuda.empty_cache()


# ---- cumsum --------------------------------------------------------------------------------------


def _cumsum_atol(N: int) -> float:
    # float32 accumulation along a random walk of unit steps.
    return 1e-5 * math.sqrt(N)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("N", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cumsum_rows(dtype: torch.dtype, N: int, rows: int) -> None:
    kernel = _kernel(CumsumFwdKernel, N, dtype)
    x = torch.randn(rows, N, device="cuda", dtype=dtype)
    out = _poisoned_like(x)
    kernel(x, out)
    torch.cuda.synchronize()
    _assert_matches(out, torch.cumsum(x.double(), dim=1), atol=_cumsum_atol(N))


@pytest.mark.parametrize("N", [65544, 262144])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cumsum_few_long_rows_every_path_agrees(dtype: torch.dtype, N: int) -> None:
    """Few long rows take the look-back scan (the default) or the split scan; the plain row
    scan agrees.  65544 ends in a partial chunk."""
    split = _kernel(CumsumFwdKernel, N, dtype, config={"lookback": 0})
    lookback = _kernel(CumsumFwdKernel, N, dtype, config={"lookback": 1})
    assert split.split_segments > 1 and LOOKBACK_ROW_SCAN in lookback.program_names()
    x = torch.randn(5, N, device="cuda", dtype=dtype)
    outs = [_poisoned_like(x) for _ in range(3)]
    split(x, outs[0])
    lookback(x, outs[1])
    split.compile_program(ROW_SCAN)(x, outs[2])
    torch.cuda.synchronize()
    reference = torch.cumsum(x.double(), dim=1)
    for out in outs:
        _assert_matches(out, reference, atol=_cumsum_atol(N))
    assert any(key[0] == SPLIT_ROW_SCAN for key in split._compiled)
    assert any(key[0] == LOOKBACK_ROW_SCAN for key in lookback._compiled)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_cumsum_lookback_across_many_windows_is_race_free(stages: int) -> None:
    """256 tiles a row: the look-back crosses several 32-tile windows; repeated on fresh inputs.
    Two stages leave no tile in flight while the next is reduced; more keep some."""
    N = 262144
    config = {"threads": 256, "items": 4, "row_threads": 256, "lookback": 1, "segments": 256,
              "lookback_stages": stages}
    kernel = _kernel(CumsumFwdKernel, N, torch.float32, config=config)
    assert LOOKBACK_ROW_SCAN in kernel.program_names()
    for _ in range(5):
        x = torch.randn(64, N, device="cuda", dtype=torch.float32)
        out = _poisoned_like(x)
        kernel(x, out)
        torch.cuda.synchronize()
        _assert_matches(out, torch.cumsum(x.double(), dim=1), atol=_cumsum_atol(N))


LOOKBACK_N = 65544  # 9 tiles a row for float32, the last one partial


def test_cumsum_lookback_workspace_is_ready_for_every_next_launch() -> None:
    """Each launch leaves the status words zeroed for the next: back-to-back launches with no
    sync between them, row counts that shrink and grow (the workspace grows), fresh inputs."""
    kernel = _kernel(CumsumFwdKernel, LOOKBACK_N, torch.float32, config={"lookback": 1})
    calls = []
    for rows in (64, 5, 64, 1, 100, 128, 7, 64, 64, 64):
        x = torch.randn(rows, LOOKBACK_N, device="cuda", dtype=torch.float32)
        out = _poisoned_like(x)
        kernel(x, out)
        calls.append((x, out))
    torch.cuda.synchronize()
    for x, out in calls:
        _assert_matches(out, torch.cumsum(x.double(), dim=1), atol=_cumsum_atol(LOOKBACK_N))
    assert max(status.shape[1] for status, _ in kernel._lookback_workspaces.snapshot().values()) >= 128


def test_cumsum_few_long_rows_are_reproducible_under_deterministic_algorithms() -> None:
    """The look-back scan's last bits depend on timing; deterministic calls take the split scan."""
    kernel = _kernel(CumsumFwdKernel, LOOKBACK_N, torch.float32, config={"lookback": 1})
    x = torch.randn(64, LOOKBACK_N, device="cuda")
    outs = [_poisoned_like(x) for _ in range(4)]
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for out in outs:
            kernel(x, out)
    finally:
        torch.use_deterministic_algorithms(previous)
    torch.cuda.synchronize()
    _assert_matches(outs[0], torch.cumsum(x.double(), dim=1), atol=_cumsum_atol(LOOKBACK_N))
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    assert any(key[0] == SPLIT_ROW_SCAN for key in kernel._compiled)


def test_cumsum_lookback_on_two_streams_at_once() -> None:
    """Launches in two streams may overlap: each stream has its own workspace."""
    kernel = _kernel(CumsumFwdKernel, LOOKBACK_N, torch.float32, config={"lookback": 1})
    streams = [torch.cuda.Stream() for _ in range(2)]
    inputs = [[torch.randn(64, LOOKBACK_N, device="cuda") for _ in range(6)] for _ in streams]
    outs = [[_poisoned_like(x) for x in xs] for xs in inputs]
    torch.cuda.synchronize()
    for step in range(6):
        for stream, xs, ys in zip(streams, inputs, outs):
            with torch.cuda.stream(stream):
                kernel(xs[step], ys[step])
    torch.cuda.synchronize()
    for xs, ys in zip(inputs, outs):
        for x, out in zip(xs, ys):
            _assert_matches(out, torch.cumsum(x.double(), dim=1), atol=_cumsum_atol(LOOKBACK_N))
    keys = {key[1] for key in kernel._lookback_workspaces.snapshot()}
    assert {stream.cuda_stream for stream in streams} <= keys


def test_cumsum_lookback_replays_in_a_cuda_graph() -> None:
    """A captured scan replays on new inputs, between eager launches of the same kernel."""
    kernel = _kernel(CumsumFwdKernel, LOOKBACK_N, torch.float32, config={"lookback": 1})
    static_x = torch.randn(64, LOOKBACK_N, device="cuda")
    static_out = torch.empty_like(static_x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kernel(static_x, static_out)
    torch.cuda.current_stream().wait_stream(side)
    cached = kernel._lookback_workspaces.snapshot()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(static_x, static_out)
    # Nothing captured is kept: a cached workspace must not live in the graph's pool.
    assert kernel._lookback_workspaces.snapshot() == cached
    for _ in range(4):
        static_x.copy_(torch.randn_like(static_x))
        static_out.fill_(float("nan"))
        graph.replay()
        x = torch.randn(64, LOOKBACK_N, device="cuda")
        out = _poisoned_like(x)
        kernel(x, out)
        torch.cuda.synchronize()
        _assert_matches(static_out, torch.cumsum(static_x.double(), dim=1), atol=_cumsum_atol(LOOKBACK_N))
        _assert_matches(out, torch.cumsum(x.double(), dim=1), atol=_cumsum_atol(LOOKBACK_N))


@pytest.mark.parametrize(
    "outer, N, inner",
    [
        (3, 1, 5),
        (3, 127, 5),
        (2, 127, 64),
        (1, 4097, 2),
        (300, 4097, 2),
        (130, 4097, 33),
        (2, 4096, 1),
        (300, 3, 7),
        # whole 16-byte vectors per thread: a full tile, a ragged one, a long axis with a tail
        (3, 127, 256),
        (40, 1000, 264),
        (128, 4097, 256),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cumsum_outer_n_inner(dtype: torch.dtype, outer: int, N: int, inner: int) -> None:
    kernel = _kernel(CumsumFwdKernel, N, dtype)
    x = torch.randn(outer, N, inner, device="cuda", dtype=dtype)
    out = _poisoned_like(x)
    kernel(x, out)
    torch.cuda.synchronize()
    _assert_matches(out, torch.cumsum(x.double(), dim=1), atol=_cumsum_atol(N))


# (outer, N, inner) scans with too few column blocks to fill the GPU: the split column scan.
SPLIT_COLUMN_CASES = (
    (16, 4096, 64),  # a row of 64 columns: tiles of 16-byte vectors
    (1, 4097, 64),  # the tail chunk in the last segment
    (3, 65537, 16),  # one 32-byte sector a position, one column a thread
    (5, 3000, 16),  # four vectors of fp32 (a 64-byte tile), two of 16-bit types
    (2, 1000, 264),  # a warp of vectors and a ragged tile
    (1, 1500, 32),  # fewer chunks than the blocks asked for
)
SPLIT_CUMPROD_CASES = ((4, 4097, 64), (2, 1000, 32))


@pytest.mark.parametrize("outer, N, inner", SPLIT_COLUMN_CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cls", [CumsumFwdKernel, CumsumBwdKernel], ids=lambda cls: cls.__name__)
def test_few_wide_columns_cut_the_axis_across_blocks(cls, dtype: torch.dtype, outer: int, N: int, inner: int) -> None:
    kernel = _kernel(cls, N, dtype)
    shape = (outer, N, inner)
    assert [name.rpartition("_")[0] for name in kernel.programs_for(shape)] == [COLUMN_SUMS, SPLIT_COLUMN_SCAN]
    x = torch.randn(shape, device="cuda", dtype=dtype)
    out = _poisoned_like(x)
    kernel(x, out)
    torch.cuda.synchronize()
    x64 = x.double()
    expected = torch.cumsum(x64, dim=1) if not cls.reverse else torch.cumsum(x64.flip(1), dim=1).flip(1)
    _assert_matches(out, expected, atol=_cumsum_atol(N))


@pytest.mark.parametrize("outer, N, inner", SPLIT_CUMPROD_CASES)
def test_cumprod_of_few_wide_columns_cuts_the_axis(outer: int, N: int, inner: int) -> None:
    kernel = _kernel(CumprodFwdKernel, N, torch.float32)
    assert kernel.programs_for((outer, N, inner))[-1].startswith(SPLIT_COLUMN_SCAN)
    x = 1 + torch.randn(outer, N, inner, device="cuda", dtype=torch.float64) / math.sqrt(N)
    out = _poisoned_like(x.float())
    kernel(x.float(), out)
    torch.cuda.synchronize()
    expected = torch.cumprod(x.float().double(), dim=1)
    relative = ((out.double() - expected).abs() / expected.abs()).max().item()
    assert relative <= 4 * math.sqrt(N) * 2.0**-23 + RTOL[torch.float32], relative


def test_cumsum_few_long_columns_take_the_transposed_path() -> None:
    N = 65537
    kernel = _kernel(CumsumFwdKernel, N, torch.float32)
    x = torch.randn(1, N, 3, device="cuda", dtype=torch.float32)
    out = _poisoned_like(x)
    kernel(x, out)
    torch.cuda.synchronize()
    _assert_matches(out, torch.cumsum(x.double(), dim=1), atol=_cumsum_atol(N))
    assert not any(str(k[0]).startswith(COLUMN_SCAN) for k in kernel._compiled)


def test_cumsum_new_shapes_do_not_recompile(compile_counter: _CompileCounter) -> None:
    N = 4097
    kernel = _kernel(CumsumFwdKernel, N, torch.bfloat16)
    # Row scans, a plain column scan, transposed single columns, a split scan of vectors.
    for shape in [(1000, N), (200, N, 40), (3, N, 40), (1, N, 64)]:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        kernel(x, torch.empty_like(x))
    compiled, compiles = len(kernel._compiled), compile_counter.count
    for shape in [(3, N), (77, N), (2, N, 45), (5, N, 64)]:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        out = _poisoned_like(x)
        kernel(x, out)
        _assert_matches(out, torch.cumsum(x.double(), dim=1), atol=_cumsum_atol(N))
    assert len(kernel._compiled) == compiled
    assert compile_counter.count == compiles


@pytest.mark.big_memory
def test_cumsum_over_2_31_elements() -> None:
    N = 4096
    rows = 2**31 // N + 1
    kernel = _kernel(CumsumFwdKernel, N, torch.bfloat16)
    x = torch.randn(rows, N, device="cuda", dtype=torch.bfloat16)
    out = _poisoned_like(x)
    kernel(x, out)
    torch.cuda.synchronize()
    for row in (0, rows // 2, rows - 1):
        _assert_matches(out[row : row + 1], torch.cumsum(x[row : row + 1].double(), dim=1), atol=_cumsum_atol(N))
    del x, out
    torch.cuda.empty_cache()


# ---- the family bases' CUDA path, through the generated ops ---------------------------------------


def test_rms_norm_op_on_gpu_folds_leading_axes() -> None:
    ops = pytest.importorskip("tileops.ops")
    op = ops.RMSNormFwdOp(N=4096, dtype=torch.bfloat16, eps=EPS)
    weight = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    for x in (
        torch.randn(2, 3, 4096, device="cuda", dtype=torch.bfloat16),
        torch.randn(4096, 6, device="cuda", dtype=torch.bfloat16).t(),  # not contiguous
        torch.randn(0, 4096, device="cuda", dtype=torch.bfloat16),
    ):
        y = op(x, weight)
        assert y.shape == x.shape and op.last_backend == "kernel"
        if x.numel():
            _assert_matches(y, _rms_norm_reference(x, weight))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_op_on_gpu_every_dim(dim: int) -> None:
    ops = pytest.importorskip("tileops.ops")
    x = torch.randn(6, 127, 5, device="cuda", dtype=torch.float32)
    op = ops.CumsumFwdOp(N=x.shape[dim], dtype=torch.float32, dim=dim)
    y = op(x)
    assert op.last_backend == "kernel"
    _assert_matches(y, torch.cumsum(x.double(), dim=dim), atol=_cumsum_atol(x.shape[dim]))
