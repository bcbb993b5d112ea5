"""Registration: every op is importable from its family package and from ``tileops.ops``.

Three things must hold per op: the family ``__init__.py`` carries the S20
import line inside its generated block; ``tileops.ops.<family>`` exports the
class (the very class of the op module) and lists it in ``__all__``; and
``tileops.ops`` does the same.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Dict, List, Optional, Sequence, Set, Tuple

from codegen.model import OpSpec
from codegen.registry import generated_names, group_comment
from codegen.render import render_slot

from .context import Context, restore_op_packages, short_error, where
from .findings import Finding, counted

__all__ = ["check", "LEVEL"]

LEVEL = "registration"


def _family_init(ctx: Context, op: OpSpec) -> List[Finding]:
    rel = f"tileops/ops/{op.family}/__init__.py"
    line = render_slot(op, "S20").strip()
    group = f"{op.family} ops"
    path = ctx.root / rel
    if not path.exists():
        return [Finding(LEVEL, op.name, "S20 registration", where(op.location), f"{rel} is missing")]
    source = path.read_text()
    in_block = op.name in generated_names(source, group)
    if line in (text.strip() for text in source.splitlines()) and in_block:
        return []
    return [Finding(LEVEL, op.name, "S20 registration", where(op.location),
                    f"{rel} lacks `{line}` under `{group_comment(group)}`")]


def _import(package: str) -> Tuple[Optional[ModuleType], str]:
    try:
        return importlib.import_module(package), ""
    except Exception as exc:
        return None, short_error(exc)


def _culprit(error: str, ops: Sequence[OpSpec]) -> str:
    """The op an ``ImportError`` names (``cannot import name 'X'``), else ``-``."""
    match = re.search(r"cannot import name '(\w+)'", error)
    names = {op.name for op in ops}
    return match.group(1) if match and match.group(1) in names else "-"


def _exported(module: ModuleType, package: str, op: OpSpec, cls: Optional[type]) -> Optional[str]:
    """Why ``package`` does not export the op's class, or None when it does."""
    exported = getattr(module, op.name, None)
    if exported is None:
        return f"{package} has no attribute {op.name}"
    if cls is not None and exported is not cls:
        return f"{package}.{op.name} is not the class defined in {op.package}.{op.module}"
    if op.name not in getattr(module, "__all__", ()):
        return f"{op.name} is not in {package}.__all__"
    return None


def check(ctx: Context) -> Tuple[List[Finding], str]:
    findings: List[Finding] = []
    classes = {op.name: ctx.op_class(op) for op in ctx.selected}
    restore_op_packages()  # from here on, imports run the real package __init__ files
    # The top package first: family packages import it, so its failure is theirs too.
    imported: Dict[str, Tuple[Optional[ModuleType], str]] = {"tileops.ops": _import("tileops.ops")}
    reported: Set[str] = set()
    by_name = ctx.manifest.by_name()
    for op in ctx.selected:
        findings += _family_init(ctx, op)
        for package in ("tileops.ops", op.package):
            if package not in imported:
                imported[package] = _import(package)
            module, error = imported[package]
            if module is None:
                # A failing parent package fails every child the same way: report each cause once.
                if error not in reported:
                    reported.add(error)
                    culprit = _culprit(error, ctx.manifest.ops)
                    location = by_name[culprit].location if culprit in by_name else op.location
                    findings.append(Finding(LEVEL, culprit, package, where(location),
                                            f"cannot import {package}: {error}"))
                continue
            problem = _exported(module, package, op, classes[op.name])
            if problem is not None:
                findings.append(Finding(LEVEL, op.name, package, where(op.location), problem))
    return findings, f"{counted(len(ctx.selected), 'op')}, 2 packages each"
