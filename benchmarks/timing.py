"""Device timing and peak-memory probes.

The harness talks to a ``Backend``: ``time_us`` (median device time of a call),
``loop_us`` (time per call back to back, host included) and ``peak_memory_bytes``
(memory one call allocates). ``CudaBackend`` is the real one;
tests pass fakes, so everything above this module runs on a CPU.

How ``CudaBackend`` times, and why:
  * CUDA events around each call, median of many: host clocks would include launch
    queueing, and a mean is pulled by the odd preempted run.
  * Warm-up first (kernel compilation, allocator growth, cuBLAS handles stay out).
  * L2 flushed before every call by reading a buffer twice the L2 size, and small
    inputs rotated over several copies that together exceed L2: otherwise repeated
    runs over one buffer measure the cache, not the memory. The flush reads rather
    than writes (``tileops.tuning.tuner.L2Flush`` says why): with a written buffer a
    64 MB copy reached 80 % of the copy ceiling on an H100, with a read one 100 %.
  * Repetitions sized from a first estimate so each variant takes about ``rep_ms``.
  * Each repetition starts behind a device-side spin (``HOLD_CYCLES``) queued ahead of
    the flush: the host then enqueues the flush, the events and the call while the
    device is still busy, so a slow or preempted host thread never leaves the device
    idle between the two events. Without it, a call whose host path takes longer than
    the flush plus the kernel shows host time in its median.

``loop_us`` answers another question: what one call costs in a model's eager loop,
where the host launches call after call. It is the wall time of many back-to-back
calls over their count (median of three loops). For large inputs it matches the
device time; for tiny ones it is the host's cost per call, which the device time
hides behind the L2 flush.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Protocol, Sequence

from tileops.tuning.tuner import L2Flush

__all__ = ["Backend", "Call", "CudaBackend", "TimingSettings", "rotation_count"]

logger = logging.getLogger(__name__)

Call = Callable[[], Any]

# Device clock cycles of the spin before each timed repetition: about 0.5 ms on an
# H100 (1.98 GHz), well over what any op's host path takes to launch.
HOLD_CYCLES = 1_000_000


class Backend(Protocol):
    """What the runner needs from a device."""

    #: L2 cache size in bytes; decides how many input copies are rotated.
    l2_bytes: int

    def time_us(self, calls: Sequence[Call]) -> float:
        """Median time of one call in microseconds, cycling through ``calls``."""

    def loop_us(self, calls: Sequence[Call]) -> float:
        """Wall time per call of many back-to-back calls, in microseconds."""

    def peak_memory_bytes(self, call: Call) -> int:
        """Bytes allocated at the peak of one call, above what was allocated before it."""

    def synchronize(self) -> None:
        """Wait for queued device work (so errors surface where they happen)."""


@dataclass(frozen=True)
class TimingSettings:
    warmup_ms: float = 25.0
    rep_ms: float = 150.0
    min_reps: int = 20
    max_reps: int = 2000
    loop_ms: float = 30.0
    loops: int = 3


def rotation_count(input_bytes: int, l2_bytes: int, max_sets: int = 64) -> int:
    """How many input copies to rotate: enough that they overflow L2 twice, or one.

    Inputs larger than L2 cannot stay cached between calls, so one set suffices.
    """
    if input_bytes <= 0 or input_bytes > l2_bytes:
        return 1
    return max(2, min(max_sets, math.ceil(2 * l2_bytes / input_bytes)))


class CudaBackend:
    """CUDA events, L2 flush, median; see the module docstring."""

    def __init__(self, device: Any = None, settings: TimingSettings = TimingSettings()) -> None:
        import torch

        self._torch = torch
        self.device = torch.device(device if device is not None else "cuda")
        self.settings = settings
        self._flush_l2 = L2Flush(self.device)
        self.l2_bytes = self._flush_l2.l2_bytes or 50 * 2**20

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self.device)

    def _hold_device(self) -> None:
        self._torch.cuda._sleep(HOLD_CYCLES)

    def _seconds_per_rep(self, calls: Sequence[Call], probes: int = 5) -> float:
        self.synchronize()
        began = time.perf_counter()
        for index in range(probes):
            self._hold_device()
            self._flush_l2()
            calls[index % len(calls)]()
        self.synchronize()
        return max((time.perf_counter() - began) / probes, 1e-7)

    def time_us(self, calls: Sequence[Call]) -> float:
        torch = self._torch
        per_rep = self._seconds_per_rep(calls)
        warmups = max(1, int(self.settings.warmup_ms * 1e-3 / per_rep))
        reps = int(self.settings.rep_ms * 1e-3 / per_rep)
        reps = max(self.settings.min_reps, min(self.settings.max_reps, reps))
        for index in range(warmups):
            self._flush_l2()
            calls[index % len(calls)]()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for index in range(reps):
            self._hold_device()
            self._flush_l2()
            starts[index].record()
            calls[index % len(calls)]()
            ends[index].record()
        self.synchronize()
        millis: List[float] = [start.elapsed_time(end) for start, end in zip(starts, ends)]
        logger.debug("%d reps after %d warm-ups: min %.4f median %.4f max %.4f ms",
                     reps, warmups, min(millis), statistics.median(millis), max(millis))
        return statistics.median(millis) * 1e3

    def _loop_seconds(self, calls: Sequence[Call], count: int) -> float:
        self.synchronize()
        began = time.perf_counter()
        for index in range(count):
            calls[index % len(calls)]()
        self.synchronize()
        return time.perf_counter() - began

    def loop_us(self, calls: Sequence[Call]) -> float:
        per_call = self._loop_seconds(calls, 10) / 10
        count = max(10, min(100_000, int(self.settings.loop_ms * 1e-3 / max(per_call, 1e-7))))
        samples = [self._loop_seconds(calls, count) / count for _ in range(self.settings.loops)]
        return statistics.median(samples) * 1e6

    def peak_memory_bytes(self, call: Call) -> int:
        torch = self._torch
        self.synchronize()
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        result = call()
        self.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device)
        del result
        return max(0, peak - before)
