"""L0: manifest defects are L0 findings located at file:line, and stop the levels that need the model."""

from __future__ import annotations

from pathlib import Path

from validator.testing import replace_in, run_validator, scratch_project

NORM = "manifest/norm.yaml"


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), start=1) if text in line)


def test_unknown_key_is_located_and_stops_every_other_level(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / NORM, "  ref_api: torch.nn.functional.rms_norm\n",
               "  ref_api: torch.nn.functional.rms_norm\n  colour: blue\n")
    run = run_validator(root, "--levels", "-kernel")
    assert run.error_keys() == {("L0", "RMSNormFwdOp", "colour")}
    assert run.errors()[0]["where"] == f"{NORM}:{_line_of(root / NORM, 'colour: blue')}"
    assert [level["level"] for level in run.report["levels"]] == ["L0"]
    assert run.returncode == 1


def test_a_shape_rule_outside_the_grammar(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / NORM, '    - "x.ndim >= 1"\n', '    - "x.ndim >= 1"\n    - "x.dtype == 3"\n')
    run = run_validator(root, "--levels", "L0")
    assert run.error_keys() == {("L0", "RMSNormFwdOp", "shape_rules[1]")}
    assert "x.dtype" in run.errors()[0]["message"]


def test_a_workload_its_own_rules_reject(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / NORM, "shapes: {x: [1, 4096], weight: [4096]}", "shapes: {x: [1, 4096], weight: [2048]}")
    run = run_validator(root, "--levels", "L0")
    (key,) = run.error_keys()
    assert key[:2] == ("L0", "RMSNormFwdOp") and key[2].startswith("workloads[")
    assert "`weight.shape[0] == N`" in run.errors()[0]["message"]
    assert run.errors()[0]["where"] == f"{NORM}:{_line_of(root / NORM, 'weight: [2048]')}"


def test_an_implemented_op_without_its_kernel_class(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / "tileops/kernels/norm/rms_norm.py", "class RMSNormFwdKernel(", "class RenamedKernel(")
    run = run_validator(root, "--levels", "L0")
    assert run.error_keys() == {("L0", "RMSNormFwdOp", "kernel_map.rms_norm_fwd")}
