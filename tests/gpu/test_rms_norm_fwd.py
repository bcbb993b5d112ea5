"""RMSNormFwdOp on the GPU against its manifest reference (float64)."""

import pytest
import torch

from tests.op_checks import assert_close, build_op, check_against_reference, manifest_cases

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", manifest_cases("RMSNormFwdOp"), ids=str)
def test_rms_norm_fwd_matches_reference(case):
    check_against_reference(case, device="cuda")
    assert build_op(case).last_backend == "kernel"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden", [1, 3, 127, 4097, 65537])
def test_rms_norm_fwd_odd_hidden_sizes_and_row_counts(dtype, hidden):
    from tileops.ops import RMSNormFwdOp

    op = RMSNormFwdOp(N=hidden, dtype=dtype, eps=1e-5)
    weight = torch.randn(hidden, device="cuda", dtype=dtype)
    for rows in (1, 3, 129):
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
        expected = op.reference(x.double(), weight.double())
        assert_close(op(x, weight), expected, dtype)


def test_rms_norm_fwd_transposed_input():
    from tileops.ops import RMSNormFwdOp

    x = torch.randn(64, 96, device="cuda", dtype=torch.bfloat16).t()  # last axis strided
    weight = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    op = RMSNormFwdOp(N=64, dtype=torch.bfloat16)
    assert_close(op(x, weight), op.reference(x.double(), weight.double()), torch.bfloat16)


# (N, dtype, per_thread, row_stages) of rows staged in shared memory: one and two rows ahead,
# a tail vector (20000 = 2 x 8192 + 3616), float32.
STAGED_ROWS = [(32768, torch.bfloat16, 32, 1), (32768, torch.bfloat16, 32, 2), (20000, torch.bfloat16, 32, 1),
               (16384, torch.float32, 16, 1)]


@pytest.mark.parametrize("N, dtype, per_thread, stages", STAGED_ROWS, ids=str)
def test_rms_norm_fwd_staged_rows(N, dtype, per_thread, stages):
    """Each block takes rows b, b + blocks, ...: one row, about one a block, several a block with
    a ragged last turn, strided rows, and a zero row (its output is zero)."""
    from tileops.kernels.norm.rms_norm import STAGED, RMSNormFwdKernel
    from tileops.ops import RMSNormFwdOp

    op = RMSNormFwdOp(N=N, dtype=dtype, eps=1e-5)
    kernel = RMSNormFwdKernel(N, dtype, eps=1e-5, config={"per_thread": per_thread, "row_stages": stages})
    assert kernel.row_program(1 << 40) == STAGED
    weight = torch.randn(N, device="cuda", dtype=dtype)
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    for rows in (1, sm_count + 1, 5 * sm_count - 7):
        x = torch.randn(rows, N + 8, device="cuda", dtype=dtype)[:, :N]
        x[-1] = 0
        out = torch.full((rows, N), float("nan"), device="cuda", dtype=dtype)
        kernel(x, weight, out)
        assert_close(out, op.reference(x.double(), weight.double()), dtype)
