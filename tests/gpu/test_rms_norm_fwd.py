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
