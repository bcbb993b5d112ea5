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
output) and ``erf`` keep CUDA's accurate functions.
"""

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

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


@dataclass(frozen=True)
class PointwiseFn:
    """``apply(T, *inputs) -> outputs``: float32 TileLang expressions in, float32 expressions out.

    ``name`` identifies the function in logs and tests.
    """

    name: str
    arity: int
    outputs: int
    apply: Callable[..., Exprs]


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


def _gelu_erf(T: Any, x: Any) -> Any:
    return _const(T, 0.5) * x * (_const(T, 1.0) + T.erf(x * _const(T, _INV_SQRT2)))


def _gelu_tanh_inner(T: Any, x: Any) -> Any:
    return _const(T, _SQRT_2_OVER_PI) * (x + _const(T, _KAPPA) * x * x * x)


def _gelu_tanh(T: Any, x: Any) -> Any:
    return _const(T, 0.5) * x * (_const(T, 1.0) + _tanh(T, _gelu_tanh_inner(T, x)))


def _gelu_erf_grad(T: Any, x: Any) -> Any:
    """Phi(x) + x * phi(x)."""
    cdf = _const(T, 0.5) * (_const(T, 1.0) + T.erf(x * _const(T, _INV_SQRT2)))
    pdf = T.exp(_const(T, -0.5) * x * x) * _const(T, _INV_SQRT_2PI)
    return cdf + x * pdf


def _gelu_tanh_grad(T: Any, x: Any) -> Any:
    """0.5 * (1 + t) + 0.5 * x * (1 - t^2) * sqrt(2/pi) * (1 + 3 * kappa * x^2), t = tanh(inner)."""
    t = _tanh(T, _gelu_tanh_inner(T, x))
    inner_grad = _const(T, _SQRT_2_OVER_PI) * (_const(T, 1.0) + _const(T, 3.0 * _KAPPA) * x * x)
    return _const(T, 0.5) * (_const(T, 1.0) + t) + _const(T, 0.5) * x * (_const(T, 1.0) - t * t) * inner_grad


_GELU: Dict[str, Callable[[Any, Any], Any]] = {"none": _gelu_erf, "tanh": _gelu_tanh}
_GELU_GRAD: Dict[str, Callable[[Any, Any], Any]] = {"none": _gelu_erf_grad, "tanh": _gelu_tanh_grad}


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


def _check_approximation(approximate: str) -> None:
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"gelu: approximate must be one of {list(GELU_APPROXIMATIONS)}, got {approximate!r}")


def gelu_fn(approximate: str) -> PointwiseFn:
    """GELU forward, exact (``none``) or with the tanh approximation."""
    _check_approximation(approximate)
    gelu = _GELU[approximate]
    return PointwiseFn(f"gelu_{approximate}", 1, 1, lambda T, x: (gelu(T, x),))


def gelu_bwd_fn(approximate: str) -> PointwiseFn:
    """GELU backward ``(grad_y, x) -> grad_x``."""
    _check_approximation(approximate)
    grad = _GELU_GRAD[approximate]
    return PointwiseFn(f"gelu_{approximate}_bwd", 2, 1, lambda T, g, x: (g * grad(T, x),))


def gelu_and_mul_fn(approximate: str) -> PointwiseFn:
    """Gated GELU forward ``(gate, up) -> gelu(gate) * up``."""
    _check_approximation(approximate)
    gelu = _GELU[approximate]
    return PointwiseFn(f"gelu_{approximate}_and_mul", 2, 1, lambda T, gate, up: (gelu(T, gate) * up,))


def gelu_and_mul_bwd_fn(approximate: str) -> PointwiseFn:
    """Gated GELU backward ``(grad_y, gate, up) -> (grad_gate, grad_up)``."""
    _check_approximation(approximate)
    gelu, grad = _GELU[approximate], _GELU_GRAD[approximate]
    return PointwiseFn(
        f"gelu_{approximate}_and_mul_bwd", 3, 2,
        lambda T, g, gate, up: (g * up * grad(T, gate), g * gelu(T, gate)),
    )
