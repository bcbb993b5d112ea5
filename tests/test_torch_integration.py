"""torch.library registration, fake functions, autograd wiring, compile and the functional API (CPU)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import List

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
        with pytest.raises(ValueError, match=r"shape rule `-max\(x.ndim, 1\) <= dim < max\(x.ndim, 1\)`"):
            library_op("CumsumFwdOp")(x, 5, None, SHARED_INSTANCE)


def test_eager_calls_skip_the_dispatcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager calls, recorded by autograd or not, never pay the custom op's dispatch; its
    autograd functions serve the eager backward too (through the op's autograd.Function)."""
    from tileops.ops import CumsumFwdOp

    op = CumsumFwdOp(N=5, dtype=torch.float32)
    calls = []
    monkeypatch.setattr(CumsumFwdOp, "_library_call", lambda self, *a, **k: calls.append(a) or torch.zeros(1))
    monkeypatch.setattr(type(op.backward_op()), "_library_call", lambda self, *a, **k: calls.append(a))
    op(torch.randn(2, 5))
    x = torch.randn(2, 5, requires_grad=True)
    y = op(x)
    assert type(y.grad_fn).__name__ == "CumsumFwdOpAutogradBackward"
    y.backward(torch.arange(10.0).view(2, 5))
    assert calls == []
    torch.testing.assert_close(x.grad, torch.arange(10.0).view(2, 5).flip(-1).cumsum(-1).flip(-1))


def test_custom_op_calls_no_gradient_follows_skip_the_redispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiled graph calls the custom ops on plain tensors with nothing to record: those calls
    run the op's kernel from the autograd kernel itself.  A call autograd records, or one on
    fake tensors, still redispatches below autograd as torch's registration does."""
    redispatched = []
    original = torch._ops.OpOverload.redispatch
    monkeypatch.setattr(torch._ops.OpOverload, "redispatch",
                        lambda self, *args, **kwargs: redispatched.append(self) or original(self, *args, **kwargs))
    cumsum = library_op("CumsumFwdOp")
    x = torch.randn(3, 5)
    torch.testing.assert_close(cumsum(x, -1, None, SHARED_INSTANCE), x.cumsum(-1))
    with torch.no_grad():
        cumsum(x.clone().requires_grad_(), -1, None, SHARED_INSTANCE)
    assert redispatched == []

    leaf = x.clone().requires_grad_()
    cumsum(leaf, -1, None, SHARED_INSTANCE).backward(torch.ones(3, 5))
    torch.testing.assert_close(leaf.grad, torch.arange(5.0, 0.0, -1.0).expand(3, 5))
    assert cumsum in redispatched
    redispatched.clear()
    with FakeTensorMode() as mode:
        fake = cumsum(mode.from_tensor(x), -1, None, SHARED_INSTANCE)
    assert fake.shape == (3, 5) and redispatched == [cumsum]


def test_only_plain_cpu_and_cuda_keysets_reach_the_kernel_directly() -> None:
    from tileops.ops.op_base import _reaches_backend_directly

    def direct(tensor: torch.Tensor) -> bool:
        return _reaches_backend_directly(torch._C._dispatch_keys(tensor).raw_repr())

    assert direct(torch.randn(2)) and direct(torch.randn(2, requires_grad=True))
    assert not direct(torch.randn(2, device="meta"))
    assert not direct(torch.randn(2, dtype=torch.complex64).conj())  # a conjugate view is resolved first
    with FakeTensorMode() as mode:
        assert not direct(mode.from_tensor(torch.randn(2)))
    # The keys a CUDA tensor carries (this host may have no GPU to make one).
    keys = torch._C.DispatchKey
    cuda = torch._C.DispatchKeySet(keys.CUDA)
    for key in (keys.AutogradCUDA, keys.ADInplaceOrView, keys.AutocastCUDA):
        cuda = cuda.add(key)
    assert _reaches_backend_directly(cuda.raw_repr())
    assert not _reaches_backend_directly(cuda.add(keys.Python).raw_repr())


