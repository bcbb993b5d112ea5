"""State shared by the levels of one validation run.

The context holds the loaded manifest, the op classes imported from the
generated package (each imported once, with import failures remembered and
reported once), and the generated L2 cases, which the shape and roofline
levels share.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch

from codegen.loader import ROOT
from codegen.model import Manifest, OpSpec

from .findings import ERROR, WARNING, Finding

__all__ = ["Context", "TORCH_DTYPES", "torch_dtype", "where", "short_error", "SPEC_ONLY", "missing_method",
           "missing_method_finding", "isolate_op_packages", "restore_op_packages"]

SPEC_ONLY = "spec-only"

# Manifest dtype names -> torch dtypes (the names schema.json allows).
TORCH_DTYPES: Dict[str, torch.dtype] = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
    "float64": torch.float64, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool,
}


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


def where(location: Any) -> str:
    """``file:line`` of a model ``Location``."""
    return f"{location.file}:{location.line}"


def short_error(exc: BaseException) -> str:
    """``Type: message`` on one line, with the innermost frame of project code when there is one."""
    text = " ".join(str(exc).split()) or "(no message)"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if str(ROOT) in f.filename]
    place = ""
    if frames:
        frame = frames[-1]
        place = f" (at {Path(frame.filename).relative_to(ROOT)}:{frame.lineno})"
    return f"{type(exc).__name__}: {text}{place}"


# Marks a package module standing in for a real one while op modules are imported.
_STUB_FLAG = "__validator_stub__"


def _stub_package(name: str, directory: Path) -> ModuleType:
    """An empty package ``name`` over ``directory``: its submodules import, its ``__init__`` does not run."""
    spec = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    spec.submodule_search_locations = [str(directory)]
    module = importlib.util.module_from_spec(spec)
    module.__path__ = [str(directory)]
    setattr(module, _STUB_FLAG, True)
    return module


def isolate_op_packages(root: Path, families: Sequence[str]) -> None:
    """Import op modules without running the package ``__init__`` files.

    A broken registration (a package ``__init__.py`` that fails) is the
    registration level's finding; it must not hide the signature, shape, dtype
    and roofline checks of every op behind one import error.
    """
    packages = [("tileops.ops", root / "tileops" / "ops")]
    packages += [(f"tileops.ops.{f}", root / "tileops" / "ops" / f) for f in families]
    for name, directory in packages:
        if name not in sys.modules:
            sys.modules[name] = _stub_package(name, directory)


def restore_op_packages() -> None:
    """Drop the stand-in packages so that the next import runs the real ``__init__`` files."""
    for name in [n for n, m in sys.modules.items() if getattr(m, _STUB_FLAG, False)]:
        del sys.modules[name]


@dataclass
class Context:
    """One run: the manifest, the ops selected, imported classes and cached cases."""

    manifest: Manifest
    selected: Tuple[OpSpec, ...]
    root: Path = ROOT
    _classes: Dict[str, Any] = field(default_factory=dict)
    _import_errors: Dict[str, str] = field(default_factory=dict)
    _import_reported: Set[str] = field(default_factory=set)
    _cases: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Before anything imports tileops.ops: see isolate_op_packages.
        isolate_op_packages(self.root, self.manifest.families)

    # ---- op classes ----------------------------------------------------------------
    def op_class(self, op: OpSpec) -> Optional[type]:
        """The generated class of ``op``, imported from its own module (not via registration)."""
        if op.name in self._classes:
            return self._classes[op.name]
        module_name = f"{op.package}.{op.module}"
        cls = None
        try:
            module = importlib.import_module(module_name)
            cls = getattr(module, op.name, None)
            if cls is None:
                self._import_errors[op.name] = f"{module_name} defines no class {op.name}"
            elif not inspect.isclass(cls):
                self._import_errors[op.name] = f"{module_name}.{op.name} is not a class"
                cls = None
        except Exception as exc:  # any import-time failure is a finding, not a crash
            self._import_errors[op.name] = f"cannot import {module_name}: {short_error(exc)}"
        self._classes[op.name] = cls
        return cls

    def class_or_finding(self, op: OpSpec, level: str) -> Tuple[Optional[type], List[Finding]]:
        """The class, or the import problem as a finding (reported by the first level only)."""
        cls = self.op_class(op)
        if cls is not None:
            return cls, []
        if op.name in self._import_reported:
            return None, []
        self._import_reported.add(op.name)
        return None, [Finding(level, op.name, "import", where(op.location), self._import_errors[op.name])]

    # ---- generated cases (L2, reused by roofline) ------------------------------------
    def cases(self, op: OpSpec, build: Callable[[OpSpec], Any]) -> Any:
        """``build(op)``, computed once per op and run."""
        if op.name not in self._cases:
            self._cases[op.name] = build(op)
        return self._cases[op.name]


def missing_method(cls: type, name: str) -> bool:
    """True when ``cls`` inherits ``name`` unchanged from the L1 ``Op`` base."""
    from tileops.ops.op_base import Op

    return getattr(cls, name, None) is getattr(Op, name, None)


def missing_method_finding(op: OpSpec, level: str, rule: str, method: str) -> Finding:
    """A generated method that is absent: a warning on a spec-only op, else an error."""
    severity = WARNING if op.status == SPEC_ONLY else ERROR
    return Finding(level, op.name, rule, where(op.location),
                   f"{op.name} does not define {method} (it inherits the L1 stub)", severity)
