"""The reduction programs compile for sm_90 without a GPU (a representative subset, in parallel)."""

from __future__ import annotations

import re
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch

from tileops.kernels.fast_math import FAST_EXP2
from tileops.kernels.kernel_base import SM90_BUILD_TARGET, with_pass_configs
from tileops.kernels.sizes import REGISTERS_PER_SM
from tileops.kernels.reduction import reduce as programs
from tests.toolchain import divisions_at_accesses, needs_nvcc, ptxas_report

# (reducer, program, shape parameters): every program kind, and every reducer at least once.
CASES = [
    ("sum", programs.ROW, (("vector", 8), ("threads", 256), ("unroll", 4), ("fused", 1))),
    ("var", programs.ROW, (("vector", 8), ("threads", 256), ("unroll", 4), ("fused", 0))),
    ("argmax", programs.COLUMN, (("cvec", 8), ("col_threads", 32), ("threads", 256), ("unroll", 4), ("fused", 1))),
    ("logsumexp", programs.COLUMN, (("cvec", 2), ("col_threads", 4), ("threads", 256), ("unroll", 4), ("fused", 0))),
    ("amax", programs.COMBINE, (("threads", 256), ("group", 256))),
    ("amin", programs.COMBINE, (("threads", 256), ("group", 1))),
    ("mean", programs.ROW, (("vector", 1), ("threads", 256), ("unroll", 4), ("fused", 1))),
    ("l2_norm", programs.COMBINE, (("threads", 256), ("group", 32))),
    # The chunk pass: log-sum-exp's rescale per chunk, and the counts of a split mean and variance.
    ("logsumexp", programs.ROW, (("vector", 8), ("threads", 256), ("unroll", 4), ("fused", 1))),
    ("var", programs.COLUMN, (("cvec", 8), ("col_threads", 32), ("threads", 256), ("unroll", 4), ("fused", 0))),
    ("amax", programs.COLUMN, (("cvec", 8), ("col_threads", 8), ("threads", 512), ("unroll", 8), ("fused", 1))),
    ("mean", programs.COLUMN, (("cvec", 4), ("col_threads", 8), ("threads", 256), ("unroll", 4), ("fused", 0))),
    # Rows of exactly `unroll` chunks: straight-line walks.
    ("var", programs.ROW, (("vector", 8), ("threads", 256), ("unroll", 2), ("fused", 1), ("exact", 1))),
    ("argmax", programs.ROW, (("vector", 2), ("threads", 256), ("unroll", 4), ("fused", 1), ("exact", 1))),
    # Rows read in windows: split (the index, log-sum-exp's chunk pass, the mean's count) and fused.
    ("argmax", programs.ROW, (("vector", 8), ("threads", 256), ("unroll", 4), ("fused", 0), ("windowed", 1))),
    ("logsumexp", programs.ROW, (("vector", 8), ("threads", 256), ("unroll", 4), ("fused", 0), ("windowed", 1))),
    ("mean", programs.ROW, (("vector", 8), ("threads", 256), ("unroll", 4), ("fused", 0), ("windowed", 1))),
    ("var", programs.ROW, (("vector", 8), ("threads", 512), ("unroll", 8), ("fused", 1), ("windowed", 1))),
]


def _compile(case) -> str:
    import tilelang

    reducer, name, params = case
    out_dtype = torch.int64 if reducer == "argmax" else torch.bfloat16
    program = programs.build_program(name, reducer, torch.bfloat16, out_dtype, 1.0, params)
    compiled = tilelang.compile(with_pass_configs(program), target=programs.SM90_BUILD_TARGET)
    return compiled.get_kernel_source()


def test_programs_compile_for_sm90() -> None:
    with ProcessPoolExecutor(max_workers=8) as pool:
        sources = list(pool.map(_compile, CASES))
    assert all("__global__" in source for source in sources)
    for case, source in zip(CASES, sources):
        assert not divisions_at_accesses(source), case
        # Log-sum-exp's exponentials are the one-instruction kind (``fast_math``); others have none.
        body = source.split("__global__", 1)[1]
        assert (f"{FAST_EXP2}(" in body) == (case[0] == "logsumexp") and "exp2f(" not in body, case


