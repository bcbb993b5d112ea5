"""The softmax family on the GPU: every op against its manifest reference, and more.

* every manifest case of the four ops (workloads, odd sizes, ranks 1-4, every
  ``dim``, strided and empty inputs) against the float64 reference;
* backward through the ops' autograd against ``torch.autograd`` of the
  float64 forward reference;
* rows long enough for the two-step programs, and the two-step programs
  forced on short rows;
* rows, and middle-axis columns, held by clusters of blocks (every variant, masked
  forward slices);
* forward rows staged in shared memory ahead of the one a block reduces, by a block or by
  a row cluster's blocks;
* rows no 16-byte access can start, read and written in aligned windows;
* views that need no copy (row and column slices, broadcast rows, misaligned
  starts) and views that do (transposes);
* masked rows (``-inf``), and tensors of more than 2**31 elements.

``python -m tests.gpu.softmax_warmup`` compiles every program these tests
launch in parallel first, so the tests themselves find them in TileLang's cache.
"""

import math
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch

from tests.op_checks import assert_close, check_against_reference, family_ops, manifest_cases

pytestmark = pytest.mark.gpu

OPS = family_ops("softmax")
# Forward op, its backward op, and the PyTorch function the pair matches.
PAIRS: Dict[str, Tuple[str, str, Callable[..., torch.Tensor]]] = {
    "softmax": ("SoftmaxFwdOp", "SoftmaxBwdOp", torch.softmax),
    "log_softmax": ("LogSoftmaxFwdOp", "LogSoftmaxBwdOp", torch.log_softmax),
}

MANIFEST_CASES = [case for name in OPS for case in manifest_cases(name)]
# (shape, dim, dtype) for the backward checks: fused rows, two-step rows, fused and two-step columns, tiny.
GRAD_CASES = [
    ((5, 4097), -1, torch.bfloat16),
    ((3, 65537), -1, torch.float32),
    ((4, 127, 6), 1, torch.bfloat16),
    ((40, 1000, 16), 1, torch.bfloat16),  # fused columns held in registers (one step covers the axis)
    ((48, 3000, 8), 1, torch.float32),  # fused columns read twice
    ((200, 777, 8), 1, torch.float16),  # fused one-vector-wide columns, in registers
    ((160, 4099, 8), 1, torch.bfloat16),  # fused one-vector-wide columns read twice, ragged last step
    ((4, 1000, 16), 1, torch.bfloat16),  # too few columns to fill the GPU: two steps
    ((2, 9000, 64), 1, torch.bfloat16),  # two steps
    ((2, 3, 3), 0, torch.float16),
    ((1,), 0, torch.float32),
    ((2, 262144), -1, torch.bfloat16),
    # Fused rows of a block or more just past a power of two: a thread holds two or three
    # vectors (one or two in the half-precision backwards), the first lanes one more; and short
    # rows that share a block.
    ((777, 4104), -1, torch.bfloat16),
    ((300, 6000), -1, torch.float16),
    ((65, 12288), -1, torch.bfloat16),
    ((1000, 100), -1, torch.float32),
]
# (N, dtype) of rows past the fused program's register budget (and one just inside it).
LONG_ROWS = [(65537, torch.float32), (262144, torch.bfloat16), (32769, torch.float16)]
# (N, dtype, rows, cluster_threads) held by row clusters: 4-block clusters of one-element vectors
# (forward and backward), 4- and 8-block float32 clusters, 8-block 16-byte vectors, 8-block clusters of
# 256 threads of one-element vectors; the rows give every SM a block.  Blocks of 512 threads (the
# forward's), 1024 (the backward's) and 256 (the backward's on fast memory).
CLUSTER_ROWS = [(65537, torch.float16, 70, 512), (100003, torch.float32, 40, 1024), (40000, torch.float32, 140, 512),
                (262144, torch.bfloat16, 17, 1024), (50257, torch.bfloat16, 66, 256)]
