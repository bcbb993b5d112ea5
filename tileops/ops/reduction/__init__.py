"""Reduction operators (package of generated op classes)."""

# --- reduction ops (generated) ---
from .amax_fwd import AmaxFwdOp
from .amin_fwd import AminFwdOp
from .argmax_fwd import ArgmaxFwdOp
from .l2_norm_fwd import L2NormFwdOp
from .log_sum_exp_fwd import LogSumExpFwdOp
from .mean_fwd import MeanFwdOp
from .sum_fwd import SumFwdOp
from .var_fwd import VarFwdOp

__all__ = [
    "AmaxFwdOp",
    "AminFwdOp",
    "ArgmaxFwdOp",
    "L2NormFwdOp",
    "LogSumExpFwdOp",
    "MeanFwdOp",
    "SumFwdOp",
    "VarFwdOp",
]
