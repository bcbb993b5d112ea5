"""Run the selected levels over the selected ops and collect a ``Report``.

Levels, in order: L0 schema, L1 signature, L2 shape parity, L3 dtype parity,
roofline parity, slot conformance, registration, kernel build.  L0 always
loads the manifest (every other level reads its model); when the manifest
cannot be loaded, its findings are reported and nothing else runs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from codegen.loader import MANIFEST_DIR, ROOT

from . import dtypes, kernels, registration, roofline, schema, shapes, signature, slots
from .context import Context, restore_op_packages, short_error
from .findings import Finding, LevelResult, Report, counted

__all__ = ["LEVELS", "ALIASES", "parse_levels", "validate", "UsageError", "UnknownOp"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Level:
    key: str
    title: str
    check: Optional[Callable[[Context], tuple]]  # None for L0, which runs before a context exists


LEVELS: Dict[str, Level] = {level.key: level for level in (
    Level("L0", "schema", None),
    Level("L1", "signature", signature.check),
    Level("L2", "shape", shapes.check),
    Level("L3", "dtype", dtypes.check),
    Level("roofline", "parity", roofline.check),
    Level("slots", "conformance", slots.check),
    Level("registration", "", registration.check),
    Level("kernel", "build", kernels.check),
)}
ALIASES: Dict[str, str] = {
    "schema": "L0", "signature": "L1", "shape": "L2", "shapes": "L2", "dtype": "L3", "dtypes": "L3",
    "slot": "slots", "register": "registration", "kernels": "kernel", "build": "kernel", "all": "all",
}


class UsageError(ValueError):
    """A level or op name that does not exist."""


class UnknownOp(UsageError):
    """``--op`` named an op the manifest does not have."""


def _level_key(name: str) -> str:
    lowered = name.strip().lower()
    for key in LEVELS:
        if key.lower() == lowered:
            return key
    if lowered in ALIASES:
        return ALIASES[lowered]
    raise UsageError(f"unknown level {name!r}; levels are {', '.join(LEVELS)} "
                     f"(aliases: {', '.join(a for a in ALIASES if a != 'all')}, all)")


def parse_levels(items: Iterable[str]) -> List[str]:
    """``["L0,L1", "-kernel"]`` -> selected level keys in run order.

    Names are comma-separated and repeatable; ``-name`` (or ``no-name``) removes
    a level.  With only removals, they apply to all levels.
    """
    names = [part for item in items for part in item.split(",") if part.strip()]
    added = [n for n in names if not n.startswith(("-", "no-"))]
    removed = {_level_key(n[1:] if n.startswith("-") else n[3:]) for n in names if n not in added}
    chosen = set(LEVELS) if not added else set()
    for name in added:
        key = _level_key(name)
        chosen |= set(LEVELS) if key == "all" else {key}
    return [key for key in LEVELS if key in chosen and key not in removed]


def _select(manifest, ops: Sequence[str]):
    if not ops:
        return manifest.ops
    names = {op.name for op in manifest.ops}
    unknown = [name for name in ops if name not in names]
    if unknown:
        raise UnknownOp(f"no op named {unknown[0]!r} in the manifest; ops are {', '.join(sorted(names))}")
    return tuple(op for op in manifest.ops if op.name in ops)


def _schema_level(ops: Sequence[str]) -> Tuple[LevelResult, Optional[Context]]:
    """L0, and the context every other level needs (None when the manifest does not load)."""
    started = time.perf_counter()
    result = LevelResult("L0", LEVELS["L0"].title)
    manifest, findings = schema.load(MANIFEST_DIR, ROOT)
    context = None
    if manifest is None:
        result.checked = "the manifest does not load; no other level ran"
    else:
        context = Context(manifest, _select(manifest, ops), ROOT)
        findings += schema.check_workloads(context.selected)
        if ops:
            findings = [f for f in findings if f.op in ops or f.op == "-"]
        result.checked = f"{counted(len(manifest.files), 'manifest')}, {counted(len(manifest.ops), 'op')}"
    result.findings = findings
    result.seconds = time.perf_counter() - started
    return result, context


def validate(levels: Sequence[str] = tuple(LEVELS), ops: Sequence[str] = ()) -> Report:
    """Run ``levels`` (keys of ``LEVELS``) over ``ops`` (default: all) and return the report."""
    schema_result, context = _schema_level(ops)
    results = [schema_result] if "L0" in levels or context is None else []
    if context is None:
        return Report(results)
    try:
        for key in levels:
            level = LEVELS[key]
            if level.check is not None:
                results.append(_run_level(level, context))
    finally:
        restore_op_packages()  # never leave stand-in packages behind for the caller's imports
    return Report(results)


def _run_level(level: Level, context: Context) -> LevelResult:
    started = time.perf_counter()
    result = LevelResult(level.key, level.title)
    try:
        outcome = level.check(context)
    except Exception as exc:  # a defect of the validator itself: report it, run the other levels
        logger.exception("level %s stopped", level.key)
        result.findings = [Finding(level.key, "-", "validator", "-", f"the level stopped: {short_error(exc)}")]
        result.checked = "stopped early"
    else:
        result.findings = list(outcome[0])
        result.checked = outcome[1]
        if len(outcome) > 2:
            result.timings = dict(outcome[2])
    result.seconds = time.perf_counter() - started
    logger.info("%s finished in %.2f s", level.key, result.seconds)
    return result
