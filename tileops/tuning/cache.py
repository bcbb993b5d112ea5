"""Config caches: a bounded in-memory LRU and a persistent JSON file per device.

Only autotuned configs are stored (the selector enforces it); every entry keeps
its provenance: where it came from, when, the tuner's statistics and the
software versions it was measured with.

The persistent file is shared by every process on the machine.  Writers take
an exclusive ``fcntl`` lock on a side file, re-read the current file, merge
their entries in, write a temporary file, fsync it and atomically replace the
original, so concurrent tuners never lose each other's results and readers
never see half a file.  A corrupt or foreign file is logged and rebuilt on the
next write; reading one never raises.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from tileops.tuning.fingerprint import DeviceFingerprint
from tileops.tuning.keys import Config, canonicalize, config_from_json

try:  # POSIX only; elsewhere writes are still atomic but not merged under a lock.
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CACHE_DIR_ENV",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CacheDirectory",
    "CacheEntry",
    "MemoryCache",
    "PersistentCache",
    "default_cache_dir",
]

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "TILEOPS_CACHE_DIR"
FORMAT_NAME = "tileops-tuning-cache"
FORMAT_VERSION = 1
DEFAULT_MAX_PERSISTENT_ENTRIES = 10_000
DEFAULT_MAX_MEMORY_ENTRIES = 1024


def default_cache_dir() -> Path:
    """``$TILEOPS_CACHE_DIR``, else ``~/.cache/tileops``."""
    configured = os.environ.get(CACHE_DIR_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "tileops"


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """A tuned config and how it was obtained."""

    config: Config
    source: str  # "autotune" for everything the selector stores
    created: str = dataclasses.field(default_factory=_utc_now)  # ISO 8601, UTC
    invocation: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tuner: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    versions: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return canonicalize(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: Any) -> "CacheEntry":
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            raise ValueError("entry has no config mapping")
        return cls(
            config=config_from_json(data["config"]),
            source=str(data.get("source", "unknown")),
            created=str(data.get("created", "")),
            invocation=data.get("invocation") or {},
            tuner=data.get("tuner") or {},
            versions=data.get("versions") or {},
        )


class MemoryCache:
    """Thread-safe LRU of ``CacheEntry`` keyed by (fingerprint id, call key)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_MEMORY_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: "collections.OrderedDict[Tuple[str, str], CacheEntry]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Tuple[str, str]) -> Optional[CacheEntry]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: Tuple[str, str], entry: CacheEntry) -> None:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def discard(self, key: Tuple[str, str]) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


