"""Every tileops operator class, grouped by family."""

# --- norm (generated) ---
from .norm import FusedAddRMSNormBwdOp
from .norm import FusedAddRMSNormFwdOp
from .norm import LayerNormBwdOp
from .norm import LayerNormFwdOp
from .norm import RMSNormBwdOp
from .norm import RMSNormFwdOp

# --- scan (generated) ---
from .scan import CumprodFwdOp
from .scan import CumsumBwdOp
from .scan import CumsumFwdOp

# --- softmax (generated) ---
from .softmax import LogSoftmaxBwdOp
from .softmax import LogSoftmaxFwdOp
from .softmax import SoftmaxBwdOp
from .softmax import SoftmaxFwdOp

# --- elementwise (generated) ---
from .elementwise import AddFwdOp
from .elementwise import ExpFwdOp
from .elementwise import GeluAndMulBwdOp
from .elementwise import GeluAndMulFwdOp
from .elementwise import GeluBwdOp
from .elementwise import GeluFwdOp
from .elementwise import MulFwdOp
from .elementwise import ReluFwdOp
from .elementwise import SigmoidFwdOp
from .elementwise import SiluAndMulBwdOp
from .elementwise import SiluAndMulFwdOp
from .elementwise import SiluBwdOp
from .elementwise import SiluFwdOp

# --- loss (generated) ---
from .loss import CrossEntropyBwdOp
from .loss import CrossEntropyFwdOp
from .loss import SoftCrossEntropyBwdOp
from .loss import SoftCrossEntropyFwdOp

# --- reduction (generated) ---
from .reduction import AmaxFwdOp
from .reduction import AminFwdOp
from .reduction import ArgmaxFwdOp
from .reduction import L2NormFwdOp
from .reduction import LogSumExpFwdOp
from .reduction import MeanFwdOp
from .reduction import SumFwdOp
from .reduction import VarFwdOp

__all__ = [
    "RMSNormFwdOp",
    "CumsumFwdOp",
    "LogSoftmaxBwdOp",
    "LogSoftmaxFwdOp",
    "SoftmaxBwdOp",
    "SoftmaxFwdOp",
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
    "FusedAddRMSNormFwdOp",
    "LayerNormBwdOp",
    "LayerNormFwdOp",
    "RMSNormBwdOp",
    "CumprodFwdOp",
    "CumsumBwdOp",
    "CrossEntropyBwdOp",
    "CrossEntropyFwdOp",
    "AmaxFwdOp",
    "AminFwdOp",
    "ArgmaxFwdOp",
    "L2NormFwdOp",
    "LogSumExpFwdOp",
    "MeanFwdOp",
    "SumFwdOp",
    "VarFwdOp",
    "FusedAddRMSNormBwdOp",
    "SoftCrossEntropyBwdOp",
    "SoftCrossEntropyFwdOp",
]
