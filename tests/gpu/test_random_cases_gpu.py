"""Every op on seeded random cases on the GPU (``tests/random_cases.py``): ranks 0-4, sizes
around powers of two on the op's axis, random params, broadcast operands, optional inputs left
out, and each input in its own layout (strided, misaligned, transposed, padded rows, stride 0),
against the float64 reference; the Fwd ops' gradients against autograd of the reference.  The
first two cases of each op traced with symbolic sizes (``torch.compile(dynamic=True)``), held
to the reference as the eager calls are.  And each op's workloads cut to a single row of a wider buffer
(``single_row_cases``).

``TILEOPS_RANDOM_CASES`` (cases an op, default 8) and ``TILEOPS_RANDOM_SEED`` (default 0) draw
more or other cases; every worker process draws the same ones.
"""

from __future__ import annotations

import os

import pytest

from codegen import load_manifest
from tests.op_checks import (check_against_reference, check_gradients, check_traced_with_dynamic_shapes,
                              has_gradients, single_row_cases)
from tests.random_cases import random_cases

pytestmark = pytest.mark.gpu

OPS = [op.name for op in load_manifest().ops if op.status == "implemented"]
COUNT = int(os.environ.get("TILEOPS_RANDOM_CASES", "8"))
SEED = int(os.environ.get("TILEOPS_RANDOM_SEED", "0"))
CASES = [case for name in OPS for case in random_cases(name, COUNT, SEED)]
GRADIENT_CASES = [case for case in CASES if has_gradients(case)]
# The first two of each op's cases (the same draws), as torch.compile retraces a graph whose input
# shapes changed: the custom op's fake function over symbolic sizes, then the kernels.
TRACED_CASES = [case for name in OPS for case in random_cases(name, 2, SEED)]


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.op}-{case}")
def test_random_case_matches_the_reference(case) -> None:
    check_against_reference(case, float32_slack=True)


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=lambda case: f"{case.op}-{case}")
def test_random_case_gradients_match_the_reference(case) -> None:
    check_gradients(case, float32_slack=True)


@pytest.mark.parametrize("case", TRACED_CASES, ids=lambda case: f"{case.op}-{case}")
def test_random_case_traces_with_dynamic_shapes(case) -> None:
    check_traced_with_dynamic_shapes(case, device="cuda")


# Each op's workloads cut to one row sliced from a wider buffer: contiguous to PyTorch whatever its
# first stride, which the row programs read as the rows' distance.
SINGLE_ROWS = [case for name in OPS for case in single_row_cases(name)]


@pytest.mark.parametrize("case", SINGLE_ROWS, ids=lambda case: f"{case.op}-{case}")
def test_a_single_row_of_a_wider_buffer_matches_the_reference(case) -> None:
    check_against_reference(case)