# And of the backwards only (one forward block holds these rows): 256-thread blocks, a ragged last
# vector a thread.
BACKWARD_CLUSTER_ROWS = [(40000, torch.bfloat16, 70, 256)]


def cluster_cases() -> List[Tuple[str, int, torch.dtype, int, int]]:
    """(op, N, dtype, rows, cluster_threads) of ``test_row_clusters``."""
    return [(name, *case) for name in OPS for case in CLUSTER_ROWS] + [
        (name, *case) for name in OPS if name.endswith("BwdOp") for case in BACKWARD_CLUSTER_ROWS]
# (shape over dim 1, dtype, blocks of the column cluster the default config takes): the middle
# axis cut among 2, 4 or 8 blocks; held in registers (2 x 1031 x 256) or read twice; ragged
# last segments (1000, 3001, 1031 positions); 16-byte float32 accesses.
COLUMN_CLUSTERS = [((64, 4096, 64), torch.bfloat16, 2), ((16, 32768, 64), torch.bfloat16, 8),
                   ((1, 4096, 1024), torch.bfloat16, 4), ((8, 1000, 256), torch.float16, 4),
                   ((4, 3001, 512), torch.float32, 2), ((2, 1031, 256), torch.bfloat16, 8)]
# A config that sends 4096-wide rows to the two-step programs, whose loads carry L2 eviction hints.
TWO_STEP_CONFIG = {"row_threads": 32, "block_threads": 128, "split_threads": 256, "split_unroll": 2,
                   "split_cache_hints": 1}


def _op(name: str, N: int, dtype: torch.dtype, dim: int):
    import tileops.ops

    return getattr(tileops.ops, name)(N=N, dtype=dtype, dim=dim)


def _op_and_kernel(name: str, N: int, dtype: torch.dtype, dim: int = -1, **config: Any):
    """The op over ``dim``, and a kernel of its class with ``config`` over its defaults."""
    op = _op(name, N, dtype, dim)
    return op, op.kernel_map[op.kernel_key](N, dtype, config=config)


def _inputs_like(name: str, x: torch.Tensor) -> List[torch.Tensor]:
    """``x`` for a forward op; ``(x, a valid forward output)`` for a backward op."""
    if not name.endswith("BwdOp"):
        return [x]
    fn = torch.log_softmax if name.startswith("Log") else torch.softmax
    y = fn(torch.randn(x.shape, device=x.device, dtype=torch.float32), -1).to(x.dtype)
    return [x, y]


def _reference(name: str, op, inputs: List[torch.Tensor]) -> torch.Tensor:
    return op.reference(*(t.double() for t in inputs))


# ---- the manifest's cases ----------------------------------------------------------------------


@pytest.mark.parametrize("case", MANIFEST_CASES, ids=lambda case: f"{case.op}-{case}")
def test_matches_manifest_reference(case):
    check_against_reference(case, device="cuda")


# ---- backward against autograd -------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(PAIRS))
@pytest.mark.parametrize("shape, dim, dtype", GRAD_CASES, ids=str)
def test_backward_matches_autograd(family, shape, dim, dtype):
    fwd_name, bwd_name, fn = PAIRS[family]
    N = shape[dim]
    x = torch.randn(shape, device="cuda", dtype=dtype)
    grad = torch.randn(shape, device="cuda", dtype=dtype)
    leaf = x.clone().requires_grad_()
    y = _op(fwd_name, N, dtype, dim)(leaf)
    y.backward(grad)
    wide = x.double().requires_grad_()
    fn(wide, dim).backward(grad.double())
    assert_close(leaf.grad, wide.grad, dtype)
    # The backward op called directly gives what autograd gave.
    direct = _op(bwd_name, N, dtype, dim)(grad, y.detach())
    torch.testing.assert_close(direct, leaf.grad, rtol=0, atol=0)


