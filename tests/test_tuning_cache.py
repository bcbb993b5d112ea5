"""Memory LRU, persistent file (locking, merging, recovery) and device fingerprints."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

import pytest

from tileops.tuning import fingerprint as fingerprint_module
from tileops.tuning.cache import (
    FORMAT_NAME,
    FORMAT_VERSION,
    CacheDirectory,
    CacheEntry,
    MemoryCache,
    PersistentCache,
    default_cache_dir,
)
from tuning_worker import FINGERPRINT, fingerprint_with, worker_invocation, write_keys


def _entry(block: int = 128) -> CacheEntry:
    return CacheEntry({"block": block, "tile": (64, 32)}, "autotune", tuner={"best_ms": 0.5}, versions={"x": "1"})


# ---- memory ----------------------------------------------------------------------------


def test_memory_cache_is_bounded_and_evicts_least_recently_used() -> None:
    cache = MemoryCache(max_entries=3)
    for index in range(3):
        cache.put(("fp", f"k{index}"), _entry(index))
    assert cache.get(("fp", "k0")) is not None  # k0 becomes most recent; k1 is now oldest
    cache.put(("fp", "k3"), _entry(3))
    cache.put(("fp", "k4"), _entry(4))
    assert len(cache) == 3
    assert cache.get(("fp", "k1")) is None and cache.get(("fp", "k2")) is None
    assert [cache.get(("fp", k)).config["block"] for k in ("k0", "k3", "k4")] == [0, 3, 4]


def test_memory_cache_rejects_a_zero_bound() -> None:
    with pytest.raises(ValueError):
        MemoryCache(max_entries=0)


# ---- persistent ------------------------------------------------------------------------


def test_round_trip_keeps_config_and_provenance(tmp_path: Path) -> None:
    PersistentCache(tmp_path, FINGERPRINT).put("key", _entry(256))
    again = PersistentCache(tmp_path, FINGERPRINT).get("key")  # a fresh reader, as another process
    assert again.config == {"block": 256, "tile": (64, 32)}  # tuples survive JSON
    assert (again.source, again.tuner, again.versions) == ("autotune", {"best_ms": 0.5}, {"x": "1"})
    assert again.created
    document = json.loads((tmp_path / f"{FINGERPRINT.id}.json").read_text())
    assert document["format"] == FORMAT_NAME and document["format_version"] == FORMAT_VERSION
    assert document["fingerprint"] == FINGERPRINT.as_dict()


def test_reader_sees_other_writers_updates(tmp_path: Path) -> None:
    reader, writer = PersistentCache(tmp_path, FINGERPRINT), PersistentCache(tmp_path, FINGERPRINT)
    assert reader.get("key") is None
    writer.put("key", _entry(1))
    assert reader.get("key").config["block"] == 1
    writer.put("key", _entry(2))
    assert reader.get("key").config["block"] == 2


def test_writes_merge_instead_of_overwriting(tmp_path: Path) -> None:
    first, second = PersistentCache(tmp_path, FINGERPRINT), PersistentCache(tmp_path, FINGERPRINT)
    first.get("warm-up")  # both hold an (empty) snapshot before either writes
    second.get("warm-up")
    first.put("a", _entry(1))
    second.put("b", _entry(2))
    assert set(PersistentCache(tmp_path, FINGERPRINT).entries()) == {"a", "b"}


def test_persistent_cache_is_bounded_dropping_oldest(tmp_path: Path) -> None:
    cache = PersistentCache(tmp_path, FINGERPRINT, max_entries=2)
    for index, stamp in enumerate(["2024-01-01", "2025-01-01", "2023-01-01", "2026-01-01"]):
        cache.put(f"k{index}", CacheEntry({"block": index}, "autotune", created=stamp))
    assert set(cache.entries()) == {"k1", "k3"}


@pytest.mark.parametrize(
    "content, problem",
    [
        ("{ this is not json", "not valid JSON"),
        ("", "not valid JSON"),
        (json.dumps({"some": "other tool"}), "not a tileops tuning cache"),
        (json.dumps({"format": FORMAT_NAME, "format_version": 0, "entries": {}}), "format version 0"),
        (
            json.dumps(
                {"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                 "fingerprint": fingerprint_with(name="Other GPU").as_dict(), "entries": {"key": {"config": {}}}}
            ),
            "another device fingerprint",
        ),
        (
            json.dumps({"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                        "fingerprint": FINGERPRINT.as_dict(), "entries": []}),
            "entries is not a mapping",
        ),
    ],
    ids=["garbage", "empty", "foreign", "old-format", "other-fingerprint", "bad-entries"],
)
def test_unusable_file_is_logged_ignored_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, problem: str
) -> None:
    path = tmp_path / f"{FINGERPRINT.id}.json"
    path.write_text(content)
    cache = PersistentCache(tmp_path, FINGERPRINT)
    with caplog.at_level(logging.WARNING, logger="tileops.tuning.cache"):
        assert cache.get("key") is None  # never raises
        assert len(cache) == 0
    assert problem in caplog.text
    cache.put("fresh", _entry(7))
    assert "rebuilding" in caplog.text
    assert json.loads(path.read_text())["entries"].keys() == {"fresh"}
    assert (tmp_path / f"{path.name}.bad").read_text() == content  # kept for inspection


def test_malformed_entry_is_skipped_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = PersistentCache(tmp_path, FINGERPRINT)
    cache.put("good", _entry(1))
    document = json.loads(cache.path.read_text())
    document["entries"]["bad"] = {"config": "not a mapping"}
    cache.path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING):
        assert cache.get("bad") is None
    assert cache.get("good").config["block"] == 1
    assert "malformed entry bad" in caplog.text


@pytest.fixture
def memory_backed_dir(tmp_path: Path):
    """A directory on tmpfs when there is one: 800 fsynced rewrites on a busy disk take
    seconds, and what this test checks (locking and merging) does not depend on the disk."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="tileops-test-", dir=shm))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_concurrent_processes_lose_no_writes(memory_backed_dir: Path) -> None:
    tmp_path = memory_backed_dir
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=write_keys, args=(str(tmp_path), worker, 100)) for worker in range(8)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=120)
    assert [p.exitcode for p in workers] == [0] * 8
    entries = PersistentCache(tmp_path, FINGERPRINT).entries()
    expected = {worker_invocation(w, i).call_key: i for w in range(8) for i in range(100)}
    assert len(entries) == 800
    assert {key: entry.config["block"] for key, entry in entries.items()} == expected
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind


