"""L1: a planted signature defect is reported at L1, for that op and parameter, and nowhere else."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Dict, Optional, Type

import pytest
import torch

from codegen.loader import load_files
from tileops.kernels.kernel_base import Kernel
from validator.signature import compare_parameters, expected_forward, expected_init
from validator.testing import regenerate, replace_in, run_validator, scratch_project

RMS = "tileops/ops/norm/rms_norm_fwd.py"

TOY_PAIR = """# yaml-language-server: $schema=schema.json

ToyScaleFwdOp:
  family: toy
  status: spec-only
  summary: "y = x * alpha"
  signature:
    inputs:
      x: {dtype: "float16 | float32"}
    outputs:
      y: {dtype: "same_as(x)"}
    params:
      alpha: {type: float, default: 2.0}
  shape_rules:
    - "y.shape == x.shape"
  reference: "x * alpha"
  roofline: {flops: "numel(x)", bytes: "2 * numel(x) * elem_bytes"}
  kernel_map: {toy_scale_fwd: ToyScaleFwdKernel}
  backward: {op: ToyScaleBwdOp, saves: [x]}

ToyScaleBwdOp:
  family: toy
  status: spec-only
  summary: "grad_x = grad_y * alpha"
  signature:
    inputs:
      grad_y: {dtype: "BWD_DTYPES"}
      x: {dtype: "same_as(grad_y)"}
    outputs:
      grad_x: {dtype: "same_as(grad_y)"}
    params:
      alpha: {type: float, default: BWD_ALPHA}
  shape_rules:
    - "x.shape == grad_y.shape"
    - "grad_x.shape == grad_y.shape"
  reference: "grad_y * alpha"
  roofline: {flops: "numel(grad_y)", bytes: "2 * numel(grad_y) * elem_bytes"}
  kernel_map: {toy_scale_bwd: ToyScaleBwdKernel}
"""


def test_hand_edited_default_is_an_l1_and_s12_finding_only(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / RMS, "eps: float = 1e-06,", "eps: float = 1e-05,")
    run = run_validator(root, "--levels", "-kernel")
    # The default also no longer matches RMSNormBwdOp's, which the pair check reports.
    assert run.error_keys() == {("L1", "RMSNormFwdOp", "signature.params.eps"),
                                ("L1", "RMSNormFwdOp", "backward params.eps"),
                                ("slots", "RMSNormFwdOp", "S12 __init__ signature")}
    assert "defaults to 1e-05; the manifest's default is 1e-06" in run.message(
        "L1", "RMSNormFwdOp", "signature.params.eps")
    assert run.returncode == 1


def test_extra_keyword_argument_is_an_error(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / RMS, "        tune: bool = False,\n", "        tune: bool = False,\n        **kwargs,\n")
    run = run_validator(root, "--levels", "L1", "--op", "RMSNormFwdOp")
    assert run.error_keys() == {("L1", "RMSNormFwdOp", "__init__ extra")}
    assert "**kwargs" in run.message("L1", "RMSNormFwdOp", "__init__ extra")


def test_forward_input_made_keyword_only(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / RMS, "def forward(self, x: torch.Tensor,", "def forward(self, *, x: torch.Tensor,")
    run = run_validator(root, "--levels", "L1", "--op", "RMSNormFwdOp")
    assert run.error_keys() == {("L1", "RMSNormFwdOp", "forward kinds")}


def test_template_without_keyword_only_marker_fails_l1_for_every_op(tmp_path: Path) -> None:
    """A generator defect: files equal their rendering (no slot finding), but break the contract."""
    root = scratch_project(tmp_path / "project")
    replace_in(root / "templates/slots/S12_init_signature.py.j2", "        *,\n", "")
    regenerate(root)
    run = run_validator(root, "--levels", "L1,slots")
    ops = {op for _, op, _ in run.error_keys()}
    assert len(ops) >= 2
    assert run.error_keys() == {("L1", op, "__init__ kinds") for op in ops}


def _toy_pair(root: Path, bwd_dtypes: str, bwd_alpha: str) -> None:
    text = TOY_PAIR.replace("BWD_DTYPES", bwd_dtypes).replace("BWD_ALPHA", bwd_alpha)
    (root / "manifest" / "toy.yaml").write_text(text)
    regenerate(root)


def test_matching_fwd_bwd_pair_passes(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    _toy_pair(root, "float16 | float32", "2.0")
    run = run_validator(root, "--levels", "L1", "--op", "ToyScaleFwdOp")
    assert run.errors() == []
    assert "1 Fwd/Bwd pair" in run.report["levels"][-1]["checked"]


def test_fwd_bwd_pair_disagreeing_on_dtypes_and_defaults(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    _toy_pair(root, "float16 | bfloat16 | float32", "3.0")
    run = run_validator(root, "--levels", "-kernel", "--op", "ToyScaleFwdOp", "--op", "ToyScaleBwdOp")
    assert run.error_keys() == {("L1", "ToyScaleFwdOp", "backward dtype"),
                                ("L1", "ToyScaleFwdOp", "backward params.alpha")}
    assert "3.0" in run.message("L1", "ToyScaleFwdOp", "backward params.alpha")
    assert "bfloat16" in run.message("L1", "ToyScaleFwdOp", "backward dtype")


SIGNATURE_OP = """# yaml-language-server: $schema=schema.json