@pytest.mark.parametrize("spec", MANIFEST.ops, ids=lambda s: s.name)
def test_an_op_copies_and_pickles_with_its_configuration(spec) -> None:
    """deepcopy, pickle and torch.save keep static dims, dtype and params; the copy compiles its
    own kernels and gets its own handle (its autograd and compiled graphs name the copy)."""
    import io
    import pickle

    case = manifest_cases(spec.name, dtypes=["float32"], max_numel=1 << 10)[0]
    op = build_op(case)
    inputs = make_inputs(spec, case, "cpu", torch.Generator().manual_seed(1))
    expected = op(*inputs)
    saved = io.BytesIO()
    torch.save(op, saved)
    saved.seek(0)
    copies = [copy.deepcopy(op), pickle.loads(pickle.dumps(op)), torch.load(saved, weights_only=False)]
    for twin in copies:
        assert type(twin) is type(op) and twin.extra_repr() == op.extra_repr()
        assert twin._handle != op._handle and type(twin).from_handle(twin._handle) is twin
        got = twin(*inputs)
        for mine, theirs in zip(got if isinstance(got, tuple) else (got,),
                                expected if isinstance(expected, tuple) else (expected,)):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0, equal_nan=True)


class _Normed(torch.nn.Module):
    """A model's block: a weight of its own and an RMSNorm op over 16 features."""

    def __init__(self, **op_args) -> None:
        from tileops.ops import RMSNormFwdOp

        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16))
        self.norm = RMSNormFwdOp(N=16, dtype=torch.float32, eps=1e-3, **op_args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x, self.weight)


def test_a_copied_model_trains_through_its_own_ops() -> None:
    block = _Normed()
    x = torch.randn(3, 16)
    block(x).square().sum().backward()
    twin = copy.deepcopy(block)
    assert twin.norm is not block.norm and twin.weight is not block.weight
    twin.zero_grad()
    twin(x).square().sum().backward()
    torch.testing.assert_close(twin.weight.grad, block.weight.grad)
    compiled = torch.compile(twin, fullgraph=True, backend="aot_eager")
    twin.zero_grad()
    compiled(x).square().sum().backward()
    torch.testing.assert_close(twin.weight.grad, block.weight.grad)


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


def test_a_compiled_block_keeps_working_when_its_batch_changes_size() -> None:
    # The second size makes torch.compile retrace with symbolic sizes ("automatic dynamic"), where
    # the ops' fake functions see SymInts: a broadcast that hashed sizes failed there.
    weight = torch.randn(16)
    compiled = torch.compile(lambda x, bias: F.mul(F.add(F.rms_norm(x, weight), bias), x), fullgraph=True,
                             backend="aot_eager")
    for rows in (8, 9, 10, 3):
        x, bias = torch.randn(rows, 16), torch.randn(16)
        expected = (torch.nn.functional.rms_norm(x, (16,), weight, 1e-6) + bias) * x
        torch.testing.assert_close(compiled(x, bias), expected)


def test_the_cpu_path_gives_the_contiguous_outputs_inductor_expects() -> None:
    # PyTorch's ops keep a transposed input's layout; the fake functions, like the kernels, promise
    # contiguous outputs, and the graph inductor compiles checks their strides.
    a, b, x = torch.randn(5, 3).t(), torch.randn(3, 5), torch.randn(8, 3).t()
    assert F.add(a, b).is_contiguous() and F.silu_and_mul(x).is_contiguous()
    compiled = torch.compile(lambda p, q, r: (F.add(p, q) * 2, F.silu_and_mul(r)), fullgraph=True)
    total, gated = compiled(a, b, x)
    torch.testing.assert_close(total, (a + b) * 2)
    torch.testing.assert_close(gated, torch.nn.functional.silu(x[:, :4]) * x[:, 4:])


