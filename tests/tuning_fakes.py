"""CPU stand-ins for kernels, workloads and timers, shared by the tuning tests."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch

from tileops.kernels.kernel_base import Kernel
from tileops.tuning.keys import Config, Invocation, canonical_json
from tileops.tuning.tuner import TuningUnavailable
from tuning_worker import FINGERPRINT, fingerprint_with  # noqa: F401 - re-exported for tests


class FakeTimer:
    """Reports a fixed time per config (``launch.config``) and counts measurements.

    ``ms`` maps a config's ``"block"`` to a time or to a list of samples.
    ``delay`` sleeps inside ``measure`` so concurrent callers overlap.
    """

    def __init__(self, ms: Mapping[int, Any], delay: float = 0.0, reps: int = 5) -> None:
        self.ms, self.delay, self.reps = dict(ms), delay, reps
        self.measured: List[Dict[str, Any]] = []
        self._lock = threading.Lock()

    def measure(self, launch: Callable[[], Any]) -> List[float]:
        launch()  # warm-up, as the real timer does
        if self.delay:
            time.sleep(self.delay)
        config = dict(launch.config)
        with self._lock:
            self.measured.append(config)
        value = self.ms.get(config["block"], 10.0)
        samples = list(value) if isinstance(value, (list, tuple)) else [float(value)] * self.reps
        for _ in samples:
            launch()
        return samples

    def describe(self) -> Dict[str, Any]:
        return {"timer": "fake", "reps": self.reps}


# ---- a Tunable without a Kernel --------------------------------------------------------


class FakeLaunch:
    def __init__(self, config: Config, run: Callable[[], Any]) -> None:
        self.config, self._run = dict(config), run

    def __call__(self) -> Any:
        return self._run()


class FakeWorkbench:
    """Outputs ``2 * x``; configs named in ``behaviour`` misbehave in the named way."""

    def __init__(self, behaviour: Mapping[int, str]) -> None:
        self.behaviour = dict(behaviour)
        self.x = torch.linspace(-1.0, 1.0, 64)

    def _mode(self, config: Config) -> str:
        return self.behaviour.get(config["block"], "ok")

    def compile(self, config: Config) -> None:
        if self._mode(config) == "compile_error":
            raise RuntimeError(f"ptxas: too much shared memory for block={config['block']}")

    def _run(self, config: Config) -> List[torch.Tensor]:
        mode = self._mode(config)
        if mode == "runtime_error":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        out = self.x * 2
        if mode == "wrong":
            out[3] += 0.5
        return [out]

    def check_run(self, config: Config) -> List[torch.Tensor]:
        return self._run(config)

    def launcher(self, config: Config) -> FakeLaunch:
        return FakeLaunch(config, lambda: self._run(config))


class FakeTunable:
    """Candidates ``block`` in 32..256; heuristic 64."""

    heuristic = {"block": 64}
    candidates = [{"block": 32}, {"block": 64}, {"block": 128}, {"block": 256}]

    def __init__(
        self,
        op_id: str = "tests.FakeOp",
        params: Optional[Mapping[str, Any]] = None,
        behaviour: Optional[Mapping[int, str]] = None,
        available: bool = True,
    ) -> None:
        self.invocation = Invocation(op_id, "1", dict(params or {"N": 4096, "dtype": "bfloat16"}))
        self.behaviour = dict(behaviour or {})
        self.available = available
        self.workbenches = 0
        self._lock = threading.Lock()

    def heuristic_config(self) -> Config:
        return dict(self.heuristic)

    def candidate_configs(self) -> Sequence[Config]:
        return [dict(c) for c in self.candidates]

    def check_config(self, config: Config) -> Config:
        unknown = set(config) - {"block"}
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}")
        return {**self.heuristic, **config}

    def workbench(self) -> FakeWorkbench:
        with self._lock:
            self.workbenches += 1
        if not self.available:
            raise TuningUnavailable("no workload for this fake")
        return FakeWorkbench(self.behaviour)


# ---- a Kernel that runs on CPU ---------------------------------------------------------


class FakeKernel(Kernel):
    """``out = x * w`` on CPU.  Config ``block`` 256 computes garbage, 512 writes nothing,
    1024 scribbles on its input, 2048 fails to compile."""

    autotune_candidates = (32, 64, 128, 256, 512, 1024, 2048)
    tuning_rows = 64  # small: CPU tensors

    def __init__(self, N: int, dtype: torch.dtype = torch.float32, **kwargs: Any) -> None:
        self.N = N
        super().__init__(dtype, **kwargs)

    @property
    def default_config(self) -> Dict[str, Any]:
        return {"block": 64, "threads": 128}

    @property
    def autotune_configs(self) -> List[Dict[str, Any]]:
        return [{"block": b, "threads": 128} for b in self.autotune_candidates]

    def compile(self, config: Optional[Dict[str, Any]] = None, target: Any = "auto") -> Any:
        config = dict(self.config if config is None else config)
        if config["block"] == 2048:
            raise RuntimeError("tvm.error: shared memory 262144 exceeds 232448")
        return ("compiled", tuple(sorted(config.items())))

    def tuning_inputs(self, rows: Optional[int] = None) -> tuple:
        rows = self.tuning_rows if rows is None else rows
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(rows, self.N, generator=generator, dtype=self.dtype)
        w = torch.randn(self.N, generator=generator, dtype=self.dtype)
        return x, w, torch.empty_like(x)

    def forward(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        block = self.config["block"]
        if block == 512:
            return out
        if block == 1024:
            x.mul_(2)
        torch.mul(x, w, out=out)
        if block == 256:
            out[0, 0] += 1.0
        return out


class FakeKernelWithoutWorkload(FakeKernel):
    tuning_inputs = Kernel.tuning_inputs


KERNEL_TIMES = {32: 3.0, 64: 2.0, 128: 1.0, 256: 0.1, 512: 0.05, 1024: 0.07, 2048: 0.01}


def config_key(config: Config) -> str:
    return canonical_json(config)
