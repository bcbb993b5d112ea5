"""The command line: level selection, output formats and exit status."""

from __future__ import annotations

from pathlib import Path

import pytest

from validator.__main__ import _attach_level_removals
from validator.findings import Finding
from validator.run import LEVELS, UsageError, parse_levels
from validator.testing import run_validator, scratch_project

ALL = list(LEVELS)


@pytest.mark.parametrize("given, expected", [
    ([], ALL),
    (["all"], ALL),
    (["L0,L1"], ["L0", "L1"]),
    (["L1", "L0"], ["L0", "L1"]),
    (["-kernel"], [level for level in ALL if level != "kernel"]),
    (["no-kernel,-slots"], [level for level in ALL if level not in ("kernel", "slots")]),
    (["shape,dtype,signature,schema"], ["L0", "L1", "L2", "L3"]),
    (["all,-l2"], [level for level in ALL if level != "L2"]),
    (["kernels"], ["kernel"]),
])
def test_parse_levels(given, expected) -> None:
    assert parse_levels(given) == expected


def test_unknown_level_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown level 'L9'"):
        parse_levels(["L9"])


def test_level_removals_are_not_read_as_options() -> None:
    assert _attach_level_removals(["--levels", "-kernel", "--op", "X"]) == ["--levels=-kernel", "--op", "X"]


def test_finding_line_format() -> None:
    finding = Finding("L2", "CumsumFwdOp", "-x.ndim <= dim < x.ndim", "manifest/scan.yaml:21", "it broke")
    assert finding.line() == "L2  CumsumFwdOp  -x.ndim <= dim < x.ndim  manifest/scan.yaml:21  it broke"
    warning = Finding("kernel", "X", "status", "m.yaml:1", "skipped", "warning")
    assert warning.line().endswith("  warning: skipped")


def test_unknown_op_exits_2(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    run = run_validator(root, "--op", "NoSuchFwdOp", "--format", "text")
    assert run.returncode == 2
    assert "no op named 'NoSuchFwdOp'" in run.stderr


def test_a_level_that_crashes_is_reported_and_does_not_stop_the_run() -> None:
    from validator.run import Level, _run_level

    def broken(context):
        raise KeyError("boom")

    result = _run_level(Level("L9", "broken", broken), context=None)
    assert [(f.level, f.op, f.rule) for f in result.findings] == [("L9", "-", "validator")]
    assert "KeyError" in result.findings[0].message and result.errors == 1
