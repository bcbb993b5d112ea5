"""CumsumFwdOp on the GPU against its manifest reference (float64)."""

import pytest
import torch

from tests.op_checks import assert_close, build_op, check_against_reference, manifest_cases

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", manifest_cases("CumsumFwdOp"), ids=str)
def test_cumsum_fwd_matches_reference(case):
    check_against_reference(case, device="cuda")
    assert build_op(case).last_backend == "kernel"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("length", [1, 3, 127, 4097, 65537, 262144])
def test_cumsum_fwd_long_and_odd_rows(dtype, length):
    from tileops.ops import CumsumFwdOp

    op = CumsumFwdOp(N=length, dtype=dtype, dim=-1)
    for rows in (1, 5):
        x = torch.randn(rows, length, device="cuda", dtype=dtype)
        assert_close(op(x), op.reference(x.double()), dtype)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cumsum_fwd_every_dim_of_a_permuted_view(dim):
    from tileops.ops import CumsumFwdOp

    x = torch.randn(6, 33, 10, device="cuda", dtype=torch.float32).permute(2, 0, 1)  # (10, 6, 33), strided
    op = CumsumFwdOp(N=x.shape[dim], dtype=torch.float32, dim=dim)
    assert_close(op(x), op.reference(x.double()), torch.float32)
