"""tileops.nn layers are drop-ins for torch.nn's, and swap_modules converts a model (CPU path)."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from tileops import nn as tnn


@pytest.mark.parametrize("shape, eps, affine", [(16, None, True), ((4, 8), 1e-5, True), (32, 1e-6, False)])
def test_rms_norm_is_a_drop_in(shape, eps, affine) -> None:
    theirs = torch.nn.RMSNorm(shape, eps=eps, elementwise_affine=affine)
    ours = tnn.RMSNorm(shape, eps=eps, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            theirs.weight.normal_()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    trailing = (shape,) if isinstance(shape, int) else shape
    x = torch.randn(3, 5, *trailing)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, affine", [(16, True), ((4, 8), True), (32, False)])
def test_rms_norm_fuses_the_residual_add_it_is_given(shape, affine) -> None:
    ours = tnn.RMSNorm(shape, eps=1e-6, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ours.weight.normal_()
    trailing = (shape,) if isinstance(shape, int) else shape
    x, residual = torch.randn(3, 5, *trailing, requires_grad=True), torch.randn(3, 5, *trailing, requires_grad=True)
    y, total = ours(x, residual)
    expected_total = x + residual
    expected_y = torch.nn.functional.rms_norm(expected_total, trailing, ours.weight, 1e-6)
    torch.testing.assert_close(total, expected_total)
    torch.testing.assert_close(y, expected_y, rtol=1e-5, atol=1e-6)
    leaves = [x, residual] + ([ours.weight] if affine else [])
    got = torch.autograd.grad(y.square().sum() + total.sin().sum(), leaves)
    expected = torch.autograd.grad(expected_y.square().sum() + expected_total.sin().sum(), leaves)
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"RMSNorm: residual must be shaped like x"):
        ours(x, residual[:1])


def test_rms_norm_rejects_a_wrong_trailing_shape() -> None:
    with pytest.raises(ValueError, match=r"RMSNorm: input's last dims \(7,\) do not match normalized_shape \(8,\)"):
        tnn.RMSNorm(8)(torch.randn(2, 7))


class LlamaRMSNorm(torch.nn.Module):
    """The usual hand-written norm of Llama-style models."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


