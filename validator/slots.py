"""Slot conformance: each generated op file equals its rendering, slot by slot.

The file is parsed with libcst and cut into the regions the slot templates
render (S1 module docstring ... S21 ``_static_axes``) and the sections of
``codegen.render.SECTIONS`` (header comment, reference method, ...).  Each
region is compared with ``render_slot`` / ``render_section``, so a finding
names the slot that differs and its first differing line.

A slot made of whole statements is found by what its rendering defines: the
methods or functions it names, the modules it imports, the names it assigns,
the calls it makes; so new sections need no change here.  The slots that are
pieces of a statement (S6 class line, S12/S15 signatures, S13/S16 bodies) are
cut by hand.  Lines outside every slot (fixed imports; blank lines aside) are
compared with the same cut of the whole rendered file, so an edit anywhere is
attributed somewhere.  S20 (the package registration) belongs to the
registration level.
"""

from __future__ import annotations

import difflib
import functools
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, PositionProvider

from codegen.model import OpSpec
from codegen.render import SECTIONS, SLOTS, render_op, render_section, render_slot

from .context import Context, where
from .findings import Finding, counted

__all__ = ["check", "check_file", "check_source", "cut", "label", "statement_key", "LEVEL", "SLOT_NAMES"]

LEVEL = "slots"

SLOT_NAMES: Dict[str, str] = {
    "header": "header", "S1": "module docstring", "S2": "Kernel import", "S3": "kernel imports",
    "S4": "Op base import", "S5": "__all__", "S6": "class name", "S7": "class docstring",
    "S12": "__init__ signature", "S13": "__init__ body", "S14": "default_kernel_map",
    "S15": "forward signature", "S16": "forward body", "S17": "_infer_output_shapes",
    "S18": "_validate_dtypes", "S19": "eval_roofline", "S21": "_static_axes",
}
NOT_IN_OP_FILE = frozenset({"S20"})  # lives in the package __init__.py
# Slots that are pieces of a statement, not whole statements: located by hand.
CLASS_HEADER, CLASS_DOCSTRING = "S6", "S7"
SIGNATURE_BODY = {"S12": "S13", "S15": "S16"}  # def header slot -> body slot of the same method
Key = Tuple[str, ...]


@dataclass(frozen=True)
class Cut:
    """Line numbers (1-based) of each slot found in a file."""

    regions: Dict[str, Tuple[int, ...]]

    def outside(self, line_count: int) -> List[int]:
        inside = {line for lines in self.regions.values() for line in lines}
        return [n for n in range(1, line_count + 1) if n not in inside]


def statement_key(statement: cst.CSTNode) -> Key:
    """What a statement defines or does, stable under edits to its details."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return ("def", statement.name.value)
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        node = statement.body[0]
        if isinstance(node, cst.ImportFrom):
            module = get_full_name_for_node(node.module) if node.module is not None else ""
            return ("from", "." * len(node.relative) + (module or ""))
        if isinstance(node, (cst.Assign, cst.AnnAssign)):
            targets = node.targets if isinstance(node, cst.Assign) else [node]
            return ("assign",) + tuple(_code(t.target) for t in targets)
        if isinstance(node, cst.Expr) and isinstance(node.value, (cst.SimpleString, cst.ConcatenatedString)):
            return ("docstring",)
        if isinstance(node, cst.Expr) and isinstance(node.value, cst.Call):
            return ("call", _code(node.value.func))
    return ("code", _code(statement))


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


@functools.lru_cache(maxsize=512)
def _statements(text: str) -> Tuple[bool, Tuple[Tuple[Key, str], ...]]:
    """(indented, (key, code) of each statement) of a rendered slot made of whole statements.

    Raises ``libcst.ParserSyntaxError`` when the slot is a piece of a statement.
    """
    indented = next((line for line in text.splitlines() if line.strip()), "").startswith(" ")
    body = cst.parse_module(textwrap.dedent(text)).body
    return indented, tuple((statement_key(s), _code(s)) for s in body)


class _Cutter:
    """Finds each slot of one op file by what its rendering defines (names, imports, calls)."""

    def __init__(self, source: str, class_name: str, rendered: Dict[str, str]) -> None:
        wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        self.module = wrapper.module
        self.positions = wrapper.resolve(PositionProvider)
        self.lines = source.splitlines()
        self.class_name = class_name
        self.rendered = rendered
        self.claimed: set = set()

    def span(self, node: cst.CSTNode) -> Tuple[int, ...]:
        """Lines of a statement with its decorators and the comment lines right above it."""
        start = self.positions[node].start.line
        for decorator in getattr(node, "decorators", ()):
            start = min(start, self.positions[decorator].start.line)
        start -= len(getattr(node, "leading_lines", ()))
        while not self.lines[start - 1].strip():  # blank lines above belong to no slot
            start += 1
        return tuple(range(start, self.positions[node].end.line + 1))

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
        if header and "header" in self.rendered:
            regions["header"] = tuple(header)
        classes = [s for s in self.module.body if isinstance(s, cst.ClassDef)]
        named = [c for c in classes if c.name.value == self.class_name]
        op_class = (named or classes or [None])[0]
        if op_class is not None:
            self.claimed.add(id(op_class))
            regions.update(self.cut_class_fragments(op_class))
        for slot, text in self.rendered.items():
            if slot in regions or slot == "header" or slot == CLASS_HEADER or slot in SIGNATURE_BODY.values() \
                    or slot in SIGNATURE_BODY:
                continue
            lines = self.locate_statements(text, op_class)
            if lines:
                regions[slot] = lines
        return Cut(regions)

    def cut_class_fragments(self, node: cst.ClassDef) -> Dict[str, Tuple[int, ...]]:
        """S6 (the class line) and the signature/body halves of the methods S12-S16 split."""
        regions = {CLASS_HEADER: tuple(range(self.positions[node].start.line, self.colon_line(node) + 1))}
        methods = {s.name.value: s for s in reversed(node.body.body) if isinstance(s, cst.FunctionDef)}
        for header_slot, body_slot in SIGNATURE_BODY.items():
            match = re.search(r"def\s+(\w+)\s*\(", self.rendered.get(header_slot, ""))
            method = methods.get(match.group(1)) if match else None
            if method is None:
                continue
            self.claimed.add(id(method))
            colon = self.colon_line(method)
            regions[header_slot] = tuple(range(self.span(method)[0], colon + 1))
            regions[body_slot] = tuple(range(colon + 1, self.positions[method].end.line + 1))
        return regions

    def locate_statements(self, text: str, op_class: Optional[cst.ClassDef]) -> Tuple[int, ...]:
        """Lines of the file statements that match, one by one, the statements ``text`` renders."""
        try:
            indented, wanted = _statements(text)
        except cst.ParserSyntaxError:
            return ()
        scope = list(op_class.body.body) if indented and op_class is not None else list(self.module.body)
        lines: List[int] = []
        for key, code in wanted:
            candidates = [s for s in scope if id(s) not in self.claimed and statement_key(s) == key]
            exact = [s for s in candidates if _code(s) == code]
            if exact or candidates:
                found = (exact or candidates)[0]
                self.claimed.add(id(found))
                lines += self.span(found)
        return self.bridge_blank_gaps(sorted(lines))

    def bridge_blank_gaps(self, lines: List[int]) -> Tuple[int, ...]:
        """Adjacent statements of one slot are separated by blank lines only: those belong to it."""
        out: List[int] = []
        for line in lines:
            if out and line > out[-1] + 1 and all(not self.lines[n - 1].strip() for n in range(out[-1] + 1, line)):
                out += range(out[-1] + 1, line)
            out.append(line)
        return tuple(out)


def cut(source: str, class_name: str, rendered: Dict[str, str]) -> Cut:
    """Where each slot of ``rendered`` (slot -> its rendering) is in ``source``.

    Raises ``libcst.ParserSyntaxError`` when ``source`` is not valid Python.
    """
    return _Cutter(source, class_name, rendered).cut()


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
        "gradients": lambda: op.location.child("backward"),
    }
    return where(specific.get(slot, lambda: op.location)())


def _file_order() -> List[str]:
    """The header, the numbered slots of an op file, then the other sections."""
    sections = [s for s in SECTIONS if s != "header"]
    return ["header"] + [s for s in SLOTS if s not in NOT_IN_OP_FILE] + sections


def label(slot: str) -> str:
    """``S16 forward body`` for a slot, the section's name for a section."""
    return f"{slot} {SLOT_NAMES[slot]}" if slot in SLOT_NAMES and slot.startswith("S") else slot


