"""Ops on a CUDA device other than device 0: results, gradients and the caller's current device.

Needs two GPUs; on a one-GPU machine these tests are skipped with that reason.
"""

import pytest
import torch

import tileops.functional as F
import tileops.nn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA device"),
]

SECOND = "cuda:1"


@pytest.fixture(autouse=True)
def _device_zero_current():
    """Each test runs with device 0 current, as a one-GPU program would, whichever GPU the worker
    process was given (the GPU tests spread their workers over the host's GPUs), and gives the
    worker its device back."""
    previous = torch.cuda.current_device()
    torch.cuda.set_device(0)
    yield
    torch.cuda.set_device(previous)


# (name, our function, the PyTorch equivalent, input shape); one op of each family.
CASES = [
    ("rms_norm", lambda x, w: F.rms_norm(x, w, eps=1e-6),
     lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps=1e-6), (37, 1024)),
    ("layer_norm", lambda x, w: F.layer_norm(x, w, None),
     lambda x, w: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, None), (37, 1024)),
    ("softmax", lambda x, w: F.softmax(x * w, dim=-1), lambda x, w: torch.softmax(x * w, dim=-1), (37, 1024)),
    ("cumsum", lambda x, w: F.cumsum(x * w, dim=0), lambda x, w: torch.cumsum(x * w, dim=0), (37, 1024)),
    ("silu_and_mul", lambda x, w: F.silu_and_mul(x * w),
     lambda x, w: torch.nn.functional.silu(x[..., :512] * w[:512]) * (x[..., 512:] * w[512:]), (37, 1024)),
]


def _inputs(shape, device):
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(shape, device=device, generator=generator, requires_grad=True)
    w = torch.rand(shape[-1], device=device, generator=generator).add_(0.5).requires_grad_()
    return x, w


@pytest.mark.parametrize("name,ours,theirs,shape", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward_stay_on_the_second_device(name, ours, theirs, shape):
    before = torch.cuda.memory_allocated(0)
    x, w = _inputs(shape, SECOND)
    out = ours(x, w)
    assert out.device == torch.device(SECOND)
    x_ref, w_ref = (t.detach().clone().requires_grad_() for t in (x, w))
    expected = theirs(x_ref, w_ref)
    torch.testing.assert_close(out, expected, rtol=2e-5, atol=2e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=1e-4, atol=1e-4)
    assert x.grad.device == torch.device(SECOND)
    # The caller's current device is untouched and nothing was left on device 0.
    assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(SECOND)
    assert torch.cuda.memory_allocated(0) == before


@pytest.mark.parametrize("dim", [None, (0,), (1,)])
def test_a_reduction_runs_on_the_second_device(dim):
    # Reductions have no backward: forward only.
    x, _ = _inputs((37, 1024), SECOND)
    x = x.detach()
    got = F.sum(x, dim=dim)
    assert got.device == torch.device(SECOND)
    torch.testing.assert_close(got, x.sum() if dim is None else x.sum(dim), rtol=1e-5, atol=1e-4)
    assert torch.cuda.current_device() == 0


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_runs_on_the_second_device(reduction):
    """The loss family: the forward's row and total programs and the backward, on device 1."""
    logits, _ = _inputs((37, 1000), SECOND)
    target = torch.randint(0, 1000, (37,), device=SECOND)
    target[::5] = -100
    loss = F.cross_entropy(logits, target, reduction=reduction)
    reference = logits.detach().clone().requires_grad_()
    expected = torch.nn.functional.cross_entropy(reference, target, reduction=reduction)
    assert loss.device == torch.device(SECOND)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    grad = torch.rand_like(expected)
    loss.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(logits.grad, reference.grad, rtol=1e-5, atol=1e-6)
    assert torch.cuda.current_device() == 0


def test_the_ops_compile_for_the_second_device():
    torch._dynamo.reset()
    norm = tileops.nn.RMSNorm(1024, eps=1e-6, device=SECOND)

    def block(x):
        h = norm(x)
        return x + F.silu_and_mul(torch.cat([h, h], dim=-1)) + F.cumsum(h, dim=0)

    x = torch.randn(37, 1024, device=SECOND)
    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(x), block(x), rtol=1e-4, atol=1e-4)
    assert torch.cuda.current_device() == 0


def test_a_model_moved_to_the_second_device_trains_there():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.RMSNorm(256), torch.nn.Linear(256, 8))
    swapped = tileops.nn.swap_modules(model)
    assert sum(swapped.values()) == 1
    model = model.to(SECOND)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 256, device=SECOND)
    y = torch.randint(0, 8, (64,), device=SECOND)
    losses = []
    for _ in range(10):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(p.device == torch.device(SECOND) for p in model.parameters())
