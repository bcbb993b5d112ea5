"""Per-element functions of the elementwise kernels, written once as float32 TileLang expressions.

A ``PointwiseFn`` maps ``arity`` float32 values to ``outputs`` float32 values.
The program builders in ``tileops.kernels.elementwise.programs`` load each
input in its storage dtype, widen it to float32, apply the function and round
each result once on the store, so half-precision inputs get the accuracy of a
float32 computation (as PyTorch's own kernels do).

Formulas follow PyTorch's: ``relu`` keeps NaN, ``sigmoid`` and ``silu`` use
``1 / (1 + exp(-x))`` (so large negative inputs give 0, not NaN), and the
GELU derivatives are those of ``aten::gelu_backward``.  The logistic function
and the ``tanh`` of the GELU approximation use the hardware exponential and
reciprocal (a few ulp in float32, far below half-precision rounding): an
IEEE division, or CUDA's ``tanhf``, puts a branchy slow path on every element,
and on an H100 the gated kernels then fall to ~75 % of copy bandwidth while
the branch-free erf GELU runs at ~100 %.  ``exp`` itself (the Exp op's
output) keeps CUDA's accurate function, and so does ``erf`` in float32.  The
half-precision erf GELUs take a fitted normal CDF instead (``_normal_cdf``):
``erff`` is about 29 instructions an element, more than an H200's issue rate
leaves at its copy bandwidth for two bytes in and two out, and the fitted CDF
rounds to bf16 and fp16 at least as close to the exact GELU as PyTorch's own
float32 GELU does (``tests/test_kernels_build_elementwise.py``).
"""

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

from tileops.kernels.fast_math import FAST_EXP2_PRELUDE, fast_exp2

__all__ = [
    "PointwiseFn", "GELU_APPROXIMATIONS",
    "RELU", "SIGMOID", "SILU", "SILU_BWD", "EXP", "ADD", "MUL", "SILU_AND_MUL", "SILU_AND_MUL_BWD",
    "gelu_fn", "gelu_bwd_fn", "gelu_and_mul_fn", "gelu_and_mul_bwd_fn",
]

GELU_APPROXIMATIONS = ("none", "tanh")
# 1 / sqrt(2), 1 / sqrt(2 * pi), sqrt(2 / pi) and the cubic coefficient of the tanh form.
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_KAPPA = 0.044715

Exprs = Tuple[Any, ...]
# A per-element formula of one float32 input: ``f(T, x)``.
Formula = Callable[[Any, Any], Any]

# The normal CDF of the half-precision erf GELUs (``_normal_cdf``): with t = 1 / (1 + |x| *
# _CDF_SCALE), erfc(|x| / sqrt 2) / 2 = t * 2^(P(t) - x^2 * _HALF_LOG2E), P of degree 7 (highest
# power first) fitted near-minimax to log2(erfc(z) / 2t) + z^2 log2(e) over z = |x| / sqrt 2 in
# [0, 10], beyond which the result is below float32's normal range.  Relative error under
# 3.5e-7 with these float32 coefficients, in the tail too, where 1 + erf(x / sqrt 2) cancels.
_CDF_SCALE = 0.3125 / math.sqrt(2.0)
_CDF_POLY = (0.5918294787406921, -2.265138864517212, 3.0179073810577393, -1.9885518550872803,
             1.2544612884521484, 0.4208776354789734, 1.474252700805664, -3.5056374073028564)
_HALF_LOG2E = 0.5 / math.log(2.0)


@dataclass(frozen=True)
class PointwiseFn:
    """``apply(T, *inputs) -> outputs``: float32 TileLang expressions in, float32 expressions out.

    ``name`` identifies the function in logs and tests; ``prelude`` is the CUDA source of the
    device functions its expressions call (``T.call_extern``), for the program's kernel.
    """

    name: str
    arity: int
    outputs: int
    apply: Callable[..., Exprs]
    prelude: str = ""


def _const(T: Any, value: float) -> Any:
    return T.float32(value)


# ---- activations and their derivatives ------------------------------------------------------


