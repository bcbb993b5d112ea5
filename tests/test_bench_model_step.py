"""benchmarks.model_step on the CPU with a stand-in timer: the swapped model is PyTorch's model with
tileops layers, and every variant steps, trains and agrees with PyTorch."""

import pytest
import torch

from bench_fakes import FakeBackend, identity_compiler
from benchmarks import model_step
from tileops import nn as tnn

SMALL = dict(layers=2, hidden=32, intermediate=48, heads=4, vocab=50, batch=2, seq=7, dtype=torch.float32,
             device="cpu")


def test_the_decoder_swaps_every_norm_and_mlp() -> None:
    model = model_step.build_model(3, 32, 48, 4, 50, torch.float32, "cpu")
    variants = model_step.variants(model, identity_compiler)
    ours = variants["tileops"]
    assert ours is not model and variants["eager"] is model
    assert sum(isinstance(m, tnn.RMSNorm) for m in ours.modules()) == 2 * 3 + 1
    assert sum(isinstance(m, tnn.GatedMLP) for m in ours.modules()) == 3
    assert not any(isinstance(m, (tnn.RMSNorm, tnn.GatedMLP)) for m in model.modules())


@pytest.mark.parametrize("mode", model_step.MODES)
def test_every_variant_steps_and_agrees_with_pytorch(mode: str) -> None:
    backend = FakeBackend(times=[2000.0], peak=3 << 20)
    results = model_step.run(backend, mode, compiler=identity_compiler, **SMALL)
    assert list(results) == ["eager", "torch.compile", "tileops", "tileops + torch.compile"]
    assert len(backend.timed) == 4 and backend.probed == 4
    for r in results.values():
        assert r["ms"] == 2.0 and r["extra_mib"] == 3.0 and r["tokens_per_s"] == 2 * 7 / 2.0 * 1e3
    checks = [r["check"] for r in results.values()]
    if mode == "train":
        assert checks[0] > 1.0  # a loss near log(50), not zero
        assert checks == pytest.approx([checks[0]] * 4, rel=1e-5)
    else:
        assert max(checks) < 1e-4


def test_a_training_step_leaves_no_gradients_behind(monkeypatch) -> None:
    made, variants = [], model_step.variants

    def recording_variants(*args, **kwargs):
        made.append(variants(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(model_step, "variants", recording_variants)
    model_step.run(FakeBackend(), "train", compiler=identity_compiler, **SMALL)
    modules = [made[0]["eager"], made[0]["tileops"]]
    assert modules[0] is not modules[1]
    assert all(p.grad is None for module in modules for p in module.parameters())


def test_unknown_modes_are_refused() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        model_step.run(FakeBackend(), "decode", compiler=identity_compiler, **SMALL)
