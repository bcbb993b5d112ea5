"""CumsumBwdOp and CumprodFwdOp on the GPU, against float64 PyTorch.

* Both ops over their manifest cases (workloads, odd sizes, ranks 1-4, every
  dim, non-contiguous views, empty tensors) against the manifest reference.
* The cumsum gradient against ``torch.autograd`` of ``torch.cumsum`` in
  float64: the Bwd op called directly, and through autograd of CumsumFwdOp,
  for lengths 1 to 262144 along every dim of contiguous and strided tensors.
* Cumprod precision on long axes.  Products of many random normals shrink
  to zero within a few hundred elements, so the manifest cases check little
  past the first ones; here inputs are ``1 + s * randn`` with ``s`` small
  enough (at most 0.01, ``1 / sqrt(N)`` for long axes) that the products stay
  within a few e-folds of 1, and every element is held to a relative bound:
  the dtype's tolerance plus float32 rounding accumulated over the product
  (``4 * sqrt(N) * 2**-24``).  bfloat16 keeps ``s = 0.01`` (see ``_spread``).
"""

from __future__ import annotations

import math
from typing import Tuple

import pytest
import torch

from tests.op_checks import TOLERANCE, assert_close, build_op, check_against_reference, manifest_cases

pytestmark = pytest.mark.gpu

LENGTHS = (1, 3, 127, 4097, 65537, 262144)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FLOAT32_UNIT = 2.0**-24


def axis_shape(length: int, dim: int) -> Tuple[int, ...]:
    """The rank-3 shape the every-dim tests use: ``length`` along ``dim``, 2 and 3 elsewhere."""
    shape = [2, 3, 2]
    shape[dim % 3] = length
    return tuple(shape)


