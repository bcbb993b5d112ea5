"""Loss operators (package of generated op classes)."""

# --- loss ops (generated) ---
from .cross_entropy_bwd import CrossEntropyBwdOp
from .cross_entropy_fwd import CrossEntropyFwdOp
from .soft_cross_entropy_bwd import SoftCrossEntropyBwdOp
from .soft_cross_entropy_fwd import SoftCrossEntropyFwdOp

__all__ = [
    "CrossEntropyBwdOp",
    "CrossEntropyFwdOp",
    "SoftCrossEntropyBwdOp",
    "SoftCrossEntropyFwdOp",
]