# ---- long rows and the two-step programs -------------------------------------------------------


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("N, dtype", LONG_ROWS, ids=str)
def test_long_rows(name, N, dtype):
    op = _op(name, N, dtype, -1)
    for rows in (1, 5):
        inputs = _inputs_like(name, torch.randn(rows, N, device="cuda", dtype=dtype))
        assert_close(op(*inputs), _reference(name, op, inputs), dtype)


@pytest.mark.parametrize("name", OPS)
def test_two_step_programs_on_short_rows(name):
    N, dtype = 4096, torch.bfloat16
    op, kernel = _op_and_kernel(name, N, dtype, **TWO_STEP_CONFIG)
    assert not kernel.fused()
    for rows in (1, 3, 700):
        inputs = _inputs_like(name, torch.randn(rows, N, device="cuda", dtype=dtype))
        out = torch.full((rows, N), float("nan"), device="cuda", dtype=dtype)
        kernel(*inputs, out)
        assert_close(out, _reference(name, op, inputs), dtype)


# Fused rows with the hint on every call (``row_hinted_min_mib`` 0) and on none (2**20 MiB).
HINT_SIZES = [8, 127, 4096, 4097, 16384]
HINT_THRESHOLDS = (0, 1 << 20)


def hint_case(name: str, N: int, dtype: torch.dtype, threshold: int, rows: int, device: str = "cuda"):
    """The op, its kernel with ``row_hinted_min_mib`` at ``threshold`` (and no rows staged, which
    devices with fast memory give rows of a whole block), and inputs of ``rows`` rows lying
    ``N + 8`` elements apart (aligned to 16 bytes where ``N`` is a multiple of 8)."""
    op, kernel = _op_and_kernel(name, N, dtype, row_hinted_min_mib=threshold, row_stages=0)
    x = torch.randn(rows, N + 8, device=device, dtype=dtype)[:, :N]
    if not name.endswith("BwdOp"):
        x[0, ::2] = float("-inf")
    return op, kernel, _inputs_like(name, x)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("N", HINT_SIZES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_fused_rows_with_and_without_the_hint(name, N, dtype):
    from tileops.kernels.softmax.softmax import ROW_FUSED

    for threshold in HINT_THRESHOLDS:
        for rows in (1, 3, 700):
            op, kernel, inputs = hint_case(name, N, dtype, threshold, rows)
            assert kernel.fused()
            out = torch.full((rows, N), float("nan"), device="cuda", dtype=dtype)
            ((program, params),) = kernel.programs_for(*inputs, out)
            assert program == ROW_FUSED
            assert dict(params)["hinted"] == int(threshold == 0 and dict(params)["vector"] * dtype.itemsize == 16)
            kernel(*inputs, out)
            assert_close(out, _reference(name, op, inputs), dtype)


# (N, dtype, rows, whether the backwards take windows) of rows no 16-byte access can start, read
# in aligned windows: short rows that share a block, rows of a block (ragged, float32), rows of
# row clusters (the backward over 50257 keeps element loads: its windows would not fit).
WINDOWED_ROWS = [(37, torch.float16, 33, True), (127, torch.bfloat16, 1000, True), (1001, torch.float32, 500, True),
                 (4097, torch.bfloat16, 300, True), (50257, torch.bfloat16, 300, False),
                 (65537, torch.float16, 140, True)]
# Gaps between rows: rows that start as far into their windows as the output's (0, 8), and rows that
# do not (3: element loads).
ROW_GAPS = (0, 8, 3)


def windowed_case(name: str, N: int, dtype: torch.dtype, rows: int, gap: int, device: str = "cuda"):
    """The op, its kernel with windows on (``row_windows``), and inputs of ``rows`` rows ``N + gap``
    elements apart (a forward's rows masked as ``_mask_forward_rows`` does)."""
    op, kernel = _op_and_kernel(name, N, dtype, row_windows=1)
    x = torch.randn(rows, N + gap, device=device, dtype=dtype)[:, :N]
    if not name.endswith("BwdOp"):
        _mask_forward_rows(x)
    return op, kernel, _inputs_like(name, x)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("N, dtype, rows, backward_windows", WINDOWED_ROWS, ids=str)
def test_odd_rows_in_windows(name, N, dtype, rows, backward_windows):
    for gap in ROW_GAPS:
        op, kernel, inputs = windowed_case(name, N, dtype, rows, gap)
        out = torch.full((rows, N), float("nan"), device="cuda", dtype=dtype)
        (program, params), = kernel.programs_for(*inputs, out)
        windows = gap % 8 == 0 and (backward_windows or not name.endswith("BwdOp"))
        assert dict(params).get("windowed", 0) == int(windows), (program, params)
        kernel(*inputs, out)
        expected = _reference(name, op, inputs)
        assert torch.equal(torch.isnan(out.cpu()), torch.isnan(expected.cpu()))
        assert_close(out, expected, dtype)
    # A row slice that starts mid-window in the input but not in the output reads element by element.
    op, kernel, (x, *rest) = windowed_case(name, N, dtype, rows, 8)
    shifted = torch.randn(rows, N + 8, device="cuda", dtype=dtype)[:, 1:N + 1]
    shifted[:, :N - 1] = x[:, :N - 1]
    out = torch.empty(rows, N, device="cuda", dtype=dtype)
    (_, params), = kernel.programs_for(shifted, *rest, out)
    assert "windowed" not in dict(params)
    kernel(shifted, *rest, out)
    assert_close(out, _reference(name, op, [shifted, *rest]), dtype)


# (N, dtype, row_stages) of forward rows staged in shared memory: whole 1024-thread blocks one and
# two rows ahead, a tail vector (20000 = 2 x 8192 + 3616), 512-thread rows, float32 and float16.
STAGED_ROWS = [(32768, torch.bfloat16, 1), (32768, torch.bfloat16, 2), (20000, torch.bfloat16, 1),
               (6000, torch.float16, 1), (16384, torch.float32, 1)]


def _check_program(name: str, op, kernel, inputs: List[torch.Tensor], program: str) -> None:
    """``kernel`` launches ``program`` alone on ``inputs`` and matches the reference, NaNs included."""
    rows, N = inputs[0].shape
    out = torch.full((rows, N), float("nan"), device="cuda", dtype=inputs[0].dtype)
    assert [launched for launched, _ in kernel.programs_for(*inputs, out)] == [program]
    kernel(*inputs, out)
    expected = _reference(name, op, inputs)
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(expected.cpu()))
    assert_close(out, expected, inputs[0].dtype)


