"""Parity validator: proves that the manifest and the generated ops agree.

``python -m validator`` runs every level (see ``validator.run``); the same is
available as ``validator.validate(levels, ops) -> Report``.  Importing this
package is cheap: the levels, and with them torch and the generated ops, load
on first use.
"""

from typing import Any

__all__ = ["validate", "LEVELS", "parse_levels"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module 'validator' has no attribute {name!r}")
