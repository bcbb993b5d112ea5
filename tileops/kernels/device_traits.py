"""How fast a CUDA device's memory feeds each of its SMs, for the heuristics that depend on it.

A memory-bound program keeps its memory busy only while each SM has enough bytes in flight
to cover the memory's latency at its bandwidth, so the bytes an SM must keep in flight grow
with the bandwidth an SM.  The heuristics were tuned on H100s (SXM: 3.35 TB/s peak over 132
SMs, 25.4 GB/s an SM).  An H200 is the same chip with 4.8 TB/s (it reports 3201 MHz x 6016
bits: 36.5 GB/s an SM): there a block of 1024 threads holding one row of 64 KiB, alone on its
SM, leaves the memory idle while it reduces and stores, and programs that keep two blocks an
SM win (the norm heuristics' docstrings give the timings).  ``has_fast_memory`` tells such devices apart.

The peak comes from the device's memory clock and bus width, both double data rate; a device
that reports neither is planned for as an H100.  A kernel picks its heuristic config once, at
construction, for the current device, as it looks up a tuned one.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

__all__ = ["FAST_MEMORY_GBPS_PER_SM", "peak_memory_gbps", "memory_is_fast", "has_fast_memory"]

# Peak GB/s an SM from which a device's memory counts as fast: between the H100 SXM's 25.4
# and the H200's 36.5.
FAST_MEMORY_GBPS_PER_SM = 30.0


def peak_memory_gbps(props: Any) -> Optional[float]:
    """Peak memory bandwidth in GB/s of a device with properties ``props``
    (``torch.cuda.get_device_properties``), or None where they do not say."""
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    if clock_khz <= 0 or bus_bits <= 0:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9


def memory_is_fast(props: Any) -> bool:
    """Whether a device with properties ``props`` feeds its SMs at ``FAST_MEMORY_GBPS_PER_SM`` or more."""
    gbps = peak_memory_gbps(props)
    sm_count = getattr(props, "multi_processor_count", 0) or 0
    return gbps is not None and sm_count > 0 and gbps / sm_count >= FAST_MEMORY_GBPS_PER_SM


@functools.lru_cache(maxsize=None)
def _device_memory_is_fast(index: int) -> bool:
    # A device's properties never change while a process runs.
    return memory_is_fast(torch.cuda.get_device_properties(index))


def has_fast_memory() -> bool:
    """Whether the current CUDA device has fast memory (``memory_is_fast``); False without CUDA,
    where heuristics plan for an H100."""
    return torch.cuda.is_available() and _device_memory_is_fast(torch.cuda.current_device())
