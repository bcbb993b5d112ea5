"""Ops the manifest differentiates without a Bwd kernel, on the GPU: by gradient formulas
(``backward: {gradients: ...}``) or by their reference (``backward: reference``).

The forward runs the op's kernels; the backward evaluates the formulas on the saved CUDA
tensors, or differentiates the reference on the saved inputs.  Each is checked against
``torch.autograd`` of the float64 reference, over manifest cases (odd sizes, ranks 1-4,
strided views), eager and under ``torch.compile``.
"""

from __future__ import annotations

from typing import List

import pytest
import torch

from codegen import load_manifest
from tests.op_checks import Case, assert_close, build_op, make_inputs, manifest_cases

pytestmark = pytest.mark.gpu

# Fwd ops only: a Bwd op's own gradients (a double backward) are autograd of its reference on
# whatever device, checked in tests/test_torch_integration.py.
BY_REFERENCE = [op for op in load_manifest().ops
                if op.direction == "Fwd" and (op.backward_by_reference or op.backward_by_formulas)]
CASES_PER_OP = 6


def _nonempty_cases(op_name: str) -> List[Case]:
    cases = manifest_cases(op_name, dtypes=["float32"], max_numel=1 << 16)
    return [case for case in cases if all(0 not in shape for _, shape in case.shapes)]


def _compiled_case(op_name: str) -> Case:
    """A case of rank 2 or more with a 127-long axis: inductor compiles its backward in seconds.
    (A 4097-long strided cumprod row took inductor 431 s, then failed an internal assertion, when
    cumprod's backward still differentiated its reference.)"""
    return next(case for case in _nonempty_cases(op_name)
                if any(len(shape) >= 2 and 127 in shape for _, shape in case.shapes))


CASES = [(case, False) for op in BY_REFERENCE for case in _nonempty_cases(op.name)[-CASES_PER_OP:]]
# One case of each op under torch.compile: formulas or the vjp trace into the compiled backward graph.
CASES += [(_compiled_case(op.name), True) for op in BY_REFERENCE]


def _gradients(run, inputs, seeds):
    outputs = run(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    total = sum((out.double() * seed).sum() for out, seed in zip(outputs, seeds))
    return torch.autograd.grad(total, inputs)


@pytest.mark.parametrize("case, compiled", CASES,
                         ids=[f"{case.op}-{case}-{'compiled' if compiled else 'eager'}" for case, compiled in CASES])
def test_gradients_match_autograd_of_the_reference(case: Case, compiled: bool) -> None:
    spec = next(op for op in BY_REFERENCE if op.name == case.op)
    generator = torch.Generator().manual_seed(3)
    inputs = [t.requires_grad_() for t in make_inputs(spec, case, "cuda", generator)]
    op = build_op(case)
    wide = [t.detach().double().requires_grad_() for t in inputs]
    expected_out = op.reference(*wide)
    expected_out = expected_out if isinstance(expected_out, tuple) else (expected_out,)
    seeds = [torch.randn(out.shape, dtype=torch.float64, generator=generator).cuda() for out in expected_out]
    expected = _gradients(op.reference, wide, seeds)
    if compiled:
        torch._dynamo.reset()
    run = torch.compile(lambda *t: op(*t), fullgraph=True) if compiled else op
    got = _gradients(run, inputs, seeds)
    for mine, theirs in zip(got, expected):
        assert mine.dtype == case.dtype
        assert_close(mine, theirs, case.dtype)