def _sigmoid(T: Any, x: Any) -> Any:
    return T.fast_rcp(_const(T, 1.0) + T.__exp(-x))


def _silu(T: Any, x: Any) -> Any:
    return x * _sigmoid(T, x)


def _tanh(T: Any, u: Any) -> Any:
    """``1 - 2 / (1 + exp(2u))``: exact limits (+-1 for large |u|), absolute error ~1e-7."""
    return _const(T, 1.0) - _const(T, 2.0) * T.fast_rcp(_const(T, 1.0) + T.__exp(_const(T, 2.0) * u))


def _silu_grad(T: Any, x: Any) -> Any:
    """d/dx silu(x) = s * (1 + x * (1 - s)), s = sigmoid(x)."""
    s = _sigmoid(T, x)
    return s * (_const(T, 1.0) + x * (_const(T, 1.0) - s))


def _normal_cdf(T: Any, x: Any, gaussian: Any = None) -> Any:
    """Phi(x) from ``_CDF_POLY`` with the hardware reciprocal and ``fast_exp2``, for the
    half-precision GELUs, whose rounding (2^-9 in bf16) dwarfs its error.  ``gaussian``, where the
    caller has it, is exp(-x^2 / 2).

    Phi is the tail below zero and 1 - tail from zero on, taken as a fused multiply-add of the
    tail with constants selected by the sign: a select between two expressions of the tail
    compiles to a branch that computes it in both arms."""
    t = T.fast_rcp(_const(T, 1.0) + T.abs(x) * _const(T, _CDF_SCALE))
    poly = _const(T, _CDF_POLY[0])
    for coefficient in _CDF_POLY[1:]:
        poly = poly * t + _const(T, coefficient)
    if gaussian is None:
        tail = t * fast_exp2(T, poly - x * x * _const(T, _HALF_LOG2E))
    else:
        tail = t * fast_exp2(T, poly) * gaussian
    negative = x < _const(T, 0.0)
    return (T.if_then_else(negative, _const(T, 1.0), _const(T, -1.0)) * tail
            + T.if_then_else(negative, _const(T, 0.0), _const(T, 1.0)))


def _gelu_erf(T: Any, x: Any) -> Any:
    return _const(T, 0.5) * x * (_const(T, 1.0) + T.erf(x * _const(T, _INV_SQRT2)))


def _gelu_cdf(T: Any, x: Any) -> Any:
    return x * _normal_cdf(T, x)


def _gelu_tanh_inner(T: Any, x: Any) -> Any:
    return _const(T, _SQRT_2_OVER_PI) * (x + _const(T, _KAPPA) * x * x * x)


def _gelu_tanh(T: Any, x: Any) -> Any:
    return _const(T, 0.5) * x * (_const(T, 1.0) + _tanh(T, _gelu_tanh_inner(T, x)))


def _gelu_erf_grad(T: Any, x: Any) -> Any:
    """Phi(x) + x * phi(x)."""
    cdf = _const(T, 0.5) * (_const(T, 1.0) + T.erf(x * _const(T, _INV_SQRT2)))
    pdf = T.exp(_const(T, -0.5) * x * x) * _const(T, _INV_SQRT_2PI)
    return cdf + x * pdf


def _gelu_cdf_grad(T: Any, x: Any) -> Any:
    """Phi(x) + x * phi(x), sharing exp(-x^2 / 2) between the two."""
    gaussian = fast_exp2(T, -(x * x * _const(T, _HALF_LOG2E)))
    return _normal_cdf(T, x, gaussian) + x * gaussian * _const(T, _INV_SQRT_2PI)


def _gelu_tanh_grad(T: Any, x: Any) -> Any:
    """0.5 * (1 + t) + 0.5 * x * (1 - t^2) * sqrt(2/pi) * (1 + 3 * kappa * x^2), t = tanh(inner)."""
    t = _tanh(T, _gelu_tanh_inner(T, x))
    inner_grad = _const(T, _SQRT_2_OVER_PI) * (_const(T, 1.0) + _const(T, 3.0 * _KAPPA) * x * x)
    return _const(T, 0.5) * (_const(T, 1.0) + t) + _const(T, 0.5) * x * (_const(T, 1.0) - t * t) * inner_grad


