"""Every implemented op on the CPU path: manifest reference, routing, shapes and errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from codegen import load_manifest
from tests.op_checks import check_against_reference, manifest_cases

OPS = [op.name for op in load_manifest().ops if op.status == "implemented"]
CASES = [case for name in OPS for case in manifest_cases(name, max_numel=1 << 18)]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_cpu_path_matches_float64_reference(case) -> None:
    check_against_reference(case, device="cpu")


def test_cases_cover_every_dim_rank_and_odd_size() -> None:
    cases = manifest_cases("CumsumFwdOp")
    seen = {(len(dict(c.shapes)["x"]), dict(c.params).get("dim")) for c in cases if c.label.startswith("rank")}
    assert seen == {(r, d) for r in (1, 2, 3, 4) for d in range(-r, r)}
    sizes = {dict(c.shapes)["x"][dict(c.params)["dim"]] for c in cases if c.label.startswith("rank")}
    assert set(sizes) == {1, 3, 127, 4097}
    assert {c.dtype for c in cases} == {torch.float16, torch.bfloat16, torch.float32}
    assert any(c.layout == "strided" for c in cases) and any(c.label == "empty" for c in cases)


def test_rms_norm_cpu_matches_the_formula() -> None:
    from tileops.ops import RMSNormFwdOp

    x = torch.randn(3, 5, 64, dtype=torch.float32)
    w = torch.randn(64)
    y = RMSNormFwdOp(N=64, dtype=torch.float32, eps=1e-5)(x, w)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)


def test_cumsum_cpu_matches_the_formula() -> None:
    from tileops.ops import CumsumFwdOp

    x = torch.randn(4, 7, 3, dtype=torch.float64).float()
    y = CumsumFwdOp(N=7, dtype=torch.float32, dim=-2)(x)
    manual = torch.stack([x[:, : i + 1, :].sum(1) for i in range(7)], dim=1)
    torch.testing.assert_close(y, manual, rtol=1e-5, atol=1e-5)


# ---- errors name the op, the argument, what was expected and what came ----------------------
def test_wrong_dtype() -> None:
    from tileops.ops import RMSNormFwdOp

    op = RMSNormFwdOp(N=8, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"RMSNormFwdOp: x.dtype must be one of float16, bfloat16, float32, got torch.int32"):
        op(torch.ones(2, 8, dtype=torch.int32), torch.ones(8, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"RMSNormFwdOp: weight.dtype must be x's dtype .*got torch.float32"):
        op(torch.ones(2, 8, dtype=torch.float16), torch.ones(8, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"x.dtype must be torch.float16 \(the dtype given at construction\), got torch.bfloat16"):
        op(torch.ones(2, 8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16))


def test_bad_construction() -> None:
    from tileops.ops import CumsumFwdOp, RMSNormFwdOp

    with pytest.raises(ValueError, match="RMSNormFwdOp: dtype must be one of float16, bfloat16, float32, got torch.int64"):
        RMSNormFwdOp(N=8, dtype=torch.int64)
    # A dtype's name is no dtype (a ValueError here read "must be one of ..., float32, got float32").
    with pytest.raises(TypeError, match=r"RMSNormFwdOp: dtype must be a torch.dtype \(float16, bfloat16, float32\), "
                                        r"got 'float32' \(str\)"):
        RMSNormFwdOp(N=8, dtype="float32")
    with pytest.raises(TypeError):
        RMSNormFwdOp(8, torch.float16)  # keyword-only
    with pytest.raises(ValueError, match="unknown kernel_map key 'nope'"):
        CumsumFwdOp(N=4, dtype=torch.float32, kernel_map={"nope": object})
    with pytest.raises(TypeError, match=r"kernel_map\['cumsum_fwd'\] must be a Kernel subclass"):
        CumsumFwdOp(N=4, dtype=torch.float32, kernel_map={"cumsum_fwd": int})


def test_params_outside_their_manifest_type_are_refused_by_name() -> None:
    from tileops.ops import CumsumFwdOp, RMSNormFwdOp, SumFwdOp

    with pytest.raises(TypeError, match=r"SumFwdOp: dim must be an int, a sequence of ints or None, got 1.5 \(float\)"):
        SumFwdOp(dtype=torch.float32, dim=1.5)
    with pytest.raises(TypeError, match=r"SumFwdOp: dim must be .*, got \[0, 'a'\] \(list\)"):
        SumFwdOp(dtype=torch.float32, dim=[0, "a"])
    with pytest.raises(TypeError, match=r"SumFwdOp: keepdim must be a bool, got 'yes' \(str\)"):
        SumFwdOp(dtype=torch.float32, keepdim="yes")
    with pytest.raises(TypeError, match=r"CumsumFwdOp: dim must be an int, got True \(bool\)"):
        CumsumFwdOp(N=4, dtype=torch.float32, dim=True)
    with pytest.raises(TypeError, match=r"RMSNormFwdOp: eps must be a float, got '1e-5' \(str\)"):
        RMSNormFwdOp(N=8, dtype=torch.float32, eps="1e-5")


def test_static_dims_must_be_sizes() -> None:
    """A static dim is a tensor's size: an int of at least 0, checked when the op is built."""
    from tileops.ops import CumsumFwdOp, RMSNormFwdOp

    for bad in ("4", 4.0, True, None):
        with pytest.raises(TypeError, match=rf"CumsumFwdOp: N \(x.shape\[dim\]\) must be an int, got {re.escape(repr(bad))} "):
            CumsumFwdOp(N=bad, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"RMSNormFwdOp: N \(x.shape\[-1\]\) must be at least 0, got -3$"):
        RMSNormFwdOp(N=-3, dtype=torch.float32)
    assert CumsumFwdOp(N=0, dtype=torch.float32)(torch.empty(2, 0)).shape == (2, 0)


