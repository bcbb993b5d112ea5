"""Shared fixtures: a scratch copy of the project for tests that edit manifests or generate."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of manifest/, tileops/ and tests/gpu scaffolding targets, generated and current."""
    for name in ("manifest", "tileops"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.fixture(autouse=True)
def plan_cpu_tests_for_an_h100(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU tests check the heuristics an H100 gets, whatever GPU the host has; GPU tests
    (marked ``gpu``) run with the device's own."""
    if request.node.get_closest_marker("gpu") is None:
        from tileops.kernels import device_traits

        monkeypatch.setattr(device_traits, "_device_memory_is_fast", lambda index: False)
