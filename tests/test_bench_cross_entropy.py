"""benchmarks.cross_entropy_timing on the CPU with a stand-in timer: every variant's step runs and
trains, also when the in-place backward overwrites the logits the next step reads."""

import pytest
import torch

from bench_fakes import FakeBackend, identity_compiler
from benchmarks import cross_entropy_timing


@pytest.mark.parametrize("hidden", [0, 16], ids=["leaf-logits", "lm-head"])
def test_every_variant_steps_and_is_measured(hidden: int) -> None:
    backend = FakeBackend(times=[1000.0], peak=5 << 20)
    results = cross_entropy_timing.run(backend, rows=9, classes=33, hidden=hidden, device="cpu",
                                       compiler=identity_compiler)
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
