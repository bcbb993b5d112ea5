"""Reductions on the GPU against the manifest reference: manifest cases, tuples of dims, keepdim,
dim=None, odd sizes, non-contiguous views, empty tensors and the variance's correction."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest
import torch

from tests.op_checks import assert_close, check_against_reference, family_ops, manifest_cases

pytestmark = pytest.mark.gpu

OPS = family_ops("reduction")
MANIFEST_CASES = [case for name in OPS for case in manifest_cases(name, max_numel=1 << 24)]

# (op, shape, dtype, params, layout): layouts are "contiguous", "transposed" (last two axes
# swapped in memory), "sliced" (every other row of a wider buffer), "padded" (rows three elements
# apart more than their length) and "offset" (a view one element into its storage, so 16-byte
# accesses do not fit).
EXTRA: List[Tuple[str, Tuple[int, ...], torch.dtype, Dict[str, Any], str]] = []
for _op in OPS:
    if _op == "ArgmaxFwdOp":
        _dims = [None, 0, 1, -1, 2]
    else:
        _dims = [None, (0,), (1,), (-1,), (0, 1), (1, 2), (0, 2), (0, 1, 2), (2, 0)]
    for _dim in _dims:
        for _keepdim in (False, True):
            EXTRA.append((_op, (5, 127, 33), torch.bfloat16, {"dim": _dim, "keepdim": _keepdim}, "contiguous"))
    for _layout in ("transposed", "sliced", "offset"):
        EXTRA.append((_op, (7, 4097, 3), torch.float16, {"dim": (1,) if _op != "ArgmaxFwdOp" else 1}, _layout))
        EXTRA.append((_op, (6, 96, 130), torch.float32, {"dim": (-1,) if _op != "ArgmaxFwdOp" else -1}, _layout))
    EXTRA.append((_op, (3, 1 << 20), torch.bfloat16, {"dim": None}, "contiguous"))  # split rows + combine
    EXTRA.append((_op, (40000, 24), torch.float32, {"dim": (0,) if _op != "ArgmaxFwdOp" else 0}, "contiguous"))
    # Enough 64- or 32-column tiles for the one-pass column program, the last one partial.
    EXTRA.append((_op, (600, 20000), torch.bfloat16, {"dim": (0,) if _op != "ArgmaxFwdOp" else 0}, "contiguous"))
    EXTRA.append((_op, (3, 700, 4160), torch.float32, {"dim": (1,) if _op != "ArgmaxFwdOp" else 1}, "sliced"))
    # Few columns over a middle axis: one-pass tiles narrowed to 64 bytes (fp16) and to one
    # 32-byte sector (fp32, the last tile half full).
    EXTRA.append((_op, (66, 1500, 96), torch.float16, {"dim": (1,) if _op != "ArgmaxFwdOp" else 1}, "contiguous"))
    EXTRA.append((_op, (64, 2048, 44), torch.float32, {"dim": (1,) if _op != "ArgmaxFwdOp" else 1}, "contiguous"))
    EXTRA.append((_op, (), torch.float32, {"dim": None}, "contiguous"))
    # Rows of exactly one and four chunks of 256 threads' 16-byte vectors: straight-line programs.
    _last = {"dim": (-1,) if _op != "ArgmaxFwdOp" else -1}
    EXTRA.append((_op, (5, 2048), torch.bfloat16, _last, "sliced"))
    EXTRA.append((_op, (3, 1024), torch.float32, _last, "sliced"))
    EXTRA.append((_op, (2, 8192), torch.float16, _last, "contiguous"))
    # Enough rows for a block each, long enough for long_row_threads: exactly four 512-thread
    # chunks, then eight vectors in flight with a partial last step (4-element and 1-element accesses).
    EXTRA.append((_op, (600, 16384), torch.bfloat16, _last, "contiguous"))
    EXTRA.append((_op, (560, 20000), torch.float32, _last, "sliced"))
    EXTRA.append((_op, (540, 33000), torch.float16, _last, "offset"))
    # Rows no 16-byte access can start, read in aligned windows: split over blocks (a decoding
    # batch's vocabulary), one block a row short and long, a row stride of its own, and a whole
    # tensor of odd size as one row.
    EXTRA.append((_op, (256, 50257), torch.bfloat16, _last, "contiguous"))
    EXTRA.append((_op, (33, 4099), torch.float32, _last, "sliced"))
    EXTRA.append((_op, (600, 16389), torch.float16, _last, "contiguous"))
    EXTRA.append((_op, (9, 1000), torch.bfloat16, _last, "padded"))
    EXTRA.append((_op, (5, 100003), torch.bfloat16, {"dim": None}, "contiguous"))
EXTRA.append(("VarFwdOp", (64, 1000), torch.float32, {"dim": (1,), "correction": 0}, "contiguous"))
EXTRA.append(("VarFwdOp", (64, 1), torch.float32, {"dim": (1,)}, "contiguous"))  # 1 element: NaN, as torch
EXTRA.append(("SumFwdOp", (4, 0, 5), torch.float32, {"dim": (1,)}, "contiguous"))
EXTRA.append(("MeanFwdOp", (4, 0, 5), torch.float32, {"dim": (1,), "keepdim": True}, "contiguous"))
EXTRA.append(("LogSumExpFwdOp", (4, 0, 5), torch.float32, {"dim": (1,)}, "contiguous"))


# The one-pass column program's wide tiles over the middle axis, each with a partial last tile:
# (8, 100, 7000) has enough 512-byte tiles for one pass, ending mid-step; (3, 5000, 3000) has too
# few and is split into segments (its strips are short, so the cases lower the strip minimum,
# ``WIDE_SPLIT_CONFIG``), which end mid-step.  (shape, segments > 1)
WIDE_COLUMNS = [((8, 100, 7000), False), ((3, 5000, 3000), True)]
WIDE_SPLIT_CONFIG = {"one_pass_split_min_strip_kib": 0}


def wide_column_op(name: str, dtype: torch.dtype):
    """The op of a ``WIDE_COLUMNS`` case, reducing the middle axis."""
    return build_extra_op(name, dtype, {"dim": 1 if name == "ArgmaxFwdOp" else (1,)})


def make_extra_input(shape: Tuple[int, ...], dtype: torch.dtype, layout: str, device: str,
                     generator: torch.Generator) -> torch.Tensor:
    """A random tensor of ``shape`` in ``layout`` (the same on every device for one generator)."""
    if layout == "transposed":
        base = torch.randn(*shape[:-2], shape[-1], shape[-2], generator=generator)
        x = base.to(device=device, dtype=dtype).transpose(-1, -2)
    elif layout == "sliced":
        base = torch.randn(*shape[:-2], 2 * shape[-2], shape[-1], generator=generator)
        x = base.to(device=device, dtype=dtype)[..., ::2, :]
    elif layout == "padded":
        base = torch.randn(*shape[:-1], shape[-1] + 3, generator=generator)
        x = base.to(device=device, dtype=dtype)[..., :shape[-1]]
    elif layout == "offset":
        base = torch.randn(torch.Size(shape).numel() + 1, generator=generator)
        x = base.to(device=device, dtype=dtype)[1:].view(shape)
    else:
        x = torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
    return x


def build_extra_op(name: str, dtype: torch.dtype, params: Dict[str, Any]):
    import tileops.ops

    return getattr(tileops.ops, name)(dtype=dtype, **params)


@pytest.mark.parametrize("case", MANIFEST_CASES, ids=str)
def test_manifest_cases(case) -> None:
    check_against_reference(case, device="cuda")


@pytest.mark.parametrize("entry", EXTRA, ids=lambda e: f"{e[0]}-{list(e[1])}-{e[2]}-{e[3]}-{e[4]}")
def test_dims_keepdim_and_layouts(entry) -> None:
    name, shape, dtype, params, layout = entry
    generator = torch.Generator().manual_seed(0)
    x = make_extra_input(shape, dtype, layout, "cuda", generator)
    op = build_extra_op(name, dtype, params)
    y = op(x)
    assert op.last_backend == "kernel"
    expected = op.reference(x.double())
    assert y.shape == expected.shape and y.device.type == "cuda"
    assert y.dtype == (torch.int64 if name == "ArgmaxFwdOp" else dtype)
    if name == "ArgmaxFwdOp":
        torch.testing.assert_close(y.cpu(), expected.cpu())
    else:
        assert_close(y, expected, dtype)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape, split", WIDE_COLUMNS, ids=str)
def test_wide_column_tiles_in_one_pass_and_over_segments(name: str, dtype: torch.dtype, shape, split: bool) -> None:
    from tileops.kernels.reduction.reduce import COLUMN
    from tileops.ops.reduction.base import reduction_view
    from tileops.tuning import overlay

    x = make_extra_input(shape, dtype, "contiguous", "cuda", torch.Generator().manual_seed(0))
    with overlay({name.replace("FwdOp", "Kernel"): WIDE_SPLIT_CONFIG}):
        op = wide_column_op(name, dtype)
        kernel = op._build_kernel(op.kernel_key, shape)
        plan, params, segments = kernel.launch_plan(reduction_view(x, (1,)), kernel.sm_count(x.device))
        y = op(x)
    assert (plan, dict(params)["col_threads"] * dict(params)["cvec"] * dtype.itemsize) == (COLUMN, 512)
    assert (segments > 1, dict(params)["fused"]) == (split, int(not split))
    expected = op.reference(x.double())
    if name == "ArgmaxFwdOp":
        torch.testing.assert_close(y.cpu(), expected.cpu())
    else:
        assert_close(y, expected, dtype)


def test_argmax_takes_the_first_maximum_and_nan() -> None:
    from tileops.ops import ArgmaxFwdOp, AmaxFwdOp

    x = torch.zeros(3, 5000, device="cuda")
    x[:, 4000] = 1.0
    x[:, 4500] = 1.0
    x[1, 2] = float("nan")
    x[1, 4999] = float("nan")
    assert ArgmaxFwdOp(dtype=torch.float32, dim=-1)(x).tolist() == [4000, 2, 4000]
    assert torch.isnan(AmaxFwdOp(dtype=torch.float32, dim=(-1,))(x)[1])


@pytest.mark.parametrize("width", [70000, 70001])
@pytest.mark.parametrize("fill", [0.0, float("-inf"), float("nan")])
def test_argmax_of_equal_values_is_the_first_position(fill: float, width: int) -> None:
    from tileops.ops import ArgmaxFwdOp

    # Rows long enough to be split over blocks (of odd length: read in windows, which must not
    # fold a neighbouring row's equal values), and columns over many lanes.
    x = torch.full((3, width), fill, device="cuda", dtype=torch.bfloat16)
    assert ArgmaxFwdOp(dtype=torch.bfloat16, dim=-1)(x).tolist() == [0, 0, 0]
    assert ArgmaxFwdOp(dtype=torch.bfloat16, dim=None)(x).item() == 0
    assert torch.argmax(x.cpu().float(), -1).tolist() == [0, 0, 0]
    columns = torch.full((20000, 24), fill, device="cuda")
    columns[7000:, 5] = float("inf")
    assert ArgmaxFwdOp(dtype=torch.float32, dim=0)(columns).tolist() == torch.argmax(columns.cpu(), 0).tolist()


def test_argmax_finds_nan_of_either_sign_anywhere() -> None:
    from tileops.ops import ArgmaxFwdOp

    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(6, 70000, device="cuda", generator=generator).to(torch.bfloat16)
    x[0, 69999] = float("nan")  # after the maximum, in the last chunk
    x[1, 123] = torch.tensor(-64, dtype=torch.int16).view(torch.bfloat16)  # 0xffc0: a NaN with its sign bit set
    x[2] = float("-inf")
    x[2, 50000] = -3.0
    x[3, 10:20] = float("nan")
    x[4] = float("-inf")
    x[4, 65000] = float("inf")
    x[5, 7] = float("inf")
    x[5, 9] = float("nan")
    expected = torch.argmax(x.cpu().float(), -1)
    assert torch.isnan(x[1, 123]) and torch.signbit(x[1, 123])
    assert ArgmaxFwdOp(dtype=torch.bfloat16, dim=-1)(x).cpu().tolist() == expected.tolist()
    columns = x.t().contiguous()
    assert ArgmaxFwdOp(dtype=torch.bfloat16, dim=0)(columns).cpu().tolist() == expected.tolist()
    assert ArgmaxFwdOp(dtype=torch.bfloat16, dim=None)(x[2:3]).item() == 50000


def test_amax_of_nothing_is_refused() -> None:
    from tileops.ops import AmaxFwdOp

    with pytest.raises(ValueError, match="shape rule"):
        AmaxFwdOp(dtype=torch.float32, dim=(0,))(torch.empty(0, 3, device="cuda"))


def test_variance_of_a_large_mean() -> None:
    from tileops.ops import VarFwdOp

    x = 1000.0 + torch.randn(16, 1 << 16, device="cuda")
    torch.testing.assert_close(VarFwdOp(dtype=torch.float32, dim=(1,))(x), x.double().var(1).float(), rtol=1e-4, atol=1e-4)


# ---- more than 2**31 elements ----------------------------------------------------------------------

# Rows of 4096 whose offsets pass 2**31, reduced whole (row segments over a 64-bit length), along
# the rows (fused rows past element 2**31) and down the columns (the one-pass column program).
BIG_SHAPE = (2**31 // 4096 + 64, 4096)
BIG_DIMS = {"all": None, "rows": -1, "columns": 0}


def big_params(name: str, axes: str) -> Dict[str, Any]:
    dim = BIG_DIMS[axes]
    return {"dim": dim if dim is None or name == "ArgmaxFwdOp" else (dim,)}


@pytest.fixture(scope="module")
def big_input() -> torch.Tensor:
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(BIG_SHAPE, device="cuda", dtype=torch.bfloat16, generator=generator)
    # The largest element lies past element 2**31: amax and argmax must reach it there.
    x[-1, -7] = 64.0
    return x


@pytest.mark.big_memory
@pytest.mark.parametrize("axes", sorted(BIG_DIMS))
@pytest.mark.parametrize("name", OPS)
def test_over_2_31_elements(big_input: torch.Tensor, name: str, axes: str) -> None:
    assert big_input.numel() > 2**31
    op = build_extra_op(name, torch.bfloat16, big_params(name, axes))
    y = op(big_input)
    assert op.last_backend == "kernel"
    expected = op.reference(big_input.double())
    if name == "ArgmaxFwdOp":
        torch.testing.assert_close(y.cpu(), expected.cpu())
        if axes == "all":
            assert y.item() == big_input.numel() - 7
    else:
        assert_close(y, expected, torch.bfloat16)
    del expected
    torch.cuda.empty_cache()


def test_torch_compile_fullgraph() -> None:
    from tileops.ops import SumFwdOp

    op = SumFwdOp(dtype=torch.bfloat16, dim=(0, 2), keepdim=True)
    x = torch.randn(4, 64, 8, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(lambda t: op(t) * 2, fullgraph=True)
    assert_close(compiled(x), op.reference(x.double()) * 2, torch.bfloat16)
