"""Roofline parity: eval_roofline off by a factor, or not an int, is a roofline finding."""

from __future__ import annotations

from pathlib import Path

from validator.testing import replace_in, run_validator, scratch_project

RMS = "tileops/ops/norm/rms_norm_fwd.py"


def test_flops_off_by_a_factor_of_two(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / RMS, "flops = 4 * M * self.N", "flops = 8 * M * self.N")
    run = run_validator(root, "--levels", "-kernel", "--op", "RMSNormFwdOp")
    assert run.error_keys() == {("roofline", "RMSNormFwdOp", "roofline.flops"),
                                ("slots", "RMSNormFwdOp", "S19 eval_roofline")}
    message = run.message("roofline", "RMSNormFwdOp", "roofline.flops")
    assert "off by a factor of 2" in message and "`4 * M * N`" in message


def test_bytes_returned_as_float(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / RMS, "return int(flops), int(moved)", "return int(flops), float(moved)")
    run = run_validator(root, "--levels", "roofline", "--op", "RMSNormFwdOp")
    assert run.error_keys() == {("roofline", "RMSNormFwdOp", "roofline.bytes")}
    assert "expected a Python int" in run.message("roofline", "RMSNormFwdOp", "roofline.bytes")
