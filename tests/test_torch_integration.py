"""torch.library registration, fake functions, autograd wiring, compile and the functional API (CPU)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tileops.functional as F
from codegen import load_manifest
from tests.op_checks import build_op, make_inputs, manifest_cases
from tileops.ops.op_base import SHARED_INSTANCE

MANIFEST = load_manifest()
FWD_OPS = [op for op in MANIFEST.ops if op.direction == "Fwd"]


def library_op(op_name: str):
    return getattr(torch.ops.tileops, MANIFEST.op(op_name).custom_op_name.split("::")[1]).default


def library_args(op, case, tensors):
    params = dict(case.params)
    values = [params.get(p.name, p.default) for p in op.params]
    return (*tensors, *values, SHARED_INSTANCE)


@pytest.mark.parametrize("spec", MANIFEST.ops, ids=lambda s: s.name)
def test_every_op_is_a_registered_custom_op(spec) -> None:
    schema = str(library_op(spec.name)._schema)
    assert schema.startswith(spec.custom_op_name + "(")
    for name in spec.input_names + spec.param_names:
        assert f" {name}" in schema


@pytest.mark.parametrize("spec", MANIFEST.ops, ids=lambda s: s.name)
def test_opcheck_schema_and_fake(spec) -> None:
    case = manifest_cases(spec.name, max_numel=1 << 12)[-2]
    tensors = make_inputs(spec, case, "cpu", torch.Generator().manual_seed(0))
    torch.library.opcheck(library_op(spec.name), library_args(spec, case, tensors),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("spec", MANIFEST.ops, ids=lambda s: s.name)
def test_fake_functions_give_shapes_and_dtypes_of_the_rules(spec) -> None:
    # Every rank and size the CPU cases cover, each dtype; shapes come from the rules, dtypes
    # from the reference run on the same (small) inputs.
    for case in manifest_cases(spec.name, max_numel=1 << 12):
        op = build_op(case)
        real = make_inputs(spec, case, "cpu", torch.Generator().manual_seed(1))
        expected = op._infer_output_shapes(*(tuple(t.shape) for t in real))
        references = op.reference(*real)
        references = references if isinstance(references, tuple) else (references,)
        with FakeTensorMode() as mode:
            fakes = [mode.from_tensor(t) for t in real]
            outputs = library_op(spec.name)(*library_args(spec, case, fakes))
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        for tensor, out, ref in zip(spec.outputs, outputs, references):
            assert tuple(out.shape) == expected[tensor.name], case
            assert out.dtype == ref.dtype, case


def test_fake_function_reports_the_violated_rule() -> None:
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(4, 3))
        with pytest.raises(ValueError, match=r"shape rule `-x.ndim <= dim < x.ndim`"):
            library_op("CumsumFwdOp")(x, 5, SHARED_INSTANCE)


def test_eager_calls_skip_the_dispatcher(monkeypatch: pytest.MonkeyPatch) -> None:
    from tileops.ops import CumsumFwdOp

    op = CumsumFwdOp(N=5, dtype=torch.float32)
    calls = []
    monkeypatch.setattr(CumsumFwdOp, "_library_call", lambda self, *a: calls.append(a) or torch.zeros(1))
    op(torch.randn(2, 5))
    assert calls == []
    op(torch.randn(2, 5, requires_grad=True))  # autograd must record it: through the custom op
    assert len(calls) == 1


def test_module_compiles_fullgraph_and_matches_eager() -> None:
    from tileops.ops import CumsumFwdOp, RMSNormFwdOp

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(16))
            self.norm = RMSNormFwdOp(N=16, dtype=torch.float32)
            self.scan = CumsumFwdOp(N=16, dtype=torch.float32, dim=-1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.scan(self.norm(x, self.weight)) + x

    block = Block()
    x = torch.randn(3, 7, 16)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), block(x))


def test_functional_api_matches_reference_and_compiles() -> None:
    x, w = torch.randn(6, 32), torch.randn(32)
    torch.testing.assert_close(F.rms_norm(x, w, eps=1e-5), torch.nn.functional.rms_norm(x, (32,), w, 1e-5))
    torch.testing.assert_close(F.cumsum(x, 0), torch.cumsum(x, 0))
    compiled = torch.compile(lambda a, b: F.cumsum(F.rms_norm(a, b), 1), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, w), torch.cumsum(torch.nn.functional.rms_norm(x, (32,), w, 1e-6), 1))


def test_functional_cross_entropy_returns_the_loss_alone_as_torch_does() -> None:
    # lse is an output of CrossEntropyFwdOp kept for the backward (``saved`` in the manifest).
    logits = torch.randn(9, 33, requires_grad=True)
    target = torch.randint(0, 33, (9,))
    target[2] = -100
    loss = F.cross_entropy(logits, target, label_smoothing=0.1)
    expected = torch.nn.functional.cross_entropy(logits, target, label_smoothing=0.1)
    assert isinstance(loss, torch.Tensor) and loss.shape == ()
    torch.testing.assert_close(loss, expected)
    (grad,) = torch.autograd.grad(loss, logits)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    torch.testing.assert_close(grad, expected_grad)
    compiled = torch.compile(lambda a, b: F.cross_entropy(a, b, reduction="none"), fullgraph=True,
                             backend="aot_eager")
    torch.testing.assert_close(compiled(logits, target),
                               torch.nn.functional.cross_entropy(logits, target, reduction="none"))


def test_functional_api_shares_instances_by_static_configuration() -> None:
    from tileops.ops import CumsumFwdOp

    a = CumsumFwdOp.shared(N=7, dtype=torch.float32, dim=1)
    assert a is CumsumFwdOp.shared(N=7, dtype=torch.float32, dim=1)
    assert a is not CumsumFwdOp.shared(N=7, dtype=torch.float32, dim=0)


def test_gradient_of_an_op_without_backward_is_a_clear_error() -> None:
    spec = [op for op in FWD_OPS if op.backward is None]
    if not spec:
        pytest.skip("every Fwd op has a backward")
    case = manifest_cases(spec[0].name, max_numel=1 << 12)[-2]
    x = make_inputs(spec[0], case, "cpu", torch.Generator().manual_seed(0))
    x = [t.requires_grad_() for t in x]
    op = build_op(case)
    out = op(*x)
    with pytest.raises(RuntimeError, match=f"{spec[0].name} has no backward"):
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    # Inference under torch.compile with inputs that require grad still compiles.
    compiled = torch.compile(lambda *t: op(*t), fullgraph=True, backend="aot_eager")
    compiled(*x)


@pytest.mark.parametrize("spec", [op for op in FWD_OPS if op.backward is not None], ids=lambda s: s.name)
def test_backward_matches_autograd_of_the_reference(spec) -> None:
    for case in manifest_cases(spec.name, dtypes=["float32"], max_numel=1 << 12)[-6:]:
        op = build_op(case)
        # Integer inputs (class indices) are not differentiable: they pass through unchanged.
        inputs = [t.double().requires_grad_() if t.is_floating_point() else t
                  for t in make_inputs(spec, case, "cpu", torch.Generator().manual_seed(2))]
        ours = [t.detach().float().requires_grad_() if t.is_floating_point() else t for t in inputs]
        expected = op.reference(*inputs)
        got = op(*ours)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        seeds = [torch.randn_like(e) for e in expected]
        sum(((e * s).sum() for e, s in zip(expected, seeds))).backward()
        sum(((g * s.float()).sum() for g, s in zip(got, seeds))).backward()
        for mine, theirs in zip(ours, inputs):
            if not theirs.is_floating_point():
                continue
            torch.testing.assert_close(mine.grad.double(), theirs.grad, rtol=1e-4, atol=1e-4)


def test_absent_optional_inputs_get_no_gradient() -> None:
    from tileops.ops import LayerNormFwdOp

    x = torch.randn(3, 8, requires_grad=True)
    weight = torch.randn(8, requires_grad=True)
    # Straight through the custom op: autograd must get no gradient for the absent bias.
    out = LayerNormFwdOp(N=8, dtype=torch.float32)._library_call(x, weight, None)
    out.square().sum().backward()
    expected_x = x.detach().clone().requires_grad_()
    expected_w = weight.detach().clone().requires_grad_()
    torch.nn.functional.layer_norm(expected_x, (8,), expected_w, None, 1e-5).square().sum().backward()
    torch.testing.assert_close(x.grad, expected_x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(weight.grad, expected_w.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("with_weight, with_bias", [(False, False), (True, False), (False, True), (True, True)])
def test_layer_norm_gradients_with_any_affine(with_weight: bool, with_bias: bool) -> None:
    from tileops.ops import LayerNormFwdOp

    x = torch.randn(3, 8, requires_grad=True)
    weight = torch.randn(8, requires_grad=True) if with_weight else None
    bias = torch.randn(8, requires_grad=True) if with_bias else None
    LayerNormFwdOp(N=8, dtype=torch.float32)(x, weight, bias).square().sum().backward()
    ours = [t for t in (x, weight, bias) if t is not None]
    theirs = [t.detach().clone().requires_grad_() for t in ours]
    named = dict(zip([n for n, t in (("x", x), ("weight", weight), ("bias", bias)) if t is not None], theirs))
    torch.nn.functional.layer_norm(named["x"], (8,), named.get("weight"), named.get("bias")).square().sum().backward()
    for mine, expected in zip(ours, theirs):
        torch.testing.assert_close(mine.grad, expected.grad, rtol=1e-4, atol=1e-5)
