"""Fakes shared by the benchmark tests: a backend with scripted times, and CPU ops."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Sequence

import torch


class FakeBackend:
    """Times come from ``times`` (cycled); every timed and probed call is recorded."""

    def __init__(self, times: Sequence[float] = (10.0,), l2_bytes: int = 1 << 20, peak: int = 3 << 20) -> None:
        self.times = list(times)
        self.l2_bytes = l2_bytes
        self.peak = peak
        self.timed: List[Sequence[Callable[[], Any]]] = []
        self.probed = 0
        self.looped = 0

    def time_us(self, calls: Sequence[Callable[[], Any]]) -> float:
        for call in calls:
            call()
        self.timed.append(calls)
        return self.times[(len(self.timed) - 1) % len(self.times)]

    def loop_us(self, calls: Sequence[Callable[[], Any]]) -> float:
        self.looped += 1
        return 2 * self.times[(len(self.timed) - 1) % len(self.times)]

    def peak_memory_bytes(self, call: Callable[[], Any]) -> int:
        call()
        self.probed += 1
        return self.peak

    def synchronize(self) -> None:
        pass


def identity_compiler(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Stands in for torch.compile: same function, no compile time."""
    return fn


class FakeRMSNorm:
    """Constructor and methods of the generated RMSNormFwdOp, computed on the CPU.

    ``offset`` makes the output wrong; ``fail`` makes the call raise. ``calls`` counts
    forward calls so tests can tell whether the op was timed.
    """

    offset = 0.0
    fail = False
    calls = 0

    def __init__(self, *, N: int, dtype: torch.dtype, eps: float = 1e-6) -> None:
        self.N, self.dtype, self.eps = N, dtype, eps

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        if self.fail:
            raise RuntimeError("kernel launch failed")
        return self.reference(x, weight) + self.offset

    def reference(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, (self.N,), weight, self.eps)

    def eval_roofline(self, x_shape, weight_shape):
        rows = 1
        for size in x_shape[:-1]:
            rows *= size
        elem = self.dtype.itemsize
        return 4 * rows * self.N, (2 * rows * self.N + self.N) * elem


def fake_resolver(**classes: type) -> Callable[[Any], type]:
    def resolve(spec: Any) -> type:
        return classes[spec.name]

    return resolve


def make_class(base: type, **attributes: Any) -> type:
    """A subclass with its own counters, so tests do not share state."""
    return type(base.__name__, (base,), {"calls": 0, **attributes})




class FakeKernel:
    default_config = {"threads": 256, "scale": 1.0}
    autotune_configs = [{"threads": 256, "scale": 1.0}, {"threads": 128, "scale": 1.0}, {"threads": 64, "scale": 2.0}]

    def __init__(self) -> None:
        self.config = dict(self.default_config)
        self.seen = []


class KernelRMSNorm(FakeRMSNorm):
    """Builds its kernel on the first call, as a generated op does; ``scale`` != 1 is a wrong result.
    ``kernel`` is the last kernel called, ``seen`` its config at each call."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._kernel_cache = {}
        self._kernel_cache_lock = threading.Lock()

    def __call__(self, x, weight):
        kernel = self._kernel_cache.setdefault(("rms_norm", ()), FakeKernel())
        type(self).kernel = kernel
        kernel.seen.append(dict(kernel.config))
        type(self).shapes.append((tuple(x.shape), self.N))
        return super().__call__(x, weight) * kernel.config["scale"]
