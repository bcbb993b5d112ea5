"""tileops: TileLang GPU operators for PyTorch, generated from a YAML manifest.

Subpackages load on first use, so ``import tileops`` stays cheap:
``tileops.ops`` (operator classes), ``tileops.kernels``, ``tileops.tuning``.
"""

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBPACKAGES = ("ops", "kernels", "tuning", "functional", "nn")


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"tileops.{name}")
    raise AttributeError(f"module 'tileops' has no attribute {name!r}")
