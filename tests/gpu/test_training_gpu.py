"""Training through tileops on the GPU: compiled block vs eager, and a swapped Llama-style model."""

import copy
import math

import pytest
import torch

import tileops.functional as F
from tileops import nn as tnn

pytestmark = pytest.mark.gpu


class MixerBlock(torch.nn.Module):
    """RMSNorm, softmax token mixing, a SiLU-gated MLP and residual adds, all tileops (the adds
    differentiate their reference)."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = tnn.RMSNorm(d, eps=1e-6)
        self.score = torch.nn.Linear(d, d, bias=False)
        self.norm2 = tnn.RMSNorm(d, eps=1e-6)
        self.up = torch.nn.Linear(d, 2 * hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        scores = h @ self.score(h).transpose(1, 2) / math.sqrt(h.shape[-1])
        x = F.add(x, F.softmax(scores, -1) @ h)
        return F.add(x, self.down(F.silu_and_mul(self.up(self.norm2(x)))))


def gradients(run, module: torch.nn.Module, x: torch.Tensor):
    """Output of ``run(x)`` and the gradients it leaves on ``module``'s parameters."""
    module.zero_grad(set_to_none=True)
    out = run(x)
    (out.float().square().mean()).backward()
    return out.detach(), {n: p.grad.detach().clone() for n, p in module.named_parameters()}


def test_compiled_block_matches_eager_forward_and_every_gradient():
    torch.manual_seed(0)
    torch._dynamo.reset()
    block = MixerBlock(256, 512).cuda()
    x = torch.randn(4, 64, 256, device="cuda")
    eager_out, eager_grads = gradients(block, block, x)
    explanation = torch._dynamo.explain(block)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(block, fullgraph=True)
    out, grads = gradients(compiled, block, x)
    torch.testing.assert_close(out, eager_out, rtol=1e-4, atol=1e-4)
    assert grads.keys() == eager_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], eager_grads[name], rtol=1e-3, atol=1e-5, msg=name)


class ResidualStream(torch.nn.Module):
    """Pre-norm layers on a residual stream, each norm fused with the add before it (as inference
    engines write Llama-style blocks): ``normed, residual = norm(h + residual)``, ``h = mlp(normed)``."""

    def __init__(self, d: int, layers: int, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(1 + 0.1 * torch.randn(d)) for _ in range(layers))
        self.mlps = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, residual = torch.zeros_like(x), x
        for weight, mlp in zip(self.weights, self.mlps):
            if self.fused:
                normed, residual = F.fused_add_rms_norm(h, residual, weight)
            else:
                residual = h + residual
                normed = torch.nn.functional.rms_norm(residual, (residual.shape[-1],), weight, 1e-6)
            h = torch.tanh(mlp(normed))
        return h + residual


def test_fused_add_norm_trains_eager_and_compiled_as_the_unfused_stream():
    """Both addends of every fused add get the gradient of their sum, the returned sum's included."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    fused = ResidualStream(512, 3, fused=True).cuda()
    plain = copy.deepcopy(fused)
    plain.fused = False
    x = torch.randn(8, 32, 512, device="cuda")
    expected_out, expected = gradients(plain, plain, x)
    for run in (fused, torch.compile(fused, fullgraph=True)):
        out, grads = gradients(run, fused, x)
        torch.testing.assert_close(out, expected_out, rtol=1e-4, atol=1e-4)
        for name in grads:
            torch.testing.assert_close(grads[name], expected[name], rtol=1e-3, atol=1e-5, msg=name)


def test_a_copied_block_of_ops_runs_and_trains_on_its_own_kernels():
    """deepcopy (an EMA model, a checkpoint) of a module holding ops whose kernels already ran."""
    from tileops.ops import FusedAddRMSNormFwdOp, SoftmaxFwdOp

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(256))
            self.norm = FusedAddRMSNormFwdOp(N=256, dtype=torch.bfloat16)
            self.softmax = SoftmaxFwdOp(N=256, dtype=torch.bfloat16, dim=-1)

        def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
            y, total = self.norm(x, residual, self.weight.to(x.dtype))
            return self.softmax(y) * total

    block = Block().cuda()
    x, residual = (torch.randn(64, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    block(x, residual).float().square().sum().backward()
    twin = copy.deepcopy(block)
    twin.zero_grad()
    twin(x, residual).float().square().sum().backward()
    assert twin.norm.last_backend == "kernel" and twin.norm._kernel_cache is not block.norm._kernel_cache
    torch.testing.assert_close(twin.weight.grad, block.weight.grad, rtol=0, atol=0)


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


class LlamaMLP(torch.nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, hidden, bias=False)
        self.up_proj = torch.nn.Linear(d, hidden, bias=False)
        self.down_proj = torch.nn.Linear(hidden, d, bias=False)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class TinyLlama(torch.nn.Module):
    def __init__(self, vocab: int = 512, d: int = 256, hidden: int = 688, layers: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.norms = torch.nn.ModuleList(LlamaRMSNorm(d) for _ in range(layers))
        self.mlps = torch.nn.ModuleList(LlamaMLP(d, hidden) for _ in range(layers))
        self.final_norm = LlamaRMSNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for norm, mlp in zip(self.norms, self.mlps):
            h = h + mlp(norm(h))
        return self.head(self.final_norm(h))


def loss_of(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def test_swapped_llama_gives_same_loss_and_gradients_then_trains():
    torch.manual_seed(0)
    reference = TinyLlama().cuda()
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, LlamaRMSNorm):
                module.weight.normal_(1.0, 0.1)
    ours = copy.deepcopy(reference)
    assert tnn.swap_modules(ours) == {"rms_norm": 3, "layer_norm": 0, "gated_mlp": 2}
    tokens = torch.randint(0, 512, (8, 128), device="cuda")
    targets = torch.randint(0, 512, (8, 128), device="cuda")

    reference_loss = loss_of(reference, tokens, targets)
    reference_loss.backward()
    loss = loss_of(ours, tokens, targets)
    loss.backward()
    torch.testing.assert_close(loss, reference_loss, rtol=1e-5, atol=1e-5)
    theirs = dict(reference.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name].grad, rtol=1e-3, atol=1e-6, msg=name)

    optimizer = torch.optim.AdamW(ours.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        optimizer.zero_grad(set_to_none=True)
        step_loss = loss_of(ours, tokens, targets)
        step_loss.backward()
        optimizer.step()
        losses.append(step_loss.item())
    print("training losses:", " ".join(f"{v:.4f}" for v in losses))
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0], losses
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 15, losses