class TinyModel(torch.nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.input_norm = LlamaRMSNorm(hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.final_norm = torch.nn.RMSNorm(hidden, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.final_norm(self.proj(self.input_norm(x)))


def test_swap_keeps_parameters_and_outputs() -> None:
    torch.manual_seed(0)
    model = TinyModel()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(4, 6, 32)
    with torch.no_grad():
        reference_out = model(x)
    params_before = {n: id(p) for n, p in model.named_parameters()}

    counts = tnn.swap_modules(model)
    assert counts == {"rms_norm": 2, "layer_norm": 0, "gated_mlp": 0}
    assert isinstance(model.input_norm, tnn.RMSNorm) and isinstance(model.final_norm, tnn.RMSNorm)
    assert {n: id(p) for n, p in model.named_parameters()} == params_before
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference_out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, affine, bias", [(16, True, True), ((4, 8), True, False), (32, False, False)])
def test_layer_norm_is_a_drop_in(shape, affine, bias) -> None:
    theirs = torch.nn.LayerNorm(shape, eps=1e-5, elementwise_affine=affine, bias=bias)
    ours = tnn.LayerNorm(shape, eps=1e-5, elementwise_affine=affine, bias=bias)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    trailing = (shape,) if isinstance(shape, int) else shape
    x = torch.randn(3, 5, *trailing)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


class LlamaMLP(torch.nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, hidden, bias=False)
        self.up_proj = torch.nn.Linear(d, hidden, bias=False)
        self.down_proj = torch.nn.Linear(hidden, d, bias=False)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(torch.nn.Module):
    def __init__(self, d: int = 32, hidden: int = 48) -> None:
        super().__init__()
        self.norm = LlamaRMSNorm(d)
        self.mlp = LlamaMLP(d, hidden)
        self.out_norm = torch.nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_norm(x + self.mlp(self.norm(x)))


def test_swapped_llama_block_gives_the_same_loss_and_gradients() -> None:
    torch.manual_seed(0)
    model = LlamaBlock()
    with torch.no_grad():
        model.norm.weight.normal_(1.0, 0.1)
        model.out_norm.weight.normal_(1.0, 0.1)
    x = torch.randn(4, 6, 32)
    model(x).square().mean().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    expected_loss = model(x).square().mean().detach()
    model.zero_grad()

    assert tnn.swap_modules(model) == {"rms_norm": 1, "layer_norm": 1, "gated_mlp": 1}
    assert isinstance(model.mlp, tnn.GatedMLP) and isinstance(model.out_norm, tnn.LayerNorm)
    assert list(model.state_dict()) == list(expected)
    loss = model(x).square().mean()
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)


class GemmaRMSNorm(torch.nn.Module):
    """Named and shaped like Llama's norm, but scaling by ``1 + weight`` (weights start at 0)."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)


class SwappedGateMLP(LlamaMLP):
    """A Llama MLP's names and modules, with the activation on the other projection."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_proj(x) * self.act_fn(self.up_proj(x)))


@pytest.mark.parametrize("module", [GemmaRMSNorm(16), SwappedGateMLP(16, 24)], ids=["gemma-norm", "other-wiring"])
def test_a_look_alike_that_computes_something_else_is_left_in_place(module, caplog) -> None:
    model = torch.nn.Sequential(module)
    x = torch.randn(3, 16)
    with torch.no_grad():
        expected = model(x)
        assert tnn.swap_modules(model) == {"rms_norm": 0, "layer_norm": 0, "gated_mlp": 0}
        assert model[0] is module
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert f"0 ({type(module).__name__}) left in place" in caplog.text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_llama_look_alikes_pass_the_probe_in_every_dtype(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(LlamaRMSNorm(64), LlamaMLP(64, 96)).to(dtype)
    with torch.no_grad():
        model[0].weight.normal_(1.0, 0.1)
    assert tnn.swap_modules(model) == {"rms_norm": 1, "layer_norm": 0, "gated_mlp": 1}


def test_look_alikes_without_values_are_not_swapped_but_torch_norms_are() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(LlamaRMSNorm(16), torch.nn.RMSNorm(16), torch.nn.LayerNorm(16))
    assert tnn.swap_modules(model) == {"rms_norm": 1, "layer_norm": 1, "gated_mlp": 0}
    assert isinstance(model[0], LlamaRMSNorm) and isinstance(model[1], tnn.RMSNorm)


def _stacked_shapes(monkeypatch) -> list:
    """The shapes of what each ``torch.cat`` call in tileops.nn stacks, recorded as calls go."""
    stacked, cat = [], torch.cat

    def recording_cat(tensors, *args, **kwargs):
        stacked.append([tuple(t.shape) for t in tensors])
        return cat(tensors, *args, **kwargs)

    monkeypatch.setattr(tnn.torch, "cat", recording_cat)
    return stacked


def _llama_mlp_pair(bias: bool, d: int = 32, hidden: int = 48):
    """A Llama-style MLP and a copy of it swapped to ``GatedMLP``."""
    torch.manual_seed(0)
    theirs = LlamaMLP(d, hidden)
    if bias:
        for name in ("gate_proj", "up_proj", "down_proj"):
            old = getattr(theirs, name)
            setattr(theirs, name, torch.nn.Linear(old.in_features, old.out_features))
    holder = torch.nn.Sequential(copy.deepcopy(theirs))
    assert tnn.swap_modules(holder, ["gated_mlp"]) == {"gated_mlp": 1}
    return theirs, holder[0]


# 32 features: 5 rows stack the two products (5 x 96 copied), 40 rows stack the weights (96 x 32).
@pytest.mark.parametrize("rows, stacked", [(5, [(5, 48), (5, 48)]), (40, [(48, 32), (48, 32)])])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_gated_mlp_takes_the_cheaper_stack_and_matches_pytorch_gradients(rows, stacked, bias, monkeypatch) -> None:
    theirs, ours = _llama_mlp_pair(bias)
    x = torch.randn(rows, 32, requires_grad=True)
    theirs(x).square().mean().backward()
    expected = [x.grad.clone()] + [p.grad.clone() for p in theirs.parameters()]
    x.grad = None
    calls = _stacked_shapes(monkeypatch)
    ours(x).square().mean().backward()
    assert calls[0] == stacked
    got = [x.grad] + [p.grad for p in ours.parameters()]
    for mine, reference in zip(got, expected):
        torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shape", [(40, 32), (2, 20, 32), (5, 32)], ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_gated_mlp_without_gradients_writes_both_products_into_one_buffer(shape, bias, monkeypatch) -> None:
    theirs, ours = _llama_mlp_pair(bias)
    x = torch.randn(shape)
    rows = x.numel() // 32
    calls = _stacked_shapes(monkeypatch)
    with torch.no_grad():
        got, expected = ours(x), theirs(x)
    with torch.inference_mode():
        torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # Over fewer rows than features the products are stacked, gradients or not.
    assert calls == ([] if rows >= 32 else [[(*shape[:-1], 48)] * 2] * 2)
    strided = torch.randn(shape[-1], *shape[:-1]).movedim(0, -1)  # features not contiguous: copied once
    with torch.no_grad():
        torch.testing.assert_close(ours(strided), theirs(strided), rtol=1e-5, atol=1e-6)
    # A call that records the weights' gradients stacks the weights (and biases) over more rows.
    calls.clear()
    torch.testing.assert_close(ours(x).detach(), expected, rtol=1e-5, atol=1e-6)
    assert len(calls) == (1 if rows < 32 or not bias else 2), calls


@pytest.mark.parametrize("rows", [5, 40])
def test_gated_mlp_traces_without_graph_breaks(rows: int) -> None:
    theirs, ours = _llama_mlp_pair(bias=False)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    x = torch.randn(rows, 32, requires_grad=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), theirs(x), rtol=1e-5, atol=1e-6)
    compiled(x).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    theirs(x).sum().backward()
    torch.testing.assert_close(expected, x.grad, rtol=1e-4, atol=1e-6)


def test_gated_mlp_under_autocast_follows_pytorch() -> None:
    theirs, ours = _llama_mlp_pair(bias=True)
    x = torch.randn(7, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, expected = ours(x), theirs(x)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_layers_follow_the_input_dtype_under_autocast() -> None:
    linear, norm = torch.nn.Linear(16, 16), tnn.RMSNorm(16)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = linear(x)
        y = norm(h)
    assert h.dtype == torch.bfloat16 and y.dtype == torch.bfloat16
    expected = torch.nn.functional.rms_norm(h.float(), (16,), norm.weight, torch.finfo(torch.bfloat16).eps)
    torch.testing.assert_close(y.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shape", [(6, 11), (11,), (3, 11, 4), (2, 11, 3, 2)], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_loss_is_a_drop_in_for_class_indices(shape, reduction: str) -> None:
    theirs = torch.nn.CrossEntropyLoss(ignore_index=2, reduction=reduction, label_smoothing=0.1)
    ours = tnn.CrossEntropyLoss(ignore_index=2, reduction=reduction, label_smoothing=0.1)
    logits = torch.randn(shape, requires_grad=True)
    target_shape = shape[:1] + shape[2:] if len(shape) > 1 else ()
    target = torch.randint(0, shape[1] if len(shape) > 1 else shape[0], target_shape)
    got, expected = ours(logits, target), theirs(logits, target)
    assert got.shape == expected.shape
    # A mean over targets that are all ignored (one class index of 11 may well be) is NaN in both.
    torch.testing.assert_close(got, expected, equal_nan=True)
    grad = torch.randn(expected.shape)
    torch.testing.assert_close(torch.autograd.grad(got, logits, grad), torch.autograd.grad(expected, logits, grad),
                               equal_nan=True)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "class-weights"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("target", [[2], [2, 2, 2]], ids=["one-row", "three-rows"])
def test_cross_entropy_mean_of_only_ignored_targets_is_nan_with_zero_gradient(target, label_smoothing: float,
                                                                               weighted: bool) -> None:
    """As in PyTorch: a padding-only batch gives a NaN mean loss, but a gradient of 0, not NaN."""
    weight = torch.rand(11) + 0.25 if weighted else None
    logits = torch.randn(len(target), 11, requires_grad=True)
    target = torch.tensor(target)
    got = tnn.CrossEntropyLoss(weight, ignore_index=2, label_smoothing=label_smoothing)(logits, target)
    expected = torch.nn.CrossEntropyLoss(weight, ignore_index=2, label_smoothing=label_smoothing)(logits, target)
    assert torch.isnan(got) and torch.isnan(expected)
    grad = torch.autograd.grad(got, logits)[0]
    assert torch.equal(grad, torch.zeros_like(logits))
    torch.testing.assert_close(grad, torch.autograd.grad(expected, logits)[0])


def test_cross_entropy_mean_over_kept_rows_of_weight_zero_stays_nan_as_in_pytorch() -> None:
    weight = torch.zeros(11)
    logits = torch.randn(3, 11, requires_grad=True)
    target = torch.tensor([1, 3, 4])
    got = tnn.CrossEntropyLoss(weight, ignore_index=2)(logits, target)
    assert torch.isnan(got) and torch.isnan(torch.autograd.grad(got, logits)[0]).all()


def test_cross_entropy_loss_passes_inplace_backward_on() -> None:
    hidden = torch.randn(5, 4, requires_grad=True)
    weight = torch.randn(9, 4, requires_grad=True)
    target = torch.randint(0, 9, (5,))
    logits = hidden @ weight.T
    expected = torch.func.grad(lambda x: torch.nn.functional.cross_entropy(x, target))(logits.detach())
    tnn.CrossEntropyLoss(inplace_backward=True)(logits, target).backward()
    torch.testing.assert_close(logits.detach(), expected)
    torch.testing.assert_close(hidden.grad, expected @ weight.detach())


@pytest.mark.parametrize("shape", [(6, 11), (11,), (3, 11, 4)], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_loss_applies_class_weights_as_pytorch_does(shape, reduction: str,
                                                                  label_smoothing: float) -> None:
    weight = torch.rand(11) + 0.25
    theirs = torch.nn.CrossEntropyLoss(weight, ignore_index=2, reduction=reduction, label_smoothing=label_smoothing)
    ours = tnn.CrossEntropyLoss(weight, ignore_index=2, reduction=reduction, label_smoothing=label_smoothing)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    generator = torch.Generator().manual_seed(len(shape))
    logits = torch.randn(shape, generator=generator, requires_grad=True)
    target_shape = shape[:1] + shape[2:] if len(shape) > 1 else ()
    target = torch.randint(0, 11, target_shape, generator=generator)
    if target.dim():
        target.view(-1)[0] = 2  # an ignored row among kept ones (weights of the kept rows only)
    got, expected = ours(logits, target), theirs(logits, target)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, equal_nan=True)
    grad = torch.randn(expected.shape, generator=generator)
    torch.testing.assert_close(torch.autograd.grad(got, logits, grad), torch.autograd.grad(expected, logits, grad))


def _random_loss_configuration(seed: int):
    """Logits of a random layout ([C], [N, C], [N, C, d1(, d2)], N from 0), class indices (a
    quarter of them maybe the ignored class) or probabilities (float32 or the logits' dtype), and
    random weights, ignore_index, smoothing, reduction, in-place backward and dtype."""
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    classes, rows = rng.choice([1, 2, 3, 7, 100]), rng.choice([0, 1, 2, 5])
    shape = rng.choice([(classes,), (rows, classes), (rows, classes, 3), (rows, classes, 2, 1)])
    dtype = rng.choice([torch.float32, torch.bfloat16, torch.float16])
    logits = torch.randn(shape, generator=generator).to(dtype)
    options = {"weight": torch.rand(classes, generator=generator) + 0.1 if rng.random() < 0.5 else None,
               "reduction": rng.choice(["none", "mean", "sum"]), "label_smoothing": rng.choice([0.0, 0.1, 1.0])}
    if rng.random() < 0.4:
        target = torch.randn(shape, generator=generator).softmax(0 if len(shape) == 1 else 1)
        target = target.to(rng.choice([torch.float32, dtype]))
    else:
        options["ignore_index"] = rng.choice([-100, 0, 1])
        target = torch.randint(0, classes, shape[:1] + shape[2:] if len(shape) > 1 else (), generator=generator)
        if target.dim() and target.numel() and rng.random() < 0.5:
            target.view(-1)[::4] = options["ignore_index"]
    return logits, target, options, rng.random() < 0.3


@pytest.mark.parametrize("seed", range(48))
def test_cross_entropy_loss_matches_pytorch_on_random_configurations(seed: int) -> None:
    logits, target, options, inplace = _random_loss_configuration(seed)
    wide = logits.double().requires_grad_()
    weight = options["weight"]
    expected = torch.nn.functional.cross_entropy(wide, target.double() if target.is_floating_point() else target,
                                                 **dict(options, weight=None if weight is None else weight.double()))
    leaf = logits.clone().requires_grad_()
    got = tnn.CrossEntropyLoss(**options, inplace_backward=inplace)(leaf, target)
    tolerance = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}[logits.dtype]
    assert got.shape == expected.shape
    torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=tolerance, equal_nan=True)
    if expected.numel() and torch.isfinite(expected).all():
        seed_grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        (grad,) = torch.autograd.grad((got.double() * seed_grad).sum(), leaf)
        (expected_grad,) = torch.autograd.grad((expected * seed_grad).sum(), wide)
        scale = max(1.0, expected_grad.abs().max().item() if expected_grad.numel() else 0.0)
        torch.testing.assert_close(grad.double(), expected_grad, rtol=tolerance, atol=tolerance * scale)


def test_class_weighted_loss_of_half_precision_logits_is_computed_in_float32() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=generator).mul_(4).bfloat16().requires_grad_()
    target = torch.randint(0, 1000, (64,), generator=generator)
    weight = torch.rand(1000, generator=generator).bfloat16()
    got = tnn.CrossEntropyLoss(weight, label_smoothing=0.1)(logits, target)
    wide = logits.detach().float().requires_grad_()
    expected = torch.nn.functional.cross_entropy(wide, target, weight.float(), label_smoothing=0.1)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=0)
    got.backward()
    expected.backward()
    torch.testing.assert_close(logits.grad.float(), wide.grad, rtol=2e-2, atol=1e-5)