def check_file(op: OpSpec, root: Path) -> List[Finding]:
    path = root / op.path
    if not path.exists():
        return [Finding(LEVEL, op.name, "file", where(op.location), f"{op.path} is missing (run `make gen`)")]
    return check_source(op, path.read_text())


def check_source(op: OpSpec, source: str) -> List[Finding]:
    """Slot-by-slot findings for ``source`` as the content of ``op``'s file."""
    lines = source.splitlines()
    rendered = {slot: _rendered(op, slot) for slot in _file_order()}
    try:
        found = cut(source, op.name, rendered)
    except cst.ParserSyntaxError as exc:
        return [Finding(LEVEL, op.name, "file", where(op.location),
                        f"{op.path}:{exc.raw_line} is not valid Python: {exc.message}")]
    findings: List[Finding] = []
    for slot, text in rendered.items():
        expected = _trimmed(text.splitlines())
        if not expected:
            continue
        if slot not in found.regions:
            findings.append(Finding(LEVEL, op.name, label(slot), _manifest_location(op, slot),
                                    f"missing from {op.path}: expected `{expected[0].strip()}`"))
            continue
        numbers = found.regions[slot]
        actual = _trimmed(lines[n - 1] for n in numbers)
        if actual != expected:
            index, what = first_difference(expected, actual)
            offset = next((i for i, n in enumerate(numbers) if lines[n - 1].strip()), 0)
            line = numbers[min(offset + index, len(numbers) - 1)]
            findings.append(Finding(LEVEL, op.name, label(slot), _manifest_location(op, slot),
                                    f"differs at {op.path}:{line}: {what}"))
    findings += _check_outside(op, lines, found, rendered)
    return findings


@functools.lru_cache(maxsize=64)
def _rendered_outside(whole: str, class_name: str, rendered: Tuple[Tuple[str, str], ...]) -> Tuple[str, ...]:
    """Non-blank lines of the rendered file that belong to no slot."""
    whole_lines = whole.splitlines()
    return tuple(whole_lines[n - 1].rstrip() for n in cut(whole, class_name, dict(rendered)).outside(len(whole_lines))
                 if whole_lines[n - 1].strip())


def _check_outside(op: OpSpec, lines: List[str], found: Cut, rendered: Dict[str, str]) -> List[Finding]:
    """Lines outside every slot, blank lines aside, must be those of the rendered file."""
    expected = list(_rendered_outside(render_op(op), op.name, tuple(rendered.items())))
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
    parts = len(_file_order())
    return findings, f"{counted(len(ctx.selected), 'file')}, {parts} slots and sections each"
