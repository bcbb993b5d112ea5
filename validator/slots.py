"""Slot conformance: each generated op file equals its rendering, slot by slot.

The file is parsed with libcst and cut into the regions the slot templates
render (S1 module docstring ... S21 ``_static_axes``, plus the ``header``
comment and the ``reference`` method).  Each region is compared with
``codegen.render_slot`` / ``render_section``, so a finding names the slot
that differs and the first differing line.  Lines outside every slot
(the fixed imports, blank lines aside) are compared with the same cut of the
whole rendered file, so an edit anywhere is attributed somewhere.  S20 (the
package registration) is checked by the registration level.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, PositionProvider

from codegen.model import OpSpec
from codegen.render import SECTIONS, SLOTS, render_op, render_section, render_slot

from .context import Context, where
from .findings import WARNING, Finding

__all__ = ["check", "cut", "LEVEL", "SLOT_NAMES"]

LEVEL = "slots"

SLOT_NAMES: Dict[str, str] = {
    "header": "header", "S1": "module docstring", "S2": "Kernel import", "S3": "kernel imports",
    "S4": "Op base import", "S5": "__all__", "S6": "class name", "S7": "class docstring",
    "S12": "__init__ signature", "S13": "__init__ body", "S14": "default_kernel_map",
    "S15": "forward signature", "S16": "forward body", "reference": "reference method",
    "S17": "_infer_output_shapes", "S18": "_validate_dtypes", "S19": "eval_roofline", "S21": "_static_axes",
}
NOT_IN_OP_FILE = frozenset({"S20"})  # lives in the package __init__.py
KERNEL_BASE_MODULE = "tileops.kernels.kernel_base"


@dataclass(frozen=True)
class Cut:
    """Line numbers (1-based) of each slot found in a file."""

    regions: Dict[str, Tuple[int, ...]]

    def outside(self, line_count: int) -> List[int]:
        inside = {line for lines in self.regions.values() for line in lines}
        return [n for n in range(1, line_count + 1) if n not in inside]


class _Cutter:
    def __init__(self, source: str, class_name: str) -> None:
        wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        self.module = wrapper.module
        self.positions = wrapper.resolve(PositionProvider)
        self.lines = source.splitlines()
        self.class_name = class_name

    def span(self, node: cst.CSTNode) -> Tuple[int, ...]:
        position = self.positions[node]
        return tuple(range(position.start.line, position.end.line + 1))

    def colon_line(self, node: cst.CSTNode) -> int:
        """The line of the ``:`` that ends a def/class header."""
        first = node.body.body[0]
        return self.positions[first].start.line - len(getattr(first, "leading_lines", ())) - 1

    def cut(self) -> Cut:
        regions: Dict[str, Tuple[int, ...]] = {}
        header = []
        for number, line in enumerate(self.lines, start=1):
            if not line.startswith("#"):
                break
            header.append(number)
        if header:
            regions["header"] = tuple(header)
        body = self.module.body
        if body and _is_docstring(body[0]):
            regions["S1"] = self.span(body[0])
        kernels: List[int] = []
        for statement in body:
            imported = _import_from(statement)
            if imported is not None:
                relative, module = imported
                if relative:
                    regions.setdefault("S4", self.span(statement))
                elif module == KERNEL_BASE_MODULE:
                    regions.setdefault("S2", self.span(statement))
                elif module.startswith("tileops.kernels."):
                    kernels += self.span(statement)
            elif _assigns(statement, "__all__"):
                regions.setdefault("S5", self.span(statement))
        if kernels:
            regions["S3"] = tuple(kernels)
        classes = [s for s in body if isinstance(s, cst.ClassDef)]
        named = [c for c in classes if c.name.value == self.class_name]
        if named or classes:
            regions.update(self.cut_class((named or classes)[0]))
        return Cut(regions)

    def cut_class(self, node: cst.ClassDef) -> Dict[str, Tuple[int, ...]]:
        start = self.positions[node].start.line
        regions = {"S6": tuple(range(start, self.colon_line(node) + 1))}
        statements = node.body.body
        if statements and _is_docstring(statements[0]):
            regions["S7"] = self.span(statements[0])
        methods: Dict[str, cst.FunctionDef] = {}
        for statement in statements:
            if isinstance(statement, cst.FunctionDef):
                methods.setdefault(statement.name.value, statement)
        for name, (header_slot, body_slot) in {"__init__": ("S12", "S13"), "forward": ("S15", "S16")}.items():
            if name in methods:
                header, rest = self.split_function(methods[name])
                regions[header_slot], regions[body_slot] = header, rest
        for name, slot in (("default_kernel_map", "S14"), ("reference", "reference"),
                           ("_infer_output_shapes", "S17"), ("_validate_dtypes", "S18"),
                           ("eval_roofline", "S19"), ("_static_axes", "S21")):
            if name in methods:
                regions[slot] = self.whole_function(methods[name])
        return regions

    def split_function(self, node: cst.FunctionDef) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        start = self.positions[node].start.line
        colon = self.colon_line(node)
        end = self.positions[node].end.line
        return tuple(range(start, colon + 1)), tuple(range(colon + 1, end + 1))

    def whole_function(self, node: cst.FunctionDef) -> Tuple[int, ...]:
        start = min([self.positions[node].start.line] + [self.positions[d].start.line for d in node.decorators])
        return tuple(range(start, self.positions[node].end.line + 1))


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _import_from(statement: cst.CSTNode) -> Optional[Tuple[bool, str]]:
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.ImportFrom)):
        return None
    node = statement.body[0]
    module = get_full_name_for_node(node.module) if node.module is not None else ""
    return len(node.relative) > 0, module or ""


def _assigns(statement: cst.CSTNode, name: str) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    node = statement.body[0]
    if isinstance(node, cst.Assign):
        return any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets)
    return isinstance(node, cst.AnnAssign) and isinstance(node.target, cst.Name) and node.target.value == name


def cut(source: str, class_name: str) -> Cut:
    """Where each slot of an op file is (raises ``libcst.ParserSyntaxError`` on invalid Python)."""
    return _Cutter(source, class_name).cut()


def _trimmed(lines: Sequence[str]) -> List[str]:
    lines = [line.rstrip() for line in lines]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def first_difference(expected: Sequence[str], found: Sequence[str]) -> Tuple[int, str]:
    """(index into ``found``, description) of the first line where the two differ."""
    matcher = difflib.SequenceMatcher(a=expected, b=found, autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace":
            return b0, f"expected `{expected[a0].strip()}`, found `{found[b0].strip()}`"
        if tag == "delete":
            return b0, f"missing `{expected[a0].strip()}`"
        return b0, f"unexpected `{found[b0].strip()}`"
    return 0, "differs"


def _rendered(op: OpSpec, slot: str) -> str:
    return render_section(op, slot) if slot in SECTIONS else render_slot(op, slot)


def _manifest_location(op: OpSpec, slot: str) -> str:
    """The manifest entry a slot is rendered from, as near as one exists."""
    specific: Dict[str, Callable[[], object]] = {
        "S3": lambda: op.kernels[0].location if op.kernels else op.location,
        "S14": lambda: op.kernels[0].location if op.kernels else op.location,
        "S17": lambda: op.output_rules[0].location,
        "S19": lambda: op.roofline.location,
        "S21": lambda: op.static_dims[0].location if op.static_dims else op.location,
        "reference": lambda: op.location.child("reference"),
    }
    return where(specific.get(slot, lambda: op.location)())


def _file_order() -> List[str]:
    """The header, the numbered slots of an op file, then the other sections."""
    sections = [s for s in SECTIONS if s != "header"]
    return ["header"] + [s for s in SLOTS if s not in NOT_IN_OP_FILE] + sections


def check_file(op: OpSpec, root: Path) -> List[Finding]:
    path = root / op.path
    if not path.exists():
        return [Finding(LEVEL, op.name, "file", where(op.location), f"{op.path} is missing (run `make gen`)")]
    source = path.read_text()
    lines = source.splitlines()
    try:
        found = cut(source, op.name)
    except cst.ParserSyntaxError as exc:
        return [Finding(LEVEL, op.name, "file", where(op.location),
                        f"{op.path}:{exc.raw_line} is not valid Python: {exc.message}")]
    findings: List[Finding] = []
    for slot in _file_order():
        label = f"{slot} {SLOT_NAMES.get(slot, slot)}" if slot.startswith("S") else SLOT_NAMES.get(slot, slot)
        if slot not in SLOT_NAMES:
            findings.append(Finding(LEVEL, op.name, label, _manifest_location(op, slot),
                                    f"the validator does not know where slot {slot} lives", WARNING))
            continue
        expected = _trimmed(_rendered(op, slot).splitlines())
        if slot not in found.regions:
            if expected:
                findings.append(Finding(LEVEL, op.name, label, _manifest_location(op, slot),
                                        f"missing from {op.path}: expected `{expected[0].strip()}`"))
            continue
        numbers = found.regions[slot]
        actual = _trimmed(lines[n - 1] for n in numbers)
        if actual != expected:
            index, what = first_difference(expected, actual)
            offset = next(i for i, n in enumerate(numbers) if lines[n - 1].strip())
            line = numbers[min(offset + index, len(numbers) - 1)]
            findings.append(Finding(LEVEL, op.name, label, _manifest_location(op, slot),
                                    f"differs at {op.path}:{line}: {what}"))
    findings += _check_outside(op, lines, found)
    return findings


def _check_outside(op: OpSpec, lines: List[str], found: Cut) -> List[Finding]:
    """Lines outside every slot, blank lines aside, must be those of the rendered file."""
    rendered = render_op(op).splitlines()
    expected = [rendered[n - 1].rstrip() for n in cut("\n".join(rendered), op.name).outside(len(rendered))
                if rendered[n - 1].strip()]
    numbers = [n for n in found.outside(len(lines)) if lines[n - 1].strip()]
    actual = [lines[n - 1].rstrip() for n in numbers]
    if actual == expected:
        return []
    index, what = first_difference(expected, actual)
    line = numbers[index] if index < len(numbers) else len(lines)
    return [Finding(LEVEL, op.name, "outside slots", where(op.location), f"differs at {op.path}:{line}: {what}")]


def check(ctx: Context) -> Tuple[List[Finding], str]:
    findings: List[Finding] = []
    for op in ctx.selected:
        findings += check_file(op, ctx.root)
    return findings, f"{len(ctx.selected)} files, {len(SLOT_NAMES)} slots each"