def test_every_row_ignored_gives_a_nan_weighted_mean_and_zero_gradient() -> None:
    logits = torch.randn(4, 3, requires_grad=True)
    target = torch.full((4,), 2)
    loss = tnn.CrossEntropyLoss(torch.rand(3), ignore_index=2)(logits, target)
    assert torch.isnan(loss)
    loss = tnn.CrossEntropyLoss(torch.rand(3), ignore_index=2, reduction="sum")(logits, target)
    loss.backward()
    assert loss == 0 and torch.equal(logits.grad, torch.zeros(4, 3))


@pytest.mark.parametrize("weight", [None, torch.rand(5) + 0.5], ids=["unweighted", "class-weighted"])
@pytest.mark.parametrize("bad_target", [-1, 5])
def test_a_target_outside_the_classes_raises_pytorchs_index_error_on_the_cpu(weight, bad_target: int) -> None:
    """The CPU path is PyTorch's; the GPU kernels give such a row NaN instead (tests/gpu)."""
    target = torch.tensor([0, bad_target, 4])
    with pytest.raises(IndexError, match="out of bounds"):
        torch.nn.functional.cross_entropy(torch.randn(3, 5), target, weight)
    with pytest.raises(IndexError, match="out of bounds"):
        tnn.CrossEntropyLoss(weight)(torch.randn(3, 5), target)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_class_weighted_loss_with_inplace_backward_gives_the_out_of_place_gradients(label_smoothing: float) -> None:
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(6, 4, generator=generator, requires_grad=True)
    projection = torch.randn(9, 4, generator=generator, requires_grad=True)
    target = torch.randint(0, 9, (6,), generator=generator)
    weight = torch.rand(9, generator=generator) + 0.5
    grads = []
    for inplace in (False, True):
        loss = tnn.CrossEntropyLoss(weight, label_smoothing=label_smoothing, inplace_backward=inplace)
        logits = hidden @ projection.T
        grads.append(torch.autograd.grad(loss(logits, target), (hidden, projection)))
        if inplace and not label_smoothing:  # the op's gradient is all there is: it took the logits' memory
            expected = torch.autograd.grad(
                torch.nn.functional.cross_entropy(hidden @ projection.T, target, weight), hidden)[0]
            torch.testing.assert_close(grads[-1][0], expected)
    for got, expected in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, expected)


