"""The host-overhead benchmark's training step, on the CPU."""

import torch

from benchmarks.host_overhead import training_step


def test_a_training_step_runs_the_forward_and_the_backward_each_time() -> None:
    seen = []

    def call(a: torch.Tensor, b: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        out = (a * b)[index]
        out.register_hook(lambda grad: seen.append(tuple(grad.shape)))
        return out

    a, b = torch.randn(3, 4), torch.randn(4)
    step = training_step(call, [a, b, torch.tensor([0, 2])])
    step()
    step()
    assert seen == [(2, 4), (2, 4)]
    assert a.grad is None and not a.requires_grad  # the caller's tensors are left alone
