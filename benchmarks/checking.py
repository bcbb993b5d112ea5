"""Is an output right? Compared with the reference before anything is timed.

The oracle is the manifest reference on inputs upcast to float64. The error is
``||out - oracle|| / ||oracle||`` over each output. An output passes when that error is
within the dtype's tolerance, or within twice the error of the reference itself run in
the working dtype: the kernel must be as accurate as PyTorch, not more (a float32 cumsum
over 256k elements drifts for torch too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Sequence

__all__ = ["TOLERANCE", "Verdict", "as_outputs", "relative_error", "upcast", "judge"]

# Relative (normwise) tolerance per working dtype.
TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 1e-3, "bfloat16": 1e-2}
DEFAULT_TOLERANCE = 1e-2
REFERENCE_ERROR_FACTOR = 2.0


@dataclass(frozen=True)
class Verdict:
    ok: bool
    error: float
    limit: float
    reason: str = ""


def as_outputs(value: Any) -> List[Any]:
    """One tensor or a tuple/list of them -> a list."""
    if isinstance(value, (tuple, list)):
        return list(value)
    return [value]


def upcast(tensors: Sequence[Any]) -> List[Any]:
    """Floating tensors as float64 (others unchanged), detached."""
    import torch

    return [t.detach().to(torch.float64) if t is not None and t.is_floating_point() else t
            for t in tensors]


def relative_error(out: Any, oracle: Any) -> float:
    """Normwise relative error in float64; inf for NaN, Inf or a shape mismatch."""
    import torch

    if tuple(out.shape) != tuple(oracle.shape):
        return math.inf
    a = out.detach().to(torch.float64)
    b = oracle.detach().to(torch.float64)
    if not bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()):
        return math.inf
    norm = float(torch.linalg.vector_norm(b))
    diff = float(torch.linalg.vector_norm(a - b))
    if math.isnan(diff):
        return math.inf
    return diff / norm if norm > 0 else diff


def _worst(outputs: Sequence[Any], oracles: Sequence[Any]) -> float:
    if len(outputs) != len(oracles):
        return math.inf
    return max((relative_error(o, r) for o, r in zip(outputs, oracles)), default=0.0)


def judge(outputs: Any, oracles: Any, dtype: str, reference_error: float = 0.0,
          expected_dtypes: Sequence[Any] = ()) -> Verdict:
    """Compare ``outputs`` with the high-precision ``oracles`` (both may be tuples).

    ``expected_dtypes`` (the working-dtype reference's output dtypes), when given, must
    match too: a float32 result from a bf16 op is a different contract, not a rounding.
    """
    outs, refs = as_outputs(outputs), as_outputs(oracles)
    limit = max(TOLERANCE.get(dtype, DEFAULT_TOLERANCE), REFERENCE_ERROR_FACTOR * reference_error)
    if len(outs) != len(refs):
        return Verdict(False, math.inf, limit, f"{len(outs)} outputs, expected {len(refs)}")
    for index, (out, ref) in enumerate(zip(outs, refs)):
        if tuple(out.shape) != tuple(ref.shape):
            return Verdict(False, math.inf, limit,
                           f"output {index} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    for index, (out, expected) in enumerate(zip(outs, expected_dtypes)):
        if out.dtype != expected:
            return Verdict(False, math.inf, limit, f"output {index} has dtype {out.dtype}, expected {expected}")
    error = _worst(outs, refs)
    if error <= limit:
        return Verdict(True, error, limit)
    return Verdict(False, error, limit, f"relative error {error:.3g} over limit {limit:.3g}")
