"""The tuner: medians, correctness gate, failure reporting (CPU, injected timer)."""

from __future__ import annotations

import logging

import pytest
import torch

from tileops.tuning.tuner import (
    CudaEventTimer,
    Tuner,
    TuningError,
    compare_outputs,
    l2_flush_bytes,
    tolerance_for,
)
from tuning_fakes import FakeTimer, FakeTunable


def _statuses(result) -> dict:
    return {trial.config["block"]: trial.status for trial in result.trials}


def test_fastest_correct_candidate_wins() -> None:
    result = Tuner(FakeTimer({32: 3.0, 64: 2.0, 128: 1.0, 256: 1.5})).tune(FakeTunable())
    assert result.best == {"block": 128}
    assert (result.best_ms, result.heuristic_ms) == (1.0, 2.0)


def test_candidate_with_wrong_output_never_wins_even_when_fastest() -> None:
    timer = FakeTimer({32: 3.0, 64: 2.0, 128: 1.0, 256: 0.01})
    result = Tuner(timer).tune(FakeTunable(behaviour={256: "wrong"}))
    assert result.best == {"block": 128}
    assert _statuses(result)[256] == "wrong_output"
    assert {"block": 256} not in timer.measured  # rejected before it was even timed


def test_median_not_mean_decides() -> None:
    # 32 has one huge outlier (mean 20.8 ms) but a median of 1 ms; 128 is a steady 2 ms.
    timer = FakeTimer({32: [1.0, 1.0, 100.0, 1.0, 1.0], 64: 3.0, 128: 2.0, 256: 2.5})
    assert Tuner(timer).tune(FakeTunable()).best == {"block": 32}


def test_heuristic_wins_ties() -> None:
    result = Tuner(FakeTimer({32: 1.0, 64: 1.0, 128: 1.0, 256: 1.0})).tune(FakeTunable())
    assert result.best == {"block": 64}


def test_every_failing_candidate_is_logged_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    target = FakeTunable(behaviour={32: "compile_error", 128: "runtime_error", 256: "wrong"})
    target.candidates = target.candidates + [{"block": 16, "warps": 4}]  # not a valid config
    with caplog.at_level(logging.WARNING, logger="tileops.tuning.tuner"):
        result = Tuner(FakeTimer({})).tune(target)
    assert result.best == {"block": 64}
    assert _statuses(result) == {
        16: "invalid_config", 32: "compile_error", 64: "ok", 128: "runtime_error", 256: "wrong_output"
    }
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 4
    expected = {
        "'block': 16": "unknown config keys",
        "'block': 32": "too much shared memory",
        "'block': 128": "illegal memory access",
        "'block': 256": "differ from the heuristic",
    }
    for config, reason in expected.items():
        assert any(config in m and reason in m for m in messages), (config, messages)
    failures = result.stats({"timer": "fake"})["failures"]
    assert {f["status"] for f in failures} == {"invalid_config", "compile_error", "runtime_error", "wrong_output"}
    assert all(f["reason"] for f in failures)


def test_failure_of_the_heuristic_config_is_a_tuning_error() -> None:
    with pytest.raises(TuningError, match="heuristic config"):
        Tuner(FakeTimer({})).tune(FakeTunable(behaviour={64: "runtime_error"}))


def test_progress_bar_shows_the_sweep(capsys: pytest.CaptureFixture) -> None:
    Tuner(FakeTimer({}), progress=True).tune(FakeTunable(op_id="tests.BarOp"))
    assert "tuning BarOp" in capsys.readouterr().err


# ---- output comparison -------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, nudge, ok",
    [
        (torch.float32, 1e-6, True),
        (torch.float32, 1e-2, False),
        (torch.float16, 1e-3, True),
        (torch.float16, 5e-2, False),
        (torch.bfloat16, 8e-3, True),
        (torch.bfloat16, 0.25, False),
    ],
)
def test_tolerance_follows_the_dtype(dtype: torch.dtype, nudge: float, ok: bool) -> None:
    want = torch.linspace(0.5, 1.0, 32).to(dtype)
    got = want.clone()
    got[5] = (got[5].float() + nudge).to(dtype)
    assert (compare_outputs([got], [want]) is None) is ok


def test_integer_outputs_must_match_exactly() -> None:
    want = torch.arange(10)
    got = want.clone()
    got[0] += 1
    assert "1 of 10 elements differ" in compare_outputs([got], [want])
    assert tolerance_for(torch.int64) == (0.0, 0.0)


def test_nan_where_a_value_belongs_is_a_mismatch() -> None:
    want = torch.ones(4)
    got = want.clone()
    got[2] = float("nan")
    assert compare_outputs([got], [want]) is not None
    assert compare_outputs([want.clone()], [want]) is None


def test_shape_or_count_mismatch_is_reported() -> None:
    assert "expected 1" in compare_outputs([torch.ones(2), torch.ones(2)], [torch.ones(2)])
    assert "expected (3,)" in compare_outputs([torch.ones(2)], [torch.ones(3)])


# ---- the CUDA timer's contract ------------------------------------------------------------


def test_l2_flush_buffer_is_larger_than_l2() -> None:
    h100_l2 = 50 * 1024 * 1024
    assert l2_flush_bytes(h100_l2) > h100_l2
    assert l2_flush_bytes(0) >= 64 << 20


def test_cuda_timer_validates_its_counts_and_describes_itself() -> None:
    with pytest.raises(ValueError):
        CudaEventTimer(reps=0)
    assert CudaEventTimer(warmup=3, reps=7).describe() == {
        "timer": "cuda_event", "warmup": 3, "reps": 7, "flush_l2": True
    }
