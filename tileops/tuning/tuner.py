"""The tuner: time candidate configs on a workload and pick the fastest correct one.

Timing happens on the GPU with CUDA events, after a warm-up, as the median of
many launches, each preceded by a write of a buffer larger than the L2 cache
(so no launch is served from a cache the previous one filled).  Before a
candidate may win, its outputs must match the heuristic config's outputs within
the dtype's tolerance.  A candidate that fails to compile, fails to run or
computes something else is logged with the reason and skipped.

What is timed and how is injected (``Workbench``, ``Timer``), so the selection
logic is exercised on CPU with fakes.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence

from tileops.tuning.keys import Config, Invocation, canonical_json

__all__ = [
    "CudaEventTimer",
    "L2Flush",
    "Timer",
    "TrialResult",
    "Tunable",
    "TuneResult",
    "Tuner",
    "TuningError",
    "TuningUnavailable",
    "Workbench",
    "compare_outputs",
    "tolerance_for",
]

logger = logging.getLogger(__name__)


class TuningError(RuntimeError):
    """Tuning ran but produced no usable config (e.g. the heuristic config itself failed)."""


class TuningUnavailable(TuningError):
    """Tuning cannot run here: no GPU, or the kernel gives no workload to time."""


# ---- what the tuner works on ---------------------------------------------------------


class Workbench(Protocol):
    """A prepared workload for timing candidates of one kernel."""

    def compile(self, config: Config) -> None:
        """Build ``config``; raising here is reported as a compile error."""

    def check_run(self, config: Config) -> Sequence[Any]:
        """Run ``config`` once on fresh buffers (outputs poisoned); return what to compare."""

    def launcher(self, config: Config) -> Callable[[], Any]:
        """A zero-argument launch of ``config`` for timing (buffers reused across calls)."""


class Tunable(Protocol):
    """Something a config is selected for (a kernel, through an adapter)."""

    invocation: Invocation

    def heuristic_config(self) -> Config: ...

    def candidate_configs(self) -> Sequence[Config]: ...

    def check_config(self, config: Config) -> Config:
        """Complete and validate ``config``; raise ``ValueError`` if it is not one of ours."""

    def workbench(self) -> Workbench:
        """Allocate the timing workload; raise ``TuningUnavailable`` if there is none."""


class Timer(Protocol):
    """Runs ``launch`` repeatedly and returns per-launch times in milliseconds."""

    def measure(self, launch: Callable[[], Any]) -> List[float]: ...

    def describe(self) -> Dict[str, Any]: ...


# ---- correctness -----------------------------------------------------------------------

# (rtol, atol) per dtype name: about one unit in the last place of the format, since
# candidates differ from the heuristic only in summation order and tiling.
_TOLERANCES = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (2e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
}


def tolerance_for(dtype: Any) -> tuple:
    """(rtol, atol) for comparing a candidate's output of ``dtype``; exact for integers."""
    return _TOLERANCES.get(str(dtype).replace("torch.", ""), (0.0, 0.0))


def compare_outputs(got: Sequence[Any], want: Sequence[Any]) -> Optional[str]:
    """``None`` if every tensor of ``got`` matches ``want``, else why not."""
    import torch

    if len(got) != len(want):
        return f"returned {len(got)} tensors, expected {len(want)}"
    for index, (g, w) in enumerate(zip(got, want)):
        if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
            return f"tensor {index}: got {tuple(g.shape)} {g.dtype}, expected {tuple(w.shape)} {w.dtype}"
        rtol, atol = tolerance_for(w.dtype)
        if g.dtype.is_floating_point or g.dtype.is_complex:
            if torch.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
                continue
            diff = (g.double() - w.double()).abs()
            bad = ~torch.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
            finite = diff[bad & torch.isfinite(diff)]
            worst = f"{finite.max().item():.3g}" if finite.numel() else "nan/inf"
            return (
                f"tensor {index}: {int(bad.sum())} of {g.numel()} elements differ from the heuristic "
                f"config's output (max abs diff {worst}, rtol={rtol}, atol={atol})"
            )
        if not torch.equal(g, w):
            return f"tensor {index}: {int((g != w).sum())} of {g.numel()} elements differ"
    return None


