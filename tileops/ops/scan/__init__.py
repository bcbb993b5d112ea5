"""Scan operators (package of generated op classes)."""

# --- scan ops (generated) ---
from .cumsum_fwd import CumsumFwdOp

__all__ = [
    "CumsumFwdOp",
]