def test_numpy_numbers_are_taken_as_pytorch_takes_them() -> None:
    """Integer and real params (and static dims) of NumPy types are accepted, as PyTorch's int and
    float arguments accept them, and kept as Python numbers (what the custom ops' schemas take)."""
    import tileops.functional as tf
    from tileops.ops import CrossEntropyFwdOp, CumsumFwdOp, SumFwdOp

    x = torch.randn(3, 4)
    op = CumsumFwdOp(N=np.int64(4), dtype=torch.float32, dim=np.int32(-1))
    assert type(op.N) is int and type(op.dim) is int
    torch.testing.assert_close(op(x), torch.cumsum(x, -1))
    reduce = SumFwdOp(dtype=torch.float32, dim=[np.int64(0)])
    assert reduce.dim == (0,) and type(reduce.dim[0]) is int
    smoothing = CrossEntropyFwdOp(V=4, dtype=torch.float32, label_smoothing=np.float32(0.25)).label_smoothing
    assert type(smoothing) is float and smoothing == 0.25
    torch.testing.assert_close(tf.cumsum(x, np.int64(1)), torch.cumsum(x, 1))
    torch.testing.assert_close(tf.softmax(x, np.int16(0)), torch.softmax(x, 0))
    # The limits are checked on the value the op keeps: the error shows a plain float.
    with pytest.raises(ValueError, match=r"label_smoothing must be between 0.0 and 1.0, got 1.5$"):
        CrossEntropyFwdOp(V=4, dtype=torch.float32, label_smoothing=np.float64(1.5))
    with pytest.raises(TypeError, match=r"CumsumFwdOp: dim must be an int, got np.True_ \(bool\)"):
        CumsumFwdOp(N=4, dtype=torch.float32, dim=np.bool_(True))