def test_functional_api_matches_reference_and_compiles() -> None:
    x, w = torch.randn(6, 32), torch.randn(32)
    torch.testing.assert_close(F.rms_norm(x, w, eps=1e-5), torch.nn.functional.rms_norm(x, (32,), w, 1e-5))
    torch.testing.assert_close(F.cumsum(x, 0), torch.cumsum(x, 0))
    compiled = torch.compile(lambda a, b: F.cumsum(F.rms_norm(a, b), 1), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, w), torch.cumsum(torch.nn.functional.rms_norm(x, (32,), w, 1e-6), 1))


def test_functional_reductions_take_a_single_axis_eager_and_compiled() -> None:
    x = torch.randn(4, 6, 5)
    torch.testing.assert_close(F.sum(x, dim=-1), torch.sum(x, dim=-1))
    torch.testing.assert_close(F.var(x, dim=1, keepdim=True), torch.var(x, dim=1, keepdim=True))
    compiled = torch.compile(lambda t: F.mean(t, dim=0) + F.amax(t, dim=0), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), torch.mean(x, dim=0) + torch.amax(x, dim=0))


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


def test_shared_instances_evict_the_least_recently_used() -> None:
    from tileops.ops.op_base import _SharedInstances

    cache = _SharedInstances(capacity=3)
    built = []

    def build(name: str):
        return lambda: built.append(name) or name

    for name in "abc":
        assert cache.get(name, build(name)) == name
    assert cache.get("a", build("a")) == "a"  # a hit: "b" is now the oldest
    cache.get("d", build("d"))
    assert len(cache) == 3 and built == ["a", "b", "c", "d"]
    cache.get("a", build("a"))
    cache.get("c", build("c"))
    assert built == ["a", "b", "c", "d"]  # "a" and "c" stayed
    cache.get("b", build("b"))  # evicted before, built again; "d" goes now
    cache.get("d", build("d"))
    assert built == ["a", "b", "c", "d", "b", "d"] and len(cache) == 3


def test_shared_instances_under_threads() -> None:
    """Hits take no lock: threads looking up, inserting and evicting at once raise nothing (an
    eviction iterates no dict that a hit writes), and the cache and its stamps stay bounded.

    Stamps are trimmed to the live keys once they pass twice the capacity; a hit that found its key
    just before another thread evicted it may stamp it afterwards, one such stamp a thread at most."""
    import threading

    from tileops.ops.op_base import _SharedInstances

    cache = _SharedInstances(capacity=8)
    errors: List[BaseException] = []

    def work(offset: int) -> None:
        try:
            for i in range(3000):  # twelve keys over eight places: evictions all along
                assert cache.get((offset + i) % 12, object) is not None
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(cache) <= 8 and len(cache._last_used) <= 2 * 8 + len(threads)


def test_every_fwd_op_with_a_floating_output_is_differentiable() -> None:
    for spec in FWD_OPS:
        floating = any(spec.may_be_floating(output.name) for output in spec.outputs)
        assert spec.differentiable or not floating, spec.name


def test_an_op_with_only_integer_outputs_takes_inputs_that_require_grad() -> None:
    from tileops.ops import ArgmaxFwdOp

    x = torch.randn(5, 9, requires_grad=True)
    op = ArgmaxFwdOp(dtype=torch.float32, dim=1)
    out = op(x)
    assert out.grad_fn is None and not out.requires_grad
    torch.testing.assert_close(out, torch.argmax(x, 1))
    compiled = torch.compile(lambda t: op(t), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), torch.argmax(x, 1))


@pytest.mark.parametrize("spec", [op for op in FWD_OPS if op.differentiable],
                         ids=lambda s: s.name)
