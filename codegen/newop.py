"""``new-op``: append a loadable manifest stub for the author to fill in."""

from __future__ import annotations

import re
from pathlib import Path

from .loader import SCHEMA_COMMENT
from .model import snake_case

__all__ = ["add_manifest_stub"]

_STUB = """
{name}:
  family: {family}
  status: spec-only
  summary: "TODO one line of semantics, e.g. y = f(x)"
  ref_api: ""
{bases}  signature:
    inputs:
      x: {{dtype: "float16 | bfloat16 | float32", description: "TODO"}}
    outputs:
      y: {{dtype: "same_as(x)", description: "TODO"}}
    params: {{}}
  static_dims: {{}}
  shape_rules:
    - "y.shape == x.shape"
  reference: "x.clone()"
  roofline:
    flops: "numel(x)"
    bytes: "2 * numel(x) * elem_bytes"
  kernel_map:
    {key}: {kernel}
{backward}  workloads:
    - {{label: small, shapes: {{x: [1024, 1024]}}, dtypes: [bfloat16]}}
"""


def add_manifest_stub(name: str, family: str, manifest_dir: Path) -> Path:
    if not re.fullmatch(r"[A-Z][A-Za-z0-9]*(Fwd|Bwd)Op", name):
        raise SystemExit(f"error: {name!r} is not an op class name ({{PascalName}}{{Fwd|Bwd}}Op)")
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", family):
        raise SystemExit(f"error: {family!r} is not a family name (lowercase, underscores)")
    path = manifest_dir / f"{family}.yaml"
    text = path.read_text() if path.exists() else f"{SCHEMA_COMMENT}\n# {family.capitalize()} operators.\n"
    for existing in sorted(manifest_dir.glob("*.yaml")):  # op names are unique across families
        if re.search(rf"^{name}:", existing.read_text(), flags=re.M):
            raise SystemExit(f"error: {name} is already in {existing.name}")
    stem = name[: -len("Op")]
    # A Fwd op starts out differentiated by its reference until it has a Bwd op.
    backward = "  backward: reference  # or {op: ...BwdOp, saves: [...]}\n" if stem.endswith("Fwd") else ""
    stub = _STUB.format(name=name, family=family, key=snake_case(stem), kernel=f"{stem}Kernel", backward=backward,
                        bases=_bases_hint(text))
    path.write_text(text.rstrip("\n") + "\n" + stub)
    return path


def _bases_hint(family_text: str) -> str:
    """A comment naming the family bases its ops already extend (each once, in manifest order), for
    the author to pick from; nothing for a new family (whose ops extend ``Op`` until it has one)."""
    bases = list(dict.fromkeys(re.findall(r"^  op_base: *(\w+)", family_text, flags=re.M)))
    return f"  # op_base: {' | '.join(bases)}  (this family's bases; pick the one the op fits)\n" if bases else ""
