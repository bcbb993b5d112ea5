"""Roofline parity: eval_roofline off by a factor, or not an int, is a roofline finding."""

from __future__ import annotations

from pathlib import Path

from validator.testing import regenerate, replace_in, run_validator, scratch_project

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


TOY = """# yaml-language-server: $schema=schema.json

ToyRowsFwdOp:
  family: toy
  status: spec-only
  summary: "y = x"
  signature:
    inputs:
      x: {dtype: "float16 | float32"}
    outputs:
      y: {dtype: "same_as(x)"}
  shape_rules:
    - "x.ndim >= 1"
    - "y.shape == x.shape"
  reference: "x"
  roofline:
    vars: {rows: "numel(x) // x.shape[-1]"}
    flops: "rows"
    bytes: "2 * numel(x) * elem_bytes"
  kernel_map: {toy_rows_fwd: ToyRowsFwdKernel}
  backward: reference
"""


def test_formulas_undefined_on_empty_inputs_warn_without_failing(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    (root / "manifest" / "toy.yaml").write_text(TOY)
    regenerate(root)
    run = run_validator(root, "--levels", "L2,roofline", "--op", "ToyRowsFwdOp")
    assert run.returncode == 0 and run.errors() == []
    (warning,) = run.findings
    assert (warning["level"], warning["op"], warning["rule"], warning["severity"]) == (
        "roofline", "ToyRowsFwdOp", "roofline", "warning")
    assert "ZeroDivisionError" in warning["message"]
