"""The device's ceilings, measured in this run: copy bandwidth and dense matmul rate.

SOL % divides by these, not by datasheet numbers: clocks, memory parts and drivers
differ between cards of one name, and a ceiling measured the same way as the ops
makes 100 % reachable.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Sequence

from .timing import Backend

__all__ = ["Ceilings", "measure_ceilings", "COPY_BYTES", "MATMUL_SIZE", "MATMUL_DTYPES"]

logger = logging.getLogger(__name__)

COPY_BYTES = 2 * 2**30  # large enough that launch cost and L2 are noise
MATMUL_SIZE = 8192
# bf16 and fp16 run on the tensor cores; fp32 (TF32 off) is the ceiling of fp32 rows.
MATMUL_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float
    matmul_tflops: Dict[str, float] = field(default_factory=dict)

    def peak_tflops(self, dtype: str) -> float:
        """The matmul rate of ``dtype``; dtypes without one of their own use bf16's."""
        if dtype in self.matmul_tflops:
            return self.matmul_tflops[dtype]
        return self.matmul_tflops.get("bfloat16", 0.0)

    def describe(self) -> str:
        rates = ", ".join(f"{name} matmul {rate:.0f} TFLOP/s" for name, rate in self.matmul_tflops.items())
        return f"copy {self.copy_gbps:.0f} GB/s" + (f", {rates}" if rates else "")


@contextlib.contextmanager
def _exact_float32_matmul() -> Iterator[None]:
    """TF32 off, so the fp32 ceiling is the rate of true fp32 arithmetic."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def measure_copy_gbps(backend: Backend, device: Any, copy_bytes: int = COPY_BYTES) -> float:
    """Device-to-device copy of ``copy_bytes``: bytes read plus bytes written over time."""
    import torch

    count = copy_bytes // 4
    source = torch.randn(count, device=device)
    target = torch.empty_like(source)
    micros = backend.time_us([lambda: target.copy_(source)])
    moved = 2 * source.numel() * source.element_size()
    del source, target
    return moved / (micros * 1e-6) / 1e9


def measure_matmul_tflops(backend: Backend, device: Any, dtype_name: str,
                          size: int = MATMUL_SIZE) -> float:
    """``size``^3 matmul of random data (zeros run faster than real data)."""
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    c = torch.empty(size, size, device=device, dtype=dtype)
    with _exact_float32_matmul():
        micros = backend.time_us([lambda: torch.matmul(a, b, out=c)])
    del a, b, c
    return 2 * size**3 / (micros * 1e-6) / 1e12


def measure_ceilings(backend: Backend, device: Any, copy_bytes: int = COPY_BYTES,
                     matmul_size: int = MATMUL_SIZE,
                     matmul_dtypes: Sequence[str] = MATMUL_DTYPES) -> Ceilings:
    copy_gbps = measure_copy_gbps(backend, device, copy_bytes)
    logger.info("copy bandwidth: %.0f GB/s", copy_gbps)
    rates = {}
    for name in matmul_dtypes:
        rates[name] = measure_matmul_tflops(backend, device, name, matmul_size)
        logger.info("%s matmul %d^3: %.1f TFLOP/s", name, matmul_size, rates[name])
    return Ceilings(copy_gbps, rates)
