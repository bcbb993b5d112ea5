"""GPU tests: skipped where no CUDA device is present; large manifest cases marked ``big_memory``."""

import math
import os

import pytest
import torch

from tests.op_checks import Case

# A manifest case whose largest input reaches this many bytes runs with the ``big_memory`` tests,
# one at a time: its float64 reference and gradients take several times the input, and a few such
# cases at once in parallel worker processes exhaust an 80 GiB GPU.
BIG_CASE_BYTES = 256 << 20


def pytest_configure(config):
    """On a host with several GPUs, parallel worker processes (pytest-xdist's ``gwN``) take them in
    turn, so ``make test-gpu`` runs on all of them; tests reach their GPU as the current device."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and torch.cuda.is_available() and torch.cuda.device_count() > 1:
        torch.cuda.set_device(int(worker[2:]) % torch.cuda.device_count())


def case_bytes(case: Case) -> int:
    """Bytes of the case's largest input."""
    return max(math.prod(shape) for _, shape in case.shapes) * case.dtype.itemsize


def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        case = callspec.params.get("case") if callspec is not None else None
        if isinstance(case, Case) and case_bytes(case) >= BIG_CASE_BYTES:
            item.add_marker(pytest.mark.big_memory)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