# ---- timing ----------------------------------------------------------------------------


def l2_flush_bytes(l2_bytes: int) -> int:
    """Size of the buffer read between launches: twice L2, at least 64 MiB."""
    return max(2 * int(l2_bytes), 64 << 20)


class L2Flush:
    """Evicts what the previous launch left in L2 by reading a buffer twice its size.

    It reads rather than writes: a written buffer leaves L2 full of dirty lines,
    and the next (timed) launch would pay for writing them back as its own
    accesses evict them. On an H100 that costs about 6 us, a fifth of a 64 MB
    copy's time, whatever the launch being measured.
    """

    def __init__(self, device: Any = None) -> None:
        import torch

        device = torch.device("cuda" if device is None else device)
        props = torch.cuda.get_device_properties(device)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
        # Written once, here; every flush only reads it.
        self._buffer = torch.zeros(l2_flush_bytes(self.l2_bytes) // 4, dtype=torch.float32, device=device)
        self._sink = torch.empty((), dtype=torch.float32, device=device)
        self._amax = torch.amax  # called before every timed launch: no import there

    def __call__(self) -> None:
        self._amax(self._buffer, dim=0, out=self._sink)


class CudaEventTimer:
    """Median-ready samples from CUDA events, with an L2 flush before each launch."""

    def __init__(self, warmup: int = 10, reps: int = 50, flush_l2: bool = True, device: Optional[int] = None):
        if warmup < 0 or reps < 1:
            raise ValueError(f"need warmup >= 0 and reps >= 1, got {warmup}, {reps}")
        self.warmup, self.reps, self.flush_l2, self.device = warmup, reps, flush_l2, device
        self._flush: Optional[L2Flush] = None

    def _l2_flush(self) -> L2Flush:
        if self._flush is None:
            self._flush = L2Flush(self.device)
        return self._flush

    def measure(self, launch: Callable[[], Any]) -> List[float]:
        import torch

        if not torch.cuda.is_available():
            raise TuningUnavailable("timing needs a CUDA device")
        flush = self._l2_flush() if self.flush_l2 else None
        for _ in range(self.warmup):
            launch()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        for start, end in zip(starts, ends):
            if flush is not None:
                flush()  # not timed
            start.record()
            launch()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in zip(starts, ends)]

    def describe(self) -> Dict[str, Any]:
        return {"timer": "cuda_event", "warmup": self.warmup, "reps": self.reps, "flush_l2": self.flush_l2}


# ---- results ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """One candidate's fate."""

    config: Config
    status: str  # "ok", "invalid_config", "compile_error", "runtime_error", "wrong_output"
    median_ms: Optional[float] = None
    reason: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class TuneResult:
    best: Config
    best_ms: float
    heuristic: Config
    heuristic_ms: Optional[float]
    trials: List[TrialResult]
    seconds: float

    def stats(self, timer: Dict[str, Any]) -> Dict[str, Any]:
        """Provenance stored with the persisted config."""
        failed = [t for t in self.trials if t.status != "ok"]
        return {
            "candidates": len(self.trials),
            "passed": len(self.trials) - len(failed),
            "best_ms": self.best_ms,
            "heuristic_ms": self.heuristic_ms,
            "seconds": round(self.seconds, 3),
            "failures": [{"config": dict(t.config), "status": t.status, "reason": t.reason} for t in failed],
            **timer,
        }


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(error).__name__}: {first}"[:300]


