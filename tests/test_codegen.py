"""Generation end to end on scratch copies of the project."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple

import pytest

from codegen import SLOTS, check, load_files, load_manifest, plan, render_op, render_slot, write
from codegen.generate import SKELETON_MARKER
from codegen.loader import SCHEMA_COMMENT
from codegen.render import render_functional
from codegen.view import FunctionView

ROOT = Path(__file__).resolve().parent.parent

DEMO = SCHEMA_COMMENT + """
ScaleShiftFwdOp:
  family: demo
  status: spec-only
  summary: "y = x * alpha + shift along dim"
  ref_api: torch.add
  signature:
    inputs:
      x: {dtype: "float16 | bfloat16 | float32"}
      shift: {dtype: "same_as(x)", shape: [N]}
    outputs:
      y: {dtype: "same_as(x)"}
    params:
      dim: {type: int, default: -1}
      alpha: {type: float, default: 2.0, minimum: 0.0}
      mode: {type: str, default: fast, choices: [fast, exact]}
  static_dims:
    N: "x.shape[dim]"
  shape_rules:
    - "-x.ndim <= dim < x.ndim"
    - "y.shape == x.shape"
  reference: "x * alpha + shift.reshape((N,) + (1,) * (x.ndim - dim % x.ndim - 1))"
  roofline:
    vars:
      M: "numel(x) // N"
    flops: "2 * M * N"
    bytes: "(2 * M * N + N) * elem_bytes"
  kernel_map:
    scale_shift_fwd: ScaleShiftFwdKernel
  backward: reference
"""


def load(root: Path):
    return load_manifest(root / "manifest", root)


def generate(root: Path):
    return write(plan(load(root), root), root)


def snapshot(root: Path) -> Dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}


def run_python(root: Path, code: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(root))
    result = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_checked_in_tree_is_current() -> None:
    assert check(plan(load_manifest()), ROOT) == []


def test_gen_on_an_unchanged_tree_changes_nothing(project: Path) -> None:
    assert generate(project) == []


def test_rendering_is_deterministic() -> None:
    for op in load_manifest().ops:
        assert render_op(op) == render_op(load_manifest().op(op.name))


def test_changed_default_is_a_stale_file_then_regenerated(project: Path) -> None:
    manifest = project / "manifest" / "scan.yaml"
    manifest.write_text(manifest.read_text().replace("default: -1", "default: 0", 1))
    diffs = check(plan(load(project), project), project)
    # The op's file and the functional form's signature depend on the default; nothing else does.
    expected = ["tileops/functional.py", "tileops/ops/scan/cumsum_fwd.py"]
    assert len(diffs) == 2 and all(f"b/{path}" in diff for path, diff in zip(expected, diffs))
    changed_lines = [l for l in diffs[1].splitlines() if l[:1] in "+-" and l[:3] not in ("+++", "---")]
    assert "+        dim: int = 0," in changed_lines
    before = snapshot(project)
    assert generate(project) == expected
    after = snapshot(project)
    assert [p for p in after if after[p] != before.get(p)] == expected


def test_check_cli_exits_1_with_a_diff_naming_the_file(project: Path) -> None:
    manifest = project / "manifest" / "norm.yaml"
    manifest.write_text(manifest.read_text().replace("default: 1.0e-6", "default: 1.0e-5"))
    result = subprocess.run([sys.executable, "-m", "codegen", "--root", str(project), "check"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1
    assert "tileops/ops/norm/rms_norm_fwd.py" in result.stdout
    assert "+        eps: float = 1e-05," in result.stdout


def test_new_entry_yields_an_importable_registered_op_and_scaffolds(project: Path) -> None:
    (project / "manifest" / "demo.yaml").write_text(DEMO)
    changed = generate(project)
    for path in ("tileops/ops/demo/scale_shift_fwd.py", "tileops/ops/demo/__init__.py", "tileops/ops/__init__.py",
                 "tileops/kernels/demo/scale_shift.py", "tests/gpu/test_scale_shift_fwd.py",
                 "benchmarks/ops/scale_shift_fwd.py"):
        assert path in changed, path
    assert SKELETON_MARKER in (project / "tileops/kernels/demo/scale_shift.py").read_text()
    out = run_python(project, """
import inspect, json, torch
from tileops.ops import ScaleShiftFwdOp
from tileops.ops.demo import ScaleShiftFwdOp as Same
assert ScaleShiftFwdOp is Same
sig = inspect.signature(ScaleShiftFwdOp.__init__)
params = [(p.name, str(p.kind), repr(p.default)) for p in sig.parameters.values()]
op = ScaleShiftFwdOp(N=3, dtype=torch.float32, dim=1)
x, shift = torch.randn(2, 3, 4), torch.randn(3)
y = op(x, shift)
assert torch.allclose(y, x * 2.0 + shift.reshape(3, 1)), "reference path"
assert op.last_backend == "reference"
# The manifest's choices and bounds are checked at construction and documented.
for bad, error in (({"mode": "slow"}, "ScaleShiftFwdOp: mode must be one of ['fast', 'exact'], got 'slow'"),
                   ({"alpha": -0.5}, "ScaleShiftFwdOp: alpha must be at least 0.0, got -0.5")):
    try:
        ScaleShiftFwdOp(N=3, dtype=torch.float32, **bad)
    except ValueError as caught:
        assert str(caught) == error, caught
    else:
        raise AssertionError(bad)