def test_class_weighted_loss_compiles() -> None:
    weight = torch.rand(7) + 0.5
    loss = tnn.CrossEntropyLoss(weight, label_smoothing=0.1)
    logits = torch.randn(5, 7, requires_grad=True)
    target = torch.tensor([0, 6, -100, 3, 3])
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got, expected = compiled(logits, target), torch.nn.functional.cross_entropy(logits, target, weight,
                                                                                label_smoothing=0.1)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got, logits), torch.autograd.grad(expected, logits))


def test_cross_entropy_loss_refuses_what_it_does_not_support() -> None:
    with pytest.raises(ValueError, match="weight must be 1-D"):
        tnn.CrossEntropyLoss(weight=torch.ones(3, 1))
    with pytest.raises(ValueError, match=r"one entry per class \(4\)"):
        tnn.CrossEntropyLoss(weight=torch.ones(3))(torch.randn(2, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="reduction must be one of"):
        tnn.CrossEntropyLoss(torch.ones(4), reduction="average")(torch.randn(2, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"probability targets must have the logits' shape \(4, 3\)"):
        tnn.CrossEntropyLoss()(torch.randn(4, 3), torch.rand(4, 2))


@pytest.mark.parametrize("shape", [(6, 11), (11,), (3, 11, 4)], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("targets_need_grad", [False, True], ids=["constant-targets", "differentiated-targets"])
def test_cross_entropy_loss_takes_probability_targets_as_pytorch_does(shape, reduction: str, label_smoothing: float,
                                                                      weighted: bool, targets_need_grad: bool) -> None:
    """Constant targets run through the soft-target op; targets that require grad (a teacher
    trained too) through PyTorch's loss, which differentiates them."""
    generator = torch.Generator().manual_seed(len(shape))
    weight = torch.rand(11, generator=generator) + 0.25 if weighted else None
    theirs = torch.nn.CrossEntropyLoss(weight, reduction=reduction, label_smoothing=label_smoothing)
    ours = tnn.CrossEntropyLoss(weight, reduction=reduction, label_smoothing=label_smoothing)
    logits = torch.randn(shape, generator=generator, requires_grad=True)
    probabilities = torch.softmax(torch.randn(shape, generator=generator), dim=min(1, len(shape) - 1))
    probabilities.requires_grad_(targets_need_grad)
    got, expected = ours(logits, probabilities), theirs(logits, probabilities)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)
    grad = torch.randn(expected.shape, generator=generator)
    leaves = (logits, probabilities) if targets_need_grad else (logits,)
    torch.testing.assert_close(torch.autograd.grad(got, leaves, grad), torch.autograd.grad(expected, leaves, grad))


def test_probability_targets_refuse_an_ignore_index_as_pytorch_does() -> None:
    logits, probabilities = torch.randn(4, 5), torch.randn(4, 5).softmax(1)
    with pytest.raises(RuntimeError, match="ignore_index is not supported"):
        torch.nn.functional.cross_entropy(logits, probabilities, ignore_index=0)
    with pytest.raises(ValueError, match="CrossEntropyLoss: ignore_index is not supported for class-probability"):
        tnn.CrossEntropyLoss(ignore_index=0)(logits, probabilities)
    # The default is no setting at all, and class indices keep taking any ignore_index.
    torch.testing.assert_close(tnn.CrossEntropyLoss()(logits, probabilities),
                               torch.nn.functional.cross_entropy(logits, probabilities))
    target = torch.tensor([0, 1, 2, 0])
    torch.testing.assert_close(tnn.CrossEntropyLoss(ignore_index=0)(logits, target),
                               torch.nn.functional.cross_entropy(logits, target, ignore_index=0))


def test_probability_targets_with_inplace_backward_and_under_compile() -> None:
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 7, generator=generator).mul_(3).bfloat16()
    probabilities = torch.softmax(torch.randn(5, 7, generator=generator), dim=1)
    wide = logits.float().requires_grad_()
    expected = torch.nn.functional.cross_entropy(wide, probabilities, label_smoothing=0.1)
    expected.backward()
    assert tnn.CrossEntropyLoss()(logits, probabilities.bfloat16()).dtype == torch.bfloat16
    for inplace in (False, True):
        leaf = logits.clone().requires_grad_()
        loss = tnn.CrossEntropyLoss(label_smoothing=0.1, inplace_backward=inplace)(leaf, probabilities)
        assert loss.dtype == torch.nn.functional.cross_entropy(logits, probabilities).dtype == torch.float32
        torch.testing.assert_close(loss, expected, rtol=1e-2, atol=0)
        loss.backward()
        torch.testing.assert_close(leaf.grad.float(), wide.grad, rtol=2e-2, atol=2e-3)
    compiled = torch.compile(tnn.CrossEntropyLoss(reduction="sum"), fullgraph=True, backend="aot_eager")
    logits = logits.float().requires_grad_()
    got, expected = compiled(logits, probabilities), torch.nn.functional.cross_entropy(logits, probabilities,
                                                                                       reduction="sum")
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got, logits), torch.autograd.grad(expected, logits))


def test_probability_targets_with_trained_class_weights_get_their_gradient_from_pytorch() -> None:
    """Weights that require grad (learned class weights) go through PyTorch's loss, which
    differentiates them; the op treats weights as constants and would refuse them."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 6, generator=generator, requires_grad=True)
    probabilities = torch.softmax(torch.randn(4, 6, generator=generator), dim=1)
    weight = (torch.rand(6, generator=generator) + 0.5).requires_grad_()
    got = tnn.probability_cross_entropy(logits, probabilities, weight, label_smoothing=0.1)
    expected = torch.nn.functional.cross_entropy(logits, probabilities, weight, label_smoothing=0.1)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got, (logits, weight)),
                               torch.autograd.grad(expected, (logits, weight)))
