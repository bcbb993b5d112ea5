"""Norm operators (package of generated op classes)."""

# --- norm ops (generated) ---
from .rms_norm_fwd import RMSNormFwdOp

__all__ = [
    "RMSNormFwdOp",
]