def _axis_tensor(length: int, dim: int, layout: str, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """A rank-3 CUDA tensor whose axis ``dim`` has ``length`` elements (the others 2 and 3), laid out as asked.

    ``permuted``: a permutation of a contiguous tensor; ``strided``: every other
    element of a twice-as-wide buffer along the last axis.
    """
    shape = list(axis_shape(length, dim))
    if layout == "permuted":
        base = torch.randn(shape[::-1], generator=generator, dtype=torch.float64)
        value = base.permute(2, 1, 0)
    elif layout == "strided":
        base = torch.randn(*shape[:-1], 2 * shape[-1], generator=generator, dtype=torch.float64)
        value = base[..., ::2]
    else:
        value = torch.randn(shape, generator=generator, dtype=torch.float64)
    return value.to(device="cuda", dtype=dtype) if layout == "contiguous" else _same_layout_on_gpu(value, dtype)


def _same_layout_on_gpu(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``value`` on the GPU with its strides kept (a plain ``.to`` may make it contiguous)."""
    storage = torch.empty_strided(value.shape, value.stride(), device="cuda", dtype=dtype)
    storage.copy_(value)
    return storage


def _autograd_of_cumsum(grad_y: torch.Tensor, dim: int) -> torch.Tensor:
    """What torch.autograd gives for ``cumsum(x, dim)`` under the output gradient ``grad_y`` (float64)."""
    x = torch.zeros(grad_y.shape, dtype=torch.float64, requires_grad=True)
    torch.cumsum(x, dim).backward(grad_y.double().cpu())
    return x.grad


# ---- manifest cases ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", manifest_cases("CumsumBwdOp"), ids=str)
def test_cumsum_bwd_matches_reference(case) -> None:
    check_against_reference(case, device="cuda")
    assert build_op(case).last_backend == "kernel"


@pytest.mark.parametrize("case", manifest_cases("CumprodFwdOp"), ids=str)
def test_cumprod_fwd_matches_reference(case) -> None:
    check_against_reference(case, device="cuda")
    assert build_op(case).last_backend == "kernel"


# ---- the cumsum gradient -------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["contiguous", "permuted", "strided"])
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("length", LENGTHS)
def test_cumsum_bwd_is_the_autograd_of_cumsum(length: int, dim: int, layout: str) -> None:
    from tileops.ops import CumsumBwdOp

    generator = torch.Generator().manual_seed(length + 7 * dim)
    grad_y = _axis_tensor(length, dim, layout, torch.float32, generator)
    op = CumsumBwdOp(N=length, dtype=torch.float32, dim=dim)
    grad_x = op(grad_y)
    assert op.last_backend == "kernel" and grad_x.shape == grad_y.shape
    assert_close(grad_x, _autograd_of_cumsum(grad_y, dim), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("length", LENGTHS)
def test_cumsum_bwd_rows_every_dtype(dtype: torch.dtype, length: int) -> None:
    from tileops.ops import CumsumBwdOp

    op = CumsumBwdOp(N=length, dtype=dtype, dim=-1)
    for rows in (1, 5, 300):
        grad_y = torch.randn(rows, length, device="cuda", dtype=dtype)
        assert_close(op(grad_y), _autograd_of_cumsum(grad_y, -1), dtype)


@pytest.mark.parametrize("layout", ["contiguous", "permuted", "strided"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_gradient_through_autograd(dim: int, layout: str) -> None:
    """x.grad of CumsumFwdOp comes from the Bwd kernel and equals float64 autograd of torch.cumsum."""
    from tileops.ops import CumsumFwdOp

    generator = torch.Generator().manual_seed(11)
    x = _axis_tensor(4097, dim, layout, torch.float32, generator).requires_grad_()
    grad_y = _axis_tensor(4097, dim, layout, torch.float32, generator)
    op = CumsumFwdOp(N=4097, dtype=torch.float32, dim=dim)
    op(x).backward(grad_y)
    assert op.backward_op().last_backend == "kernel"
    assert_close(x.grad, _autograd_of_cumsum(grad_y, dim), torch.float32)


@pytest.mark.parametrize("op_name", ["CumsumFwdOp", "CumsumBwdOp", "CumprodFwdOp"])
@pytest.mark.parametrize("length", [3, 4097])
def test_first_axis_of_a_single_column(op_name: str, length: int) -> None:
    """(N, 1) along dim 0 is one row of N elements, not N rows."""
    import tileops.ops

    op = getattr(tileops.ops, op_name)(N=length, dtype=torch.float32, dim=0)
    x = 1 + 0.01 * torch.randn(length, 1, device="cuda")
    assert_close(op(x), op.reference(x.double()), torch.float32)


def test_cumsum_gradient_under_torch_compile() -> None:
    import tileops.functional as F

    torch._dynamo.reset()
    x = torch.randn(9, 333, device="cuda", requires_grad=True)
    # aot_eager traces the custom ops' autograd as inductor would, without its compile time.
    compiled = torch.compile(lambda t: (F.cumsum(t, 1) ** 2).sum(), fullgraph=True, backend="aot_eager")
    compiled(x).backward()
    expected = torch.zeros_like(x, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        expected.copy_(x.double())
    (torch.cumsum(expected, 1) ** 2).sum().backward()
    assert_close(x.grad, expected.grad, torch.float32)


@pytest.mark.big_memory
def test_cumsum_bwd_over_2_31_elements() -> None:
    from tileops.ops import CumsumBwdOp

    N = 4096
    rows = 2**31 // N + 1
    op = CumsumBwdOp(N=N, dtype=torch.bfloat16, dim=-1)
    grad_y = torch.randn(rows, N, device="cuda", dtype=torch.bfloat16)
    grad_x = op(grad_y)
    torch.cuda.synchronize()
    for row in (0, rows // 2, rows - 1):
        assert_close(grad_x[row], _autograd_of_cumsum(grad_y[row], -1), torch.bfloat16)
    del grad_y, grad_x
    torch.cuda.empty_cache()


# ---- cumprod precision ---------------------------------------------------------------------------


def _spread(length: int, dtype: torch.dtype) -> float:
    """How far from 1 the inputs stray.

    Small for long axes, so that float16 products stay in its range; but
    bfloat16 keeps 0.01, because a narrower spread rounds most inputs to 1 and
    the rest mostly down (its spacing below 1 is half that above), a bias
    that underflows a product of 262144 of them.
    """
    if dtype == torch.bfloat16:
        return 0.01
    return min(0.01, 1 / math.sqrt(length))


def _near_one(shape: Tuple[int, ...], length: int, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    return (1 + _spread(length, dtype) * torch.randn(shape, generator=generator, dtype=torch.float64)).to(dtype)


def _assert_relative(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, length: int) -> None:
    out = out.double().cpu()
    assert not torch.isnan(out).any(), "output has NaN (unwritten or wrong)"
    bound = TOLERANCE[dtype] + 4 * math.sqrt(length) * FLOAT32_UNIT
    error = ((out - expected).abs() / expected.abs()).max().item()
    assert error <= bound, f"max relative error {error:.3g} over {bound:.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("length", LENGTHS)
def test_cumprod_long_rows_near_one(dtype: torch.dtype, length: int) -> None:
    from tileops.ops import CumprodFwdOp

    op = CumprodFwdOp(N=length, dtype=dtype, dim=-1)
    for rows in (1, 5, 300):
        x = _near_one((rows, length), length, dtype, torch.Generator().manual_seed(rows))
        _assert_relative(op(x.cuda()), torch.cumprod(x.double(), -1), dtype, length)


@pytest.mark.parametrize("layout", ["contiguous", "permuted", "strided"])
@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("length", [3, 127, 4097, 65537])
def test_cumprod_every_dim_near_one(length: int, dim: int, layout: str) -> None:
    from tileops.ops import CumprodFwdOp

    generator = torch.Generator().manual_seed(3 * length + dim)
    noise = _axis_tensor(length, dim, layout, torch.float32, generator)
    x = noise.mul_(_spread(length, torch.float32)).add_(1)  # in place: keeps the layout
    op = CumprodFwdOp(N=length, dtype=torch.float32, dim=dim)
    _assert_relative(op(x), torch.cumprod(x.double().cpu(), dim), torch.float32, length)
