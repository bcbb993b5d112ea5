"""Registration: an op missing from its package is a registration finding, and only that."""

from __future__ import annotations

from pathlib import Path

from validator.testing import replace_in, run_validator, scratch_project

NORM_INIT = "tileops/ops/norm/__init__.py"


def test_missing_import_line_is_reported_once_per_package_for_that_op(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / NORM_INIT, "from .rms_norm_fwd import RMSNormFwdOp\n", "")
    run = run_validator(root, "--levels", "-kernel")
    assert run.error_keys() == {("registration", "RMSNormFwdOp", "S20 registration"),
                                ("registration", "RMSNormFwdOp", "tileops.ops.norm"),
                                ("registration", "RMSNormFwdOp", "tileops.ops")}
    assert "lacks `from .rms_norm_fwd import RMSNormFwdOp`" in run.message(
        "registration", "RMSNormFwdOp", "S20 registration")


def test_missing_all_entry(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / NORM_INIT, '    "RMSNormFwdOp",\n', "")
    run = run_validator(root, "--levels", "registration", "--op", "RMSNormFwdOp")
    assert run.error_keys() == {("registration", "RMSNormFwdOp", "tileops.ops.norm")}
    assert "not in tileops.ops.norm.__all__" in run.message("registration", "RMSNormFwdOp", "tileops.ops.norm")
