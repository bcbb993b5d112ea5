"""Elementwise operators (package of generated op classes)."""

# --- elementwise ops (generated) ---
from .add_fwd import AddFwdOp
from .exp_fwd import ExpFwdOp
from .gelu_and_mul_bwd import GeluAndMulBwdOp
from .gelu_and_mul_fwd import GeluAndMulFwdOp
from .gelu_bwd import GeluBwdOp
from .gelu_fwd import GeluFwdOp
from .mul_fwd import MulFwdOp
from .relu_fwd import ReluFwdOp
from .sigmoid_fwd import SigmoidFwdOp
from .silu_and_mul_bwd import SiluAndMulBwdOp
from .silu_and_mul_fwd import SiluAndMulFwdOp
from .silu_bwd import SiluBwdOp
from .silu_fwd import SiluFwdOp

__all__ = [
    "AddFwdOp",
    "ExpFwdOp",
    "GeluAndMulBwdOp",
    "GeluAndMulFwdOp",
    "GeluBwdOp",
    "GeluFwdOp",
    "MulFwdOp",
    "ReluFwdOp",
    "SigmoidFwdOp",
    "SiluAndMulBwdOp",
    "SiluAndMulFwdOp",
    "SiluBwdOp",
    "SiluFwdOp",
]
