"""2^x in the one hardware instruction, for values whose results below float32's normal range
do not matter.

CUDA's ``exp2f`` and ``__expf``, compiled without fast math (as TileLang compiles), wrap the
hardware's ``ex2.approx`` in a scaling that keeps results below 2^-126 as subnormals: three
more instructions an element, which kernels near an H200's issue rate feel.  ``fast_exp2``
calls ``ex2.approx.ftz`` alone, which flushes those results to zero.  That is harmless in a
sum of exponentials taken after its maximum (the maximum's term is 1, and a term below 2^-126
is lost in rounding anyway).  In the half-precision GELUs it gives 0 where the exact GELU is
below 4e-38 in magnitude (x < -13.05) and the derivative below 7e-38 (x < -13.2); PyTorch's
float32 GELU, where 1 + erf(x / sqrt 2) cancels, gives 0 from about x = -5.5 on.  A program
that calls it names ``FAST_EXP2_PRELUDE`` in its kernel's prelude.
"""

from typing import Any

__all__ = ["FAST_EXP2", "FAST_EXP2_PRELUDE", "fast_exp2"]

FAST_EXP2 = "tileops_exp2_ftz"
FAST_EXP2_PRELUDE = r"""
__device__ __forceinline__ float tileops_exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""


def fast_exp2(T: Any, x: Any) -> Any:
    """2^x of a float32 expression (``FAST_EXP2``)."""
    return T.call_extern("float32", FAST_EXP2, x)
