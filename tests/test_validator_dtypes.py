"""L3: a dtype accepted (or a same_as link dropped) that the manifest forbids is an L3 finding."""

from __future__ import annotations

from pathlib import Path

from validator.testing import replace_in, run_validator, scratch_project, slot_containing

SCAN = "tileops/ops/scan/cumsum_fwd.py"
RMS = "tileops/ops/norm/rms_norm_fwd.py"


def test_float64_accepted_is_an_l3_finding_naming_the_dtype(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    check = "if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):"
    replace_in(root / SCAN, check, "if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):")
    run = run_validator(root, "--levels", "-kernel", "--op", "CumsumFwdOp")
    rule = "x.dtype float16 | bfloat16 | float32"
    assert run.error_keys() == {("L3", "CumsumFwdOp", rule),
                                ("slots", "CumsumFwdOp", slot_containing(root, "CumsumFwdOp", check))}
    message = run.message("L3", "CumsumFwdOp", rule)
    assert message.startswith("accepts x=float64") and "more" not in message


def test_dropped_same_as_check_is_an_l3_finding_on_that_input(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / RMS, "if weight.dtype != x.dtype:", "if False:")
    run = run_validator(root, "--levels", "L3", "--op", "RMSNormFwdOp")
    assert run.error_keys() == {("L3", "RMSNormFwdOp", "weight.dtype same_as(x)")}
    assert "x=float16, weight=bfloat16" in run.message("L3", "RMSNormFwdOp", "weight.dtype same_as(x)")


def test_constructor_accepting_an_undeclared_dtype(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / RMS, "self._check_init_dtype(dtype, (torch.float16, torch.bfloat16, torch.float32))",
               "self._check_init_dtype(dtype, (torch.float16, torch.bfloat16, torch.float32, torch.int8))")
    run = run_validator(root, "--levels", "L3", "--op", "RMSNormFwdOp")
    assert run.error_keys() == {("L3", "RMSNormFwdOp", "__init__ dtype")}
    assert "accepts int8" in run.message("L3", "RMSNormFwdOp", "__init__ dtype")
