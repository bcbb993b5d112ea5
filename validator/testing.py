"""Scratch projects for testing the validator, and a fast way to run it on one.

``scratch_project(dest)`` copies the project (generator, templates,
manifests, runtime package, validator) to ``dest`` and makes it complete
enough to validate: an implemented op whose kernel or family base is not
written yet becomes ``spec-only`` in the copy (with a stand-in base), and the
ops are generated.  Tests then plant one defect in the copy and run the
validator on it with ``run_validator``.

``run_validator`` runs ``python -m validator`` of the copy in a process
forked from a server that has torch and the parsing libraries imported
already, so a run costs a fork instead of a fresh interpreter, and every run
imports the copy's own ``tileops`` (nothing leaks between copies).
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

__all__ = ["ROOT", "scratch_project", "regenerate", "replace_in", "slot_containing", "run_validator", "Run"]

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PARTS = ("codegen", "templates", "manifest", "tileops", "validator", "pyproject.toml")
PROJECT_PACKAGES = ("validator", "codegen", "tileops")
# Imported once by the fork server; ``torch._dynamo`` because meta-tensor references load it (~1.5 s).
PRELOAD = ["torch", "torch._dynamo", "libcst", "jsonschema", "yaml", "jinja2"]

_STAND_IN_BASE = '''"""Stand-in {family} base of a validation scratch project: the real base is not written yet."""

from tileops.ops.op_base import Op

__all__ = ["{base}"]


class {base}(Op):
    """No kernel path: the ops of this family are spec-only in this copy."""
'''


def _copy(source: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for part in PROJECT_PARTS:
        if (source / part).is_dir():
            shutil.copytree(source / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
        elif (source / part).exists():
            shutil.copy2(source / part, dest / part)


def _set_spec_only(dest: Path, manifest_file: str, line: int) -> None:
    path = dest / manifest_file
    lines = path.read_text().splitlines(keepends=True)
    lines[line - 1] = re.sub(r"status:\s*implemented", "status: spec-only", lines[line - 1])
    path.write_text("".join(lines))


def _complete(dest: Path) -> None:
    """Make a copy of a tree under construction validatable.

    An op whose family base is missing gets a stand-in base; an op whose kernel
    file is missing or lacks its class (a kernel still being written) becomes
    spec-only, and such a kernel file is removed so that generation writes the
    skeleton in its place.
    """
    from codegen.loader import load_manifest

    manifest = load_manifest(dest / "manifest", dest)
    unfinished = {k.path for op in manifest.ops for k in op.kernels
                  if not (dest / k.path).exists()
                  or not re.search(rf"^class {k.class_name}\b", (dest / k.path).read_text(), flags=re.M)}
    for op in manifest.ops:
        base_path = dest / "tileops" / "ops" / op.family / "base.py"
        base_missing = op.op_base != "Op" and not base_path.exists()
        if base_missing:
            base_path.parent.mkdir(parents=True, exist_ok=True)
            base_path.write_text(_STAND_IN_BASE.format(family=op.family, base=op.op_base))
        if op.status == "implemented" and (base_missing or any(k.path in unfinished for k in op.kernels)):
            _set_spec_only(dest, op.location.file, _status_line(dest / op.location.file, op.location.line))
    for path in unfinished:
        (dest / path).unlink(missing_ok=True)


def _status_line(path: Path, entry_line: int) -> int:
    """The ``status:`` line of the entry that starts at ``entry_line``."""
    for number, line in enumerate(path.read_text().splitlines()[entry_line:], start=entry_line + 1):
        if re.match(r"\s+status:", line):
            return number
    raise ValueError(f"no status line after {path}:{entry_line}")


def regenerate(dest: Path) -> None:
    """``python -m codegen gen`` in the copy (its own templates and manifests)."""
    done = subprocess.run([sys.executable, "-m", "codegen", "gen"], cwd=dest, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"codegen gen failed in {dest}:\n{done.stdout}{done.stderr}")


_TEMPLATES: Dict[Path, Path] = {}


def scratch_project(dest: Path, source: Path = ROOT) -> Path:
    """A generated, validatable copy of the project at ``dest``.

    The first call per source builds the copy (and generates it); later calls
    copy that result, which is much faster than generating again.
    """
    template = _TEMPLATES.get(source)
    if template is None:
        template = Path(tempfile.mkdtemp(prefix="tileops-scratch-")) / "project"
        atexit.register(shutil.rmtree, template.parent, True)
        _copy(source, template)
        _complete(template)
        regenerate(template)
        _TEMPLATES[source] = template
    shutil.copytree(template, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def replace_in(path: Path, old: str, new: str, count: int = 1) -> None:
    """Replace ``old`` (which must occur) by ``new`` in ``path``: plants a defect."""
    text = path.read_text()
    if old not in text:
        raise AssertionError(f"{path} does not contain {old!r}")
    path.write_text(text.replace(old, new, count))


def slot_containing(root: Path, op_name: str, needle: str) -> str:
    """The label (``S16 forward body``, ``checks``) of the slot whose rendering contains ``needle``.

    Tests plant a defect in a line and ask which slot must report it, so they
    keep working when templates move a line from one slot to another.
    """
    from codegen.loader import load_manifest
    from codegen.render import SECTIONS, render_section, render_slot

    from .slots import label

    op = load_manifest(root / "manifest", root).op(op_name)
    rendered = {slot: render_slot(op, slot) for slot in ("S1", "S2", "S3", "S4", "S5", "S6", "S7", "S12", "S13",
                                                         "S14", "S15", "S16", "S17", "S18", "S19", "S21")}
    rendered.update({section: render_section(op, section) for section in SECTIONS})
    found = [label(slot) for slot, text in rendered.items() if needle in text]
    if len(found) != 1:
        raise AssertionError(f"{needle!r} is in {len(found)} slots of {op_name}: {found}")
    return found[0]


@dataclass
class Run:
    """One validator run: exit status, output, and the findings when the format was JSON."""

    returncode: int
    stdout: str
    stderr: str
    report: Dict[str, Any] = field(default_factory=dict)

    @property
    def findings(self) -> List[Dict[str, Any]]:
        return self.report.get("findings", [])

    def errors(self) -> List[Dict[str, Any]]:
        return [f for f in self.findings if f["severity"] == "error"]

    def error_keys(self) -> Set[Tuple[str, str, str]]:
        """(level, op, rule) of every error."""
        return {(f["level"], f["op"], f["rule"]) for f in self.errors()}

    def message(self, level: str, op: str, rule: str) -> str:
        """The message of the one error at (level, op, rule)."""
        found = [f["message"] for f in self.errors() if (f["level"], f["op"], f["rule"]) == (level, op, rule)]
        assert len(found) == 1, f"expected one error at {(level, op, rule)}, found {found}"
        return found[0]


_CONTEXT: Optional[Any] = None


def _forkserver() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        _CONTEXT = context
    return _CONTEXT


def _child(root: str, args: Sequence[str], out_path: str, err_path: str) -> None:
    """Runs in a fresh fork: import the copy's packages, not whatever the server had on its path."""
    for name in list(sys.modules):
        if name.split(".")[0] in PROJECT_PACKAGES:
            del sys.modules[name]
    sys.path.insert(0, root)
    os.chdir(root)
    with open(out_path, "w") as out, open(err_path, "w") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        from validator.__main__ import main

        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


def run_validator(root: Path, *args: str, timeout: float = 300.0) -> Run:
    """``python -m validator --format json ARGS`` in the copy at ``root``."""
    args = ("--format", "json") + tuple(args) if "--format" not in args else tuple(args)
    output = Path(tempfile.mkdtemp(prefix="validator-run-"))
    out_path, err_path = output / "stdout", output / "stderr"
    process = _forkserver().Process(target=_child, args=(str(root), args, str(out_path), str(err_path)))
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        raise TimeoutError(f"the validator ran over {timeout} s on {root}")
    stdout, stderr = out_path.read_text(), err_path.read_text()
    shutil.rmtree(output, ignore_errors=True)
    report: Dict[str, Any] = {}
    if "json" in args and stdout.strip():
        try:
            report = json.loads(stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"validator output is not JSON ({exc}):\n{stdout}\n{stderr}") from None
    return Run(process.exitcode, stdout, stderr, report)