@contextlib.contextmanager
def _exclusive_file_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (a side file, never replaced)."""
    with open(lock_path, "a+") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# Stateless after construction, so one instance serves every thread.
_SORTED_ENCODER = json.JSONEncoder(sort_keys=True)


def _render_document(header: Dict[str, Any], entries: Dict[str, dict]) -> str:
    """The file text: the header, then one entry per line (diffable, and fast to write:
    ``json.dumps`` without ``indent`` runs in C, ten times faster than an indented dump)."""
    encode = _SORTED_ENCODER.encode
    lines = [encode(key) + ": " + encode(entries[key]) for key in sorted(entries)]
    head = encode(header)[:-1]
    body = ",\n".join(lines)
    return f'{head}, "entries": {{\n{body}\n}}}}\n' if lines else f'{head}, "entries": {{}}}}\n'


class PersistentCache:
    """The JSON cache file of one device fingerprint.

    Reads keep a parsed snapshot and re-read only when the file's stat changes,
    so a lookup costs one ``stat`` call.
    """

    def __init__(
        self,
        directory: Path,
        fingerprint: DeviceFingerprint,
        *,
        max_entries: int = DEFAULT_MAX_PERSISTENT_ENTRIES,
    ) -> None:
        self.directory = Path(directory)
        self.fingerprint = fingerprint
        self.max_entries = max_entries
        self.path = self.directory / f"{fingerprint.id}.json"
        self.lock_path = self.directory / f"{fingerprint.id}.lock"
        self._lock = threading.Lock()
        self._snapshot_stat: Optional[Tuple[int, int, int]] = None
        self._snapshot: Dict[str, dict] = {}
        self._reported_stat: Optional[Tuple[int, int, int]] = None

    # ---- reading -----------------------------------------------------------------
    def _read_file(self) -> Tuple[Dict[str, dict], Optional[str]]:
        """(raw entries, problem).  A missing file is not a problem; anything unusable is."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}, None
        except OSError as error:
            return {}, f"unreadable: {error}"
        try:
            document = json.loads(text)
        except ValueError as error:
            return {}, f"not valid JSON ({error})"
        if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
            return {}, "not a tileops tuning cache"
        if document.get("format_version") != FORMAT_VERSION:
            return {}, f"format version {document.get('format_version')!r}, expected {FORMAT_VERSION}"
        if document.get("fingerprint") != self.fingerprint.as_dict():
            return {}, "written for another device fingerprint"
        entries = document.get("entries")
        if not isinstance(entries, dict):
            return {}, "entries is not a mapping"
        return entries, None

    def _stat(self) -> Optional[Tuple[int, int, int]]:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _entries(self) -> Dict[str, dict]:
        stat = self._stat()
        with self._lock:
            if stat is None:
                self._snapshot_stat, self._snapshot = None, {}
            elif stat != self._snapshot_stat:
                entries, problem = self._read_file()
                if problem is not None and stat != self._reported_stat:
                    self._reported_stat = stat
                    logger.warning("ignoring tuning cache %s: %s; it will be rebuilt", self.path, problem)
                self._snapshot_stat, self._snapshot = stat, entries
            return self._snapshot

    def get(self, key: str) -> Optional[CacheEntry]:
        raw = self._entries().get(key)
        if raw is None:
            return None
        try:
            return CacheEntry.from_json(raw)
        except ValueError as error:
            logger.warning("ignoring malformed entry %s in %s: %s", key, self.path, error)
            return None

    def entries(self) -> Dict[str, CacheEntry]:
        out = {}
        for key, raw in self._entries().items():
            try:
                out[key] = CacheEntry.from_json(raw)
            except ValueError:
                continue
        return out

    def __len__(self) -> int:
        return len(self._entries())

    # ---- writing -----------------------------------------------------------------
    def put(self, key: str, entry: CacheEntry) -> None:
        self.update({key: entry})

    def update(self, new_entries: Mapping[str, CacheEntry]) -> None:
        """Merge ``new_entries`` into the file under the lock (newer entries win)."""
        self._rewrite(lambda current: {**current, **{k: e.to_json() for k, e in new_entries.items()}})

    def remove(self, keys: List[str]) -> None:
        doomed = set(keys)
        self._rewrite(lambda current: {k: v for k, v in current.items() if k not in doomed})

    def _rewrite(self, change: Any) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock, _exclusive_file_lock(self.lock_path):
            stat = self._stat()
            if stat is not None and stat == self._snapshot_stat and stat != self._reported_stat:
                current, problem = self._snapshot, None  # unchanged since we last read it
            else:
                current, problem = self._read_file()
            if problem is not None:
                self._set_aside(problem)
            merged = self._bounded(change(current))
            self._write_atomically(merged)
            self._snapshot_stat, self._snapshot = self._stat(), merged

    def _set_aside(self, problem: str) -> None:
        # Keep the unusable file next to the new one for inspection (only the latest copy).
        aside = self.path.with_name(self.path.name + ".bad")
        try:
            os.replace(self.path, aside)
        except OSError:
            aside = None
        logger.warning(
            "rebuilding tuning cache %s: %s%s", self.path, problem, f" (old file kept as {aside})" if aside else ""
        )

    def _bounded(self, entries: Dict[str, dict]) -> Dict[str, dict]:
        if len(entries) <= self.max_entries:
            return entries
        newest = sorted(entries.items(), key=lambda item: str(item[1].get("created", "")), reverse=True)
        dropped = len(entries) - self.max_entries
        logger.info("tuning cache %s is full; dropping the %d oldest entries", self.path, dropped)
        return dict(newest[: self.max_entries])

    def _write_atomically(self, entries: Dict[str, dict]) -> None:
        header = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "fingerprint": self.fingerprint.as_dict(),
            "updated": _utc_now(),
        }
        text = _render_document(header, entries)
        fd, temp_name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp_name, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp_name)
            raise
        self._fsync_directory()

    def _fsync_directory(self) -> None:
        # Makes the rename itself durable; not every platform allows opening a directory.
        try:
            fd = os.open(self.directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def clear(self) -> None:
        """Delete this fingerprint's file."""
        if not self.directory.exists():
            return
        with self._lock, _exclusive_file_lock(self.lock_path):
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self._snapshot_stat, self._snapshot = None, {}


@dataclasses.dataclass(frozen=True)
class CacheFileSummary:
    """What ``tileops cache show`` prints for one file."""

    path: Path
    fingerprint: Optional[dict]
    entries: Dict[str, Any]
    problem: Optional[str]


class CacheDirectory:
    """The directory holding one cache file per fingerprint."""

    # A process sees one fingerprint per device; the bound only guards misuse.
    _MAX_OPEN = 16

    def __init__(self, directory: Optional[Path] = None, **cache_options: Any) -> None:
        self.path = Path(directory) if directory is not None else default_cache_dir()
        self._cache_options = cache_options
        self._caches: "collections.OrderedDict[str, PersistentCache]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def for_fingerprint(self, fingerprint: DeviceFingerprint) -> PersistentCache:
        with self._lock:
            cache = self._caches.get(fingerprint.id)
            if cache is None or cache.fingerprint != fingerprint:
                cache = PersistentCache(self.path, fingerprint, **self._cache_options)
                self._caches[fingerprint.id] = cache
                while len(self._caches) > self._MAX_OPEN:
                    self._caches.popitem(last=False)
            return cache

    def files(self) -> List[Path]:
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.glob("*.json") if not p.name.startswith("."))

    def summaries(self) -> List[CacheFileSummary]:
        """Every cache file, parsed leniently for display."""
        out = []
        for path in self.files():
            try:
                document = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                out.append(CacheFileSummary(path, None, {}, f"unreadable: {error}"))
                continue
            if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
                out.append(CacheFileSummary(path, None, {}, "not a tileops tuning cache"))
                continue
            problem = None
            if document.get("format_version") != FORMAT_VERSION:
                problem = f"format version {document.get('format_version')!r}"
            entries = document.get("entries") if isinstance(document.get("entries"), dict) else {}
            out.append(CacheFileSummary(path, document.get("fingerprint"), entries, problem))
        return out

    def clear(self) -> int:
        """Delete every cache file (and its lock file); returns how many data files went."""
        removed = 0
        for path in self.files():
            lock_path = path.with_suffix(".lock")
            with _exclusive_file_lock(lock_path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
        # Lock files stay: unlinking one while another process waits on it would let
        # two writers hold "the" lock at once.  Open caches notice the deletion by stat.
        return removed