def test_backward_matches_autograd_of_the_reference(spec) -> None:
    for case in manifest_cases(spec.name, dtypes=["float32"], max_numel=1 << 12)[-6:]:
        op = build_op(case)
        # Integer inputs (class indices) and constant ones are not differentiated: they pass unchanged.
        differentiated = _differentiated(spec)
        inputs = [t.double().requires_grad_() if i in differentiated else t
                  for i, t in enumerate(make_inputs(spec, case, "cpu", torch.Generator().manual_seed(2)))]
        ours = [t.detach().float().requires_grad_() if i in differentiated else t for i, t in enumerate(inputs)]
        expected = op.reference(*inputs)
        got = op(*ours)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        seeds = [torch.randn_like(e) for e in expected]
        sum(((e * s).sum() for e, s in zip(expected, seeds))).backward()
        sum(((g * s.float()).sum() for g, s in zip(got, seeds))).backward()
        for index in differentiated:
            # NaN where PyTorch's is NaN (the variance of a 0-d tensor), nowhere else.
            torch.testing.assert_close(ours[index].grad.double(), inputs[index].grad, rtol=1e-4, atol=1e-4,
                                       equal_nan=True)


def _differentiated(spec) -> List[int]:
    """Positions of the floating-point inputs the op differentiates (those not marked constant)."""
    return [index for index, tensor in enumerate(spec.inputs) if tensor.name in spec.differentiated_inputs]


@pytest.mark.parametrize("spec", [op for op in FWD_OPS if op.backward is not None], ids=lambda s: s.name)
def test_a_bwd_op_is_differentiable_again(spec) -> None:
    """Gradients of gradients (``create_graph=True``: gradient penalties, Hessian-vector products)
    through ops whose backward is a Bwd op, which differentiates its own reference."""
    for case in manifest_cases(spec.name, dtypes=["float32"], max_numel=1 << 10)[-3:]:
        op = build_op(case)
        differentiated = _differentiated(spec)
        wide = [t.double().requires_grad_() if i in differentiated else t
                for i, t in enumerate(make_inputs(spec, case, "cpu", torch.Generator().manual_seed(3)))]
        ours = [t.detach().float().requires_grad_() if i in differentiated else t for i, t in enumerate(wide)]

        def second_order(run, leaves):
            outputs = run(*leaves)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            first = sum((out.double().pow(3) * (index + 1)).sum() for index, out in enumerate(outputs))
            grads = torch.autograd.grad(first, [leaves[i] for i in differentiated], create_graph=True,
                                        allow_unused=True)
            penalty = sum(g.double().square().sum() for g in grads if g is not None)
            return torch.autograd.grad(penalty, [leaves[i] for i in differentiated], allow_unused=True)

        for mine, theirs in zip(second_order(op, ours), second_order(op.reference, wide)):
            assert (mine is None) == (theirs is None), case
            if mine is not None:
                torch.testing.assert_close(mine.double(), theirs, rtol=1e-3, atol=1e-3)


def test_torch_func_transforms_see_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """grad, vmap, jacrev and per-sample gradients (vmap of grad) run through ops as through their
    PyTorch references; neither the kernels nor the custom op (whose autograd functorch cannot
    run) are asked."""
    from tileops.ops import CrossEntropyFwdOp, RMSNormFwdOp, SoftmaxFwdOp

    def refuse(self, *args, **kwargs):
        raise AssertionError(f"{type(self).__name__} left the reference under a torch.func transform")

    for cls in (CrossEntropyFwdOp, RMSNormFwdOp, SoftmaxFwdOp):
        monkeypatch.setattr(cls, "_eager", refuse)
        monkeypatch.setattr(cls, "_library_call", refuse)
    x, weight = torch.randn(4, 6, 8), torch.randn(8)
    targets = torch.randint(0, 8, (6,))

    def check(ours, theirs) -> None:
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)

    check(torch.func.grad(lambda t: F.rms_norm(t, weight).square().sum())(x),
          torch.func.grad(lambda t: torch.nn.functional.rms_norm(t, (8,), weight, 1e-6).square().sum())(x))
    check(torch.func.vmap(lambda t: F.softmax(t, -1))(x), torch.softmax(x, -1))
    check(torch.func.jacrev(lambda t: F.softmax(t, -1))(x[0, 0]), torch.func.jacrev(lambda t: torch.softmax(t, -1))(x[0, 0]))

    def per_sample(loss):
        return torch.func.vmap(torch.func.grad(lambda t, target: loss(t[None], target[None])))(x[0], targets)

    check(per_sample(F.cross_entropy), per_sample(torch.nn.functional.cross_entropy))


