"""Findings, per-level results and the report the CLI prints.

A finding names the level that produced it, the op, the slot or rule it is
about and the manifest ``file:line`` of that rule, so a reader can go straight
to the line that has to change (or to the generated file the message names).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Tuple

__all__ = ["ERROR", "WARNING", "Finding", "Tally", "LevelResult", "Report", "counted"]

ERROR = "error"
WARNING = "warning"


def counted(count: int, noun: str) -> str:
    """``1 op``, ``2 ops``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@dataclass(frozen=True)
class Finding:
    """One disagreement between the manifest and the code (or a defect of either)."""

    level: str
    op: str
    rule: str
    where: str
    message: str
    severity: str = ERROR

    def line(self) -> str:
        message = self.message if self.severity == ERROR else f"warning: {self.message}"
        return "  ".join((self.level, self.op, self.rule, self.where, message))


class Tally:
    """One op's disagreements over many cases, one finding per (rule, kind): the first example and a count."""

    def __init__(self, level: str, op: str) -> None:
        self.level = level
        self.op = op
        self.groups: Dict[Tuple[str, str], List[object]] = {}

    def add(self, rule: str, where: str, kind: str, message: str, severity: str = ERROR) -> None:
        group = self.groups.setdefault((rule, kind), [0, where, message, severity])
        group[0] += 1  # type: ignore[operator]

    def findings(self, total: int) -> List[Finding]:
        out = []
        for (rule, _), (count, where, message, severity) in self.groups.items():
            suffix = f" ({count} of {total} cases)" if count > 1 else ""  # type: ignore[operator]
            out.append(Finding(self.level, self.op, rule, str(where), f"{message}{suffix}", str(severity)))
        return out


@dataclass
class LevelResult:
    """What one level found, how long it took and what it looked at."""

    level: str
    title: str
    findings: List[Finding] = field(default_factory=list)
    seconds: float = 0.0
    checked: str = ""
    timings: Dict[str, float] = field(default_factory=dict)  # e.g. seconds per kernel build

    @property
    def errors(self) -> int:
        return sum(f.severity == ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == WARNING for f in self.findings)


@dataclass
class Report:
    """The results of every level that ran, in level order."""

    results: List[LevelResult]

    @property
    def findings(self) -> List[Finding]:
        return [f for result in self.results for f in result.findings]

    @property
    def ok(self) -> bool:
        return all(result.errors == 0 for result in self.results)

    @property
    def seconds(self) -> float:
        return sum(result.seconds for result in self.results)

    def text(self) -> str:
        lines = [finding.line() for finding in self.findings]
        if lines:
            lines.append("")
        lines.append(f"{'level':<22} {'errors':>6} {'warnings':>8} {'time':>8}  checked")
        for result in self.results:
            lines.append(f"{result.level + ' ' + result.title:<22} {result.errors:>6} {result.warnings:>8} "
                         f"{result.seconds:>7.2f}s  {result.checked}")
            for name, seconds in result.timings.items():
                lines.append(f"{'':<22} {'':>6} {'':>8} {seconds:>7.2f}s    {name}")
        errors = sum(r.errors for r in self.results)
        warnings = sum(r.warnings for r in self.results)
        verdict = "OK" if self.ok else "FAILED"
        lines.append(f"{verdict}: {errors} errors, {warnings} warnings in {self.seconds:.2f} s")
        return "\n".join(lines) + "\n"

    def json(self) -> str:
        return json.dumps({
            "ok": self.ok,
            "findings": [asdict(f) for f in self.findings],
            "levels": [_level_summary(r) for r in self.results],
        }, indent=2) + "\n"


def _level_summary(result: LevelResult) -> Dict[str, object]:
    return {"level": result.level, "title": result.title, "errors": result.errors, "warnings": result.warnings,
            "seconds": round(result.seconds, 3), "checked": result.checked,
            "timings": {k: round(v, 3) for k, v in result.timings.items()}}
