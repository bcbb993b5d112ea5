"""Roofline arithmetic: achieved rates, speed-of-light percentage, speedups.

Pure functions on plain numbers so that every figure in a report can be recomputed
from the CSV columns alone.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["achieved_gbps", "achieved_tflops", "sol_percent", "speedup"]


def achieved_gbps(bytes_moved: float, micros: float) -> float:
    """Bytes over time, in GB/s (10^9 bytes per second)."""
    return bytes_moved / (micros * 1e-6) / 1e9


def achieved_tflops(flops: float, micros: float) -> float:
    """Floating-point operations over time, in TFLOP/s (10^12 per second)."""
    return flops / (micros * 1e-6) / 1e12


def sol_percent(flops: float, bytes_moved: float, micros: float,
                copy_gbps: float, peak_tflops: float) -> float:
    """Speed of light: the roofline floor over the measured time, in percent.

    The floor is the larger of the memory time (bytes at copy bandwidth) and the
    compute time (flops at the matmul rate): no version of the op can beat it, so
    100 % means the op runs at the device's limit for its bound.
    """
    memory_seconds = bytes_moved / (copy_gbps * 1e9) if copy_gbps > 0 else 0.0
    compute_seconds = flops / (peak_tflops * 1e12) if peak_tflops > 0 else 0.0
    return 100.0 * max(memory_seconds, compute_seconds) / (micros * 1e-6)


def speedup(baseline_micros: Optional[float], micros: Optional[float]) -> Optional[float]:
    """How many times faster than the baseline (>1 is faster); None when either is missing."""
    if not baseline_micros or not micros:
        return None
    return baseline_micros / micros
