"""What an op given ``out_dtype`` asks of its kernels (no GPU needed): which change of dtype a
kernel writes itself, which casts the input first, and the kernels' checks and access widths."""

import pytest
import torch

from tileops.kernels.scan.cumsum import CumsumBwdKernel, CumsumFwdKernel
from tileops.kernels.softmax.softmax import SoftmaxBwdKernel, SoftmaxFwdKernel
from tileops.ops import CumsumBwdOp, L2NormFwdOp, SoftmaxBwdOp, SoftmaxFwdOp, SumFwdOp

HALF = (torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_forward_widening_half_precision_reads_the_input_as_it_is(dtype: torch.dtype) -> None:
    op = SoftmaxFwdOp(N=64, dtype=dtype, out_dtype=torch.float32)
    assert op._kernel_dtypes() == (None, torch.float32)
    assert op._kernel_dtype_args() == {"dtype": dtype, "out_dtype": torch.float32}
    for reduction in (SumFwdOp, L2NormFwdOp):
        assert reduction(dtype=dtype, out_dtype=torch.float32)._kernel_dtypes() == (None, torch.float32)


@pytest.mark.parametrize("dtype, out_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16),
                                              (torch.float32, torch.float16)], ids=str)
def test_any_other_forward_change_of_dtype_casts_the_input_first(dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    op = SoftmaxFwdOp(N=64, dtype=dtype, out_dtype=out_dtype)
    assert op._kernel_dtypes() == (out_dtype, out_dtype)
    assert op._kernel_dtype_args() == {"dtype": out_dtype}


@pytest.mark.parametrize("dtype, out_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
                                              (torch.float16, torch.bfloat16)], ids=str)
def test_a_backward_rounds_its_result_to_out_dtype(dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    for cls in (SoftmaxBwdOp, CumsumBwdOp):
        assert cls(N=64, dtype=dtype, out_dtype=out_dtype)._kernel_dtypes() == (None, out_dtype)


def test_no_out_dtype_or_the_input_s_own_changes_nothing() -> None:
    for out_dtype in (None, torch.bfloat16):
        op = SoftmaxFwdOp(N=64, dtype=torch.bfloat16, out_dtype=out_dtype)
        assert op._kernel_dtypes() == (None, torch.bfloat16)
        assert op._kernel_dtype_args() == {"dtype": torch.bfloat16}


def test_the_forward_builds_its_backward_for_the_output_and_the_input_dtypes() -> None:
    widened = SoftmaxFwdOp(N=64, dtype=torch.bfloat16, out_dtype=torch.float32).backward_op()
    assert (widened.dtype, widened.out_dtype) == (torch.float32, torch.bfloat16)
    plain = SoftmaxFwdOp(N=64, dtype=torch.bfloat16).backward_op()
    assert (plain.dtype, plain.out_dtype) == (torch.bfloat16, None)


def test_kernels_refuse_a_change_of_dtype_they_do_not_fuse() -> None:
    with pytest.raises(TypeError, match="out_dtype must be torch.float32 or, for float16 and bfloat16 inputs, float32"):
        SoftmaxFwdKernel(64, torch.float32, out_dtype=torch.bfloat16, config={})
    with pytest.raises(TypeError, match="CumsumFwdKernel: out_dtype must be"):
        CumsumFwdKernel(64, torch.bfloat16, out_dtype=torch.float16, config={})
    # A gradient is rounded to whichever dtype its input had.
    assert SoftmaxBwdKernel(64, torch.float32, out_dtype=torch.bfloat16, config={}).result_dtype == torch.bfloat16
    assert CumsumBwdKernel(64, torch.float32, out_dtype=torch.float16, config={}).result_dtype == torch.float16


def test_a_float32_output_of_half_precision_rows_takes_16_byte_stores() -> None:
    """The softmax kernels' accesses are 16 bytes of the wider dtype: four elements, not eight."""
    plain = SoftmaxFwdKernel(4096, torch.bfloat16, config={})
    widened = SoftmaxFwdKernel(4096, torch.bfloat16, out_dtype=torch.float32, config={})
    assert (plain._row_vector, widened._row_vector) == (8, 4)
    assert widened.static_signature()["out_dtype"] == "float32" and "out_dtype" not in plain.static_signature()