def test_torch_jit_trace_records_the_custom_ops() -> None:
    """A traced module calls the custom ops (a kernel launched outside the dispatcher would be
    missing from the trace), on inputs of other row counts and after save and load."""
    import io
    import warnings

    class Block(_Normed):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.softmax(super().forward(x), -1)

    block = Block()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the shape checks read sizes
        traced = torch.jit.trace(block, (torch.randn(2, 16),))
    kinds = {node.kind() for node in traced.inlined_graph.nodes()}
    assert {"tileops::rms_norm_fwd", "tileops::softmax_fwd"} <= kinds, kinds
    saved = io.BytesIO()
    torch.jit.save(traced, saved)
    saved.seek(0)
    x = torch.randn(5, 16)
    for module in (traced, torch.jit.load(saved)):
        torch.testing.assert_close(module(x), block(x))


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


@pytest.mark.parametrize("uses_sum", [True, False], ids=["sum-used", "sum-unused"])
def test_fused_add_rms_norm_gives_both_addends_the_gradient_of_their_sum(uses_sum: bool) -> None:
    """x and residual take one gradient (the Bwd op returns it once), eager and compiled, whether
    or not the returned sum is used downstream (autograd then passes no gradient for it)."""
    x, residual = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    weight = torch.randn(8, requires_grad=True)

    def reference(a, r, w):
        total = a + r
        return torch.nn.functional.rms_norm(total, (8,), w, 1e-6), total

    def loss(fused, a, r, w):
        y, total = fused(a, r, w)
        return y.square().sum() + (total.sin().sum() if uses_sum else 0)

    leaves = (x, residual, weight)
    expected = torch.autograd.grad(loss(reference, *leaves), leaves)
    compiled = torch.compile(lambda *t: loss(F.fused_add_rms_norm, *t), fullgraph=True, backend="aot_eager")
    for got in (torch.autograd.grad(loss(F.fused_add_rms_norm, *leaves), leaves),
                torch.autograd.grad(compiled(*leaves), leaves)):
        for mine, theirs in zip(got, expected):
            torch.testing.assert_close(mine, theirs)
        torch.testing.assert_close(got[0], got[1], rtol=0, atol=0)