def test_inputs_that_are_no_tensors_are_refused_by_name() -> None:
    import tileops.functional as F
    from tileops.ops import AddFwdOp, LayerNormFwdOp

    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match="AddFwdOp: b must be a torch.Tensor, got float"):
        AddFwdOp(dtype=torch.float32)(x, 1.0)
    with pytest.raises(TypeError, match="AddFwdOp: a must be a torch.Tensor, got float"):
        F.add(1.0, x)  # the functional form reads a's dtype first
    with pytest.raises(TypeError, match="LayerNormFwdOp: weight must be a torch.Tensor, got list"):
        LayerNormFwdOp(N=4, dtype=torch.float32)(x, [1.0] * 4)
    with pytest.raises(TypeError, match=r"SoftmaxFwdOp: dim must be an int, got \(0,\) \(tuple\)"):
        F.softmax(x, dim=(0,))
    # Absent optional inputs stay allowed.
    torch.testing.assert_close(F.layer_norm(x, None, None), torch.nn.functional.layer_norm(x, (4,)))


def test_params_of_no_param_type_are_refused_by_name() -> None:
    """An array where a number belongs is shown by type, shape and dtype (its repr would print its
    values), and a value no key can hold (an array, a set) reaches the op's own check through the
    functional forms too, rather than failing as unhashable."""
    import tileops.functional as F
    from tileops.ops import CumsumFwdOp, RMSNormFwdOp

    x, weight = torch.randn(3, 4), torch.ones(4)
    with pytest.raises(TypeError, match=r"RMSNormFwdOp: eps must be a float, got a Tensor of shape \(4,\) "
                                        r"and dtype torch.float32$"):
        RMSNormFwdOp(N=4, dtype=torch.float32, eps=weight)
    with pytest.raises(TypeError, match=r"CumsumFwdOp: N \(x.shape\[dim\]\) must be an int, got a Tensor of "
                                        r"shape \(1,\) and dtype torch.int64$"):
        CumsumFwdOp(N=torch.tensor([4]), dtype=torch.float32)
    with pytest.raises(TypeError, match=r"RMSNormFwdOp: eps must be a float, got a ndarray of shape \(2,\) "
                                        r"and dtype float64$"):
        F.rms_norm(x, weight, eps=np.ones(2))
    with pytest.raises(TypeError, match=r"SumFwdOp: dim must be an int, a sequence of ints or None, "
                                        r"got \{0\} \(set\)$"):
        F.sum(x, dim={0})
    with pytest.raises(TypeError, match=r"SoftmaxFwdOp: dim must be an int, got \{\} \(dict\)$"):
        F.softmax(x, dim={})
    # A list still shares the instance of the equal tuple.
    assert F.sum(x, dim=[0]).shape == (4,)


def test_a_single_axis_reads_as_a_one_axis_tuple_as_in_torch() -> None:
    from tileops.ops import AmaxFwdOp, SumFwdOp

    x = torch.randn(3, 5, 4)
    assert SumFwdOp(dtype=torch.float32, dim=-1).dim == (-1,)
    assert SumFwdOp(dtype=torch.float32, dim=[0, 2]).dim == (0, 2)
    torch.testing.assert_close(SumFwdOp(dtype=torch.float32, dim=1)(x), torch.sum(x, dim=1))
    torch.testing.assert_close(AmaxFwdOp(dtype=torch.float32, dim=-1, keepdim=True)(x), torch.amax(x, -1, True))