def _progress(total: int, label: str, enabled: Optional[bool]) -> Any:
    """A tqdm bar when tqdm is installed and wanted (default: when stderr is a terminal)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=label, unit="cfg", leave=False)


class Tuner:
    """Sweeps a ``Tunable``'s candidates with a ``Timer``."""

    def __init__(self, timer: Optional[Timer] = None, *, progress: Optional[bool] = None) -> None:
        self.timer: Timer = timer if timer is not None else CudaEventTimer()
        self.progress = progress

    def _candidates(self, target: Tunable, heuristic: Config, trials: List[TrialResult], label: str) -> List[Config]:
        """Heuristic first (so it wins ties), then each distinct valid candidate."""
        ordered, seen = [heuristic], {canonical_json(heuristic)}
        for raw in target.candidate_configs():
            try:
                config = target.check_config(raw)
            except (ValueError, TypeError) as error:
                trials.append(TrialResult(dict(raw), "invalid_config", reason=_short(error)))
                self._report(label, trials[-1])
                continue
            key = canonical_json(config)
            if key not in seen:
                seen.add(key)
                ordered.append(config)
        return ordered

    def _trial(self, bench: Workbench, config: Config, reference: Sequence[Any]) -> TrialResult:
        try:
            bench.compile(config)
        except Exception as error:  # noqa: BLE001 - any failure disqualifies, with its reason
            return TrialResult(config, "compile_error", reason=_short(error))
        try:
            outputs = bench.check_run(config)
        except Exception as error:  # noqa: BLE001
            return TrialResult(config, "runtime_error", reason=_short(error))
        mismatch = compare_outputs(outputs, reference)
        if mismatch is not None:
            return TrialResult(config, "wrong_output", reason=mismatch)
        try:
            samples = self.timer.measure(bench.launcher(config))
        except TuningUnavailable:
            raise
        except Exception as error:  # noqa: BLE001
            return TrialResult(config, "runtime_error", reason=f"while timing: {_short(error)}")
        return TrialResult(config, "ok", median_ms=float(statistics.median(samples)))

    def tune(self, target: Tunable) -> TuneResult:
        """Time every candidate; return the fastest whose output matches the heuristic's."""
        began = time.perf_counter()
        label = target.invocation.op_id.rsplit(".", 1)[-1]
        heuristic = target.check_config(target.heuristic_config())
        bench = target.workbench()
        try:
            bench.compile(heuristic)
            reference = bench.check_run(heuristic)
        except TuningUnavailable:
            raise
        except Exception as error:
            raise TuningError(f"{label}: the heuristic config {dict(heuristic)} failed: {_short(error)}") from error

        trials: List[TrialResult] = []
        candidates = self._candidates(target, heuristic, trials, label)
        bar = _progress(len(candidates), f"tuning {label}", self.progress)
        try:
            for config in candidates:
                trial = self._trial(bench, config, reference)
                trials.append(trial)
                self._report(label, trial)
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return self._result(label, heuristic, trials, time.perf_counter() - began)

    @staticmethod
    def _report(label: str, trial: TrialResult) -> None:
        if trial.status == "ok":
            logger.debug("%s: %s ran in %.4f ms", label, dict(trial.config), trial.median_ms)
        else:
            logger.warning("%s: candidate %s skipped (%s): %s", label, dict(trial.config), trial.status, trial.reason)

    @staticmethod
    def _result(label: str, heuristic: Config, trials: List[TrialResult], seconds: float) -> TuneResult:
        passed = [t for t in trials if t.status == "ok"]
        if not passed:
            raise TuningError(f"{label}: no candidate config passed ({len(trials)} tried)")
        best = min(passed, key=lambda t: t.median_ms)  # first (heuristic) wins ties
        heuristic_key = canonical_json(heuristic)
        heuristic_ms = next((t.median_ms for t in passed if canonical_json(t.config) == heuristic_key), None)
        logger.info(
            "%s: picked %s at %.4f ms (heuristic %s ms) from %d candidates, %d failed, in %.1f s",
            label,
            dict(best.config),
            best.median_ms,
            "n/a" if heuristic_ms is None else f"{heuristic_ms:.4f}",
            len(trials),
            len(trials) - len(passed),
            seconds,
        )
        return TuneResult(dict(best.config), best.median_ms, dict(heuristic), heuristic_ms, trials, seconds)
