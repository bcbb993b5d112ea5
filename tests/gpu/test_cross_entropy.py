"""Cross-entropy on the GPU: forward and backward against PyTorch autograd in float64.

Covers every reduction, label smoothing, ignored rows (including an in-range
``ignore_index`` and a batch with every row ignored), targets outside the classes,
class counts from 1 to 262144, the three float dtypes and logits of more than
2**31 elements (class indices and class probabilities).  Kernels are built in parallel before the
tests run, so the tests themselves find them in TileLang's cache.
"""

from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List, Tuple

import pytest
import torch
import torch.nn.functional as F

from tests.op_checks import TOLERANCE
from tileops.kernels.loss.cross_entropy import SMALL_TOTAL_ELEMENTS, windowed_rows
from tileops.ops import CrossEntropyBwdOp, CrossEntropyFwdOp, SoftCrossEntropyFwdOp

pytestmark = pytest.mark.gpu

REDUCTIONS = ("none", "mean", "sum")
# (V, dtype, ignore_index, label_smoothing): each row compiles one forward and one backward program.
CONFIGS: List[Tuple[int, torch.dtype, int, float]] = [
    (1, torch.float32, -100, 0.0),
    (3, torch.float16, -100, 0.0),
    (127, torch.float16, -100, 0.0),
    (127, torch.bfloat16, -100, 0.0),
    (127, torch.float32, -100, 0.0),
    (127, torch.bfloat16, 0, 0.2),
    (4097, torch.bfloat16, -100, 0.0),
    (4097, torch.float32, -100, 0.1),
    (32000, torch.bfloat16, -100, 0.0),
    (50257, torch.bfloat16, -100, 0.1),  # GPT-2's classes: rows read in windows
    (32000, torch.float16, -100, 0.0),
    (32000, torch.float32, -100, 0.0),
    (32000, torch.bfloat16, -100, 0.1),
    (131072, torch.bfloat16, -100, 0.0),
    (262144, torch.bfloat16, -100, 0.0),
]


def _ops(V: int, dtype: torch.dtype, ignore_index: int, label_smoothing: float,
         reduction: str) -> Tuple[CrossEntropyFwdOp, CrossEntropyBwdOp]:
    params = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction)
    fwd = CrossEntropyFwdOp.shared(V=V, dtype=dtype, **params)
    return fwd, fwd.backward_op()


@pytest.fixture(scope="module", autouse=True)
def prebuilt_kernels(request: pytest.FixtureRequest) -> Iterator[None]:
    """Compile in parallel (the compiler runs outside the GIL) every program of the ``CONFIGS``
    the selected tests of this module use: a ``-k`` selection compiles only its own."""
    device = torch.device("cuda", torch.cuda.current_device())
    module = request.node.path
    selected = {item.callspec.params.get("config") for item in request.session.items
                if item.path == module and hasattr(item, "callspec")}

    def build(config: Tuple[int, torch.dtype, int, float]) -> None:
        for op in _ops(*config, "mean"):
            for compile_program in op._device_kernel(device).program_builds().values():
                compile_program()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(build, [config for config in CONFIGS if config in selected]))
    yield