def test_label_smoothing_outside_zero_to_one_is_refused_at_construction() -> None:
    """PyTorch refuses such a weight at every call; the ops refuse it when built, on any device."""
    from tileops.ops import (CrossEntropyBwdOp, CrossEntropyFwdOp, SoftCrossEntropyBwdOp,
                             SoftCrossEntropyFwdOp)

    for op_cls in (CrossEntropyFwdOp, CrossEntropyBwdOp, SoftCrossEntropyFwdOp, SoftCrossEntropyBwdOp):
        for bad in (-0.1, 1.5):
            with pytest.raises(ValueError, match=rf"^{op_cls.__name__}: label_smoothing must be between 0.0 and 1.0, "
                                                 rf"got {bad}$"):
                op_cls(V=8, dtype=torch.float32, label_smoothing=bad)
        for edge in (0.0, 1.0):
            assert op_cls(V=8, dtype=torch.float32, label_smoothing=edge).label_smoothing == edge
    logits, target = torch.randn(4, 8), torch.tensor([1, 7, 0, 3])
    torch.testing.assert_close(CrossEntropyFwdOp(V=8, dtype=torch.float32, label_smoothing=1.0)(logits, target)[0],
                               F.cross_entropy(logits, target, label_smoothing=1.0))


def test_shape_rule_violations_quote_the_rule() -> None:
    from tileops.ops import AddFwdOp, CumsumFwdOp, MulFwdOp, RMSNormFwdOp, SumFwdOp

    # Broadcasting is checked at every rank: here the tenth axis from the end disagrees.
    high = torch.randn(2, *([1] * 9))
    with pytest.raises(ValueError, match=r"AddFwdOp: shape rule `broadcastable\(a.shape, b.shape\)` does not hold"):
        AddFwdOp(dtype=torch.float32)(high, torch.randn(3, *([1] * 9)))
    with pytest.raises(ValueError, match=r"MulFwdOp: shape rule `broadcastable\(a.shape, b.shape\)` does not hold "
                                         r"for a.shape=\(8, 4096\), b.shape=\(4095,\)"):
        MulFwdOp(dtype=torch.float32)(torch.randn(8, 4096), torch.randn(4095))

    # The params and static dims a rule reads follow the shapes.
    with pytest.raises(ValueError, match=r"CumsumFwdOp: dim must be an axis of x \(shape rule `-max\(x.ndim, 1\) <= "
                                         r"dim < max\(x.ndim, 1\)` does not hold for x.shape=\(4, 3\), dim=2\)$"):
        CumsumFwdOp(N=4, dtype=torch.float32, dim=2)(torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"does not hold for x.shape=\(\), dim=1\)$"):
        CumsumFwdOp(N=1, dtype=torch.float32, dim=1)(torch.tensor(2.0))
    with pytest.raises(ValueError, match=r"shape rule `weight.shape\[0\] == N` does not hold for x.shape=\(2, 8\), "
                                         r"weight.shape=\(9,\), N=8$"):
        RMSNormFwdOp(N=8, dtype=torch.float32)(torch.randn(2, 8), torch.randn(9))
    with pytest.raises(ValueError, match=r"shape rule `x.ndim >= 1`"):
        RMSNormFwdOp(N=8, dtype=torch.float32)(torch.randn(()), torch.randn(8))


