"""The elementwise family on the GPU: every op against its manifest reference, and more.

* every manifest case of the thirteen ops (workloads up to 2**24 elements,
  odd sizes, ranks 1-4, strided and empty inputs) against the float64 reference;
* backward through each Fwd op's autograd against ``torch.autograd`` of the
  float64 forward reference, and the Bwd op called directly;
* broadcasting of every kind (bias rows, per-row scales, scalars, size-0
  axes, broadcasts that need more than three axes, expanded inputs);
* views read in place (row slices, misaligned starts) and views copied
  (transposes, every other element);
* tensors of more than 2**31 elements (several launches, 64-bit offsets).

``python -m tests.gpu.elementwise_warmup`` compiles every program these tests
launch in parallel first, so the tests find them in TileLang's cache.  The
case tables and input builders below take a ``device``, so the warm-up can
replay them on ``meta`` tensors to learn which programs they launch.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch

from tests.op_checks import assert_close, check_against_reference, family_ops, manifest_cases

pytestmark = pytest.mark.gpu

OPS = family_ops("elementwise")
# Manifest cases up to this many elements; the large workloads are checked by the timing script.
MAX_CASE_ELEMENTS = 1 << 24
MANIFEST_CASES = [case for name in OPS for case in manifest_cases(name, max_numel=MAX_CASE_ELEMENTS)]

# (Fwd op, params, shape of x, dtype): the flat kernels for each function and dtype, and gated
# rows of several widths (odd H, H = 1, long rows).
GRAD_CASES: List[Tuple[str, Dict[str, Any], Tuple[int, ...], torch.dtype]] = [
    ("SiluFwdOp", {}, (3, 4097), torch.bfloat16),
    ("SiluFwdOp", {}, (2, 3, 127), torch.float16),
    ("SiluFwdOp", {}, (5,), torch.float32),
    ("GeluFwdOp", {"approximate": "none"}, (3, 4097), torch.float32),
    ("GeluFwdOp", {"approximate": "tanh"}, (2, 3, 127), torch.bfloat16),
    ("SiluAndMulFwdOp", {}, (5, 254), torch.float32),
    ("SiluAndMulFwdOp", {}, (4, 5, 8192), torch.bfloat16),
    ("SiluAndMulFwdOp", {}, (3, 2), torch.float32),
    ("SiluAndMulFwdOp", {}, (3, 96), torch.float16),
    ("GeluAndMulFwdOp", {"approximate": "none"}, (5, 254), torch.bfloat16),
    ("GeluAndMulFwdOp", {"approximate": "tanh"}, (2, 3, 96), torch.float16),
    ("GeluAndMulFwdOp", {"approximate": "tanh"}, (3, 254), torch.float32),
]

# (a shape, b shape, dtype): every kind of broadcast the binary ops fold.
BROADCASTS: List[Tuple[Tuple[int, ...], Tuple[int, ...], torch.dtype]] = [
    ((2048, 4096), (4096,), torch.bfloat16),  # a bias row
    ((64, 4096), (64, 1), torch.bfloat16),  # a per-row scale
    ((7, 129), (129,), torch.float32),  # odd rows: narrow accesses
    ((4, 1, 5), (3, 1), torch.float16),  # both operands broadcast
    ((2, 3, 4, 5), (5,), torch.bfloat16),
    ((2, 3, 4, 8), (2, 1, 4, 8), torch.float32),  # a middle axis
    ((4, 3, 4096), (4, 1, 4096), torch.float16),  # a middle axis, rows of whole tiles: blocks over (D1, D0)
    ((1000,), (), torch.bfloat16),  # a scalar
    ((), (1000,), torch.float32),
    ((1, 1), (1,), torch.bfloat16),  # one element
    ((3, 1, 4, 1, 5), (1, 2, 1, 6, 1), torch.bfloat16),  # folds into five axes: materialized
    ((0, 3), (3,), torch.float32),  # empty
    ((5, 0), (1, 1), torch.bfloat16),
]


def build(name: str, dtype: torch.dtype, **params: Any):
    import tileops.ops

    return getattr(tileops.ops, name)(dtype=dtype, **params)


def static_params(name: str, x_shape: Tuple[int, ...]) -> Dict[str, int]:
    """The static dims of ``name`` for an input ``x`` of this shape (gated ops commit N)."""
    return {"N": x_shape[-1]} if "AndMul" in name else {}


def bwd_name(fwd: str) -> str:
    return fwd.replace("FwdOp", "BwdOp")


def grad_shape(fwd: str, x_shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """The shape of ``grad_y`` for an input ``x``."""
    return x_shape[:-1] + (x_shape[-1] // 2,) if "AndMul" in fwd else x_shape


# ---- views: (label, op name, params, inputs builder) --------------------------------------------
ViewCase = Tuple[str, str, Dict[str, Any], Callable[[str], List[torch.Tensor]]]


def _randn(device: str, *shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, device=device).to(dtype)


VIEW_CASES: List[ViewCase] = [
    ("silu-every-other", "SiluFwdOp", {}, lambda d: [_randn(d, 6, 200)[:, ::2]]),
    ("silu-transposed", "SiluFwdOp", {}, lambda d: [_randn(d, 33, 70).t()]),
    ("silu-misaligned", "SiluFwdOp", {}, lambda d: [_randn(d, 4097)[1:]]),
    ("silu-bwd-mixed", "SiluBwdOp", {}, lambda d: [_randn(d, 40, 64).t(), _randn(d, 64, 40)]),
    ("gated-row-slice", "SiluAndMulFwdOp", {"N": 4096}, lambda d: [_randn(d, 6, 4200)[:, 8:4104]]),
    ("gated-misaligned", "SiluAndMulFwdOp", {"N": 4096}, lambda d: [_randn(d, 6, 4200)[:, 1:4097]]),
    ("gated-3d-slice", "GeluAndMulFwdOp", {"N": 256}, lambda d: [_randn(d, 2, 3, 300, dtype=torch.float32)[..., :256]]),
    ("gated-transposed", "SiluAndMulFwdOp", {"N": 8}, lambda d: [_randn(d, 8, 5).t()]),
    ("gated-bwd-slices", "SiluAndMulBwdOp", {"N": 4096},
     lambda d: [_randn(d, 6, 2100)[:, 4:2052], _randn(d, 6, 4200)[:, 8:4104]]),
    ("add-row-slices", "AddFwdOp", {}, lambda d: [_randn(d, 16, 300)[:, :256], _randn(d, 16, 256)]),
    ("mul-transposed", "MulFwdOp", {}, lambda d: [_randn(d, 48, 32).t(), _randn(d, 32, 48)]),
    ("add-expanded", "AddFwdOp", {}, lambda d: [_randn(d, 4, 1).expand(4, 6), _randn(d, 4, 1).expand(4, 6)]),
    ("mul-misaligned", "MulFwdOp", {}, lambda d: [_randn(d, 1001)[1:], _randn(d, 1000)]),
]

# (label, op name, params, shapes): over 2**31 elements; only the tails are compared.
BIG_CASES = [
    ("silu-flat", "SiluFwdOp", {}, [(2**31 + 3,)]),
    ("silu-and-mul-rows", "SiluAndMulFwdOp", {"N": 2**15}, [(2**16 + 1, 2**15)]),
    ("add-scalar-broadcast", "AddFwdOp", {}, [(2**31 + 5,), (1,)]),
    ("gelu-bwd-flat", "GeluBwdOp", {}, [(2**31 + 3,), (2**31 + 3,)]),
    ("mul-rows", "MulFwdOp", {}, [(2**16 + 1, 2**15), (2**16 + 1, 2**15)]),
    ("silu-and-mul-bwd-rows", "SiluAndMulBwdOp", {"N": 2**15}, [(2**16 + 1, 2**14), (2**16 + 1, 2**15)]),
]


# ---- the manifest's cases ----------------------------------------------------------------------


@pytest.mark.parametrize("case", MANIFEST_CASES, ids=lambda case: f"{case.op}-{case}")
def test_matches_manifest_reference(case):
    check_against_reference(case, device="cuda")


# ---- backward against autograd -------------------------------------------------------------------


@pytest.mark.parametrize("fwd, params, shape, dtype", GRAD_CASES, ids=str)
def test_backward_matches_autograd(fwd, params, shape, dtype):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    grad = torch.randn(grad_shape(fwd, shape), device="cuda", dtype=dtype)
    op = build(fwd, dtype, **static_params(fwd, shape), **params)
    leaf = x.clone().requires_grad_()
    op(leaf).backward(grad)
    wide = x.double().requires_grad_()
    op.reference(wide).backward(grad.double())
    assert_close(leaf.grad, wide.grad, dtype)
    # The Bwd op called directly gives what autograd gave.
    direct = build(bwd_name(fwd), dtype, **static_params(fwd, shape), **params)(grad, x)
    torch.testing.assert_close(direct, leaf.grad, rtol=0, atol=0)


# ---- broadcasting ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["AddFwdOp", "MulFwdOp"])
@pytest.mark.parametrize("a_shape, b_shape, dtype", BROADCASTS, ids=str)
def test_broadcasting_matches_pytorch(name, a_shape, b_shape, dtype):
    a = torch.randn(a_shape, device="cuda", dtype=dtype)
    b = torch.randn(b_shape, device="cuda", dtype=dtype)
    op = build(name, dtype)
    out = op(a, b)
    assert out.shape == torch.broadcast_shapes(a_shape, b_shape) and out.is_contiguous()
    assert_close(out, op.reference(a.double(), b.double()), dtype)


@pytest.mark.parametrize("config", [{"threads": 512, "unroll": 1}, {"threads": 256, "unroll": 2}],
                         ids=["h100", "fast-memory"])
@pytest.mark.parametrize("name", ["AddFwdKernel", "MulFwdKernel"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_binary_layouts_of_both_memory_tiers(config, name, dtype):
    """Half-precision adds and products under the H100's layout and the fast-memory one
    (``BroadcastKernel.fast_memory_threads``), each pinned, on whatever GPU runs the test: same-shape
    operands, a bias over rows of whole tiles and of a tail, and a column scaling rows; large calls
    and small ones."""
    from tileops.kernels.elementwise import binary

    kernel = getattr(binary, name)(dtype, config=config)
    op = torch.add if name == "AddFwdKernel" else torch.mul
    generator = torch.Generator().manual_seed(len(name))
    for rows, width, b_shape in ((4099, 4096, (4096,)), (1000, 4000, (4000,)), (2048, 8192, (2048, 1)),
                                 (8, 4096, (4096,)), (4099, 4096, None)):
        a = torch.randn(rows, width, generator=generator).to(device="cuda", dtype=dtype)
        b = torch.randn(b_shape or (rows, width), generator=generator).to(device="cuda", dtype=dtype)
        out = torch.empty_like(a)
        if b_shape is None:
            kernel.forward(a.view(-1), b.view(-1), out.view(-1))
        else:
            kernel.forward(a.unsqueeze(0), b.expand(rows, width).unsqueeze(0), out.unsqueeze(0))
        assert_close(out, op(a.float(), b.float()), dtype)


def test_incompatible_shapes_quote_the_rule_and_the_shapes():
    with pytest.raises(ValueError, match=r"AddFwdOp: shape rule `broadcastable\(a.shape, b.shape\)` does not hold "
                                         r"for a.shape=\(3, 4\), b.shape=\(2, 4\)"):
        build("AddFwdOp", torch.float32)(torch.randn(3, 4, device="cuda"), torch.randn(2, 4, device="cuda"))


# ---- views ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("label, name, params, make", VIEW_CASES, ids=[c[0] for c in VIEW_CASES])
def test_views_match_reference(label, name, params, make):
    inputs = make("cuda")
    dtype = inputs[0].dtype
    op = build(name, dtype, **params)
    out = op(*inputs)
    assert out.is_contiguous()
    assert_close(out, op.reference(*(t.double() for t in inputs)), dtype)


# ---- hinted loads ----------------------------------------------------------------------------------

# (label, op name, params, inputs builder): each program layout past the small-call size, at odd
# lengths, row slices and 8-byte aligned starts (which load unhinted).
HINTED_CASES: List[ViewCase] = [
    ("silu-flat-odd", "SiluFwdOp", {}, lambda d: [_randn(d, 1_000_003)]),
    ("gelu-flat-fp32", "GeluFwdOp", {"approximate": "none"}, lambda d: [_randn(d, 3, 333_333, dtype=torch.float32)]),
    ("exp-flat-fp16", "ExpFwdOp", {}, lambda d: [_randn(d, 700, 1501, dtype=torch.float16)]),
    ("silu-bwd-flat", "SiluBwdOp", {}, lambda d: [_randn(d, 999_999), _randn(d, 999_999)]),
    ("gelu-bwd-misaligned", "GeluBwdOp", {"approximate": "tanh"},
     lambda d: [_randn(d, 1_000_001)[1:], _randn(d, 1_000_000)]),
    ("silu-and-mul-rows", "SiluAndMulFwdOp", {"N": 8192}, lambda d: [_randn(d, 301, 8192)]),
    ("silu-and-mul-slice-fp32", "SiluAndMulFwdOp", {"N": 4096},
     lambda d: [_randn(d, 517, 4200, dtype=torch.float32)[:, 8:4104]]),
    ("gelu-and-mul-tanh-bwd", "GeluAndMulBwdOp", {"N": 8192, "approximate": "tanh"},
     lambda d: [_randn(d, 301, 4096), _randn(d, 301, 8192)]),
    ("silu-and-mul-bwd-fp16", "SiluAndMulBwdOp", {"N": 2048},
     lambda d: [_randn(d, 999, 1024, dtype=torch.float16), _randn(d, 999, 2048, dtype=torch.float16)]),
    ("add-same-shape", "AddFwdOp", {}, lambda d: [_randn(d, 1003, 1001), _randn(d, 1003, 1001)]),
    ("add-bias-rows", "AddFwdOp", {}, lambda d: [_randn(d, 300, 8192), _randn(d, 8192)]),
    ("mul-row-scale", "MulFwdOp", {}, lambda d: [_randn(d, 1000, 4104), _randn(d, 1000, 1)]),
    ("mul-bias-slices", "MulFwdOp", {}, lambda d: [_randn(d, 999, 4200)[:, :4104], _randn(d, 4104)]),
]


@pytest.mark.parametrize("label, name, params, make", HINTED_CASES, ids=[c[0] for c in HINTED_CASES])
def test_hinted_programs_match_reference(label, name, params, make):
    """With ``hinted_min_mib`` 0 every call past the small-call size loads with the L2 hint, as
    calls of that many MiB do by default."""
    inputs = make("cuda")
    dtype = inputs[0].dtype
    op = build(name, dtype, **params)
    kernel = op._kernel(op.kernel_key, (torch.cuda.current_device(),))
    kernel.config = {**kernel.config, "hinted_min_mib": 0}
    out = op(*inputs)
    assert_close(out, op.reference(*(t.double() for t in inputs)), dtype)
    hinted = [key for key in kernel._compiled if ("hinted", True) in key]
    assert hinted if "misaligned" not in label else not hinted


def test_calls_take_the_hint_from_hinted_min_mib_on():
    op = build("SiluFwdOp", torch.bfloat16)
    kernel = op._kernel(op.kernel_key, (torch.cuda.current_device(),))
    least = (kernel.config["hinted_min_mib"] << 20) // 2  # elements
    for length, hinted in ((least - 8, False), (least, True)):
        x = torch.randn(length, device="cuda", dtype=torch.bfloat16)
        out = op(x)
        assert any(("hinted", True) in key for key in kernel._compiled) == hinted
        assert_close(out[-5:], op.reference(x[-5:].double()), torch.bfloat16)
        del x, out


# ---- more than 2**31 elements --------------------------------------------------------------------


def big_inputs(shapes: List[Tuple[int, ...]], device: str) -> List[torch.Tensor]:
    return [torch.randn(shape, device=device, dtype=torch.bfloat16) for shape in shapes]


@pytest.mark.big_memory
@pytest.mark.parametrize("label, name, params, shapes", BIG_CASES, ids=[c[0] for c in BIG_CASES])
def test_more_than_2_31_elements(label, name, params, shapes):
    assert max(math.prod(s) for s in shapes) > 2**31
    inputs = big_inputs(shapes, "cuda")
    op = build(name, torch.bfloat16, **params)
    out = op(*inputs)
    # The last rows or elements, whose offsets do not fit in 32 bits.
    tails = [t[-3:] if t.numel() > 1 else t for t in inputs]
    assert_close(out[-3:], op.reference(*(t.double() for t in tails)), torch.bfloat16)
    del inputs, out
    torch.cuda.empty_cache()


# ---- a gated MLP trains through the ops ------------------------------------------------------------


def test_gated_mlp_gradients_match_pytorch():
    torch.manual_seed(0)
    d, hidden = 256, 688
    up = torch.nn.Linear(d, 2 * hidden, bias=False, device="cuda")
    down = torch.nn.Linear(hidden, d, bias=False, device="cuda")
    x = torch.randn(4, 64, d, device="cuda")
    act = build("SiluAndMulFwdOp", torch.float32, N=2 * hidden)

    def run(gated: Callable[[torch.Tensor], torch.Tensor]):
        up.zero_grad(set_to_none=True)
        down.zero_grad(set_to_none=True)
        down(gated(up(x))).square().mean().backward()
        return up.weight.grad.clone(), down.weight.grad.clone()

    ours = run(act)
    theirs = run(lambda h: torch.nn.functional.silu(h[..., :hidden]) * h[..., hidden:])
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tokens", [8, 300], ids=["fewer-rows-than-features", "more-rows"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_gated_mlp_module_matches_pytorch_by_every_route(tokens: int, bias: bool, activation: str):
    """``tileops.nn.GatedMLP`` without gradients (both products written into one buffer), and with
    them (the products stacked, or the weights), against the same projections in PyTorch."""
    from tileops import nn as tnn

    torch.manual_seed(0)
    d, hidden = 256, 688
    gate, up = (torch.nn.Linear(d, hidden, bias=bias, device="cuda") for _ in range(2))
    down = torch.nn.Linear(hidden, d, bias=bias, device="cuda")
    ours = tnn.GatedMLP(gate, up, down, activation)
    act = torch.nn.functional.silu if activation == "silu" else torch.nn.functional.gelu

    def theirs(x: torch.Tensor) -> torch.Tensor:
        return down(act(gate(x)) * up(x))

    x = torch.randn(2, tokens // 2, d, device="cuda", requires_grad=True)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-4, atol=1e-5)
    params = [x, *gate.parameters(), *up.parameters(), *down.parameters()]
    theirs(x).square().mean().backward()
    expected = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    ours(x).square().mean().backward()
    for mine, reference in zip((p.grad for p in params), expected):
        torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-6)
