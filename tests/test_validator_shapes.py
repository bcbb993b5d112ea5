"""L2: generated cases cover what they must, and planted shape defects are reported at L2."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.loader import load_files
from validator.cases import ACCEPT, RULE, STATIC_DIM, expect, generate_cases
from validator.testing import regenerate, replace_in, run_validator, scratch_project, slot_containing

SCAN_LIKE = """# yaml-language-server: $schema=schema.json

ScanLikeFwdOp:
  family: toy
  status: spec-only
  summary: "y = scan(x, dim)"
  signature:
    inputs:
      x: {dtype: "float16 | float32"}
      w: {dtype: "same_as(x)", shape: [N]}
    outputs:
      y: {dtype: "same_as(x)"}
    params:
      dim: {type: int, default: -1}
  static_dims:
    N: "x.shape[dim]"
  shape_rules:
    - "x.ndim >= 1"
    - "-x.ndim <= dim < x.ndim"
    - "y.shape == x.shape"
  reference: "x"
  roofline: {flops: "numel(x)", bytes: "2 * numel(x) * elem_bytes"}
  kernel_map: {scan_like_fwd: ScanLikeFwdKernel}
  backward: reference
"""


@pytest.fixture(scope="module")
def scan_like(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("manifest") / "toy.yaml"
    path.write_text(SCAN_LIKE)
    return load_files([path], path.parent).op("ScanLikeFwdOp")


def test_cases_are_many_deterministic_and_cover_every_dim(scan_like) -> None:
    cases = generate_cases(scan_like, 200)
    assert len(cases) >= 200
    assert cases == generate_cases(scan_like, 200)
    judged = [(case, expect(scan_like, case)) for case in cases]
    accepted = {(len(c.shapes[0]), dict(c.params)["dim"]) for c, v in judged if v.kind == ACCEPT}
    for rank in range(1, 5):
        assert {dim for r, dim in accepted if r == rank} == set(range(-rank, rank))
    sizes = {size for case in cases for shape in case.shapes for size in shape}
    assert {1, 3, 5, 127} <= sizes


def test_0d_inputs_take_dims_0_and_minus_1_where_the_rules_allow(tmp_path: Path) -> None:
    """Rank-0 cases try dims -2 to 1; under the PyTorch-like rule, -1 and 0 are accepted with the
    static dim 1 and the others refused by the rule."""
    path = tmp_path / "toy.yaml"
    path.write_text(SCAN_LIKE.replace('    - "x.ndim >= 1"\n    - "-x.ndim <= dim < x.ndim"\n',
                                      '    - "-max(x.ndim, 1) <= dim < max(x.ndim, 1)"\n'))
    op = load_files([path], path.parent).op("ScanLikeFwdOp")
    scalar = [(case, expect(op, case)) for case in generate_cases(op, 200) if case.shapes[0] == ()]
    accepted = {dict(c.params)["dim"] for c, v in scalar if v.kind == ACCEPT}
    refused = {dict(c.params)["dim"] for c, v in scalar if v.kind == RULE}
    assert accepted == {-1, 0} and refused == {-2, 1}
    assert all(dict(c.committed)["N"] == 1 for c, v in scalar if v.kind == ACCEPT)


def test_cases_probe_invalid_ranks_dims_shapes_and_commitments(scan_like) -> None:
    verdicts = [expect(scan_like, case) for case in generate_cases(scan_like, 200)]
    violated = {v.rule.text for v in verdicts if v.kind == RULE}
    assert {"x.ndim >= 1", "-x.ndim <= dim < x.ndim", "w.ndim == 1", "w.shape[0] == N"} <= violated
    assert any(v.kind == STATIC_DIM for v in verdicts)
    assert sum(v.kind == ACCEPT for v in verdicts) >= 100


def test_wrong_inferred_shape_is_an_l2_finding_on_the_output_rule(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / "tileops/ops/norm/rms_norm_fwd.py", 'return {"y": tuple(x_shape)}',
               'return {"y": tuple(x_shape[:-1]) + (1,)}')
    run = run_validator(root, "--levels", "-kernel", "--op", "RMSNormFwdOp")
    assert run.error_keys() == {("L2", "RMSNormFwdOp", "y.shape == x.shape"),
                                ("slots", "RMSNormFwdOp", "S17 _infer_output_shapes")}
    message = run.message("L2", "RMSNormFwdOp", "y.shape == x.shape")
    assert "_infer_output_shapes gives" in message and "cases)" in message


def test_weakened_forward_check_is_an_l2_finding_quoting_the_rule(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    rule = "-max(x.ndim, 1) <= dim < max(x.ndim, 1)"
    check = "if not (-max(x.ndim, 1) <= self.dim < max(x.ndim, 1)):"
    replace_in(root / "tileops/ops/scan/cumsum_fwd.py", check, "if not (-max(x.ndim, 1) <= self.dim <= max(x.ndim, 1)):")
    run = run_validator(root, "--levels", "-kernel", "--op", "CumsumFwdOp")
    assert run.error_keys() == {("L2", "CumsumFwdOp", rule),
                                ("slots", "CumsumFwdOp", slot_containing(root, "CumsumFwdOp", check))}
    assert f"expected a ValueError quoting `{rule}`" in run.message("L2", "CumsumFwdOp", rule)


def test_a_dropped_bound_or_choice_check_is_an_l2_finding_on_the_param(tmp_path: Path) -> None:
    """Building the op must refuse what the manifest's bounds and choices exclude, and a negative
    static dim: a generated file whose check is gone builds the op anyway, and L2 says so at the
    param or dim (and the slot check sees the edit)."""
    root = scratch_project(tmp_path / "project")
    path = root / "tileops/ops/loss/cross_entropy_fwd.py"
    bound = '        self._check_bounds("label_smoothing", self.label_smoothing, 0.0, 1.0)\n'
    choice = "        self._check_choice(\"reduction\", self.reduction, ('none', 'mean', 'sum'))\n"
    sizes = '        self._check_static_dims({"V": "logits.shape[1]"})\n'
    for check in (bound, choice, sizes):
        replace_in(path, check, "")
    run = run_validator(root, "--levels", "L2", "--op", "CrossEntropyFwdOp")
    assert run.error_keys() == {("L2", "CrossEntropyFwdOp", "label_smoothing"),
                                ("L2", "CrossEntropyFwdOp", "reduction"), ("L2", "CrossEntropyFwdOp", "V")}
    assert "CrossEntropyFwdOp(V=-1) was built; the manifest allows no such value" in run.message(
        "L2", "CrossEntropyFwdOp", "V")
    assert "CrossEntropyFwdOp(label_smoothing=-1.0) was built; the manifest allows no such value (2 of 6 cases)" in (
        run.message("L2", "CrossEntropyFwdOp", "label_smoothing"))
    assert "CrossEntropyFwdOp(reduction='<not a choice>') was built" in run.message("L2", "CrossEntropyFwdOp",
                                                                                  "reduction")


def test_shape_template_defect_fails_l2_for_every_op_without_slot_findings(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / "templates/slots/S17_infer_output_shapes.py.j2", '"{{ name }}": {{ expr }}',
               '"{{ name }}": {{ expr }}[::-1]')
    regenerate(root)
    run = run_validator(root, "--levels", "L2,slots")
    levels = {level for level, _, _ in run.error_keys()}
    ops = {op for _, op, _ in run.error_keys()}
    assert levels == {"L2"} and len(ops) >= 2


FIXED_RANK = """# yaml-language-server: $schema=schema.json

