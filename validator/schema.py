"""L0: every manifest against schema.json, the loader's cross-field checks, and workloads.

The loader (``codegen.loader``) already validates the schema and the
cross-field rules (names resolve, ``same_as`` targets exist, static dims name
real axes, rules parse); its located ``ManifestErrors`` become findings here.
On top of that, L0 checks what needs the model: an implemented op ships a
real kernel (``codegen.generate.plan`` refuses otherwise), and every workload
satisfies its op's own shape rules, with a roofline that evaluates.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from codegen.errors import ManifestError, ManifestErrors
from codegen.generate import plan
from codegen.loader import MANIFEST_DIR, ROOT, load_manifest
from codegen.model import Manifest, OpSpec

from .cases import ACCEPT, expect, expected_roofline, workload_case
from .context import torch_dtype, where
from .findings import Finding

__all__ = ["load", "check_workloads", "LEVEL"]

LEVEL = "L0"


def _finding(error: ManifestError) -> Finding:
    """Split ``Op.key.path`` into the op and the rule."""
    path = error.location.path
    op, _, rule = path.partition(".")
    if not op.endswith("Op") or "[" in op:
        op, rule = "-", path
    return Finding(LEVEL, op or "-", rule or "-", where(error.location), error.message)


def load(directory: Path = MANIFEST_DIR, root: Path = ROOT) -> Tuple[Optional[Manifest], List[Finding]]:
    """The manifest model, or the findings that prevent building it."""
    try:
        manifest = load_manifest(directory, root)
    except ManifestErrors as exc:
        return None, [_finding(e) for e in exc.errors]
    try:
        plan(manifest, root)  # refuses an implemented op whose kernel file is missing or a skeleton
    except ManifestErrors as exc:
        return manifest, [_finding(e) for e in exc.errors]
    return manifest, []


def check_workloads(ops: Sequence[OpSpec]) -> List[Finding]:
    """Each workload must be a case its op accepts, and its roofline must evaluate."""
    findings = []
    for op in ops:
        for index, workload in enumerate(op.workloads):
            rule = f"workloads[{index}] {workload.label}"
            missing = [t.name for t in op.inputs if not t.optional and workload.shape_of(t.name) is None]
            if missing:
                findings.append(Finding(LEVEL, op.name, rule, where(workload.location),
                                        f"no shape for input {missing[0]!r}"))
                continue
            case = workload_case(op, workload, workload.dtypes[0])
            verdict = expect(op, case)
            if verdict.kind != ACCEPT:
                broken = (f"shape rule `{verdict.rule.text}`" if verdict.rule is not None and not verdict.problem
                          else f"static dim {verdict.static_dim.name} = {verdict.static_dim.text}"
                          if verdict.static_dim is not None and not verdict.problem else verdict.problem)
                findings.append(Finding(LEVEL, op.name, rule, where(workload.location),
                                        f"the op's own rules reject this workload: {broken}"))
                continue
            try:
                expected_roofline(op, case, torch_dtype(workload.dtypes[0]).itemsize)
            except Exception as exc:
                findings.append(Finding(LEVEL, op.name, "roofline", where(op.roofline.location),
                                        f"the roofline does not evaluate on workload {workload.label}: "
                                        f"{type(exc).__name__}: {exc}"))
    return findings