def test_exact_rows_walk_without_a_loop_or_checks_and_the_shift_is_read_after_the_loads() -> None:
    """Each keeps a short row's loads from waiting: a loop's trip count, checked loads (the
    compiler issues some only after folding others), or a shift read ahead of the loop (its
    conversion is hoisted before the loads) each cost a memory latency."""
    params = (("vector", 8), ("threads", 256), ("unroll", 2), ("fused", 1))
    exact, looping = (_compile(("var", programs.ROW, extra)) for extra in (params + (("exact", 1),), params))
    assert "for (int64_t step" not in exact and "< N)" not in exact
    loop = looping.index("for (int64_t step")
    first_load = looping.index("*(uint4*)(X + ", loop)
    shift_read = looping.index("shift[0] = ((float)X[")
    assert loop < first_load < shift_read
    with pytest.raises(ValueError, match="exact rows need the fused program"):
        programs.build_program(programs.ROW, "sum", torch.float32, torch.float32, 0.0,
                               params[:-1] + (("fused", 0), ("exact", 1)))


@needs_nvcc
@pytest.mark.parametrize("reducer, fused", [("sum", 1), ("var", 1), ("var", 0), ("argmax", 0), ("logsumexp", 0)])
def test_windowed_rows_load_16_bytes_and_check_each_element_in_32_bits(reducer: str, fused: int, tmp_path) -> None:
    """Every window is one 16-byte load from the rows' flat memory, its row's elements picked by
    32-bit checks; the program holds at most 64 registers a thread (four 256-thread blocks an SM)
    and spills none.  Loads element by element at the rows' ends took 127 registers."""
    params = (("vector", 8), ("threads", 256), ("unroll", 4), ("fused", fused), ("windowed", 1))
    source = _compile((reducer, programs.ROW, params))
    body = source.split("__global__", 2)[2]
    loads = re.findall(r"= \*\(uint4\*\)\(XF \+ ", body)
    assert len(loads) == (2 if reducer == "argmax" else 1), body  # one per walk (argmax walks again for NaN)
    # No element-wise load but the variance's shift, read once.
    assert len(re.findall(r"\bXF\[", body)) == (1 if reducer == "var" else 0), body
    assert re.search(r"\(\(int\)max\(.*\) <= e\w*\) && \(e\w* < \(\(int\)min\(", body)
    report = ptxas_report(source, str(tmp_path))
    assert report["spill_bytes"] == 0 and report["registers"] <= 64, report
    with pytest.raises(ValueError, match="never windows"):
        programs.build_program(programs.ROW, "sum", torch.bfloat16, torch.bfloat16, 0.0,
                               params[:3] + (("fused", 1), ("exact", 1), ("windowed", 1)))


def test_a_fused_mean_folds_a_sum_and_divides_by_the_extent_at_its_store() -> None:
    """Every thread of a fused program knows the count (N), so it keeps one float a column, not a
    sum and a count; a split program's partials still carry the count for the combine."""
    params = (("cvec", 8), ("col_threads", 8), ("threads", 256), ("unroll", 8))
    fused, split = (_compile(("mean", programs.COLUMN, params + (("fused", fused),))) for fused in (1, 0))
    assert "float st[8];" in fused and "/ ((float)N))" in fused
    assert "float st[16];" in split and "(float)N" not in split
    row = _compile(("mean", programs.ROW, (("vector", 8), ("threads", 256), ("unroll", 4), ("fused", 1))))
    assert "float st[1];" in row and "Y[((int64_t)((int)blockIdx.x))] = ((bfloat16_t)(st[0] / ((float)N)));" in row


def test_kernel_class_builds_its_fused_row_program() -> None:
    kernel = programs.SumKernel(torch.float16, config={})
    assert kernel.build_for_sm90() is not None