_GELU: Dict[str, Formula] = {"none": _gelu_erf, "tanh": _gelu_tanh}
_GELU_GRAD: Dict[str, Formula] = {"none": _gelu_erf_grad, "tanh": _gelu_tanh_grad}


def _relu(T: Any, x: Any) -> Exprs:
    # ``x < 0`` is false for NaN, so NaN passes through as in torch.relu.
    return (T.if_then_else(x < _const(T, 0.0), _const(T, 0.0), x),)


RELU = PointwiseFn("relu", 1, 1, _relu)
SIGMOID = PointwiseFn("sigmoid", 1, 1, lambda T, x: (_sigmoid(T, x),))
SILU = PointwiseFn("silu", 1, 1, lambda T, x: (_silu(T, x),))
SILU_BWD = PointwiseFn("silu_bwd", 2, 1, lambda T, g, x: (g * _silu_grad(T, x),))
EXP = PointwiseFn("exp", 1, 1, lambda T, x: (T.exp(x),))
ADD = PointwiseFn("add", 2, 1, lambda T, a, b: (a + b,))
MUL = PointwiseFn("mul", 2, 1, lambda T, a, b: (a * b,))

# Gated functions: inputs (gate, up) forward; (grad_y, gate, up) backward -> (grad_gate, grad_up).
SILU_AND_MUL = PointwiseFn("silu_and_mul", 2, 1, lambda T, gate, up: (_silu(T, gate) * up,))
SILU_AND_MUL_BWD = PointwiseFn(
    "silu_and_mul_bwd", 3, 2,
    lambda T, g, gate, up: (g * up * _silu_grad(T, gate), g * _silu(T, gate)),
)


def _gelu_forms(approximate: str, half_precision: bool) -> Tuple[Formula, Formula, str]:
    """The GELU, its derivative and their prelude for ``approximate``; in half precision the erf
    form takes the fitted normal CDF (``_normal_cdf``), in float32 CUDA's ``erff``."""
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"gelu: approximate must be one of {list(GELU_APPROXIMATIONS)}, got {approximate!r}")
    if approximate == "none" and half_precision:
        return _gelu_cdf, _gelu_cdf_grad, FAST_EXP2_PRELUDE
    return _GELU[approximate], _GELU_GRAD[approximate], ""


def gelu_fn(approximate: str, half_precision: bool = False) -> PointwiseFn:
    """GELU forward, exact (``none``) or with the tanh approximation."""
    gelu, _, prelude = _gelu_forms(approximate, half_precision)
    return PointwiseFn(f"gelu_{approximate}", 1, 1, lambda T, x: (gelu(T, x),), prelude)


def gelu_bwd_fn(approximate: str, half_precision: bool = False) -> PointwiseFn:
    """GELU backward ``(grad_y, x) -> grad_x``."""
    _, grad, prelude = _gelu_forms(approximate, half_precision)
    return PointwiseFn(f"gelu_{approximate}_bwd", 2, 1, lambda T, g, x: (g * grad(T, x),), prelude)


def gelu_and_mul_fn(approximate: str, half_precision: bool = False) -> PointwiseFn:
    """Gated GELU forward ``(gate, up) -> gelu(gate) * up``."""
    gelu, _, prelude = _gelu_forms(approximate, half_precision)
    return PointwiseFn(f"gelu_{approximate}_and_mul", 2, 1, lambda T, gate, up: (gelu(T, gate) * up,), prelude)


def gelu_and_mul_bwd_fn(approximate: str, half_precision: bool = False) -> PointwiseFn:
    """Gated GELU backward ``(grad_y, gate, up) -> (grad_gate, grad_up)``."""
    gelu, grad, prelude = _gelu_forms(approximate, half_precision)
    return PointwiseFn(
        f"gelu_{approximate}_and_mul_bwd", 3, 2,
        lambda T, g, gate, up: (g * up * grad(T, gate), g * gelu(T, gate)), prelude,
    )