ScaleShiftFwdOp(N=3, dtype=torch.float32, alpha=0.0)
assert "At least 0.0. Default: 2.0." in ScaleShiftFwdOp.__doc__
print(json.dumps(params))
""")
    params = json.loads(out)
    assert [name for name, _, _ in params] == ["self", "N", "dtype", "dim", "alpha", "mode", "kernel_map", "tune"]
    assert all(kind == "KEYWORD_ONLY" for _, kind, _ in params[1:])
    defaults = {name: default for name, _, default in params}
    assert defaults["N"] == defaults["dtype"] == "<class 'inspect._empty'>"
    assert (defaults["dim"], defaults["alpha"], defaults["mode"]) == ("-1", "2.0", "'fast'")
    assert (defaults["kernel_map"], defaults["tune"]) == ("None", "False")


def test_scaffolds_are_written_once_and_never_overwritten(project: Path) -> None:
    (project / "manifest" / "demo.yaml").write_text(DEMO)
    generate(project)
    test_file = project / "tests/gpu/test_scale_shift_fwd.py"
    test_file.write_text("# the author's own tests\n")
    kernel = project / "tileops/kernels/demo/scale_shift.py"
    kernel.write_text(kernel.read_text().replace(SKELETON_MARKER, "# real kernel"))
    assert generate(project) == []
    assert test_file.read_text() == "# the author's own tests\n"


def test_implemented_op_must_not_ship_a_skeleton(project: Path) -> None:
    (project / "manifest" / "demo.yaml").write_text(DEMO)
    generate(project)
    (project / "manifest" / "demo.yaml").write_text(DEMO.replace("status: spec-only", "status: implemented"))
    from codegen import ManifestErrors

    with pytest.raises(ManifestErrors, match="still the kernel skeleton") as info:
        plan(load(project), project)
    assert str(info.value).startswith("manifest/demo.yaml:")


def test_implemented_op_without_kernel_file_is_an_error(project: Path) -> None:
    (project / "manifest" / "demo.yaml").write_text(DEMO.replace("status: spec-only", "status: implemented"))
    from codegen import ManifestErrors

    with pytest.raises(ManifestErrors, match="does not exist"):
        plan(load(project), project)


def test_bad_manifest_writes_nothing(project: Path) -> None:
    (project / "manifest" / "demo.yaml").write_text(DEMO.replace("dim: {type: int", "dim: {typ: int"))
    before = snapshot(project)
    result = subprocess.run([sys.executable, "-m", "codegen", "--root", str(project), "gen"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: manifest/demo.yaml:")
    assert "unknown key 'typ'" in lines[0]
    assert snapshot(project) == before


def test_removed_op_is_unregistered_and_its_file_deleted(project: Path) -> None:
    (project / "manifest" / "demo.yaml").write_text(DEMO)
    generate(project)
    init = project / "tileops/ops/demo/__init__.py"
    init.write_text(init.read_text() + "\n# a hand-written note\nHAND_WRITTEN = 1\n")
    (project / "manifest" / "demo.yaml").write_text(SCHEMA_COMMENT + "\n{}\n")
    changed = generate(project)
    assert "tileops/ops/demo/scale_shift_fwd.py" in changed
    assert not (project / "tileops/ops/demo/scale_shift_fwd.py").exists()
    text = init.read_text()
    assert "ScaleShiftFwdOp" not in text and "HAND_WRITTEN = 1" in text and "# a hand-written note" in text
    assert "ScaleShiftFwdOp" not in (project / "tileops/ops/__init__.py").read_text()


def test_partial_generation_by_op(project: Path) -> None:
    (project / "manifest" / "demo.yaml").write_text(DEMO)
    result = write(plan(load(project), project, ops=["ScaleShiftFwdOp"]), project)
    assert "tileops/ops/demo/scale_shift_fwd.py" in result
    assert "tileops/ops/norm/rms_norm_fwd.py" not in result


@pytest.mark.parametrize("slot", sorted(SLOTS))
def test_every_slot_renders_alone_and_appears_in_the_file(slot: str) -> None:
    for op in load_manifest().ops:
        text = render_slot(op, slot)
        assert text.strip(), slot
        if slot == "S20":
            assert text.strip() in (ROOT / f"tileops/ops/{op.family}/__init__.py").read_text()
        else:
            assert text in render_op(op), slot


def test_init_signature_follows_s12(project: Path) -> None:
    from tileops.ops import CumsumFwdOp, RMSNormFwdOp

    for cls, expected in ((RMSNormFwdOp, ["N", "dtype", "eps", "kernel_map", "tune"]),
                          (CumsumFwdOp, ["N", "dtype", "dim", "out_dtype", "kernel_map", "tune"])):
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        assert [p.name for p in params] == expected
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)


def test_new_op_cli_adds_a_loadable_stub(project: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "codegen", "--root", str(project), "new-op", "SoftplusFwdOp",
                             "--family", "activation"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    op = load(project).op("SoftplusFwdOp")
    assert op.status == "spec-only" and op.family == "activation"
    assert "tileops/kernels/activation/softplus.py" in generate(project)


def test_new_op_stub_in_a_family_names_the_family_bases(project: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "codegen", "--root", str(project), "new-op", "SoftplusFwdOp",
                             "--family", "elementwise"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    stub = (project / "manifest" / "elementwise.yaml").read_text().split("\nSoftplusFwdOp:\n")[1]
    assert "  # op_base: UnaryElementwiseOp | BinaryElementwiseOp | GatedElementwiseOp  (this family's bases" in stub
    op = load(project).op("SoftplusFwdOp")  # still a loadable spec-only stub, extending ``Op``
    assert op.status == "spec-only" and op.op_base == "Op"


def test_new_op_cli_refuses_a_name_another_family_holds(project: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "codegen", "--root", str(project), "new-op", "ReluFwdOp",
                             "--family", "activation"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode != 0
    assert "ReluFwdOp is already in elementwise.yaml" in result.stderr
    assert not (project / "manifest" / "activation.yaml").exists()


def test_a_reference_backward_differentiates_the_reference_eager_traced_and_twice(project: Path) -> None:
    """``backward: reference`` (the demo op): an eager backward runs plain autograd of the reference
    (torch.func's transforms cost most of a millisecond a call), a compiled one traces
    ``torch.func.vjp`` of it, and ``create_graph=True`` records the gradient's own graph."""
    (project / "manifest" / "demo.yaml").write_text(DEMO)
    generate(project)
    run_python(project, """
import torch
from tileops.ops import ScaleShiftFwdOp
op = ScaleShiftFwdOp(N=3, dtype=torch.float32, dim=1, alpha=1.5)
x, shift = torch.randn(2, 3, 4, requires_grad=True), torch.randn(3, requires_grad=True)
seed = torch.randn(2, 3, 4)
expected = (1.5 * seed, seed.sum((0, 2)))

def refuse(*args, **kwargs):
    raise AssertionError("torch.func.vjp in an eager backward")

vjp, torch.func.vjp = torch.func.vjp, refuse
eager = torch.autograd.grad(op(x, shift), (x, shift), seed)
torch.func.vjp = vjp
compiled = torch.compile(lambda a, b: op(a, b), backend="aot_eager", dynamic=True, fullgraph=True)
traced = torch.autograd.grad(compiled(x, shift), (x, shift), seed)
for got in (eager, traced):
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine, theirs)
(grad_x,) = torch.autograd.grad(op(x, shift).square().sum(), (x,), create_graph=True)
(second,) = torch.autograd.grad(grad_x.sum(), (x,))
torch.testing.assert_close(second, torch.full_like(x, 2 * 1.5 * 1.5))
""")


def test_a_cast_input_gives_the_functional_form_a_keyword_only_dtype(tmp_path: Path) -> None:
    def function_of(text: str) -> Tuple[FunctionView, str]:
        path = tmp_path / "demo.yaml"
        path.write_text(text)
        manifest = load_files([path], root=tmp_path)
        return FunctionView(manifest.op("ScaleShiftFwdOp")), render_functional(manifest)

    cast = DEMO.replace('x: {dtype: "float16 | bfloat16 | float32"}',
                        'x: {dtype: "float16 | bfloat16 | float32", cast_by_dtype: true}')
    view, module = function_of(cast)
    assert view.params[-2:] == ["*", "dtype: Optional[torch.dtype] = None"]
    assert "cast x to it first, as ``torch.add`` does" in view.dtype_note
    assert "    if dtype is not None:\n        x = cast_to_dtype(" in module
    assert ('        x = cast_to_dtype(x, dtype, (torch.float16, torch.bfloat16, torch.float32), "ScaleShiftFwdOp", "x")'
            in module)
    view, _ = function_of(cast.replace("  ref_api: torch.add\n", ""))
    assert "as PyTorch's counterpart does" in view.dtype_note
    view, module = function_of(DEMO)
    assert "dtype" not in " ".join(view.params) and view.dtype_note == "" and "cast_to_dtype(x" not in module