def test_unknown_program_and_bad_tile_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown program"):
        programs.build_program("diagonal", "sum", torch.float32, torch.float32, 0.0, ())
    with pytest.raises(ValueError, match="bad tile"):
        programs.build_program(programs.COLUMN, "sum", torch.float32, torch.float32, 0.0,
                               (("cvec", 3), ("col_threads", 4), ("threads", 256), ("unroll", 4), ("fused", 1)))


def test_launch_plans_split_rows_and_columns_to_fill_the_sms() -> None:
    kernel = programs.SumKernel(torch.bfloat16, config={})
    sms = 132
    # Many rows: one fused block per row.
    name, params, segments = kernel.launch_plan(torch.empty(16384, 1024, dtype=torch.bfloat16), sms)
    assert (name, segments, dict(params)["fused"]) == (programs.ROW, 1, 1)
    # One long row: split into ROW_BLOCKS_PER_SM blocks per SM, then combined.
    name, params, segments = kernel.launch_plan(torch.empty(1, 1 << 24, dtype=torch.bfloat16), sms)
    assert (name, segments, dict(params)["fused"]) == (programs.ROW, programs.ROW_BLOCKS_PER_SM * sms, 0)
    # 16384 x 16384 reduced over the first axis (a stride-0 view stands in for the data): 64
    # tiles of 256 columns are too few for one pass, so the axis is split into four segments of
    # 4096 rows (2 MiB strips), two blocks an SM, in the one-pass program's shape.
    columns = torch.empty(1, 1, 16384, dtype=torch.bfloat16).expand(1, 16384, 16384)
    name, params, segments = kernel.launch_plan(columns, sms)
    assert (name, segments) == (programs.COLUMN, 4)
    assert dict(params) == {"cvec": 8, "col_threads": 32, "threads": 256, "unroll": 8, "fused": 0}
    assert (name, params) in kernel.program_specs()
    # 4096 x 65536: 256 tiles of 256 columns fill the SMs, so one fused pass walks the whole axis.
    wider = torch.empty(1, 1, 65536, dtype=torch.bfloat16).expand(1, 4096, 65536)
    name, params, segments = kernel.launch_plan(wider, sms)
    assert (name, segments) == (programs.COLUMN, 1)
    assert dict(params) == {"cvec": 8, "col_threads": 32, "threads": 256, "unroll": 8, "fused": 1}
    # Without the one-pass program (col_threads 0): 64 tiles of 256 columns, each split so
    # that the blocks reach COLUMN_BLOCKS_PER_SM per SM.
    split_only = programs.ArgmaxKernel(torch.bfloat16, config={"one_pass_col_threads": 0})
    name, params, segments = split_only.launch_plan(columns, sms)
    tiles = 16384 // (dict(params)["col_threads"] * dict(params)["cvec"])
    assert (name, dict(params)["fused"], dict(params)["col_threads"]) == (programs.COLUMN, 0, 32)
    assert segments == -(-programs.COLUMN_BLOCKS_PER_SM * sms // tiles)


@pytest.mark.parametrize("rows, N, segments, threads, unroll, exact", [
    (16384, 32768, 1, 512, 8, 0),   # long rows: 512 threads a row, eight vectors a thread to take
    (16384, 16384, 1, 512, 4, 1),   # long rows of exactly four 512-thread chunks: straight-line
    (16384, 20480, 1, 512, 4, 0),   # long rows of five 512-thread chunks: two checked steps
    (16384, 12288, 1, 256, 4, 0),   # four vectors cover the row in two steps
    (16384, 8192, 1, 256, 4, 1),    # exactly four chunks: straight-line, unchecked
    (8, 4096, 1, 256, 2, 1),        # exactly two chunks
    (8, 2048, 1, 256, 1, 1),        # exactly one chunk
    (8, 6144, 1, 256, 4, 0),        # three chunks: one checked step
    (16384, 4100, 1, 256, 4, 0),    # 8-byte aligned rows: 4-element vectors, two checked steps
    (1, 1 << 24, programs.ROW_BLOCKS_PER_SM * 132, 256, 4, 0),  # row segments: eight lost up to 18%
])
def test_fused_rows_take_straight_line_or_long_row_programs(rows: int, N: int, segments: int, threads: int,
                                                            unroll: int, exact: int) -> None:
    kernel = programs.SumKernel(torch.bfloat16, config={})
    name, params, planned = kernel.launch_plan(torch.empty(rows, N, dtype=torch.bfloat16), 132)
    assert (name, planned, dict(params)["threads"], dict(params)["unroll"]) == (programs.ROW, segments, threads,
                                                                                 unroll)
    assert dict(params).get("exact", 0) == exact
    if dict(params)["vector"] == 8:
        assert (name, params) in kernel.program_specs()


@pytest.mark.parametrize("kernel_cls, threads", [(programs.SumKernel, 512), (programs.VarKernel, 512),
                                                 (programs.ArgmaxKernel, 256), (programs.LogSumExpKernel, 256)])
def test_long_rows_take_wide_blocks_but_for_argmax_and_log_sum_exp(kernel_cls, threads: int) -> None:
    kernel = kernel_cls(torch.bfloat16, config={})
    name, params, segments = kernel.launch_plan(torch.empty(1, 16384, dtype=torch.bfloat16).expand(16384, 16384), 132)
    assert dict(params)["threads"] == threads and segments == 1


def test_fast_memory_gives_argmax_and_log_sum_exp_narrow_long_row_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where memory is fast, half-precision argmax and log-sum-exp walk long rows with 64 and 128
    threads a block; float32, the other reducers and rows below the long-row length keep theirs."""
    def long_row_threads(kernel_cls, dtype: torch.dtype, N: int = 16384) -> int:
        kernel = kernel_cls(dtype, config={})
        rows = torch.empty(1, N, dtype=dtype).expand(16384, N)
        name, params, segments = kernel.launch_plan(rows, 132)
        assert name == programs.ROW and segments == 1
        assert (name, params) in kernel.program_specs()
        return dict(params)["threads"]

    monkeypatch.setattr(programs, "has_fast_memory", lambda: True)
    for dtype in (torch.bfloat16, torch.float16):
        assert long_row_threads(programs.ArgmaxKernel, dtype) == 64
        assert long_row_threads(programs.LogSumExpKernel, dtype) == 128
        assert long_row_threads(programs.ArgmaxKernel, dtype, N=8192) == 256
        assert long_row_threads(programs.SumKernel, dtype) == 512
    assert long_row_threads(programs.ArgmaxKernel, torch.float32) == 256
    assert long_row_threads(programs.LogSumExpKernel, torch.float32) == 256
    monkeypatch.setattr(programs, "has_fast_memory", lambda: False)
    assert long_row_threads(programs.ArgmaxKernel, torch.bfloat16) == 256


def test_fast_memory_gives_row_segments_wide_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where memory is fast, an aligned half-precision row cut across blocks (a whole-tensor sum,
    mean, amax, amin or 2-norm) takes 512-thread segments, four blocks an SM; narrower accesses,
    float32, the wide-state reducers and slow memory keep 256."""
    def segment_plan(kernel_cls, dtype: torch.dtype, misaligned: bool = False) -> "tuple[int, int]":
        kernel = kernel_cls(dtype, config={})
        x = torch.empty(2**28 + 1, dtype=dtype)[int(misaligned):2**28 + int(misaligned)].view(1, 2**28)
        name, params, segments = kernel.launch_plan(x, 132)
        assert name == programs.ROW and dict(params)["fused"] == 0
        assert misaligned or (name, params) in kernel.program_specs()  # the specs: aligned programs
        return dict(params)["threads"], segments

    monkeypatch.setattr(programs, "has_fast_memory", lambda: True)
    for dtype in (torch.bfloat16, torch.float16):
        for kernel_cls in (programs.SumKernel, programs.MeanKernel, programs.AmaxKernel, programs.AminKernel,
                           programs.L2NormKernel):
            assert segment_plan(kernel_cls, dtype) == (512, 528)
            assert segment_plan(kernel_cls, dtype, misaligned=True) == (256, 528)
        for kernel_cls in (programs.VarKernel, programs.LogSumExpKernel, programs.ArgmaxKernel):
            assert segment_plan(kernel_cls, dtype) == (256, 528)
    assert segment_plan(programs.SumKernel, torch.float32) == (256, 528)
    monkeypatch.setattr(programs, "has_fast_memory", lambda: False)
    assert segment_plan(programs.AmaxKernel, torch.bfloat16) == (256, 528)


WIDE_SEGMENT_KERNELS = [cls for cls in (programs.SumKernel, programs.MeanKernel, programs.AmaxKernel,
                                         programs.AminKernel, programs.VarKernel, programs.LogSumExpKernel,
                                         programs.ArgmaxKernel, programs.L2NormKernel)
                        if cls.fast_memory_split_row_threads]


@needs_nvcc
@pytest.mark.parametrize("kernel_cls", WIDE_SEGMENT_KERNELS)
def test_wide_row_segments_fill_an_sm(kernel_cls, tmp_path) -> None:
    """The segment programs that take 512 threads on fast memory (16-byte accesses) hold at most
    32 registers a thread, so the four blocks an SM that the segment count assumes are resident
    at once (the mean's, when each thread also counted, held 38: three fit, and its segments ran
    past one wave)."""
    threads = kernel_cls.fast_memory_split_row_threads
    kernel = kernel_cls(torch.bfloat16, config={"split_row_threads": threads})
    params = kernel._row_params(8, False)
    assert dict(params)["threads"] == threads
    program = kernel.compile_program(programs.ROW, params, target=SM90_BUILD_TARGET)
    report = ptxas_report(program.get_kernel_source(), str(tmp_path))
    assert report["spill_bytes"] == 0, report
    assert report["registers"] * threads * programs.ROW_BLOCKS_PER_SM <= REGISTERS_PER_SM, report


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("config", [{}, {"long_row_threads": 256}, {"long_row_threads": 64}, {"long_row_threads": 1024, "row_unroll": 2},
                                    {"row_threads": 128, "long_row_unroll": 4},
                                    {"long_row_threads": 128, "long_row_unroll": 1}, {"long_row_unroll": 1}])
def test_program_specs_hold_every_fused_row_program(dtype: torch.dtype, config) -> None:
    """Every row length, aligned or not, launches a program the sm_90 build (and the GPU warm-up) compiled."""
    kernel = programs.SumKernel(dtype, config=config)
    specs = kernel.program_specs()
    vector = kernel._max_vector
    for N in range(vector, 1 << 17, vector):
        rows = torch.empty(1, N, dtype=dtype).expand(16384, N)  # a stride-0 view stands in for the data
        name, params, segments = kernel.launch_plan(rows, 132)
        assert (name, params) in specs, (N, dict(params))
    for N in range(1, 1 << 17, 7):  # rows read in windows, fused or cut across blocks
        for count in (16384, 8):
            name, params, segments = kernel.launch_plan(torch.empty(count, N, dtype=dtype, device="meta"), 132)
            assert (name, params) in specs or dict(params)["vector"] < vector, (N, dict(params))


def test_rows_no_wide_access_fits_are_read_in_windows_where_that_gains() -> None:
    """Windows of 16 bytes replace accesses narrower than 8 bytes, over rows cut across blocks for
    every reducer, and over rows a block reduces alone but for argmax and log-sum-exp."""
    def plan(kernel, shape, stride=None, offset=0):
        x = torch.empty(shape, dtype=torch.bfloat16, device="meta")
        if stride is not None or offset:
            x = x.as_strided(shape, (stride or shape[1], 1), offset)
        name, params, segments = kernel.launch_plan(x, 132)
        shape = dict(params)
        # The builds hold every program of 16-byte accesses (windows among them).
        assert name == programs.ROW and ((name, params) in kernel.program_specs() or shape["vector"] < 8)
        return shape["vector"], shape["threads"], shape.get("windowed", 0), segments

    total, argmax = programs.SumKernel(torch.bfloat16, config={}), programs.ArgmaxKernel(torch.bfloat16, config={})
    wide = programs.SumKernel(torch.bfloat16, config={"split_row_threads": 512})
    for kernel in (total, argmax, wide):  # a decoding batch's vocabulary: cut across blocks of 256 threads
        assert plan(kernel, (256, 50257)) == (8, 256, 1, 3)
    assert plan(total, (16384, 4097)) == (8, 256, 1, 1)
    assert plan(argmax, (16384, 4097)) == (1, 256, 0, 1)   # as before windows
    assert plan(argmax, (200, 4097)) == (1, 256, 0, 3)     # cut as before, over its plain accesses
    assert plan(total, (16384, 4100)) == (4, 256, 0, 1)    # 8-byte accesses stay
    assert plan(total, (9, 1000), stride=1003) == (8, 256, 1, 1)
    assert plan(total, (9, 1000), stride=1000, offset=1) == (1, 256, 0, 1)  # an unaligned start
    off = programs.SumKernel(torch.bfloat16, config={"windowed_below_bytes": 0})
    assert plan(off, (256, 50257)) == (1, 256, 0, 3)


@pytest.mark.parametrize("shape, why", [
    ((1, 16384, 8192), "128 tiles of 64 columns are too few blocks, narrower ones walk too long a strip, "
                       "and eight segments of 512-byte tiles hold 1 MiB strips"),
    ((1, 200, 16384), "200 rows are less than one step of 32 lanes x 8 in 128-byte tiles"),
])
def test_one_pass_columns_need_enough_tiles_and_rows(shape, why) -> None:
    kernel = programs.SumKernel(torch.bfloat16, config={})
    columns = torch.empty(1, 1, shape[2], dtype=torch.bfloat16).expand(*shape)
    name, params, segments = kernel.launch_plan(columns, 132)
    assert (dict(params)["col_threads"], dict(params)["unroll"]) == (programs.MAX_COL_THREADS, 4), why
    assert segments > 1, why


@pytest.mark.parametrize("shape, col_threads, segments", [
    ((1, 8192, 32768), 16, 1),      # 256 tiles of 128 columns (256 bytes): one pass
    ((8, 2048, 16384), 32, 1),      # 8 x 32 tiles of 256 columns over the middle axis: one pass
    ((1, 32768, 8192), 32, 8),      # 32 tiles of 256 columns, 8 segments of 4096 rows
    ((1, 2048, 16384), 8, 1),       # four segments would walk 256 KiB strips: 128-byte tiles instead
    ((1, 4096, 4096), 2, 1),        # 32-byte tiles over a 128 KiB strip
])
def test_one_pass_columns_prefer_wide_tiles_then_long_segments(shape, col_threads: int, segments: int) -> None:
    columns = torch.empty(shape[0], 1, shape[2], dtype=torch.bfloat16).expand(*shape)
    for kernel_class in (programs.SumKernel, programs.VarKernel, programs.ArgmaxKernel):
        kernel = kernel_class(torch.bfloat16, config={})
        name, params, planned = kernel.launch_plan(columns, 132)
        assert (name, dict(params)["col_threads"], planned) == (programs.COLUMN, col_threads, segments)
        assert (dict(params)["fused"], dict(params)["unroll"]) == (int(segments == 1), kernel.one_pass[2])


def test_one_pass_columns_with_the_earlier_config_keep_their_earlier_plans() -> None:
    # 128-byte tiles and no few-segment split: 16384 x 16384 takes one pass, 32768 x 8192 the split
    # program at COLUMN_BLOCKS_PER_SM.
    earlier = programs.SumKernel(torch.bfloat16, config={"one_pass_col_threads": 8, "one_pass_split_blocks_per_sm": 0})
    square = torch.empty(1, 1, 16384, dtype=torch.bfloat16).expand(1, 16384, 16384)
    assert dict(earlier.launch_plan(square, 132)[1])["col_threads"] == 8
    assert earlier.launch_plan(square, 132)[2] == 1
    tall = torch.empty(1, 1, 8192, dtype=torch.bfloat16).expand(1, 32768, 8192)
    name, params, segments = earlier.launch_plan(tall, 132)
    assert (dict(params)["unroll"], segments) == (4, -(-programs.COLUMN_BLOCKS_PER_SM * 132 // 32))


def test_variance_one_pass_columns_walk_four_rows_a_lane() -> None:
    # The variance's one-pass step in 128-byte tiles is 32 lanes x 4 rows, so 200 rows (too few for
    # the sums' step of 32 x 8) still take one fused pass.
    columns = torch.empty(1, 1, 16384, dtype=torch.bfloat16).expand(1, 200, 16384)
    name, params, segments = programs.VarKernel(torch.bfloat16, config={}).launch_plan(columns, 132)
    assert (name, segments, dict(params)["unroll"], dict(params)["fused"]) == (programs.COLUMN, 1, 4, 1)
    assert programs.SumKernel(torch.bfloat16, config={}).launch_plan(columns, 132)[2] > 1
    # Over 16384 rows its segments walk four rows a lane too.
    columns = torch.empty(1, 1, 16384, dtype=torch.bfloat16).expand(1, 16384, 16384)
    name, params, segments = programs.VarKernel(torch.bfloat16, config={}).launch_plan(columns, 132)
    assert (name, segments, dict(params)["unroll"], dict(params)["fused"]) == (programs.COLUMN, 4, 4, 0)


def test_one_pass_columns_need_16_byte_accesses() -> None:
    kernel = programs.SumKernel(torch.bfloat16, config={})
    storage = torch.empty(16385, dtype=torch.bfloat16)
    name, params, segments = kernel.launch_plan(storage[1:].expand(1, 16384, 16384), 132)
    assert (dict(params)["cvec"], dict(params)["col_threads"]) == (1, programs.MAX_COL_THREADS)
    assert segments > 1


def test_one_pass_columns_narrow_their_tiles_on_short_axes() -> None:
    # 64 x 4096 x 64 over the middle axis: 64 tiles of 64 columns are too few, 256 of 16 are
    # enough, and a 16-column strip of 4096 rows is 128 KiB.
    columns = torch.empty(64, 1, 64, dtype=torch.bfloat16).expand(64, 4096, 64)
    for kernel_class in (programs.SumKernel, programs.VarKernel, programs.LogSumExpKernel):
        name, params, segments = kernel_class(torch.bfloat16, config={}).launch_plan(columns, 132)
        assert (name, segments, dict(params)["col_threads"], dict(params)["fused"]) == (programs.COLUMN, 1, 2, 1)
    # 25 x 4096 x 64: only 16-byte tiles would be enough, and they would waste half of
    # each sector, so the axis is split instead.
    fewer = torch.empty(25, 1, 64, dtype=torch.bfloat16).expand(25, 4096, 64)
    name, params, segments = programs.SumKernel(torch.bfloat16, config={}).launch_plan(fewer, 132)
    assert (dict(params)["fused"], segments > 1) == (0, True)


def test_wide_state_reducers_split_columns_into_blocks_of_at_least_eight_steps() -> None:
    # 64 x 4096 x 64 over the middle axis, split: 64 tiles of 64 columns, 32 lanes x 4 rows a step.
    columns = torch.empty(64, 1, 64, dtype=torch.bfloat16).expand(64, 4096, 64)
    split = {"one_pass_col_threads": 0}
    assert programs.SumKernel(torch.bfloat16, config=split).launch_plan(columns, 132)[2] == 32
    for kernel_class in (programs.VarKernel, programs.LogSumExpKernel, programs.ArgmaxKernel):
        assert kernel_class(torch.bfloat16, config=split).launch_plan(columns, 132)[2] == 4096 // (32 * 4 * 8)
