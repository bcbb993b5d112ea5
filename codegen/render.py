"""Render op files from the model through the slot templates.

``render_op`` produces a whole generated op file; ``render_slot`` produces one
slot alone (the validator compares files slot by slot).  Rendering is a pure
function of the model: same manifest, same bytes.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Dict

import jinja2

from .model import Manifest, OpSpec
from .view import FunctionView, OpView

__all__ = ["SLOTS", "SECTIONS", "render_slot", "render_section", "render_op", "render_functional", "TEMPLATE_DIR"]

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"

# Slot id -> template file; S8-S11 are reserved and absent.
SLOTS: Dict[str, str] = {
    "S1": "S01_module_docstring",
    "S2": "S02_import_kernel_base",
    "S3": "S03_import_kernels",
    "S4": "S04_import_op_base",
    "S5": "S05_all",
    "S6": "S06_class_name",
    "S7": "S07_class_docstring",
    "S12": "S12_init_signature",
    "S13": "S13_init_body",
    "S14": "S14_default_kernel_map",
    "S15": "S15_forward_signature",
    "S16": "S16_forward_body",
    "S17": "S17_infer_output_shapes",
    "S18": "S18_validate_dtypes",
    "S19": "S19_eval_roofline",
    "S20": "S20_registration",
    "S21": "S21_static_axes",
}


# Parts of an op file that are not numbered slots: the file header and the reference method.
SECTIONS: Dict[str, str] = {
    "header": "header",            # the generated-file notice
    "workloads": "workloads",      # the manifest workloads as a class attribute
    "checks": "checks",            # _check_inputs: the manifest's rules on the inputs
    "reference": "reference",      # the manifest's PyTorch reference
    "gradients": "gradients",      # _formula_gradients: the manifest's gradient formulas
    "library": "library",          # _library_call, _fake_outputs, backward_op
    "registration": "registration",  # the torch.library custom op, its fake and its autograd
}


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )


def _normalize_slot_id(slot: str) -> str:
    slot = slot.upper()
    if slot.startswith("S") and slot[1:].isdigit():
        slot = f"S{int(slot[1:])}"
    if slot not in SLOTS:
        raise KeyError(f"unknown slot {slot!r}; slots are {', '.join(SLOTS)}")
    return slot


def render_slot(op: OpSpec, slot: str) -> str:
    """The text of one slot of ``op``'s generated file (S20: its package import line)."""
    template = _environment().get_template(f"slots/{SLOTS[_normalize_slot_id(slot)]}.py.j2")
    return template.render(v=OpView(op))


def render_section(op: OpSpec, section: str) -> str:
    """The text of a non-slot section (see ``SECTIONS``)."""
    if section not in SECTIONS:
        raise KeyError(f"unknown section {section!r}; sections are {', '.join(SECTIONS)}")
    return _environment().get_template(f"{SECTIONS[section]}.py.j2").render(v=OpView(op))


def render_op(op: OpSpec) -> str:
    """The whole generated file of ``op``; checked to be valid Python."""
    text = _environment().get_template("op.py.j2").render(v=OpView(op))
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    try:
        ast.parse(text)
    except SyntaxError as exc:  # a template defect, not a manifest one
        raise RuntimeError(f"rendering {op.name} produced invalid Python at line {exc.lineno}: {exc.msg}") from exc
    return text


def render_functional(manifest: Manifest) -> str:
    """``tileops/functional.py``: one function per Fwd op, named after it (``rms_norm``)."""
    functions = [FunctionView(op) for op in manifest.ops if op.direction == "Fwd"]
    text = _environment().get_template("functional.py.j2").render(functions=functions)
    ast.parse(text)
    return text
