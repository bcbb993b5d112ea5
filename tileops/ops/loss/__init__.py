"""Loss operators (package of generated op classes)."""

# --- loss ops (generated) ---
from .cross_entropy_bwd import CrossEntropyBwdOp
from .cross_entropy_fwd import CrossEntropyFwdOp

__all__ = [
    "CrossEntropyBwdOp",
    "CrossEntropyFwdOp",
]