def test_formula_gradients_trace_into_a_compiled_backward() -> None:
    """Ops differentiated by the manifest's formulas differentiate under torch.compile as in eager mode."""
    def loss(f, a, b):
        h = f.mul(f.add(a, b), torch.sigmoid(a)) if f is F else torch.mul(torch.add(a, b), torch.sigmoid(a))
        return (f.sum(h, [1]) if f is F else torch.sum(h, 1)).square().mean()

    a = torch.randn(6, 5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    expected = torch.autograd.grad(loss(torch, a, b), (a, b))
    compiled = torch.compile(lambda x, y: loss(F, x, y), fullgraph=True, backend="aot_eager")
    for got in (torch.autograd.grad(loss(F, a, b), (a, b)), torch.autograd.grad(compiled(a, b), (a, b))):
        for mine, theirs in zip(got, expected):
            torch.testing.assert_close(mine, theirs)


CACHED_STEP = """
import sys, torch
import tileops.functional as F
from tileops.ops import GeluAndMulBwdOp
# Instances made first shift this process's numbering: one of them takes the handle
# the first process's Bwd op had, with other sizes and another approximation.
keep = [GeluAndMulBwdOp(N=6, dtype=torch.float32, approximate="tanh") for _ in range(int(sys.argv[1]))]
x = torch.randn(3, 8, requires_grad=True, generator=torch.Generator().manual_seed(0))
step = torch.compile(lambda t: F.gelu_and_mul(t).square().sum(), fullgraph=True)
step(x).backward()
expected = torch.func.grad(lambda t: (torch.nn.functional.gelu(t[:, :4]) * t[:, 4:]).square().sum())(x.detach())
torch.testing.assert_close(x.grad, expected)
"""


def test_a_compiled_backward_from_another_process_cache_finds_its_bwd_op(tmp_path) -> None:
    """torch caches compiled graphs on disk, keyed by the forward graph: the backward a second
    process loads must not hold the first process's instance numbers."""
    script = tmp_path / "step.py"
    script.write_text(CACHED_STEP)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    for extra_instances in (0, 5):
        run = subprocess.run([sys.executable, str(script), str(extra_instances)], env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    assert any((tmp_path / "cache").rglob("*")), "nothing was cached: the second run proved nothing"


EXPORTED_RUN = """
import sys, torch
from tileops.ops import RMSNormFwdOp
# Instances of the same class with another eps: a graph holding a stale handle could find one.
others = [RMSNormFwdOp(N=16, dtype=torch.float32, eps=0.5) for _ in range(int(sys.argv[2]))]
program = torch.export.load(sys.argv[1])
x, expected = torch.load(sys.argv[1] + ".io")
torch.testing.assert_close(program.module()(x), expected)
"""


def test_graphs_name_an_op_by_configuration_unless_its_kernels_are_its_own() -> None:
    from tileops.kernels.norm.rms_norm import RMSNormFwdKernel
    from tileops.ops import RMSNormFwdOp

    plain = RMSNormFwdOp(N=8, dtype=torch.float32)
    assert plain._graph_handle == SHARED_INSTANCE
    for own in (RMSNormFwdOp(N=8, dtype=torch.float32, tune=True),
                RMSNormFwdOp(N=8, dtype=torch.float32, kernel_map={"rms_norm_fwd": RMSNormFwdKernel})):
        assert own._graph_handle == own._handle and own._handle > 0
        assert copy.deepcopy(own)._graph_handle not in (own._handle, SHARED_INSTANCE)


@pytest.mark.parametrize("custom", [False, True], ids=["default-kernels", "own-kernel-map"])
def test_an_exported_program_runs_in_another_process_or_refuses(tmp_path, custom: bool) -> None:
    """torch.export of a module holding an op: with the default kernels, the program names the
    shared instance of the op's configuration and runs anywhere; with a kernel map of its own it
    names the instance, and another process refuses it (never another instance's eps)."""
    from tileops.kernels.norm.rms_norm import RMSNormFwdKernel

    module = _Normed(**({"kernel_map": {"rms_norm_fwd": RMSNormFwdKernel}} if custom else {}))
    x = torch.randn(3, 16)
    program_path = tmp_path / "normed.pt2"
    torch.export.save(torch.export.export(module, (x,)), program_path)
    torch.save((x, module(x).detach()), str(program_path) + ".io")
    script = tmp_path / "run.py"
    script.write_text(EXPORTED_RUN)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    for others in (0, 3):
        run = subprocess.run([sys.executable, str(script), str(program_path), str(others)], env=env,
                             capture_output=True, text=True, timeout=600)
        if custom:
            assert run.returncode != 0 and "no live instance has handle" in run.stderr, run.stderr[-3000:]
        else:
            assert run.returncode == 0, run.stderr[-3000:]


def _saved_bytes(run) -> list:
    """Bytes of storage behind each tensor autograd saves while ``run()`` builds its graph."""
    sizes = []

    def pack(tensor):
        sizes.append(tensor.untyped_storage().nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sizes


def test_a_formula_backward_keeps_only_the_tensors_its_gradient_needs() -> None:
    a = torch.randn(64, 32, requires_grad=True)
    b = torch.randn(32, requires_grad=True)
    # An add's or a sum's gradient depends only on shapes: no tensor is kept.
    assert _saved_bytes(lambda: F.add(a, b)) == []
    assert _saved_bytes(lambda: F.sum(a, [0])) == []
    # A product's gradient needs both operands; an exp's, its output.
    assert sorted(_saved_bytes(lambda: F.mul(a, b))) == [32 * 4, 64 * 32 * 4]
    assert _saved_bytes(lambda: F.exp(b)) == [32 * 4]
    (F.add(a, b) * F.sum(a, [0])).sum().backward()
    expected_a, expected_b = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ((expected_a + expected_b) * expected_a.sum(0)).sum().backward()
    torch.testing.assert_close(a.grad, expected_a.grad)
    torch.testing.assert_close(b.grad, expected_b.grad)


@pytest.mark.parametrize("spec", [op for op in FWD_OPS if op.backward_by_formulas], ids=lambda s: s.name)
def test_a_formula_backward_never_recomputes_the_forward(spec, monkeypatch) -> None:
    """The formulas read saved tensors only: neither the reference nor the op runs again."""
    case = [c for c in manifest_cases(spec.name, dtypes=["float32"], max_numel=1 << 10) if c.label != "scalar"][-1]
    op = build_op(case)
    inputs = [t.requires_grad_() for t in make_inputs(spec, case, "cpu", torch.Generator().manual_seed(5))]
    expected = torch.autograd.grad(op.reference(*inputs).square().sum(), inputs)
    out = op(*inputs)

    def refuse(*args, **kwargs):
        raise AssertionError("the forward ran again in the backward")

    monkeypatch.setattr(op, "reference", refuse)
    monkeypatch.setattr(op, "_eager", refuse)
    for mine, theirs in zip(torch.autograd.grad(out.square().sum(), inputs), expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


def test_a_formula_backward_is_differentiable_again() -> None:
    """``create_graph=True`` records the gradient's own graph (here d/da of d(a*b*b)/da = 0, d/db = 2b)."""
    a = torch.randn(4, 3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    (grad_a,) = torch.autograd.grad(F.mul(F.mul(a, b), b).sum(), (a,), create_graph=True)
    torch.testing.assert_close(grad_a, (b * b).expand(4, 3))
    grad_a.sum().backward()
    torch.testing.assert_close(b.grad, 2 * 4 * b.detach())
    assert a.grad is None or torch.count_nonzero(a.grad) == 0


def test_shapes_that_passed_skip_the_rules_and_others_still_meet_them() -> None:
    from tileops.ops import RMSNormFwdOp

    op = RMSNormFwdOp(N=8, dtype=torch.float32)
    weight = torch.randn(8)
    for _ in range(2):
        torch.testing.assert_close(op(torch.randn(3, 8), weight).shape, torch.Size([3, 8]))
    with pytest.raises(ValueError, match="static dim N"):
        op(torch.randn(3, 9), weight)
    with pytest.raises(ValueError, match=r"weight.shape\[0\] == N"):
        op(torch.randn(3, 8), torch.randn(9))
    with pytest.raises(ValueError, match=r"weight.shape\[0\] == N"):  # refused shapes are never remembered
        op(torch.randn(3, 8), torch.randn(9))
    # Traced calls check every time, with symbolic sizes.
    compiled = torch.compile(lambda x: op(x, weight), dynamic=True, fullgraph=True, backend="aot_eager")
    for rows in (3, 5, 7):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(compiled(x), op.reference(x, weight))


def test_a_constant_input_that_requires_grad_is_refused() -> None:
    """An input the manifest marks ``constant`` gets no gradient from the Bwd op: a call that would
    need one raises instead of leaving autograd a silent zero; detached, it runs."""
    from tileops.ops import SoftCrossEntropyFwdOp

    logits = torch.randn(4, 6, requires_grad=True)
    probabilities = torch.softmax(torch.randn(4, 6), -1).requires_grad_()
    op = SoftCrossEntropyFwdOp(V=6, dtype=torch.float32)
    with pytest.raises(ValueError, match="SoftCrossEntropyFwdOp: probabilities requires grad"):
        op(logits, probabilities)
    loss, _, _ = op(logits, probabilities.detach())
    loss.backward()
    assert logits.grad is not None
    with torch.no_grad():
        op(logits, probabilities)  # nothing needs a gradient: no refusal
