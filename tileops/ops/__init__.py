"""Every tileops operator class, grouped by family."""

# --- norm (generated) ---
from .norm import RMSNormFwdOp

# --- scan (generated) ---
from .scan import CumsumFwdOp

# --- softmax (generated) ---
from .softmax import LogSoftmaxBwdOp
from .softmax import LogSoftmaxFwdOp
from .softmax import SoftmaxBwdOp
from .softmax import SoftmaxFwdOp

__all__ = [
    "RMSNormFwdOp",
    "CumsumFwdOp",
    "LogSoftmaxBwdOp",
    "LogSoftmaxFwdOp",
    "SoftmaxBwdOp",
    "SoftmaxFwdOp",
]
