"""The functional forms' ``dtype`` keyword: the result as if the input were cast to it before the
op, as PyTorch documents for ``softmax``, ``log_softmax``, ``cumsum``, ``cumprod``, ``sum``, ``mean``
and (widening) ``torch.linalg.vector_norm``."""

import inspect
from typing import Callable, Dict, Optional, Tuple

import pytest
import torch

import tileops.functional as F
from tests.op_checks import assert_close, coarsest

def _vector_norm(x: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``torch.linalg.vector_norm`` over the last axis; a narrowing ``dtype``, which it refuses,
    casts ``x`` first, as ``tileops.functional.l2_norm`` does."""
    if dtype is not None and torch.promote_types(x.dtype, dtype) != dtype:
        x, dtype = x.to(dtype), None
    return torch.linalg.vector_norm(x, 2, -1, dtype=dtype)


# name -> (tileops call, PyTorch call), both given x and an optional dtype keyword.
FUNCTIONS: Dict[str, Tuple[Callable, Callable]] = {
    "softmax": (lambda x, **k: F.softmax(x, 1, **k), lambda x, **k: torch.softmax(x, 1, **k)),
    "log_softmax": (lambda x, **k: F.log_softmax(x, -1, **k), lambda x, **k: torch.log_softmax(x, -1, **k)),
    "cumsum": (lambda x, **k: F.cumsum(x, 0, **k), lambda x, **k: torch.cumsum(x, 0, **k)),
    "cumprod": (lambda x, **k: F.cumprod(x, -1, **k), lambda x, **k: torch.cumprod(x, -1, **k)),
    "sum": (lambda x, **k: F.sum(x, 1, **k), lambda x, **k: torch.sum(x, 1, **k)),
    "mean": (lambda x, **k: F.mean(x, (0, 2), **k), lambda x, **k: torch.mean(x, (0, 2), **k)),
    "l2_norm": (lambda x, **k: F.l2_norm(x, -1, **k), _vector_norm),
}
CASTS = [(torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.float32, torch.bfloat16),
         (torch.bfloat16, torch.float16), (torch.float32, torch.float32)]


def _input(dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Near 1 so that cumprod's products stay in range over the 37-long rows.
    x = 1 + 0.05 * torch.randn(3, 5, 37, generator=generator)
    return x.to(device=device, dtype=dtype)


def check_cast_then_op(name: str, source: torch.dtype, target: torch.dtype, device: str) -> None:
    """Forward and gradient of ``name`` with ``dtype=target`` over a ``source`` input against the op's
    semantics in float64 (the input cast to ``target`` first), and the output against PyTorch's own
    ``dtype=`` call."""
    ours, pytorch = FUNCTIONS[name]
    x = _input(source, device).requires_grad_()
    y = ours(x, dtype=target)
    assert y.dtype == target
    cast = x.detach().to(target).double().requires_grad_()
    expected = pytorch(cast)
    assert_close(y, expected, target)
    # PyTorch's own call, up to its own error: on an H200 its bfloat16 cumprod over these rows came
    # out 0.039 from the kernel's result, which was within bfloat16's tolerance of float64.
    own = pytorch(x.detach(), dtype=target)
    assert_close(y, own, coarsest(source, target), slack=(own.double() - expected).abs().max().item())

    # A positive incoming gradient: derivative formulas run in their tensors' dtype (here ``target``),
    # and the reversed sums of cumprod's over gradients of either sign cancel, leaving results far
    # below the rounding error of their terms; what this checks is where the cast and the gradient go.
    grad = (0.5 + torch.rand(y.shape, generator=torch.Generator().manual_seed(1))).to(device=device, dtype=target)
    (gx,) = torch.autograd.grad(y, x, grad)
    (expected_gx,) = torch.autograd.grad(expected, cast, grad.double())
    assert gx.dtype == source
    assert_close(gx, expected_gx, coarsest(source, target))


@pytest.mark.parametrize("source, target", CASTS, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_dtype_casts_the_input_before_the_op(name: str, source: torch.dtype, target: torch.dtype) -> None:
    check_cast_then_op(name, source, target, "cpu")


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_no_dtype_or_the_input_s_own_leaves_the_input_as_it_is(name: str) -> None:
    ours, _ = FUNCTIONS[name]
    x = _input(torch.bfloat16, "cpu")
    plain = ours(x)
    assert plain.dtype == torch.bfloat16
    assert torch.equal(ours(x, dtype=torch.bfloat16), plain)
    assert torch.equal(ours(x, dtype=None), plain)


def test_dtype_takes_only_a_dtype_the_op_takes_and_only_by_keyword() -> None:
    x = _input(torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match=r"SoftmaxFwdOp: out_dtype \(the functional form's dtype\) must be one "
                                         r"of float16, bfloat16, float32 \(the dtypes its input takes\), got "
                                         r"torch.float64"):
        F.softmax(x, dtype=torch.float64)
    with pytest.raises(ValueError, match="LogSoftmaxFwdOp: out_dtype .* must be one of .* got torch.int64"):
        F.log_softmax(x, dtype=torch.int64)
    # A name is taken too (as the manifest's workloads give it), for a dtype the op takes.
    assert F.cumsum(x, 0, dtype="float32").dtype == torch.float32
    with pytest.raises(TypeError, match=r"CumsumFwdOp: out_dtype must be a torch.dtype, the name of a floating-point "
                                        r"one, or None, got 'half' \(str\)"):
        F.cumsum(x, 0, dtype="half")
    with pytest.raises(TypeError, match="positional"):
        F.softmax(x, -1, torch.float32)
    with pytest.raises(TypeError, match="CumprodFwdOp: x must be a torch.Tensor, got float"):
        F.cumprod(1.0, 0, dtype=torch.float32)


def test_l2_norm_casts_first_where_torch_refuses_a_narrowing_dtype() -> None:
    x = _input(torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="narrowing"):
        torch.linalg.vector_norm(x, dim=-1, dtype=torch.bfloat16)
    y = F.l2_norm(x, -1, dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, torch.linalg.vector_norm(x.to(torch.bfloat16), dim=-1))


def test_the_softmaxes_scans_and_sums_alone_take_dtype_by_keyword() -> None:
    taking = {name for name in F.__all__ if "dtype" in inspect.signature(getattr(F, name)).parameters}
    assert taking == set(FUNCTIONS)
    for name in taking:
        parameter = inspect.signature(getattr(F, name)).parameters["dtype"]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default is None


@pytest.mark.parametrize("dynamic", [False, True])
def test_dtype_traces_without_graph_breaks(dynamic: bool) -> None:
    torch._dynamo.reset()

    def attention_weights(scores: torch.Tensor) -> torch.Tensor:
        return F.softmax(scores, -1, dtype=torch.float32).to(scores.dtype) + F.cumsum(scores, 0, dtype=torch.float32)

    compiled = torch.compile(attention_weights, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for rows in (4, 7):
        scores = torch.randn(rows, 33, dtype=torch.bfloat16)
        expected = attention_weights(scores)
        got = compiled(scores)
        assert got.dtype == expected.dtype == torch.float32
        torch.testing.assert_close(got, expected)


def check_compiled_training(name: str, device: str, backend: str) -> None:
    """Forward and backward of a float32 output of a bf16 input traced by torch.compile: the
    custom ops' fake functions give the dtypes the eager calls give (the Bwd op's ``out_dtype``
    included), and the gradient reaches the input in bf16, as in eager."""
    torch._dynamo.reset()
    ours, _ = FUNCTIONS[name]

    def loss(x: torch.Tensor) -> torch.Tensor:
        y = ours(x, dtype=torch.float32)
        return (y * torch.linspace(0.5, 1.5, y.numel(), device=y.device).view(y.shape)).sum()

    compiled = torch.compile(loss, fullgraph=True, backend=backend)
    x = _input(torch.bfloat16, device).requires_grad_()
    (expected,) = torch.autograd.grad(loss(x), x)
    (got,) = torch.autograd.grad(compiled(x), x)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_a_float32_output_trains_through_a_compiled_graph(name: str) -> None:
    check_compiled_training(name, "cpu", "aot_eager")


def test_a_float32_output_exports_and_loads(tmp_path) -> None:
    """torch.export records the custom ops with their ``out_dtype`` (a ``ScalarType?``), and the
    saved program loads and runs."""

    class Weights(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.softmax(x, -1, dtype=torch.float32) + F.cumsum(x, 0, dtype=torch.float32)

    x = torch.randn(4, 33, dtype=torch.bfloat16)
    program = torch.export.export(Weights(), (x,))
    assert {str(n.target) for n in program.graph.nodes if n.op == "call_function"} >= {
        "tileops.softmax_fwd.default", "tileops.cumsum_fwd.default"}
    torch.export.save(program, tmp_path / "weights.pt2")
    got = torch.export.load(tmp_path / "weights.pt2").module()(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, Weights()(x))
