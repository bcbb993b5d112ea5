"""Norm operators (package of generated op classes)."""

# --- norm ops (generated) ---
from .fused_add_rms_norm_bwd import FusedAddRMSNormBwdOp
from .fused_add_rms_norm_fwd import FusedAddRMSNormFwdOp
from .layer_norm_bwd import LayerNormBwdOp
from .layer_norm_fwd import LayerNormFwdOp
from .rms_norm_bwd import RMSNormBwdOp
from .rms_norm_fwd import RMSNormFwdOp

__all__ = [
    "RMSNormFwdOp",
    "FusedAddRMSNormFwdOp",
    "LayerNormBwdOp",
    "LayerNormFwdOp",
    "RMSNormBwdOp",
    "FusedAddRMSNormBwdOp",
]
