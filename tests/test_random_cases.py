"""Seeded random cases of every op on the CPU (``tests/random_cases.py``): the generator finds
cases of every op, the same ones in every process, and on the CPU path each case's outputs
(shapes, dtypes, values) and gradients match the float64 reference, traced with symbolic
sizes (``torch.compile(dynamic=True)``) they match it too, and each op's custom op passes
``torch.library.opcheck`` (schema, fake function, autograd registration, tracing).  The GPU runs the same
cases, more of them and larger, in ``tests/gpu/test_random_cases_gpu.py``."""

from __future__ import annotations

import pytest

import torch

from codegen import load_manifest
from tests.op_checks import (_spec, build_op, check_against_reference, check_gradients,
                              check_traced_with_dynamic_shapes, has_gradients, make_inputs)
from tests.random_cases import random_cases

OPS = [op.name for op in load_manifest().ops if op.status == "implemented"]
COUNT = 4
MAX_NUMEL = 1 << 14
CASES = [case for name in OPS for case in random_cases(name, COUNT, seed=1, max_numel=MAX_NUMEL)]
GRADIENT_CASES = [case for case in CASES if has_gradients(case)]
# Two cases an op traced with symbolic sizes, as torch.compile retraces a graph whose input shapes
# changed (its "automatic dynamic" shapes).
TRACED_CASES = [case for name in OPS for case in random_cases(name, 2, seed=2, max_numel=1 << 12)]


@pytest.mark.parametrize("name", OPS)
def test_every_op_gets_its_random_cases_the_same_in_every_draw(name: str) -> None:
    cases = random_cases(name, 8, seed=3)
    assert len(cases) == 8
    assert random_cases(name, 8, seed=3) == cases
    assert random_cases(name, 8, seed=4) != cases


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.op}-{case}")
def test_random_case_matches_the_reference_on_the_cpu(case) -> None:
    check_against_reference(case, device="cpu", float32_slack=True)


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=lambda case: f"{case.op}-{case}")
def test_random_case_gradients_match_the_reference_on_the_cpu(case) -> None:
    check_gradients(case, device="cpu", float32_slack=True)


@pytest.mark.parametrize("case", TRACED_CASES, ids=lambda case: f"{case.op}-{case}")
def test_random_case_traces_with_dynamic_shapes(case) -> None:
    check_traced_with_dynamic_shapes(case)


def _opcheck_cases():
    """Two cases an op for ``torch.library.opcheck``, less those it cannot take: an empty tensor
    (its input cloning fails on one), an output with NaN (its comparisons take NaN for a
    difference), and an ``inplace_backward`` loss, whose eager backward writes the gradient over
    the logits by design, so two runs on the same inputs see different logits."""
    for name in OPS:
        for case in random_cases(name, 10, seed=5, max_numel=1 << 10):
            if dict(case.params).get("inplace_backward") or any(0 in shape for _, shape in case.shapes):
                continue
            inputs = make_inputs(_spec(name), case, "cpu", torch.Generator().manual_seed(0))
            outputs = build_op(case).reference(*inputs)
            if any(out.isnan().any() for out in (outputs if isinstance(outputs, tuple) else (outputs,))):
                continue
            yield case


OPCHECK_CASES = [case for name in OPS for case in [c for c in _opcheck_cases() if c.op == name][:2]]


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=lambda case: f"{case.op}-{case}")
def test_random_case_passes_torch_library_opcheck(case) -> None:
    op = build_op(case)
    inputs = make_inputs(_spec(case.op), case, "cpu", torch.Generator().manual_seed(0))
    params = tuple(getattr(op, name) for name in type(op)._library_params)
    library_op = getattr(torch.ops.tileops, _spec(case.op).custom_op_name.split("::")[-1])
    torch.library.opcheck(library_op, tuple(inputs) + params + (op._graph_handle,))
