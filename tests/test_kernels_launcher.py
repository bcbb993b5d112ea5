"""Launch helpers: which callable ``direct_launcher`` picks, with stand-ins for TileLang's adapter
and runtime objects (what they return is all the launcher looks at), and the layout predicates
the op bases decide views with."""

import math
from typing import Any, Optional

import pytest
import torch

from tileops.kernels.launch import direct_launcher, merged_axes_view, rows_and_output


class _Module:
    """A runtime module: its entry function is the attribute ``main``."""

    def __init__(self) -> None:
        self.main = lambda *args: ("main", args)


class _Executable:
    """A freshly compiled executable: ``jit()`` yields the runnable module."""

    def __init__(self, module: _Module) -> None:
        self.module = module
        self.jits = 0

    def jit(self) -> _Module:
        self.jits += 1
        return self.module


class _Adapter:
    def __init__(self, executable: Any, result_idx: Optional[list] = None) -> None:
        self.executable = executable
        self.result_idx = result_idx

    def _get_executable(self) -> Any:
        if isinstance(self.executable, Exception):
            raise self.executable
        return self.executable


class _Compiled:
    def __init__(self, adapter: Any = None) -> None:
        if adapter is not None:
            self.adapter = adapter

    def __call__(self, *args: Any) -> Any:
        return ("wrapper", args)


def test_a_fresh_executable_is_resolved_to_its_entry_function_once() -> None:
    module = _Module()
    executable = _Executable(module)
    launcher = direct_launcher(_Compiled(_Adapter(executable)))
    assert launcher is module.main
    assert executable.jits == 1
    assert launcher(1, 2) == ("main", (1, 2))


def test_a_module_loaded_from_the_cache_launches_its_entry_function() -> None:
    module = _Module()
    assert direct_launcher(_Compiled(_Adapter(module))) is module.main


def test_programs_that_allocate_outputs_keep_the_wrapper() -> None:
    compiled = _Compiled(_Adapter(_Module(), result_idx=[1]))
    assert direct_launcher(compiled) is compiled


def test_other_backends_keep_the_wrapper() -> None:
    plain = _Compiled()
    assert direct_launcher(plain) is plain
    failing = _Compiled(_Adapter(RuntimeError("no executable")))
    assert direct_launcher(failing) is failing


def test_empty_contiguous_is_contiguous_with_unit_rows_whatever_its_model() -> None:
    import torch

    from tileops.kernels.launch import empty_contiguous, has_unit_rows

    column = torch.randn(1, 4).t()  # (4, 1), strides (1, 4): contiguous, yet no unit last stride
    assert column.is_contiguous() and not has_unit_rows(column)
    for like, shape in [(torch.randn(3, 5), (3, 5)), (column, (4, 1)), (torch.randn(4, 6)[:, ::2], (4, 3)),
                        (torch.randn(2, 8), (2, 4))]:
        out = empty_contiguous(like, shape)
        assert out.shape == shape and out.dtype == like.dtype and has_unit_rows(out)
        assert out.stride() == torch.empty(shape).stride()


@pytest.mark.parametrize("make", [
    lambda: torch.randn(3, 64),
    lambda: torch.randn(1, 64),
    lambda: torch.randn(4, 128)[1:2, :64],  # one row of a wider buffer: contiguous, row stride 128
    lambda: torch.randn(2, 3, 64)[1],
    lambda: torch.randn(2, 5, 64),
    lambda: torch.randn(0, 64),
    lambda: torch.randn(5, 1),
    lambda: torch.randn(64, 3).t(),  # not contiguous: a copy
], ids=["rows", "one-row", "row-of-wider", "slice", "rank-3", "empty", "width-1", "transposed"])
@pytest.mark.parametrize("dtype", [None, torch.float64])
def test_rows_and_output_give_rows_width_apart_over_the_same_memory(make: Any, dtype: Optional[torch.dtype]) -> None:
    x = make()
    width = x.shape[-1]
    rows, out, out_rows = rows_and_output(x, width, dtype)
    assert out.shape == x.shape and out.is_contiguous() and out.dtype == (dtype or x.dtype)
    for view in (rows, out_rows):
        assert view.shape == (x.numel() // max(width, 1), width) and view.stride() == (width, 1)
    assert out_rows.data_ptr() == out.data_ptr()
    out_rows.copy_(rows)
    torch.testing.assert_close(out.to(x.dtype), x, rtol=0, atol=0)


def test_layout_predicates_match_torch() -> None:
    from tileops.kernels.launch import contiguous_strides, is_contiguous

    base = torch.randn(4, 1, 6, 5)
    tensors = [base, base.transpose(0, 2), base[:, :, ::2], base[..., :3], base[:1, :, :1], base.permute(1, 0, 2, 3),
               torch.randn(3, 0, 2).transpose(0, 2), torch.randn(5, 1).t(), torch.tensor(1.0),
               base.expand(2, 4, 3, 6, 5)]
    for tensor in tensors:
        assert is_contiguous(tensor.shape, tensor.stride()) == tensor.is_contiguous(), (tensor.shape, tensor.stride())
        assert contiguous_strides(tensor.shape) == torch.empty(tensor.shape).stride()


def _layouts_of(shape: tuple) -> list:
    """``(name, tensor)`` of ``shape`` in several memory layouts."""
    base = torch.arange(math.prod(shape) * 4, dtype=torch.float64)
    contiguous = base[:math.prod(shape)].view(shape)
    wide = base.view(*shape[:-1], shape[-1] * 4)
    return [
        ("contiguous", contiguous),
        ("last-axis slice", wide[..., 1:1 + shape[-1]]),
        ("every other element", wide[..., ::2][..., :shape[-1]]),
        ("transposed", base[:math.prod(shape)].view(shape[::-1]).permute(*range(len(shape) - 1, -1, -1))),
    ]


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4), (4, 1, 3, 2), (1, 6, 1)])
def test_merged_axes_views_address_the_tensor_in_place(shape: tuple) -> None:
    for name, tensor in _layouts_of(shape):
        for first in range(len(shape)):
            for last in range(first, len(shape)):
                view = merged_axes_view(tuple(tensor.shape), tensor.stride(), first, last)
                if view is None:
                    assert name != "contiguous", (shape, first, last)  # contiguous memory always merges
                    continue
                size, stride = view
                assert stride[-1] == 1
                merged = tensor.reshape(*((math.prod(shape[:first]), math.prod(shape[first:last + 1]))
                                          + ((math.prod(shape[last + 1:]),) if len(size) == 3 else ())))
                assert torch.equal(tensor.as_strided(size, stride), merged), (name, shape, first, last)
    # A transpose and every other element have no unit-stride innermost axis to merge into.
    assert merged_axes_view((3, 4), (1, 3), 1, 1) is None
    assert merged_axes_view((3, 4), (8, 2), 0, 1) is None