def test_a_rule_s_words_lead_its_violation() -> None:
    """Where the manifest gives a rule a `why`, the error says it first, then the rule and the shapes."""
    import tileops.functional as F
    from tileops.ops import AmaxFwdOp, SumFwdOp

    with pytest.raises(ValueError, match=r"^SumFwdOp: dim must not name an axis twice \(shape rule `dim is None or "
                                         r"len\(dim\) < 2 or .*` does not hold for x.shape=\(4, 8\), dim=\(0, -2\)\)$"):
        SumFwdOp(dtype=torch.float32, dim=(0, -2))(torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"^AmaxFwdOp: every reduced axis must be non-empty: an empty one has no "
                                         r"maximum \(shape rule `numel\(.*\) > 0` does not hold for x.shape=\(3, 0\), "
                                         r"dim=\(1,\)\)$"):
        AmaxFwdOp(dtype=torch.float32, dim=1)(torch.empty(3, 0))
    # The declared shape [N, V] implies the rule; the written one lends it its words.
    with pytest.raises(ValueError, match=r"^CrossEntropyFwdOp: logits must be 2-D: one row of class scores per sample "
                                         r"\(shape rule `logits.ndim == 2` does not hold for logits.shape=\(2, 3, 8\), "
                                         r"target.shape=\(2, 3\)\)$"):
        F.cross_entropy(torch.randn(2, 3, 8), torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^SiluAndMulFwdOp: the last axis must have even length"):
        F.silu_and_mul(torch.randn(4, 7))


@pytest.mark.parametrize("dim", [0, -1])
def test_axis_ops_take_0d_tensors_as_pytorch_does(dim: int) -> None:
    """A 0-d tensor is a row of one along dim 0 or -1: the ops built for it as the functional
    API builds them (N from the shape) match PyTorch, forward and backward."""
    import tileops.ops as ops

    x = torch.tensor(0.75)
    for name, torch_fn in (("CumsumFwdOp", torch.cumsum), ("CumprodFwdOp", torch.cumprod),
                           ("SoftmaxFwdOp", torch.softmax), ("LogSoftmaxFwdOp", torch.log_softmax)):
        op = getattr(ops, name)._shared_for(x, dim, None)
        assert op.N == 1
        y = op(x)
        assert y.shape == () and torch.equal(y, torch_fn(x, dim)), name
    grad, y = torch.tensor(1.5), torch.softmax(x, dim)
    leaf = x.clone().requires_grad_()
    torch.softmax(leaf, dim).backward(grad)
    torch.testing.assert_close(ops.SoftmaxBwdOp(N=1, dtype=torch.float32, dim=dim)(grad, y), leaf.grad)
    torch.testing.assert_close(ops.CumsumBwdOp(N=1, dtype=torch.float32, dim=dim)(grad), grad)
    with pytest.raises(ValueError, match=r"static dim N = x.shape\[dim\] was committed as 3 at construction, but "
                                         r"the input has 1"):
        ops.SoftmaxFwdOp(N=3, dtype=torch.float32, dim=dim)(x)


def test_static_dim_mismatch() -> None:
    from tileops.ops import CumsumFwdOp

    with pytest.raises(ValueError, match=r"CumsumFwdOp: static dim N = x.shape\[dim\] was committed as 5 at construction, but the input has 6"):
        CumsumFwdOp(N=5, dtype=torch.float32, dim=0)(torch.randn(6, 5))


def test_mixed_devices_and_strict_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from tileops.ops import RMSNormFwdOp

    op = RMSNormFwdOp(N=8, dtype=torch.float32)
    with pytest.raises(ValueError, match="RMSNormFwdOp: inputs must share one device, got cpu, meta"):
        op(torch.randn(2, 8), torch.randn(8, device="meta"))
    monkeypatch.setenv("TILEOPS_STRICT_DEVICE", "1")
    with pytest.raises(ValueError, match="inputs are on cpu, but TILEOPS_STRICT_DEVICE is set"):
        op(torch.randn(2, 8), torch.randn(8))


def test_meta_tensors_give_shapes_without_computing() -> None:
    from tileops.ops import CumsumFwdOp

    y = CumsumFwdOp(N=5, dtype=torch.bfloat16, dim=1)(torch.empty(3, 5, 2, dtype=torch.bfloat16, device="meta"))
    assert y.device.type == "meta" and y.shape == (3, 5, 2) and y.dtype == torch.bfloat16


def test_calls_are_reentrant_across_ranks() -> None:
    from tileops.ops import CumsumFwdOp

    op = CumsumFwdOp(N=4, dtype=torch.float32, dim=-1)
    a, b = torch.randn(4), torch.randn(2, 3, 4)
    first = op(a)
    op(b)
    torch.testing.assert_close(op(a), first)
    assert op._static_axes((4,)) == frozenset({(0, 0)}) and op._static_axes((2, 3, 4)) == frozenset({(0, 2)})
    # A 0-d input's committed size lies along its one virtual axis (``axis_size``).
    assert op._static_axes(()) == frozenset({(0, 0)})
