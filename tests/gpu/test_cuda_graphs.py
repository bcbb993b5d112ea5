"""CUDA graphs over tileops calls: eager calls captured with ``torch.cuda.graph``, forward and
backward through ``torch.cuda.make_graphed_callables``, and ``torch.compile(mode="reduce-overhead")``.

A decode step spends most of its time on the host; a graph replays the launches without it.
Each test captures after a warm-up on a side stream (which compiles the programs), then writes
new data into the captured inputs and checks every replay against eager calls on that data:
a launch that read a stale pointer, allocated outside the graph's pool or ran on another
stream would replay the warm-up's numbers or fail to capture.
"""

from typing import Callable, Dict, List, Tuple

import pytest
import torch

import tileops.functional as F
from tests.gpu.test_training_gpu import MixerBlock

pytestmark = pytest.mark.gpu

ROWS, HIDDEN, VOCAB = 4, 1024, 32000
REPLAYS = 3


def _decode_inputs(generator: torch.Generator) -> Dict[str, torch.Tensor]:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=generator)

    return {
        "x": randn(ROWS, HIDDEN),
        "residual": randn(ROWS, HIDDEN),
        "weight": randn(HIDDEN),
        "bias": randn(HIDDEN),
        "gate_up": randn(ROWS, 2 * HIDDEN),
        "long_row": randn(2, 65536),
        # Rows a cluster of blocks holds (enough of them for every SM).
        "vocab_rows": randn(140, 65536),
        "logits": randn(ROWS * 2, VOCAB),
        "target": torch.randint(0, VOCAB, (ROWS * 2,), device="cuda", generator=generator),
    }


# One call per family and layout a decode step meets: rows, columns (dim 0), all dims, split rows,
# rows held by clusters of blocks.
CALLS: Dict[str, Callable[[Dict[str, torch.Tensor]], object]] = {
    "rms_norm": lambda t: F.rms_norm(t["x"], t["weight"]),
    "layer_norm": lambda t: F.layer_norm(t["x"], t["weight"], t["bias"]),
    "fused_add_rms_norm": lambda t: F.fused_add_rms_norm(t["x"], t["residual"], t["weight"]),
    "softmax_rows": lambda t: F.softmax(t["x"], -1),
    "log_softmax_columns": lambda t: F.log_softmax(t["x"], 0),
    "softmax_long_row": lambda t: F.softmax(t["long_row"], -1),
    "softmax_clustered_rows": lambda t: F.softmax(t["vocab_rows"], -1),
    "cumsum_rows": lambda t: F.cumsum(t["x"], -1),
    "cumsum_long_row": lambda t: F.cumsum(t["long_row"], -1),
    "cumprod_columns": lambda t: F.cumprod(t["x"] * 0.01 + 1.0, 0),
    "sum_rows": lambda t: F.sum(t["x"], [-1]),
    "var_columns": lambda t: F.var(t["x"], [0]),
    "log_sum_exp_all": lambda t: F.log_sum_exp(t["long_row"]),
    "amax_all": lambda t: F.amax(t["x"]),
    "argmax_rows": lambda t: F.argmax(t["logits"], -1),
    "silu_and_mul": lambda t: F.silu_and_mul(t["gate_up"]),
    "gelu_tanh": lambda t: F.gelu(t["x"], approximate="tanh"),
    "add_bias": lambda t: F.add(t["x"], t["bias"]),
    "mul_column": lambda t: F.mul(t["x"], t["x"][:, :1]),
    "cross_entropy_mean": lambda t: F.cross_entropy(t["logits"], t["target"], label_smoothing=0.1),
    "cross_entropy_none": lambda t: F.cross_entropy(t["logits"], t["target"], reduction="none"),
}


def _flatten(result: object) -> List[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _capture(fn: Callable[[], object]) -> Tuple[torch.cuda.CUDAGraph, object]:
    """``fn`` warmed up on a side stream (as torch requires before capture), then captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


@pytest.mark.parametrize("name", sorted(CALLS))
def test_captured_eager_call_replays_on_new_data(name: str) -> None:
    call = CALLS[name]
    generator = torch.Generator(device="cuda").manual_seed(0)
    static = _decode_inputs(generator)
    graph, captured = _capture(lambda: call(static))
    for _ in range(REPLAYS):
        fresh = _decode_inputs(generator)
        for key, tensor in fresh.items():
            static[key].copy_(tensor)
        graph.replay()
        expected = _flatten(call(fresh))
        got = _flatten(captured)
        assert len(got) == len(expected)
        for out, ref in zip(got, expected):
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def _block_and_input(seed: int) -> Tuple[MixerBlock, torch.Tensor]:
    torch.manual_seed(seed)
    return MixerBlock(256, 512).cuda(), torch.randn(2, 16, 256, device="cuda")


def test_graphed_forward_and_backward_match_eager_gradients() -> None:
    block, x = _block_and_input(0)
    x.requires_grad_(True)
    graphed = torch.cuda.make_graphed_callables(block, (x,))
    for step in range(REPLAYS):
        fresh = torch.randn_like(x).requires_grad_(True)
        block.zero_grad(set_to_none=True)
        graphed(fresh).float().square().mean().backward()
        got = {n: p.grad.clone() for n, p in block.named_parameters()}
        got_x = fresh.grad.clone()
        block.zero_grad(set_to_none=True)
        eager_x = fresh.detach().clone().requires_grad_(True)
        block(eager_x).float().square().mean().backward()
        torch.testing.assert_close(got_x, eager_x.grad, rtol=1e-4, atol=1e-6, msg=f"step {step}: x")
        for name, parameter in block.named_parameters():
            torch.testing.assert_close(got[name], parameter.grad, rtol=1e-4, atol=1e-6, msg=f"step {step}: {name}")


def test_reduce_overhead_compile_matches_eager() -> None:
    torch._dynamo.reset()
    block, x = _block_and_input(1)
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(REPLAYS + 2):  # the first calls record, later ones replay
            fresh = torch.randn_like(x)
            got = compiled(fresh).clone()
            torch.testing.assert_close(got, block(fresh), rtol=1e-4, atol=1e-4)
