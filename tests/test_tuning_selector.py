"""The selection chain: every tier, what is (not) persisted, policy scoping, single flight."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import List

import pytest

from tileops.tuning.policy import current_policy, overlay, policy_override
from tileops.tuning.selector import ConfigSelectionError, ConfigSelector
from tileops.tuning.tuner import Tuner, TuningUnavailable
from tuning_fakes import FINGERPRINT, FakeTimer, FakeTunable, fingerprint_with

TIMES = {32: 3.0, 64: 2.0, 128: 1.0, 256: 1.5}  # 128 is the fastest, 64 the heuristic
TUNED, HEURISTIC = {"block": 128}, {"block": 64}


@pytest.fixture(autouse=True)
def _default_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TILEOPS_AUTOTUNE", raising=False)


def _selector(path: Path, timer: FakeTimer = None, fingerprint=FINGERPRINT) -> ConfigSelector:
    return ConfigSelector(path, tuner=Tuner(timer or FakeTimer(TIMES)), fingerprint=fingerprint)


def _persisted(path: Path, fingerprint=FINGERPRINT) -> dict:
    file = path / f"{fingerprint.id}.json"
    return json.loads(file.read_text())["entries"] if file.exists() else {}


# ---- tier by tier ------------------------------------------------------------------------


def test_autotune_tier_tunes_persists_with_provenance_then_memory_serves(tmp_path: Path) -> None:
    selector, target = _selector(tmp_path), FakeTunable()
    first = selector.choose(target, autotune=True)
    assert (first.config, first.source) == (TUNED, "autotune")
    stored = _persisted(tmp_path)[target.invocation.call_key]
    assert stored["config"] == TUNED and stored["source"] == "autotune" and stored["created"]
    assert stored["tuner"]["candidates"] == 4 and stored["tuner"]["best_ms"] == 1.0
    assert stored["tuner"]["heuristic_ms"] == 2.0 and stored["tuner"]["timer"] == "fake"
    assert stored["versions"] == FINGERPRINT.versions()
    assert stored["invocation"]["op"] == "tests.FakeOp"
    second = selector.choose(target, autotune=True)
    assert (second.config, second.source) == (TUNED, "memory")
    assert target.workbenches == 1


def test_persistent_tier_serves_a_new_process_without_tuning(tmp_path: Path) -> None:
    _selector(tmp_path).choose(FakeTunable(), autotune=True)
    timer, target = FakeTimer(TIMES), FakeTunable()
    fresh = _selector(tmp_path, timer)  # empty memory, as in another process
    with policy_override(autotune=True):
        chosen = fresh.choose(target)
    assert (chosen.config, chosen.source) == (TUNED, "persistent")
    assert chosen.entry.tuner["best_ms"] == 1.0
    assert timer.measured == [] and target.workbenches == 0
    assert fresh.choose(target).source == "memory"


def test_heuristic_tier_is_used_by_default_and_never_persisted(tmp_path: Path) -> None:
    selector, target = _selector(tmp_path), FakeTunable()
    chosen = selector.choose(target)
    assert (chosen.config, chosen.source) == (HEURISTIC, "heuristic")
    assert _persisted(tmp_path) == {} and len(selector.memory) == 0
    # ... so it does not block a later tuning run.
    assert selector.choose(target, autotune=True).source == "autotune"


def test_override_wins_on_every_path_and_is_never_persisted(tmp_path: Path) -> None:
    selector, target = _selector(tmp_path), FakeTunable()
    pinned = {"block": 32}
    for autotune in (None, True, False):
        assert selector.choose(target, override=pinned, autotune=autotune).source == "override"
    assert _persisted(tmp_path) == {} and target.workbenches == 0
    selector.choose(target, autotune=True)  # now memory and disk hold the tuned config
    with overlay({target.invocation.op_id: {"block": 256}}), policy_override(autotune=True, heuristics=False):
        chosen = selector.choose(target, override=pinned, force=True)
    assert (chosen.config, chosen.source) == (pinned, "override")
    assert _persisted(tmp_path)[target.invocation.call_key]["config"] == TUNED
    with pytest.raises(ValueError, match="unknown config keys"):
        selector.choose(target, override={"warps": 4})


def test_overlay_beats_caches_and_is_never_persisted(tmp_path: Path) -> None:
    selector, target = _selector(tmp_path), FakeTunable()
    selector.choose(target, autotune=True)
    for key in (target.invocation.call_key, target.invocation, "tests.FakeOp", "tests.FakeOp@1", "FakeOp"):
        with overlay({key: {"block": 32}}):
            chosen = selector.choose(target, autotune=True)
        assert (chosen.config, chosen.source) == ({"block": 32}, "overlay"), key
    with overlay({"FakeOp": {"block": 32}}):
        with overlay({"tests.FakeOp": {"block": 256}}):
            assert selector.choose(target).config == {"block": 256}  # innermost wins
        assert selector.choose(target).config == {"block": 32}
    assert selector.choose(target).source == "memory"
    assert _persisted(tmp_path)[target.invocation.call_key]["config"] == TUNED
    with overlay({"some.OtherOp": {"block": 32}}):
        assert selector.choose(target).source == "memory"


def test_error_tier_when_nothing_is_allowed(tmp_path: Path) -> None:
    with policy_override(heuristics=False):
        with pytest.raises(ConfigSelectionError, match=r"tests\.FakeOp@1.*autotune=off, heuristics=off"):
            _selector(tmp_path).choose(FakeTunable())


def test_fully_tuned_deployment_passes_with_heuristics_off(tmp_path: Path) -> None:
    _selector(tmp_path).choose(FakeTunable(), autotune=True)
    with policy_override(heuristics=False):
        assert _selector(tmp_path).choose(FakeTunable()).source == "persistent"


def test_cached_config_the_kernel_rejects_is_a_miss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = FakeTunable()
    _selector(tmp_path).choose(target, autotune=True)
    file = tmp_path / f"{FINGERPRINT.id}.json"
    file.write_text(file.read_text().replace('"config": {"block": 128}', '"config": {"warps": 8}'))
    with caplog.at_level(logging.WARNING):
        chosen = _selector(tmp_path).choose(FakeTunable())
    assert chosen.source == "heuristic" and "ignoring cached config" in caplog.text


def test_corrupt_cache_file_falls_back_and_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / f"{FINGERPRINT.id}.json").write_text('{"format": "tileops-tuning-cache", "entr')
    with caplog.at_level(logging.WARNING):
        assert _selector(tmp_path).choose(FakeTunable()).source == "heuristic"
        assert _selector(tmp_path).choose(FakeTunable(), autotune=True).source == "autotune"
    assert len(_persisted(tmp_path)) == 1 and "not valid JSON" in caplog.text


def test_version_change_means_no_reuse(tmp_path: Path) -> None:
    _selector(tmp_path).choose(FakeTunable(), autotune=True)
    timer = FakeTimer(TIMES)
    upgraded = _selector(tmp_path, timer, fingerprint=fingerprint_with(tileops="0.2.0"))
    assert upgraded.choose(FakeTunable()).source == "heuristic"
    assert upgraded.choose(FakeTunable(), autotune=True).source == "autotune"
    assert len(timer.measured) == 4


def test_force_retunes_even_when_cached(tmp_path: Path) -> None:
    selector, target = _selector(tmp_path), FakeTunable()
    selector.choose(target, autotune=True)
    assert selector.choose(target, force=True).source == "autotune"
    assert target.workbenches == 2


def test_no_disk_cache_when_asked(tmp_path: Path) -> None:
    selector = ConfigSelector(tmp_path, tuner=Tuner(FakeTimer(TIMES)), fingerprint=FINGERPRINT, persist=False)
    assert selector.choose(FakeTunable(), autotune=True).source == "autotune"
    assert list(tmp_path.iterdir()) == []


# ---- when tuning cannot run -------------------------------------------------------------------


def test_unavailable_tuning_falls_back_under_policy_but_fails_when_requested(tmp_path: Path) -> None:
    target = FakeTunable(available=False)
    with policy_override(autotune=True):
        assert _selector(tmp_path).choose(target).source == "heuristic"
    with pytest.raises(TuningUnavailable):
        _selector(tmp_path).choose(target, autotune=True)
    assert _persisted(tmp_path) == {}


def test_failed_tuning_under_policy_warns_and_uses_heuristic(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = FakeTunable(behaviour={64: "runtime_error"})  # the heuristic itself breaks
    with policy_override(autotune=True), caplog.at_level(logging.WARNING):
        assert _selector(tmp_path).choose(target).source == "heuristic"
    assert "illegal memory access" in caplog.text and _persisted(tmp_path) == {}


# ---- policy ----------------------------------------------------------------------------


def test_environment_sets_the_default_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert current_policy().autotune is False
    monkeypatch.setenv("TILEOPS_AUTOTUNE", "1")
    assert _selector(tmp_path).choose(FakeTunable()).source == "autotune"
    assert _selector(tmp_path / "b").choose(FakeTunable(), autotune=False).source == "heuristic"
    with policy_override(autotune=False):
        assert _selector(tmp_path / "c").choose(FakeTunable()).source == "heuristic"
    monkeypatch.setenv("TILEOPS_AUTOTUNE", "maybe")
    with pytest.raises(ValueError, match="TILEOPS_AUTOTUNE"):
        current_policy()


def test_policy_and_overlay_are_local_to_a_thread() -> None:
    inside, ready, done = {}, threading.Barrier(2), threading.Event()

    def tuned_thread() -> None:
        with policy_override(autotune=True), overlay({"Op": {"block": 1}}):
            ready.wait()
            done.wait(5)
            inside["policy"] = current_policy().autotune

    def plain_thread() -> None:
        ready.wait()
        inside["other"] = current_policy().autotune
        target = FakeTunable(op_id="x.Op")
        from tileops.tuning.policy import find_overlay

        inside["other_overlay"] = find_overlay(target.invocation)
        done.set()

    threads = [threading.Thread(target=tuned_thread), threading.Thread(target=plain_thread)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert inside == {"policy": True, "other": False, "other_overlay": None}
    assert current_policy().autotune is False


def test_policy_is_local_to_an_async_task() -> None:
    seen: List[tuple] = []

    async def task(name: str, autotune: bool) -> None:
        with policy_override(autotune=autotune):
            for _ in range(3):
                await asyncio.sleep(0)  # interleave with the other task
                seen.append((name, current_policy().autotune))

    async def both() -> None:
        await asyncio.gather(task("on", True), task("off", False))

    asyncio.run(both())
    assert sorted(seen) == [("off", False)] * 3 + [("on", True)] * 3
    assert current_policy().autotune is False


def test_nested_overrides_restore_the_outer_policy() -> None:
    with policy_override(autotune=True):
        with policy_override(heuristics=False):
            assert (current_policy().autotune, current_policy().heuristics) == (True, False)
        assert (current_policy().autotune, current_policy().heuristics) == (True, True)
    assert current_policy().autotune is False


# ---- single flight -----------------------------------------------------------------------


def test_eight_threads_on_one_untuned_key_tune_it_once(tmp_path: Path) -> None:
    timer = FakeTimer(TIMES, delay=0.05)
    selector, target = _selector(tmp_path, timer), FakeTunable()
    start, results, errors = threading.Barrier(8), [], []

    def ask() -> None:
        start.wait()
        try:
            results.append(selector.choose(target, autotune=True))
        except BaseException as error:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert target.workbenches == 1 and len(timer.measured) == 4
    assert [r.config for r in results] == [TUNED] * 8
    assert len(_persisted(tmp_path)) == 1


def test_distinct_keys_tune_independently(tmp_path: Path) -> None:
    selector = _selector(tmp_path)
    a, b = FakeTunable(params={"N": 1}), FakeTunable(params={"N": 2})
    threads = [threading.Thread(target=selector.choose, args=(t,), kwargs={"autotune": True}) for t in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (a.workbenches, b.workbenches) == (1, 1)
    assert len(_persisted(tmp_path)) == 2
