"""Light helpers (no torch import) for tests that spawn processes."""

from __future__ import annotations

from pathlib import Path

from tileops.tuning.cache import CacheEntry, PersistentCache
from tileops.tuning.fingerprint import DeviceFingerprint
from tileops.tuning.keys import Invocation

FINGERPRINT = DeviceFingerprint(
    kind="cuda", name="Fake GPU 80GB", sm="90", cuda="12.8", torch="2.13.0", tilelang="0.1.15", tileops="0.1.0"
)


def fingerprint_with(**changes: str) -> DeviceFingerprint:
    return DeviceFingerprint(**{**FINGERPRINT.as_dict(), **changes})


def worker_invocation(worker: int, index: int) -> Invocation:
    return Invocation("tests.Worker", "1", {"worker": worker, "index": index})


def write_keys(directory: str, worker: int, count: int) -> None:
    """Put ``count`` distinct entries, one locked write each (runs in a spawned process)."""
    cache = PersistentCache(Path(directory), FINGERPRINT)
    for index in range(count):
        invocation = worker_invocation(worker, index)
        cache.put(invocation.call_key, CacheEntry({"block": index}, "autotune"))