@pytest.mark.parametrize("name", ("SoftmaxFwdOp", "LogSoftmaxFwdOp"))
@pytest.mark.parametrize("N, dtype, stages", STAGED_ROWS, ids=str)
def test_staged_rows(name, N, dtype, stages):
    """Each block takes rows b, b + blocks, ...: fewer rows than blocks, about one a block, several
    a block with a ragged last turn, and strided rows; masked rows give NaN (all ``-inf``) or one."""
    from tileops.kernels.softmax.softmax import ROW_STAGED

    op, kernel = _op_and_kernel(name, N, dtype, row_stages=stages)
    sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    for rows in (1, sm_count + 1, 5 * sm_count - 7):
        x = torch.randn(rows, N + 8, device="cuda", dtype=dtype)[:, :N]
        x[-1] = float("-inf")
        x[0, : N - 1] = float("-inf")
        if rows > 1:
            x[1, ::2] = float("-inf")
        _check_program(name, op, kernel, [x], ROW_STAGED)


def _cluster_kernel(name: str, N: int, dtype: torch.dtype, threads: int):
    return _op_and_kernel(name, N, dtype, max_cluster=8, cluster_threads=threads,
                          cluster_min_blocks=1024 // threads, cluster_stages=0)


def _mask_forward_rows(x: torch.Tensor) -> None:
    """All -inf (NaN, as PyTorch), a lone finite element (so most blocks of its cluster hold only
    -inf), and every other element; and the last row all -inf."""
    N = x.shape[1]
    x[0] = float("-inf")
    x[1] = float("-inf")
    x[1, N - 3] = 2.0
    x[2, ::2] = float("-inf")
    x[-1] = float("-inf")


@pytest.mark.parametrize("name, N, dtype, rows, threads", cluster_cases(), ids=str)
def test_row_clusters(name, N, dtype, rows, threads):
    from tileops.kernels.softmax.softmax import ROW_CLUSTER

    op, kernel = _cluster_kernel(name, N, dtype, threads)
    x = torch.randn(rows, N, device="cuda", dtype=dtype)
    if not name.endswith("BwdOp"):
        _mask_forward_rows(x)
    _check_program(name, op, kernel, _inputs_like(name, x), ROW_CLUSTER)


# (N, dtype, cluster_stages) of forward rows staged by clusters of two 1024-thread blocks: one and
# two rows ahead; tail vectors (60000 = 3 x 16384 + 10848, 49160 = 3 x 16384 + 8, float32 40000 =
# 4 x 8192 + 7232).
CLUSTER_STAGED_ROWS = [(65536, torch.bfloat16, 1), (65536, torch.bfloat16, 2), (60000, torch.float16, 2),
                       (49160, torch.bfloat16, 1), (40000, torch.float32, 2)]


@pytest.mark.parametrize("name", ("SoftmaxFwdOp", "LogSoftmaxFwdOp"))
@pytest.mark.parametrize("N, dtype, stages", CLUSTER_STAGED_ROWS, ids=str)
def test_staged_row_clusters(name, N, dtype, stages):
    """Each cluster takes rows g, g + groups, ...: two rows a cluster (the fewest that take the
    program), one more, several with a ragged last turn; strided rows, masked as in
    ``test_row_clusters``."""
    from tileops.kernels.softmax.softmax import ROW_CLUSTER_STAGED

    op, kernel = _op_and_kernel(name, N, dtype, cluster_stages=stages)
    sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    least = kernel.least_staged_cluster_rows(sm_count)
    for rows in (least, least + 1, 5 * sm_count - 7):
        x = torch.randn(rows, N + 8, device="cuda", dtype=dtype)[:, :N]
        _mask_forward_rows(x)
        _check_program(name, op, kernel, [x], ROW_CLUSTER_STAGED)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("shape, dtype, cluster", COLUMN_CLUSTERS, ids=str)
def test_column_clusters(name, shape, dtype, cluster):
    from tileops.kernels.softmax.softmax import COLUMN_FUSED

    N = shape[1]
    op, kernel = _op_and_kernel(name, N, dtype, 1)
    x = torch.randn(shape, device="cuda", dtype=dtype)
    if not name.endswith("BwdOp"):
        # Masked columns: all -inf (NaN, as PyTorch); -inf over the first half of the axis, so
        # the first blocks of the cluster hold only -inf; one finite element at the end.
        x[0, :, 5] = float("-inf")
        x[:, : N // 2, :3] = float("-inf")
        x[:, :, 9] = float("-inf")
        x[:, N - 1, 9] = 1.0
    inputs = _inputs_like(name, x)
    out = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    assert [(program, dict(params)["cluster"]) for program, params in kernel.programs_for(*inputs, out)] == [
        (COLUMN_FUSED, cluster)]
    kernel(*inputs, out)
    expected = _reference(name, op, inputs)
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(expected.cpu()))
    assert_close(out, expected, dtype)


# ---- rows held by several blocks -------------------------------------------------------------------

# (N, dtype, row counts) of forward rows held by blocks that exchange through global memory: 22
# blocks of 16-byte vectors; 9 blocks of one-element accesses (65537 float32); a last block partly
# past the row's end (100000 half, 131080 bf16).  Row counts below those of row clusters, and
# (where no row cluster holds the rows) far more blocks than fit on the GPU at once.
HELD_ROWS = [(262144, torch.bfloat16, (1, 3, 16, 300)), (65537, torch.float32, (1, 3, 16)),
             (100000, torch.float16, (3, 16)), (131080, torch.bfloat16, (3, 700))]


@pytest.mark.parametrize("name", ("SoftmaxFwdOp", "LogSoftmaxFwdOp"))
@pytest.mark.parametrize("N, dtype, row_counts", HELD_ROWS, ids=str)
def test_held_rows(name, N, dtype, row_counts):
    """Strided rows, masked as in ``test_row_clusters``: a row all -inf, a lone finite element (so
    most blocks of its row hold only -inf), every other element -inf."""
    from tileops.kernels.softmax.softmax import ROW_HELD

    op, kernel = _op_and_kernel(name, N, dtype)
    for rows in row_counts:
        x = torch.randn(rows, N + 8, device="cuda", dtype=dtype)[:, :N]
        if rows >= 3:
            _mask_forward_rows(x)
        _check_program(name, op, kernel, [x], ROW_HELD)


def test_held_rows_leave_the_workspace_ready_for_every_next_launch():
    """Back-to-back launches with no sync between them, row counts that shrink and grow (the
    workspace grows), on two streams at once, and a CUDA graph's replays between eager launches."""
    N, dtype = 262144, torch.bfloat16
    op, kernel = _op_and_kernel("SoftmaxFwdOp", N, dtype)
    streams = [torch.cuda.Stream() for _ in range(2)]
    calls = []
    torch.cuda.synchronize()
    for rows in (64, 5, 64, 1, 100, 128, 7, 64):
        for stream in streams:
            with torch.cuda.stream(stream):
                x = torch.randn(rows, N, device="cuda", dtype=dtype)
                out = torch.full_like(x, float("nan"))
                kernel(x, out)
                calls.append((x, out))
    torch.cuda.synchronize()
    for x, out in calls:
        assert_close(out, torch.softmax(x.double(), -1), dtype)
    held = kernel._held_workspaces.snapshot()
    assert {stream.cuda_stream for stream in streams} <= {key[1] for key in held}
    assert max(status.shape[1] for status, _ in held.values()) >= 128

    static_x = torch.randn(64, N, device="cuda", dtype=dtype)
    static_out = torch.empty_like(static_x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kernel(static_x, static_out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(static_x, static_out)
    sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    assert kernel._held_workspaces.snapshot().keys() == held.keys() | {
        (torch.cuda.current_device(), side.cuda_stream, kernel.row_held(sm_count))}
    for _ in range(3):
        static_x.copy_(torch.randn_like(static_x))
        static_out.fill_(float("nan"))
        graph.replay()
        x = torch.randn(64, N, device="cuda", dtype=dtype)
        out = kernel(x, torch.empty_like(x))
        torch.cuda.synchronize()
        assert_close(static_out, torch.softmax(static_x.double(), -1), dtype)
        assert_close(out, torch.softmax(x.double(), -1), dtype)


# ---- views -----------------------------------------------------------------------------------------


def view_cases(device: str = "cuda") -> List[Tuple[str, torch.Tensor, int]]:
    """(label, input, dim): layouts the ops take as views, and some they must copy."""
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=generator).to(torch.bfloat16)

    return [
        ("row-slice-aligned", randn(6, 4200)[:, 8:8 + 4096], -1),
        ("row-slice-misaligned", randn(6, 4200)[:, 3:3 + 4096], -1),
        ("broadcast-rows", randn(1, 4096).expand(6, 4096), -1),
        ("offset-start", randn(6 * 4096 + 1)[1:].view(6, 4096), -1),
        ("column-slice", randn(4, 130, 40)[:, 1:128, :32], 1),
        ("column-slice-fused", randn(64, 130, 40)[:, 1:128, :32], 1),
        ("transposed", randn(4096, 6).t(), -1),
        ("every-other", randn(6, 8192)[:, ::2], -1),
    ]


@pytest.mark.parametrize("name", OPS)
def test_views(name):
    for label, x, dim in view_cases():
        op = _op(name, x.shape[dim], x.dtype, dim)
        inputs = [x]
        if name.endswith("BwdOp"):
            fn = torch.log_softmax if name.startswith("Log") else torch.softmax
            inputs.append(fn(torch.randn(x.shape, device="cuda"), dim).to(x.dtype))
        out = op(*inputs)
        assert out.is_contiguous(), label
        ref = op.reference(*(t.double() for t in inputs))
        try:
            assert_close(out, ref, x.dtype)
        except AssertionError as error:
            raise AssertionError(f"{name} on {label}: {error}") from None


# ---- masked rows -------------------------------------------------------------------------------------


MASKED_SHAPES = [((6, 4096), -1, torch.bfloat16), ((3, 65537), -1, torch.float32), ((4, 127, 32), 1, torch.bfloat16)]


@pytest.mark.parametrize("family", sorted(PAIRS))
@pytest.mark.parametrize("shape, dim, dtype", MASKED_SHAPES, ids=str)
def test_masked_rows_match_pytorch(family, shape, dim, dtype):
    fwd_name, _, fn = PAIRS[family]
    x = torch.randn(shape, device="cuda", dtype=dtype)
    x = x.masked_fill(torch.rand(shape, device="cuda") < 0.5, float("-inf"))
    # The first position along the axis is masked everywhere, and one whole slice is.
    first = [slice(None)] * len(shape)
    first[dim] = 0
    x[tuple(first)] = float("-inf")
    whole = [0] * len(shape)
    whole[dim] = slice(None)
    x[tuple(whole)] = float("-inf")
    out = _op(fwd_name, shape[dim], dtype, dim)(x)
    expected = fn(x.double(), dim)
    assert torch.equal(torch.isnan(out), torch.isnan(expected))
    assert torch.equal(torch.isneginf(out), torch.isneginf(expected))
    finite = torch.isfinite(expected)
    torch.testing.assert_close(out.double()[finite], expected[finite], rtol=1e-2, atol=1e-2)


# ---- more than 2**31 elements ----------------------------------------------------------------------


def _big_case_shapes() -> List[Tuple[Tuple[int, ...], int]]:
    # Rows; more than 65535 rows in two-block clusters; rows of two-block clusters taken in turn
    # (where memory is fast, staged); columns in two steps; one-vector-wide columns in the fused
    # program.
    return [((2**19 + 1, 4096), -1), ((2**16 + 1, 49153), -1), ((2**15 + 1, 65536), -1), ((3, 2**20, 2**10), 1),
            ((2**16 + 1, 4096, 8), 1)]


@pytest.mark.big_memory
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("shape, dim", _big_case_shapes(), ids=str)
def test_more_than_2_31_elements(shape, dim, name):
    """Each op's last slices, whose offsets do not fit in 32 bits, against its reference in
    float64; a backward takes the forward's output, as in training."""
    assert math.prod(shape) > 2**31
    dtype = torch.bfloat16
    op = _op(name, shape[dim], dtype, dim)
    inputs = [torch.randn(shape, device="cuda", dtype=dtype)]
    if name.endswith("BwdOp"):
        forward = _op(name.replace("BwdOp", "FwdOp"), shape[dim], dtype, dim)
        inputs.append(forward(inputs[0]))  # (grad_y, y): the random input doubles as the gradient
    out = op(*inputs)

    def tail(t: torch.Tensor) -> torch.Tensor:
        return t[-2:] if dim == -1 else t[-1:, :, -8:]

    assert_close(tail(out), op.reference(*(tail(t).double() for t in inputs)), dtype)
    del inputs, out
    torch.cuda.empty_cache()
