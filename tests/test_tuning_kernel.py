"""Kernel integration: init_config, Kernel.autotune, tuning_inputs, the workbench (CPU fakes)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch

from tileops.kernels.kernel_base import Kernel
from tileops.tuning.kernels import KernelTunable, kernel_invocation
from tileops.tuning.policy import overlay, policy_override
from tileops.tuning.selector import ConfigSelector, using_selector
from tileops.tuning.tuner import Tuner, TuningUnavailable
from tuning_fakes import FINGERPRINT, KERNEL_TIMES, FakeKernel, FakeKernelWithoutWorkload, FakeTimer

HEURISTIC = {"block": 64, "threads": 128}
TUNED = {"block": 128, "threads": 128}  # fastest correct (256, 512, 1024 are faster but wrong)


@pytest.fixture(autouse=True)
def _default_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TILEOPS_AUTOTUNE", raising=False)


@pytest.fixture
def timer() -> FakeTimer:
    return FakeTimer(KERNEL_TIMES)


@pytest.fixture
def selector(tmp_path: Path, timer: FakeTimer):
    chosen = ConfigSelector(tmp_path, tuner=Tuner(timer), fingerprint=FINGERPRINT)
    with using_selector(chosen):
        yield chosen


class _Untouchable(ConfigSelector):
    def choose(self, *args, **kwargs):  # pragma: no cover - reaching it fails the test
        raise AssertionError("an explicit config must not consult the selector")


def test_default_construction_uses_the_heuristic(selector: ConfigSelector, timer: FakeTimer) -> None:
    assert FakeKernel(16).config == HEURISTIC
    assert timer.measured == []


def test_explicit_config_takes_the_fast_path_and_survives_autotune(tmp_path: Path, timer: FakeTimer) -> None:
    with using_selector(_Untouchable(tmp_path)):
        kernel = FakeKernel(16, config={"block": 32}, tune=True)
    assert kernel.config == {"block": 32, "threads": 128}
    with using_selector(ConfigSelector(tmp_path, tuner=Tuner(timer), fingerprint=FINGERPRINT)):
        assert kernel.autotune() == {"block": 32, "threads": 128}
    assert timer.measured == [] and not list(tmp_path.glob("*.json"))


def test_unknown_explicit_config_key_is_an_error(selector: ConfigSelector) -> None:
    with pytest.raises(ValueError, match="unknown config keys"):
        FakeKernel(16, config={"warps": 4})


def test_tune_true_picks_the_fastest_correct_config_and_a_new_process_reuses_it(
    tmp_path: Path, selector: ConfigSelector, timer: FakeTimer
) -> None:
    assert FakeKernel(16, tune=True).config == TUNED
    statuses = {}
    persisted = selector.persistent().entries()
    assert len(persisted) == 1
    for failure in next(iter(persisted.values())).tuner["failures"]:
        statuses[failure["config"]["block"]] = failure["status"]
    # 256 computes garbage, 512 writes nothing (caught by poisoned outputs), 1024 corrupts
    # its input, 2048 does not compile: none of them may win although all are "faster".
    assert statuses == {256: "wrong_output", 512: "wrong_output", 1024: "wrong_output", 2048: "compile_error"}

    later_timer = FakeTimer(KERNEL_TIMES)
    with using_selector(ConfigSelector(tmp_path, tuner=Tuner(later_timer), fingerprint=FINGERPRINT)):
        again = FakeKernel(16)
    assert again.config == TUNED and later_timer.measured == []


def test_environment_policy_tunes_kernels_built_with_tune_false(
    selector: ConfigSelector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TILEOPS_AUTOTUNE", "1")
    assert FakeKernel(16, tune=False).config == TUNED


def test_policy_can_forbid_tuning_and_overlay_can_pin(selector: ConfigSelector, timer: FakeTimer) -> None:
    with policy_override(autotune=False):
        assert FakeKernel(16).config == HEURISTIC
    with overlay({FakeKernel: {"block": 32}}):
        assert FakeKernel(16, tune=True).config == {"block": 32, "threads": 128}
    assert timer.measured == []


def test_kernel_autotune_adopts_the_result(selector: ConfigSelector) -> None:
    kernel = FakeKernel(16)
    assert kernel.autotune() == TUNED
    assert kernel.config == TUNED


def test_tuning_identity_is_class_signature_dtype_and_workload() -> None:
    with policy_override(autotune=False):
        base = kernel_invocation(FakeKernel(16))
        assert base.op_id == "tuning_fakes.FakeKernel"
        assert dict(base.params) == {"N": 16, "dtype": "float32"}
        assert dict(base.workload) == {"rows": FakeKernel.tuning_rows} != {"rows": Kernel.tuning_rows}
        others = {
            kernel_invocation(FakeKernel(32)).call_key,
            kernel_invocation(FakeKernel(16, torch.float16)).call_key,
            kernel_invocation(FakeKernel(16), rows=128).call_key,
            kernel_invocation(FakeKernelWithoutWorkload(16)).call_key,
        }
    assert base.call_key not in others and len(others) == 4


def test_missing_tuning_inputs_has_a_clear_message(selector: ConfigSelector) -> None:
    kernel = FakeKernelWithoutWorkload(16)
    with pytest.raises(NotImplementedError, match=r"FakeKernelWithoutWorkload cannot be autotuned.*tuning_inputs"):
        kernel.tuning_inputs()
    with pytest.raises(TuningUnavailable, match="tuning_inputs"):
        kernel.autotune()


def test_missing_tuning_inputs_under_policy_falls_back(
    selector: ConfigSelector, caplog: pytest.LogCaptureFixture
) -> None:
    with policy_override(autotune=True), caplog.at_level(logging.INFO, logger="tileops.tuning"):
        assert FakeKernelWithoutWorkload(16).config == HEURISTIC
    assert "cannot be autotuned" in caplog.text


def test_candidates_run_on_a_copy_never_the_live_kernel(selector: ConfigSelector) -> None:
    kernel = FakeKernel(16)
    seen = []
    original = FakeKernel.forward

    def spy(self, *args):
        seen.append(self is kernel)
        return original(self, *args)

    FakeKernel.forward = spy
    try:
        kernel.autotune()
    finally:
        FakeKernel.forward = original
    assert seen and not any(seen)


def test_workbench_detects_outputs_and_poisons_them(selector: ConfigSelector) -> None:
    bench = KernelTunable(FakeKernel(8), rows=4).workbench()
    reference = bench.check_run(HEURISTIC)
    assert bench._output_indices == [2]
    lazy = bench.check_run({"block": 512, "threads": 128})  # writes nothing
    assert torch.isnan(lazy[2]).all() and torch.equal(lazy[0], reference[0])


def test_construction_without_tuning_stays_cheap(selector: ConfigSelector) -> None:
    FakeKernel(16)
    began = time.perf_counter()
    for _ in range(200):
        FakeKernel(16)
    per_kernel = (time.perf_counter() - began) / 200
    assert per_kernel < 2e-3, f"{per_kernel * 1e6:.0f} us per construction"
