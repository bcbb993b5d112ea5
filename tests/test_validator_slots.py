"""Slot conformance: an edit in any slot is reported as that slot; edits elsewhere too."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest

from codegen.loader import load_manifest
from codegen.render import SECTIONS, SLOTS, render_op, render_section, render_slot
from validator.slots import check_source, cut, label
from validator.testing import replace_in, run_validator, scratch_project

OP_FILE_PARTS = ["header"] + [s for s in SLOTS if s != "S20"] + [s for s in SECTIONS if s != "header"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory):
    root = scratch_project(tmp_path_factory.mktemp("slots") / "project")
    return load_manifest(root / "manifest", root)


def _rendered(op) -> Dict[str, str]:
    return {part: render_section(op, part) if part in SECTIONS else render_slot(op, part) for part in OP_FILE_PARTS}


def _keys(findings) -> List[tuple]:
    return [(f.level, f.op, f.rule) for f in findings]


def test_every_rendered_file_is_cut_into_its_slots(manifest) -> None:
    for op in manifest.ops:
        text = render_op(op)
        rendered = _rendered(op)
        regions = cut(text, op.name, rendered).regions
        assert {part for part, body in rendered.items() if body.strip()} <= set(regions), op.name
        assert check_source(op, text) == []


@pytest.mark.parametrize("part", OP_FILE_PARTS)
def test_an_edit_in_one_slot_is_reported_as_that_slot(manifest, part: str) -> None:
    # RMSNormFwdOp renders every part but the gradient formulas, which AddFwdOp has.
    op = next(op for op in (manifest.op("RMSNormFwdOp"), manifest.op("AddFwdOp")) if _rendered(op)[part].strip())
    text = render_op(op)
    rendered = _rendered(op)
    lines = text.splitlines()
    first = next(n for n in cut(text, op.name, rendered).regions[part] if lines[n - 1].strip())
    lines[first - 1] += "  # edited by hand"
    findings = check_source(op, "\n".join(lines) + "\n")
    assert _keys(findings) == [("slots", op.name, label(part))]
    assert f"{op.path}:{first}:" in findings[0].message


def test_a_line_added_outside_every_slot(manifest) -> None:
    op = manifest.op("RMSNormFwdOp")
    text = render_op(op).replace("import torch\n", "import torch\nimport os\n", 1)
    findings = check_source(op, text)
    assert _keys(findings) == [("slots", op.name, "outside slots")]
    assert "unexpected `import os`" in findings[0].message


def test_a_hand_written_method_is_reported(manifest) -> None:
    op = manifest.op("RMSNormFwdOp")
    text = render_op(op).replace("    def reference(", "    def helper(self):\n        return 1\n\n    def reference(", 1)
    assert _keys(check_source(op, text)) == [("slots", op.name, "outside slots")]


def test_a_deleted_method_is_reported_as_its_slot(manifest) -> None:
    op = manifest.op("RMSNormFwdOp")
    text = render_op(op)
    text = text.replace(render_slot(op, "S19"), "", 1)
    assert _keys(check_source(op, text)) == [("slots", op.name, "S19 eval_roofline")]


def test_a_missing_op_file_through_the_cli(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    (root / "tileops/ops/norm/rms_norm_fwd.py").unlink()
    run = run_validator(root, "--levels", "slots")
    assert run.error_keys() == {("slots", "RMSNormFwdOp", "file")}
    assert run.returncode == 1


def test_a_hand_edit_through_the_cli_names_slot_and_line(tmp_path: Path) -> None:
    root = scratch_project(tmp_path / "project")
    replace_in(root / "tileops/ops/norm/rms_norm_fwd.py", "        self.dispatch_kernel(kernel_map)\n",
               "        self.dispatch_kernel(kernel_map)\n        self.patched = True\n")
    run = run_validator(root, "--levels", "slots", "--format", "text")
    assert run.returncode == 1
    finding = run.stdout.splitlines()[0].split("  ")
    assert finding[:4] == ["slots", "RMSNormFwdOp", "S13 __init__ body", "manifest/norm.yaml:4"]
    assert "unexpected `self.patched = True`" in finding[4]