SigFwdOp:
  family: toy
  status: spec-only
  summary: "y = x"
  signature:
    inputs:
      x: {dtype: "float32"}
      bias: {dtype: "float32", optional: true}
    outputs:
      y: {dtype: "same_as(x)"}
    params:
      dim: {type: int, default: -1}
      eps: {type: float, default: 1.0}
  static_dims:
    N: "x.shape[dim]"
  shape_rules:
    - "y.shape == x.shape"
  reference: "x"
  roofline: {flops: "numel(x)", bytes: "numel(x) * elem_bytes"}
  kernel_map: {sig_fwd: SigFwdKernel}
  backward: reference
"""

GOOD_INIT = ("self, *, N: int, dtype: torch.dtype, dim: int = -1, eps: float = 1.0, "
             "kernel_map: Optional[Dict[str, Type[Kernel]]] = None, tune: bool = False")


@pytest.fixture(scope="module")
def sig_op(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("manifest") / "toy.yaml"
    path.write_text(SIGNATURE_OP)
    return load_files([path], path.parent).op("SigFwdOp")


def _signature(params: str) -> inspect.Signature:
    namespace = {"torch": torch, "Optional": Optional, "Dict": Dict, "Type": Type, "Kernel": Kernel}
    exec(f"def f({params}): pass", namespace)  # a signature as source, the way a file would spell it
    return inspect.signature(namespace["f"])


@pytest.mark.parametrize("params, rules", [
    (GOOD_INIT, set()),
    (GOOD_INIT.replace("*, ", ""), {"__init__ kinds"}),
    (GOOD_INIT.replace("eps: float = 1.0", "eps: float = 1"), {"signature.params.eps"}),
    (GOOD_INIT.replace("eps: float = 1.0", "eps: int = 1.0"), {"signature.params.eps"}),
    (GOOD_INIT.replace("dim: int = -1, eps: float = 1.0", "eps: float = 1.0, dim: int = -1"), {"__init__ order"}),
    (GOOD_INIT.replace("N: int", "N: int = 4"), {"static_dims.N"}),
    (GOOD_INIT.replace(", tune: bool = False", ""), {"tune"}),
    (GOOD_INIT + ", extra: int = 0", {"__init__ extra"}),
    (GOOD_INIT + ", **kwargs", {"__init__ extra"}),
])
def test_init_signature_departures(sig_op, params: str, rules: set) -> None:
    found = compare_parameters(sig_op, "__init__", _signature(params), expected_init(sig_op))
    assert {f.rule for f in found} == rules, [f.message for f in found]


@pytest.mark.parametrize("params, rules", [
    ("self, x: torch.Tensor, bias: Optional[torch.Tensor] = None", set()),
    ("self, x: torch.Tensor, bias: Optional[torch.Tensor]", {"signature.inputs.bias"}),
    ("self, x: torch.Tensor, *, bias: Optional[torch.Tensor] = None", {"forward kinds"}),
    ("self, bias: Optional[torch.Tensor] = None, x: torch.Tensor = None", {"forward order", "signature.inputs.x"}),
    ("self, x, bias: Optional[torch.Tensor] = None", {"signature.inputs.x"}),
])
def test_forward_signature_departures(sig_op, params: str, rules: set) -> None:
    found = compare_parameters(sig_op, "forward", _signature(params), expected_forward(sig_op))
    assert {f.rule for f in found} == rules, [f.message for f in found]
