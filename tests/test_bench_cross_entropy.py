"""benchmarks.cross_entropy_timing on the CPU with a stand-in timer: every variant's step runs and
trains, also when the in-place backward overwrites the logits the next step reads."""

import pytest
import torch

from bench_fakes import FakeBackend, identity_compiler
from benchmarks import cross_entropy_timing


@pytest.mark.parametrize("targets", cross_entropy_timing.TARGETS)
@pytest.mark.parametrize("hidden", [0, 16], ids=["leaf-logits", "lm-head"])
def test_every_variant_steps_and_is_measured(hidden: int, targets: str) -> None:
    backend = FakeBackend(times=[1000.0], peak=5 << 20)
    results = cross_entropy_timing.run(backend, rows=9, classes=33, hidden=hidden, device="cpu",
                                       compiler=identity_compiler, targets=targets)
    assert list(results) == ["tileops", "tileops, inplace_backward", "eager", "torch.compile"]
    assert all(r == {"ms": 1.0, "extra_mib": 5.0} for r in results.values())
    assert len(backend.timed) == 4 and backend.probed == 4


def test_each_measured_step_starts_without_gradients() -> None:
    leaf = torch.randn(3, 4, requires_grad=True)
    grads_seen = []

    def step() -> None:
        grads_seen.append(leaf.grad)
        (leaf * 2).sum().backward()

    cross_entropy_timing.measure(FakeBackend(), step, (leaf,))
    assert grads_seen == [None, None] and leaf.grad is None  # one timed call, one memory probe


def test_unknown_targets_are_refused() -> None:
    with pytest.raises(ValueError, match="targets must be one of"):
        cross_entropy_timing.run(FakeBackend(), rows=2, classes=3, device="cpu", targets="labels")


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("probabilities", [False, True], ids=["indices", "probabilities"])
def test_every_variant_computes_the_same_loss(weighted: bool, probabilities: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5, generator=generator)
    target = (torch.softmax(torch.randn(6, 5, generator=generator), dim=1) if probabilities
              else torch.tensor([0, 4, -100, 2, 2, 1]))
    weight = torch.rand(5, generator=generator) + 0.5 if weighted else None
    variants = cross_entropy_timing.losses(5, torch.float32, identity_compiler, weight)
    expected = torch.nn.functional.cross_entropy(logits, target, weight)
    for name, loss in variants.items():
        torch.testing.assert_close(loss(logits.clone(), target), expected, msg=name)
