"""A Llama-style decoder, whole: PyTorch's layers against tileops' swapped in, eager and compiled.

``python -m benchmarks.model_step [--mode train|infer] [--layers 4] [--hidden 2048]
[--intermediate 5632] [--heads 16] [--vocab 32000] [--batch 4] [--seq 2048] [--dtype bfloat16]
[--compile-mode default|reduce-overhead|max-autotune]``
prints a Markdown table: median milliseconds of one step (timed as ``make bench`` times), tokens
a second, the peak memory the step allocates beyond what it starts with, and each variant's
loss (``train``) or largest logit difference from PyTorch eager (``infer``).

The model is written with ``torch.nn`` alone, under the names Hugging Face's Llama uses
(``input_layernorm``, ``mlp.gate_proj``, ``act_fn``, ...), so ``tileops.nn.swap_modules``
finds its RMSNorms and gated MLPs as it finds a real model's.  Attention is PyTorch's
``scaled_dot_product_attention`` (causal, no rotary embedding: it is the same in every
variant).  ``train`` is a forward over ``batch x seq`` tokens, the cross-entropy loss against
the next tokens (``tileops.nn.CrossEntropyLoss`` for tileops) and the backward; ``infer`` is a
forward without gradients (``--seq 1`` for a decoding step without a cache).  Small steps
are bound by the host's time to issue them; ``--compile-mode reduce-overhead`` replays both
compiled variants from CUDA graphs, which issue a step with no host path.
"""

from __future__ import annotations

import argparse
import copy
import functools
import logging
from typing import Any, Callable, Dict

import torch
import torch.nn.functional as F

from benchmarks.timing import CudaBackend, TimingSettings
from tileops import nn as tnn

logger = logging.getLogger(__name__)

MIB = 1 << 20
MODES = ("train", "infer")
Module = Callable[..., torch.Tensor]


class Attention(torch.nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            torch.nn.Linear(hidden, hidden, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, seq, self.heads, hidden // self.heads).transpose(1, 2)

        mixed = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)),
                                               is_causal=True)
        return self.o_proj(mixed.transpose(1, 2).reshape(batch, seq, hidden))


class MLP(torch.nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = torch.nn.Linear(intermediate, hidden, bias=False)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden: int, intermediate: int, heads: int) -> None:
        super().__init__()
        self.input_layernorm = torch.nn.RMSNorm(hidden, eps=1e-6)
        self.self_attn = Attention(hidden, heads)
        self.post_attention_layernorm = torch.nn.RMSNorm(hidden, eps=1e-6)
        self.mlp = MLP(hidden, intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(torch.nn.Module):
    def __init__(self, layers: int, hidden: int, intermediate: int, heads: int, vocab: int) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(DecoderLayer(hidden, intermediate, heads) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(hidden, eps=1e-6)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def build_model(layers: int, hidden: int, intermediate: int, heads: int, vocab: int, dtype: torch.dtype,
                device: str) -> Decoder:
    """A decoder with its norms' weights drawn around 1 (not all ones, so that they matter)."""
    torch.manual_seed(0)
    model = Decoder(layers, hidden, intermediate, heads, vocab)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.weight.normal_(1.0, 0.1)
            elif isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, module.in_features ** -0.5)
    return model.to(device=device, dtype=dtype)


def variants(model: Decoder, compiler: Callable[[Module], Module] = torch.compile) -> Dict[str, Module]:
    """PyTorch's model and a swapped copy of it, each eager and compiled."""
    ours = copy.deepcopy(model)
    swapped = tnn.swap_modules(ours)
    logger.info("swapped: %s", swapped)
    return {"eager": model, "torch.compile": compiler(model),
            "tileops": ours, "tileops + torch.compile": compiler(ours)}


def run(backend: Any, mode: str, layers: int = 4, hidden: int = 2048, intermediate: int = 5632, heads: int = 16,
        vocab: int = 32000, batch: int = 4, seq: int = 2048, dtype: torch.dtype = torch.bfloat16,
        device: str = "cuda", compiler: Callable[[Module], Module] = torch.compile) -> Dict[str, Dict[str, float]]:
    """Each variant's ms a step, tokens a second, memory beyond the start (MiB) and its loss
    (``train``) or largest logit difference from PyTorch eager (``infer``)."""
    if mode not in MODES:
        raise ValueError(f"model_step: mode must be one of {MODES}, got {mode!r}")
    model = build_model(layers, hidden, intermediate, heads, vocab, dtype, device)
    generator = torch.Generator(device="cpu").manual_seed(1)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)
    results: Dict[str, Dict[str, float]] = {}
    reference = None
    for name, forward in variants(model, compiler).items():
        parameters = list(_module_of(forward).parameters())
        loss_of = tnn.CrossEntropyLoss() if name.startswith("tileops") else torch.nn.CrossEntropyLoss()

        def step(forward: Module = forward, loss_of: Module = loss_of, parameters: list = parameters) -> torch.Tensor:
            if mode == "infer":
                with torch.no_grad():
                    return forward(inputs)
            loss = loss_of(forward(inputs).flatten(0, 1), targets)
            loss.backward()
            for p in parameters:
                p.grad = None  # every step starts without gradients
            return loss.detach()

        out = step()
        if mode == "train":
            check = float(out)
        else:
            reference = out.float() if reference is None else reference
            check = float((out.float() - reference).abs().max())
        ms = backend.time_us([step]) / 1e3
        results[name] = {"ms": ms, "tokens_per_s": batch * seq / ms * 1e3,
                         "extra_mib": backend.peak_memory_bytes(step) / MIB, "check": check}
    return results


def _module_of(forward: Module) -> torch.nn.Module:
    """The module behind a variant: itself, or what torch.compile wrapped."""
    return getattr(forward, "_orig_mod", forward)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="train")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--compile-mode", choices=("default", "reduce-overhead", "max-autotune"), default="default",
                        help="torch.compile's mode for both compiled variants")
    parser.add_argument("--rep-ms", type=float, default=300.0, help="timed repetitions per variant, in ms")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    backend = CudaBackend(settings=TimingSettings(rep_ms=args.rep_ms))
    results = run(backend, args.mode, args.layers, args.hidden, args.intermediate, args.heads, args.vocab,
                  args.batch, args.seq, getattr(torch, args.dtype),
                  compiler=functools.partial(torch.compile, mode=args.compile_mode))
    check = "loss" if args.mode == "train" else "max |logit - eager|"
    logger.info("| %s, %d layers, hidden %d / %d, %d x %d tokens, %s, compile mode %s | ms | tokens/s | "
                "peak beyond start MiB | %s | vs eager |", args.mode, args.layers, args.hidden, args.intermediate,
                args.batch, args.seq, args.dtype, args.compile_mode, check)
    logger.info("|---|---|---|---|---|---|")
    for name, r in results.items():
        logger.info("| %s | %.3f | %.0f | %.0f | %.4g | %.3fx |", name, r["ms"], r["tokens_per_s"], r["extra_mib"],
                    r["check"], results["eager"]["ms"] / r["ms"])


if __name__ == "__main__":
    main()