def _rows(V: int) -> int:
    return max(3, min(67, (1 << 24) // V))


def _inputs(V: int, dtype: torch.dtype, ignore_index: int, rows: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    logits = (3 * torch.randn(rows, V, device="cuda", generator=generator)).to(dtype)
    target = torch.randint(0, V, (rows,), device="cuda", generator=generator)
    target[::3] = ignore_index
    return logits, target


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Per-dtype relative tolerance against the largest expected magnitude (all-zero results: against
    1e-6), and never less than the step between subnormals of ``actual``'s dtype: a float32 value a
    few ulps from float64's, rounded to float16 near 2**-25, lands on either neighbour."""
    assert not torch.isnan(actual).any(), "NaN in the result"
    tol = TOLERANCE[dtype]
    scale = expected.abs().max().item() if expected.numel() else 1.0
    info = torch.finfo(actual.dtype)
    atol = max(tol * max(scale, 1e-6), info.smallest_normal * info.eps)
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=atol)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"V{c[0]}-{str(c[1])[6:]}-ii{c[2]}-ls{c[3]}")
def test_forward_and_backward_match_autograd_in_float64(config, reduction: str) -> None:
    V, dtype, ignore_index, label_smoothing = config
    fwd, _ = _ops(V, dtype, ignore_index, label_smoothing, reduction)
    logits, target = _inputs(V, dtype, ignore_index, _rows(V), seed=V)
    wide = logits.double().requires_grad_()
    expected = F.cross_entropy(wide, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                               reduction=reduction)
    ours = logits.clone().requires_grad_()
    loss, lse = fwd(ours, target)
    assert loss.dtype == dtype and loss.shape == expected.shape
    assert fwd.last_backend == "kernel"
    _close(loss, expected.detach(), dtype)
    _close(lse, torch.logsumexp(wide.detach(), -1), torch.float32)

    grad = torch.randn(expected.shape, device="cuda", dtype=torch.float64)
    expected.backward(grad)
    loss.backward(grad.to(dtype))
    _close(ours.grad, wide.grad, dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradient_through_lse_as_well(reduction: str) -> None:
    V, dtype = 4097, torch.float32
    fwd, _ = _ops(V, dtype, -100, 0.1, reduction)
    logits, target = _inputs(V, dtype, -100, 17, seed=1)
    wide = logits.double().requires_grad_()
    ours = logits.clone().requires_grad_()
    seeds = torch.randn(2, 17, device="cuda", dtype=torch.float64)
    loss, lse = fwd(ours, target)
    expected = F.cross_entropy(wide, target, label_smoothing=0.1, reduction=reduction)
    weight = seeds[0] if reduction == "none" else seeds[0, 0]
    ((expected * weight).sum() + (torch.logsumexp(wide, -1) * seeds[1]).sum()).backward()
    ((loss.double() * weight).sum() + (lse.double() * seeds[1]).sum()).backward()
    _close(ours.grad, wide.grad, dtype)


@pytest.mark.parametrize("reduction", ("mean", "sum"))
@pytest.mark.parametrize("config", [c for c in CONFIGS if c[0] <= 127], ids=lambda c: f"V{c[0]}-{str(c[1])[6:]}-ii{c[2]}-ls{c[3]}")
def test_small_means_and_sums_in_one_block(config, reduction: str) -> None:
    """The largest call the one-block program takes (a warp a row, the total in the same block)."""
    V, dtype, ignore_index, label_smoothing = config
    fwd, _ = _ops(V, dtype, ignore_index, label_smoothing, reduction)
    rows = SMALL_TOTAL_ELEMENTS // V
    kernel = fwd._device_kernel(torch.device("cuda", torch.cuda.current_device()))
    assert kernel.takes_small_total(rows) and not kernel.takes_small_total(rows + 1)
    logits, target = _inputs(V, dtype, ignore_index, rows, seed=V + rows)
    if V > 1 and label_smoothing == 0:
        # A row with some -inf logits (all would give NaN; smoothing would make the loss infinite).
        logits[1, : V // 2] = -float("inf")
        target[1] = V - 1
    wide = logits.double()
    expected = F.cross_entropy(wide, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                               reduction=reduction)
    loss, lse = fwd(logits, target)
    assert loss.dtype == dtype and loss.shape == ()
    _close(loss, expected, dtype)
    _close(lse, torch.logsumexp(wide, -1), torch.float32)


def test_every_row_ignored_gives_nan_mean_and_zero_gradient() -> None:
    fwd, _ = _ops(127, torch.float32, -100, 0.0, "mean")
    logits = torch.randn(5, 127, device="cuda", requires_grad=True)
    target = torch.full((5,), -100, device="cuda")
    loss, _ = fwd(logits, target)
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(logits.detach(), target))
    loss.backward()  # the mean's gradient is 0, as autograd's (its 1 / 0 scale is never applied)
    assert torch.count_nonzero(logits.grad) == 0
    logits.grad = None
    fwd_sum, _ = _ops(127, torch.float32, -100, 0.0, "sum")
    fwd_sum(logits, target)[0].backward()
    assert torch.count_nonzero(logits.grad) == 0


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_every_row_ignored_in_a_class_weighted_mean_gives_nan_and_zero_gradient(label_smoothing: float) -> None:
    from tileops.nn import CrossEntropyLoss

    logits = torch.randn(5, 127, device="cuda", requires_grad=True)
    target = torch.full((5,), -100, device="cuda")
    loss = CrossEntropyLoss(torch.rand(127, device="cuda") + 0.5, label_smoothing=label_smoothing)(logits, target)
    assert torch.isnan(loss)
    assert torch.count_nonzero(torch.autograd.grad(loss, logits)[0]) == 0


def _with_targets_outside_the_classes(target: torch.Tensor, V: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``target`` with rows 1, 4 and 6 set to -1, ``V`` and ``V + 7`` (none of them ignored),
    and a mask of those rows."""
    bad = torch.zeros_like(target, dtype=torch.bool)
    bad[[1, 4, 6]] = True
    target = target.clone()
    target[[1, 4, 6]] = torch.tensor([-1, V, V + 7], device=target.device)
    return target, bad


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("rows", [7, 300], ids=lambda rows: f"{rows}-rows")
@pytest.mark.parametrize("config", [(127, torch.bfloat16, 0, 0.2), (32000, torch.bfloat16, -100, 0.0)],
                         ids=lambda c: f"V{c[0]}-ii{c[2]}-ls{c[3]}")
def test_targets_outside_the_classes_give_nan_rows_not_plausible_numbers(config, rows: int, reduction: str) -> None:
    """PyTorch's CUDA kernels stop the process there; ours give the row a NaN loss and a NaN
    gradient row (so a mean or sum is NaN), and leave every other row as it would be.  Seven
    rows of 127 classes take the one-block mean and sum."""
    V, dtype, ignore_index, label_smoothing = config
    fwd, _ = _ops(V, dtype, ignore_index, label_smoothing, reduction)
    logits, target = _inputs(V, dtype, ignore_index, rows, seed=rows + V)
    target, bad = _with_targets_outside_the_classes(target, V)
    ours = logits.clone().requires_grad_()
    loss, lse = fwd(ours, target)
    _close(lse, torch.logsumexp(logits.double(), -1), torch.float32)
    seeds = torch.rand(rows, device="cuda", dtype=torch.float64) if reduction == "none" else 1
    (loss.double() * seeds).sum().backward()
    assert torch.isnan(ours.grad[bad]).all() and not torch.isnan(ours.grad[~bad]).any()
    if reduction != "none":
        assert torch.isnan(loss)
        return
    assert torch.isnan(loss[bad]).all()
    wide = logits.double().requires_grad_()
    expected = F.cross_entropy(wide, torch.where(bad, ignore_index, target), ignore_index=ignore_index,
                               label_smoothing=label_smoothing, reduction="none")
    _close(loss[~bad], expected[~bad].detach(), dtype)


def test_a_target_outside_the_classes_gives_a_class_weighted_loss_of_nan() -> None:
    from tileops.nn import CrossEntropyLoss

    V = 4097
    logits, target = _inputs(V, torch.float32, -100, 9, seed=21)
    target, bad = _with_targets_outside_the_classes(target, V)
    ours = logits.clone().requires_grad_()
    loss = CrossEntropyLoss(torch.rand(V, device="cuda") + 0.5, label_smoothing=0.1)(ours, target)
    loss.backward()
    assert torch.isnan(loss) and torch.isnan(ours.grad[bad]).all() and not torch.isnan(ours.grad[~bad]).any()


@pytest.mark.parametrize("reduction", ("mean", "sum"))
def test_total_of_many_rows_is_deterministic_on_any_stream_and_in_a_graph(reduction: str) -> None:
    """The row program and the one-block total over several waves of blocks give the same
    bits call after call, on a second stream and replayed from a CUDA graph."""
    fwd, _ = _ops(32000, torch.bfloat16, -100, 0.0, reduction)
    logits, target = _inputs(32000, torch.bfloat16, -100, 3001, seed=11)
    expected = F.cross_entropy(logits.double(), target, reduction=reduction)
    first = fwd(logits, target)[0]
    _close(first, expected, torch.bfloat16)
    for _ in range(3):
        assert torch.equal(fwd(logits, target)[0], first)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = fwd(logits, target)[0]
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(on_side, first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fwd(logits, target)[0]
    for _ in range(2):
        captured.zero_()
        graph.replay()
        assert torch.equal(captured, first)
    assert torch.equal(fwd(logits, target)[0], first)


def test_every_row_ignored_beyond_the_one_block_program_gives_nan_mean() -> None:
    fwd, _ = _ops(4097, torch.float32, -100, 0.1, "mean")
    logits = torch.randn(40, 4097, device="cuda")
    target = torch.full((40,), -100, device="cuda")
    assert not fwd._device_kernel(logits.device).takes_small_total(40)
    assert torch.isnan(fwd(logits, target)[0])
    target[7] = 3  # one kept row: its loss alone
    expected = F.cross_entropy(logits.double(), target, label_smoothing=0.1)
    _close(fwd(logits, target)[0], expected, torch.float32)


@pytest.mark.big_memory
@pytest.mark.parametrize("config", [(32000, torch.bfloat16, -100, 0.0)], ids=["V32000-bfloat16"])
def test_logits_of_more_than_2_31_elements(config) -> None:
    """64-bit row offsets: the rows on both sides of element 2**31 and the last, forward and
    backward, against float64 autograd; the mean over all of them against the row losses."""
    V, dtype, ignore_index, label_smoothing = config
    straddling = 2**31 // V  # the row that holds element 2**31
    rows = straddling + 3
    checked = [0, straddling - 1, straddling, rows - 1]
    fwd, _ = _ops(V, dtype, ignore_index, label_smoothing, "none")
    logits, target = _inputs(V, dtype, ignore_index, rows, seed=31)
    assert logits.numel() > 2**31
    ours = logits.requires_grad_()
    loss, lse = fwd(ours, target)
    grad_loss = torch.rand(rows, device="cuda", dtype=dtype)
    loss.backward(grad_loss)
    wide = logits.detach()[checked].double().requires_grad_()
    expected = F.cross_entropy(wide, target[checked], ignore_index=ignore_index, reduction="none")
    expected.backward(grad_loss[checked].double())
    _close(loss[checked], expected.detach(), dtype)
    _close(lse[checked], torch.logsumexp(wide.detach(), -1), torch.float32)
    _close(ours.grad[checked], wide.grad, dtype)
    mean, _ = _ops(V, dtype, ignore_index, label_smoothing, "mean")[0](logits.detach(), target)
    kept = target != ignore_index
    _close(mean, loss.detach().double()[kept].mean(), dtype)
    del logits, ours, loss, lse
    torch.cuda.empty_cache()


def test_row_count_changes_reuse_one_kernel_and_empty_batches_work() -> None:
    fwd, bwd = _ops(32000, torch.bfloat16, -100, 0.0, "none")
    for rows in (1, 5, 300):
        logits, target = _inputs(32000, torch.bfloat16, -100, rows, seed=rows)
        expected = F.cross_entropy(logits.double(), target, reduction="none")
        _close(fwd(logits, target)[0], expected, torch.bfloat16)
    assert len(fwd._kernel_cache) == 1
    empty = torch.empty(0, 32000, device="cuda", dtype=torch.bfloat16)
    loss, lse = fwd(empty, torch.empty(0, dtype=torch.int64, device="cuda"))
    assert loss.shape == (0,) and lse.shape == (0,)


def test_compiled_training_step_matches_eager() -> None:
    fwd, _ = _ops(4097, torch.bfloat16, -100, 0.0, "mean")
    logits, target = _inputs(4097, torch.bfloat16, -100, 33, seed=3)

    def step(x: torch.Tensor) -> torch.Tensor:
        return fwd(x, target)[0]

    eager_x = logits.clone().requires_grad_()
    step(eager_x).backward()
    compiled_x = logits.clone().requires_grad_()
    torch.compile(step, fullgraph=True)(compiled_x).backward()
    torch.testing.assert_close(compiled_x.grad, eager_x.grad)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("config", [(127, torch.float16, -100, 0.0), (4097, torch.float32, -100, 0.1),
                                    (32000, torch.bfloat16, -100, 0.0)],
                         ids=lambda c: f"V{c[0]}-{str(c[1])[6:]}")
def test_logits_sliced_from_a_padded_vocabulary_give_what_a_copy_gives(config, reduction: str) -> None:
    """Logits ``[N, V]`` that are a row slice of a wider buffer (a vocabulary padded to a
    multiple of 64) are read in place: loss, lse and gradient are bitwise those of a copy.  Rows
    read in windows (``windowed_rows``: V not a multiple of a 16-byte vector) start at other
    offsets into their windows in the buffer than in the copy, so each thread sums other
    elements: there the results agree within rounding."""
    V, dtype, ignore_index, label_smoothing = config
    fwd, _ = _ops(V, dtype, ignore_index, label_smoothing, reduction)
    padded, target = _inputs(V + 64, dtype, ignore_index, _rows(V), seed=V + 1)
    target.clamp_(max=V - 1)
    results = []
    for logits in (padded[:, :V], padded[:, :V].contiguous()):
        logits = logits.detach().requires_grad_()
        loss, lse = fwd(logits, target)
        loss.backward(torch.ones_like(loss))
        results.append((loss, lse, logits.grad))
    assert not padded[:, :V].is_contiguous()
    for sliced, copied in zip(*results):
        if windowed_rows(V, dtype):
            _close(sliced, copied, torch.float32 if sliced.dtype == torch.float32 else dtype)
        else:
            assert torch.equal(sliced, copied)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("padded", [False, True], ids=["contiguous", "padded-vocabulary"])
def test_inplace_backward_writes_the_gradient_over_the_logits_and_holds_one_tensor_less(reduction: str,
                                                                                        padded: bool) -> None:
    """A language-model head's step (logits = hidden @ weight.T, then the loss): with
    ``inplace_backward`` the logits end up holding exactly the gradient the out-of-place backward
    returns, the parameters' gradients are those of the out-of-place step, and (contiguous logits)
    the backward's peak memory is at least one ``[N, V]`` gradient lower.  A padded vocabulary's
    logits are a row slice, overwritten in place too; its slice backward allocates a full-width
    gradient of its own, so there only the values are checked."""
    V, dtype, rows, width = 32000, torch.bfloat16, 512, 256
    generator = torch.Generator(device="cuda").manual_seed(5)
    hidden = torch.randn(rows, width, device="cuda", dtype=dtype, generator=generator)
    weight = torch.randn(V + 64 if padded else V, width, device="cuda", dtype=dtype, generator=generator) / 16
    target = torch.randint(0, V, (rows,), device="cuda", generator=generator)
    target[::5] = -100
    steps = {}
    for inplace in (False, True):
        fwd = CrossEntropyFwdOp.shared(V=V, dtype=dtype, reduction=reduction, inplace_backward=inplace)
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        logits = (h @ w.T)[:, :V]
        if not inplace:
            logits.retain_grad()
        loss = fwd(logits, target)[0]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss.backward(torch.full_like(loss, 0.75))
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        steps[inplace] = (logits.grad if not inplace else logits.detach(), h.grad, w.grad, peak)
    (gradient, *grads, peak), (overwritten, *inplace_grads, inplace_peak) = steps[False], steps[True]
    assert torch.equal(overwritten, gradient)
    for got, expected in zip(inplace_grads, grads):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if not padded:
        assert peak - inplace_peak >= rows * V * dtype.itemsize, (peak, inplace_peak)


@pytest.mark.parametrize("soft", [False, True], ids=["index-targets", "soft-targets"])
def test_inplace_backward_leaves_a_leaf_its_gradient_in_its_own_memory(soft: bool) -> None:
    """Logits that are a leaf get as ``.grad`` the out-of-place gradient, bitwise, in the logits'
    own memory: the backward allocates no ``[N, V]`` tensor.  Soft targets: float32, weighted."""
    V, dtype, rows = 32000, torch.bfloat16, 512
    logits, target = _inputs(V, dtype, -100, rows, seed=9)
    generator = torch.Generator(device="cuda").manual_seed(10)
    probabilities = torch.softmax(torch.randn(rows, V, device="cuda", generator=generator), -1)
    weight = torch.rand(V, device="cuda", generator=generator) + 0.5
    gradients = {}
    for inplace in (False, True):
        leaf = logits.clone().requires_grad_()
        if soft:
            fwd = SoftCrossEntropyFwdOp.shared(V=V, dtype=dtype, label_smoothing=0.1, inplace_backward=inplace)
            loss = fwd(leaf, probabilities, weight)[0]
        else:
            fwd = CrossEntropyFwdOp.shared(V=V, dtype=dtype, inplace_backward=inplace)
            loss = fwd(leaf, target)[0]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss.backward()
        torch.cuda.synchronize()
        gradients[inplace] = (leaf.grad, torch.cuda.max_memory_allocated() - before, leaf.data_ptr())
    (expected, peak, _), (got, inplace_peak, address) = gradients[False], gradients[True]
    assert torch.equal(got, expected) and got.data_ptr() == address
    assert peak >= rows * V * dtype.itemsize > inplace_peak


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("config", [(32000, torch.bfloat16, -100, 0.0), (4097, torch.float32, -100, 0.1)],
                         ids=lambda c: f"V{c[0]}-{str(c[1])[6:]}-ls{c[3]}")
def test_class_weighted_loss_matches_autograd_in_float64(config, reduction: str) -> None:
    """``tileops.nn.CrossEntropyLoss(weight)`` (the kernels' per-row losses and lse, weighted by
    PyTorch ops) against PyTorch's weighted loss in float64, forward and backward."""
    from tileops.nn import CrossEntropyLoss

    V, dtype, ignore_index, label_smoothing = config
    logits, target = _inputs(V, dtype, ignore_index, _rows(V), seed=11)
    weight = torch.rand(V, device="cuda", generator=torch.Generator(device="cuda").manual_seed(12)) + 0.5
    ours = logits.clone().requires_grad_()
    loss = CrossEntropyLoss(weight, ignore_index, reduction, label_smoothing)(ours, target)
    wide = logits.double().requires_grad_()
    expected = F.cross_entropy(wide, target, weight.double(), ignore_index=ignore_index, reduction=reduction,
                               label_smoothing=label_smoothing)
    assert loss.dtype == dtype
    _close(loss, expected, dtype)
    grad = torch.rand_like(expected)
    loss.backward(grad.to(dtype))
    expected.backward(grad)
    _close(ours.grad, wide.grad, dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("config", [(32000, torch.bfloat16, False, 0.0), (4097, torch.float32, True, 0.1)],
                         ids=lambda c: f"V{c[0]}-{str(c[1])[6:]}-{'weighted' if c[2] else 'unweighted'}-ls{c[3]}")
def test_probability_targets_match_autograd_in_float64(config, reduction: str) -> None:
    """``tileops.nn.CrossEntropyLoss`` with class-probability targets (the kernels' lse, the rest
    PyTorch ops) against PyTorch's loss in float64, forward and backward."""
    from tileops.nn import CrossEntropyLoss

    V, dtype, weighted, label_smoothing = config
    rows = _rows(V)
    generator = torch.Generator(device="cuda").manual_seed(13)
    logits = (3 * torch.randn(rows, V, device="cuda", generator=generator)).to(dtype)
    probabilities = torch.softmax(2 * torch.randn(rows, V, device="cuda", generator=generator), dim=1)
    weight = torch.rand(V, device="cuda", generator=generator) + 0.5 if weighted else None
    ours = logits.clone().requires_grad_()
    loss = CrossEntropyLoss(weight, reduction=reduction, label_smoothing=label_smoothing)(ours, probabilities)
    wide = logits.double().requires_grad_()
    expected = F.cross_entropy(wide, probabilities.double(), None if weight is None else weight.double(),
                               reduction=reduction, label_smoothing=label_smoothing)
    assert loss.dtype == torch.promote_types(dtype, probabilities.dtype)  # float32 targets promote, as in PyTorch
    _close(loss, expected, dtype)
    grad = torch.rand_like(expected)
    loss.backward(grad.to(loss.dtype))
    expected.backward(grad)
    _close(ours.grad, wide.grad, dtype)


# (V, logits dtype, targets dtype, weighted, label smoothing): the soft-target op's kernels.
SOFT_CONFIGS = [
    (1, torch.float32, torch.float32, False, 0.0),
    (3, torch.float16, torch.float16, True, 0.2),
    (127, torch.bfloat16, torch.bfloat16, False, 0.1),
    (4097, torch.float32, torch.bfloat16, True, 0.0),
    (32000, torch.bfloat16, torch.float32, True, 0.1),
    (131072, torch.bfloat16, torch.bfloat16, False, 0.0),
    (262144, torch.bfloat16, torch.float32, False, 0.0),
]
# The soft-target kernels the module's other tests reach (through tileops.nn and in place).
SOFT_CONFIGS_OF_OTHER_TESTS = [
    (32000, torch.bfloat16, torch.float32, False, 0.0),
    (4097, torch.float32, torch.float32, True, 0.1),
    (32000, torch.bfloat16, torch.float32, True, 0.1),
]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("config", SOFT_CONFIGS,
                         ids=lambda c: f"V{c[0]}-{str(c[1])[6:]}-targets-{str(c[2])[6:]}-w{int(c[3])}-ls{c[4]}")
def test_soft_targets_forward_and_backward_match_autograd_in_float64(config, reduction: str) -> None:
    """``SoftCrossEntropyFwdOp``: loss, lse and target mass, and the logits' gradient through the
    loss and the lse, against PyTorch's loss in float64; the targets and logits are row slices of
    wider buffers (a padded vocabulary), read in place."""
    V, dtype, target_dtype, weighted, label_smoothing = config
    rows = _rows(V)
    generator = torch.Generator(device="cuda").manual_seed(V)
    logits = (3 * torch.randn(rows, V + 8, device="cuda", generator=generator)).to(dtype)[:, :V]
    probabilities = torch.softmax(2 * torch.randn(rows, V + 8, device="cuda", generator=generator), 1)
    probabilities = probabilities.to(target_dtype)[:, :V]
    weight = torch.rand(V, device="cuda", generator=generator) + 0.5 if weighted else None
    fwd = SoftCrossEntropyFwdOp(V=V, dtype=dtype, label_smoothing=label_smoothing, reduction=reduction)
    ours = logits.detach().clone().requires_grad_()
    loss, lse, mass = fwd(ours, probabilities, weight)
    assert fwd.last_backend == "kernel" and loss.dtype == torch.float32

    wide = logits.double().requires_grad_()
    wide_weight = None if weight is None else weight.double()
    expected = F.cross_entropy(wide, probabilities.double(), wide_weight, label_smoothing=label_smoothing,
                               reduction=reduction)
    mixed = (probabilities.double() * (1 - label_smoothing) + label_smoothing / V) * (1 if weight is None else wide_weight)
    # Float32 sums of up to 262144 terms, from the very inputs the float64 reference reads (a
    # one-class row loses lse * q - q * x: 0 up to the rounding of one product).
    scale = expected.detach().abs().max().item() if expected.numel() else 1.0
    torch.testing.assert_close(loss.double(), expected.detach(), rtol=1e-4, atol=1e-4 * max(scale, 1.0))
    _close(lse, torch.logsumexp(wide.detach(), -1), torch.float32)
    torch.testing.assert_close(mass.double(), mixed.sum(-1), rtol=1e-4, atol=1e-4)

    seeds = torch.randn(2, rows, device="cuda", dtype=torch.float64)
    scale = seeds[0] if reduction == "none" else seeds[0, 0]
    ((expected * scale).sum() + (torch.logsumexp(wide, -1) * seeds[1]).sum()).backward()
    ((loss.double() * scale).sum() + (lse.double() * seeds[1]).sum()).backward()
    _close(ours.grad, wide.grad, dtype)


@pytest.mark.big_memory
def test_soft_targets_over_more_than_2_31_elements() -> None:
    """The soft-target kernels past 32-bit offsets: the loss and the logits' gradient of the first
    row and the last rows (past element 2**31) against float64 autograd."""
    V, dtype = 131072, torch.bfloat16
    rows = 2**31 // V + 3
    logits = torch.randn(rows, V, device="cuda", dtype=dtype)
    probabilities = (torch.rand(rows, V, device="cuda", dtype=dtype) * (2 / V)).to(dtype)
    assert logits.numel() > 2**31
    ours = logits.requires_grad_()
    loss, lse, _ = SoftCrossEntropyFwdOp(V=V, dtype=dtype, reduction="none")(ours, probabilities)
    grad_loss = torch.rand(rows, device="cuda")
    loss.backward(grad_loss)
    checked = [0, rows - 3, rows - 2, rows - 1]
    wide = logits.detach()[checked].double().requires_grad_()
    expected = F.cross_entropy(wide, probabilities[checked].double(), reduction="none")
    expected.backward(grad_loss[checked].double())
    torch.testing.assert_close(loss[checked].double(), expected.detach(), rtol=1e-4, atol=1e-4)
    _close(lse[checked], torch.logsumexp(wide.detach(), -1), torch.float32)
    _close(ours.grad[checked], wide.grad, dtype)
    del logits, ours, probabilities, loss, lse
    torch.cuda.empty_cache()


def test_soft_targets_of_an_empty_batch_and_a_refused_differentiable_target() -> None:
    fwd = SoftCrossEntropyFwdOp(V=5, dtype=torch.bfloat16)
    logits = torch.empty(0, 5, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    loss, lse, mass = fwd(logits, torch.empty(0, 5, device="cuda"))
    assert torch.isnan(loss) and lse.shape == mass.shape == (0,)  # PyTorch's mean of no rows
    loss.backward()
    assert logits.grad.shape == (0, 5)
    with pytest.raises(ValueError, match="probabilities requires grad"):
        fwd(torch.randn(2, 5, device="cuda", dtype=torch.bfloat16),
            torch.rand(2, 5, device="cuda", requires_grad=True))