ToyMatmulFwdOp:
  family: toy
  status: spec-only
  summary: "c = a @ b + bias"
  signature:
    inputs:
      a: {dtype: "float16 | float32", shape: [M, K]}
      b: {dtype: "same_as(a)", shape: [K, N]}
      bias: {dtype: "same_as(a)", shape: [N], optional: true}
    outputs:
      c: {dtype: "same_as(a)"}
  static_dims:
    K: "a.shape[1]"
    N: "b.shape[-1]"
  shape_rules:
    - "c.shape == (a.shape[0], N)"
  reference: "a @ b"
  roofline: {flops: "2 * a.shape[0] * K * N", bytes: "numel(a) * elem_bytes"}
  kernel_map: {toy_matmul_fwd: ToyMatmulFwdKernel}
  backward: reference
"""


def test_fixed_rank_and_optional_inputs(tmp_path: Path) -> None:
    path = tmp_path / "toy.yaml"
    path.write_text(FIXED_RANK)
    op = load_files([path], tmp_path).op("ToyMatmulFwdOp")
    cases = generate_cases(op, 200)
    verdicts = [expect(op, case) for case in cases]
    assert len(cases) >= 200
    assert {len(case.shapes[0]) for case in cases} >= {1, 2, 3}
    assert any(case.shapes[2] is None for case in cases) and any(case.shapes[2] is not None for case in cases)
    accepted = [v for v in verdicts if v.kind == ACCEPT]
    assert len(accepted) >= 100
    # A size committed differently from the input breaks the rule its declared shape implies.
    assert {v.rule.text for v in verdicts if v.kind == RULE} >= {"a.ndim == 2", "a.shape[1] == K", "b.shape[0] == K",
                                                                 "b.shape[1] == N", "bias.shape[0] == N"}