# ---- directory -----------------------------------------------------------------------------


def test_cache_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TILEOPS_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("TILEOPS_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "tileops"


def test_directory_lists_summarises_and_clears(tmp_path: Path) -> None:
    directory = CacheDirectory(tmp_path)
    directory.for_fingerprint(FINGERPRINT).put("a", _entry(1))
    directory.for_fingerprint(fingerprint_with(tileops="0.2.0")).put("b", _entry(2))
    (tmp_path / "junk.json").write_text("nope")
    summaries = {s.path.name: s for s in directory.summaries()}
    assert len(summaries) == 3
    assert summaries[f"{FINGERPRINT.id}.json"].entries.keys() == {"a"}
    assert summaries["junk.json"].problem.startswith("unreadable")
    assert directory.clear() == 3
    assert directory.files() == []
    assert directory.for_fingerprint(FINGERPRINT).get("a") is None


# ---- fingerprint -----------------------------------------------------------------------


def test_fingerprint_id_changes_with_every_version() -> None:
    ids = {FINGERPRINT.id}
    for field, value in [("tileops", "0.2.0"), ("tilelang", "0.1.16"), ("torch", "2.14.0"),
                         ("cuda", "13.0"), ("sm", "100"), ("name", "NVIDIA H200")]:
        ids.add(fingerprint_with(**{field: value}).id)
    assert len(ids) == 7
    assert FINGERPRINT.id.startswith("cuda-fake-gpu-80gb-sm90-")


def test_new_version_does_not_reuse_old_entries(tmp_path: Path) -> None:
    directory = CacheDirectory(tmp_path)
    directory.for_fingerprint(FINGERPRINT).put("key", _entry(1))
    for upgraded in (fingerprint_with(tileops="0.1.1"), fingerprint_with(tilelang="0.2.0")):
        assert directory.for_fingerprint(upgraded).get("key") is None


def test_cpu_fingerprint_works_and_tracks_installed_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    here = fingerprint_module.device_fingerprint()
    assert here.kind in ("cpu", "cuda") and here.torch and here.tileops
    base = fingerprint_module._compute(fingerprint_module._CPU_INDEX)
    monkeypatch.setitem(sys.modules, "tilelang", types.SimpleNamespace(__version__="9.9.9"))
    new_tilelang = fingerprint_module._compute(fingerprint_module._CPU_INDEX)
    import tileops

    monkeypatch.setattr(tileops, "__version__", "7.0.0")
    new_tileops = fingerprint_module._compute(fingerprint_module._CPU_INDEX)
    assert (new_tilelang.tilelang, new_tileops.tileops) == ("9.9.9", "7.0.0")
    assert len({base.id, new_tilelang.id, new_tileops.id}) == 3
