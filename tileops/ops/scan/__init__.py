"""Scan operators (package of generated op classes)."""

# --- scan ops (generated) ---
from .cumprod_fwd import CumprodFwdOp
from .cumsum_bwd import CumsumBwdOp
from .cumsum_fwd import CumsumFwdOp

__all__ = [
    "CumsumFwdOp",
    "CumprodFwdOp",
    "CumsumBwdOp",
]
