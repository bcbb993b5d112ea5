"""Softmax operators (package of generated op classes)."""

# --- softmax ops (generated) ---
from .log_softmax_bwd import LogSoftmaxBwdOp
from .log_softmax_fwd import LogSoftmaxFwdOp
from .softmax_bwd import SoftmaxBwdOp
from .softmax_fwd import SoftmaxFwdOp

__all__ = [
    "LogSoftmaxBwdOp",
    "LogSoftmaxFwdOp",
    "SoftmaxBwdOp",
    "SoftmaxFwdOp",
]
