"""tileops code generator: manifest -> schema -> typed model -> slot templates -> op files.

Entry points: ``python -m codegen gen|check|new-op`` and the functions below.
"""

from .errors import Location, ManifestError, ManifestErrors
from .generate import Plan, check, plan, write
from .loader import load_files, load_manifest
from .model import Manifest, OpSpec
from .render import SECTIONS, SLOTS, render_op, render_section, render_slot

__all__ = [
    "Location", "ManifestError", "ManifestErrors", "Manifest", "OpSpec", "Plan", "SLOTS",
    "SECTIONS", "check", "load_files", "load_manifest", "plan", "render_op", "render_section", "render_slot", "write",
]
