"""Config selection: override, overlay, memory, persistent, autotune, heuristic, error.

``ConfigSelector.choose`` walks the tiers in that order and returns the first
answer with the tier that gave it.  Rules that keep the tiers honest:

- an explicit override wins on every path and is never stored anywhere;
- overlays are context-local (see ``policy``) and never stored;
- only autotuned configs are stored, in memory and on disk, with provenance;
  heuristic picks are recomputed (they are cheap) so they never shadow a later
  tuning run;
- concurrent callers that miss on the same key wait for one tuning run
  (single flight) instead of each tuning.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import logging
import threading
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Tuple, Union

from tileops.tuning.cache import CacheDirectory, CacheEntry, MemoryCache, PersistentCache, default_cache_dir
from tileops.tuning.fingerprint import DeviceFingerprint, device_fingerprint
from tileops.tuning.keys import Config
from tileops.tuning.policy import TuningPolicy, current_policy, describe_policy, find_overlay
from tileops.tuning.tuner import Tunable, Tuner, TuningError

__all__ = [
    "ConfigSelectionError",
    "ConfigSelector",
    "Selection",
    "active_selector",
    "default_selector",
    "using_selector",
]

logger = logging.getLogger(__name__)

# Where a config came from.
OVERRIDE, OVERLAY, MEMORY, PERSISTENT, AUTOTUNE, HEURISTIC = (
    "override", "overlay", "memory", "persistent", "autotune", "heuristic",
)


class ConfigSelectionError(LookupError):
    """No tier produced a config (heuristics disabled and nothing cached or tuned)."""


@dataclasses.dataclass(frozen=True)
class Selection:
    config: Config
    source: str
    call_key: Optional[str] = None
    entry: Optional[CacheEntry] = None


FingerprintSource = Union[DeviceFingerprint, Callable[[], DeviceFingerprint]]


class ConfigSelector:
    """The selection chain with its caches and tuner.

    Args:
        cache_dir: directory of persistent cache files, or ``None`` for no disk cache.
        memory: the in-memory LRU (default: a fresh bounded one).
        tuner: what times candidates (default: CUDA events).
        fingerprint: the device fingerprint, or a callable giving it (default: the
            current device's).  Tests pass a fixed one.
    """

    def __init__(
        self,
        cache_dir: Optional[Path] = None,
        *,
        memory: Optional[MemoryCache] = None,
        tuner: Optional[Tuner] = None,
        fingerprint: Optional[FingerprintSource] = None,
        persist: bool = True,
    ) -> None:
        self.cache_dir = CacheDirectory(cache_dir) if (persist and cache_dir is not None) else None
        self.memory = memory if memory is not None else MemoryCache()
        self._tuner = tuner
        self._tuner_lock = threading.Lock()
        self._fingerprint = fingerprint
        self._inflight: Dict[Tuple[str, str], "concurrent.futures.Future[Optional[Selection]]"] = {}
        self._inflight_lock = threading.Lock()

    @property
    def tuner(self) -> Tuner:
        with self._tuner_lock:
            if self._tuner is None:
                self._tuner = Tuner()
            return self._tuner

    def fingerprint(self) -> DeviceFingerprint:
        source = self._fingerprint
        if source is None:
            return device_fingerprint()
        return source() if callable(source) else source

    def persistent(self, fingerprint: Optional[DeviceFingerprint] = None) -> Optional[PersistentCache]:
        if self.cache_dir is None:
            return None
        return self.cache_dir.for_fingerprint(fingerprint or self.fingerprint())

    # ---- the chain ----------------------------------------------------------------
    def choose(
        self,
        target: Tunable,
        *,
        override: Optional[Config] = None,
        autotune: Optional[bool] = None,
        force: bool = False,
    ) -> Selection:
        """Select a config for ``target``.

        Args:
            override: an explicit config; returned (validated) on every path, never stored.
            autotune: per-call policy: ``True`` tunes on a miss (and errors if tuning
                cannot run), ``False`` never tunes, ``None`` follows the context policy.
            force: skip the cached tiers and retune (implies ``autotune=True``).
        """
        if override is not None:
            return Selection(target.check_config(override), OVERRIDE)
        invocation = target.invocation
        pinned = find_overlay(invocation)
        if pinned is not None:
            return Selection(target.check_config(pinned), OVERLAY, invocation.call_key)

        fingerprint = self.fingerprint()
        key = (fingerprint.id, invocation.call_key)
        if not force:
            found = self._cached(target, fingerprint, key)
            if found is not None:
                return found

        policy = current_policy()
        wants_tuning = force or (policy.autotune if autotune is None else autotune)
        if wants_tuning:
            strict = force or autotune is True
            tuned = self._single_flight(key, lambda: self._tune(target, fingerprint, key, strict, force))
            if tuned is not None:
                return tuned
        if policy.heuristics:
            return Selection(target.check_config(target.heuristic_config()), HEURISTIC, invocation.call_key)
        raise ConfigSelectionError(
            f"no config for {invocation.versioned_op_id} (call key {invocation.call_key}, "
            f"params {dict(invocation.params)}, workload {dict(invocation.workload)}) on {fingerprint.id}: "
            f"nothing cached and the policy ({describe_policy(self._effective(policy, autotune))}) "
            "allows neither tuning nor heuristics; tune it (`tileops tune` or op.autotune()) "
            "or allow heuristics"
        )

    @staticmethod
    def _effective(policy: TuningPolicy, autotune: Optional[bool]) -> TuningPolicy:
        return policy if autotune is None else dataclasses.replace(policy, autotune=autotune)

    # ---- cached tiers -------------------------------------------------------------
    def _cached(self, target: Tunable, fingerprint: DeviceFingerprint, key: Tuple[str, str]) -> Optional[Selection]:
        entry = self.memory.get(key)
        if entry is not None:
            usable = self._usable(target, entry, key)
            if usable is not None:
                return Selection(usable, MEMORY, key[1], entry)
            self.memory.discard(key)
        persistent = self.persistent(fingerprint)
        entry = persistent.get(key[1]) if persistent is not None else None
        if entry is not None:
            usable = self._usable(target, entry, key)
            if usable is not None:
                self.memory.put(key, entry)
                return Selection(usable, PERSISTENT, key[1], entry)
        return None

    @staticmethod
    def _usable(target: Tunable, entry: CacheEntry, key: Tuple[str, str]) -> Optional[Config]:
        # A stored config the kernel no longer accepts (its keys changed without a
        # version bump) is treated as a miss rather than crashing the caller.
        try:
            return target.check_config(entry.config)
        except (ValueError, TypeError) as error:
            logger.warning("ignoring cached config for %s (%s): %s", target.invocation.op_id, key[1], error)
            return None

    # ---- tuning -------------------------------------------------------------------
    def _single_flight(
        self, key: Tuple[str, str], work: Callable[[], Optional[Selection]]
    ) -> Optional[Selection]:
        with self._inflight_lock:
            future = self._inflight.get(key)
            leader = future is None
            if leader:
                future = concurrent.futures.Future()
                self._inflight[key] = future
        if not leader:
            return future.result()
        try:
            result = work()
        except BaseException as error:
            future.set_exception(error)
            raise
        else:
            future.set_result(result)
            return result
        finally:
            with self._inflight_lock:
                self._inflight.pop(key, None)

    def _tune(
        self, target: Tunable, fingerprint: DeviceFingerprint, key: Tuple[str, str], strict: bool, force: bool
    ) -> Optional[Selection]:
        if not force:
            # Another caller may have finished tuning this key while we waited for the lock.
            entry = self.memory.get(key)
            if entry is not None:
                return Selection(entry.config, MEMORY, key[1], entry)
        invocation = target.invocation
        logger.info("autotuning %s %s", invocation.op_id, dict(invocation.params))
        try:
            result = self.tuner.tune(target)
        except TuningError as error:
            if strict:
                raise
            logger.warning("not autotuning %s, using its heuristic config: %s", invocation.op_id, error)
            return None
        entry = CacheEntry(
            config=result.best,
            source=AUTOTUNE,
            invocation=invocation.describe(),
            tuner=result.stats(self.tuner.timer.describe()),
            versions=fingerprint.versions(),
        )
        self.memory.put(key, entry)
        self._persist(fingerprint, key[1], entry)
        return Selection(entry.config, AUTOTUNE, key[1], entry)

    def _persist(self, fingerprint: DeviceFingerprint, call_key: str, entry: CacheEntry) -> None:
        persistent = self.persistent(fingerprint)
        if persistent is None:
            return
        try:
            persistent.put(call_key, entry)
        except OSError as error:
            # The tuned config still serves this process; only reuse by others is lost.
            logger.warning("could not save tuned config to %s: %s", persistent.path, error)


# ---- which selector is active ----------------------------------------------------------

_defaults_lock = threading.Lock()
# One default selector per cache directory (the env var may change between calls,
# e.g. in tests); bounded so a process that keeps changing it cannot grow this.
_defaults: "collections.OrderedDict[str, ConfigSelector]" = collections.OrderedDict()
_MAX_DEFAULTS = 4
_selector_var: "contextvars.ContextVar[Optional[ConfigSelector]]" = contextvars.ContextVar(
    "tileops_tuning_selector", default=None
)


def default_selector() -> ConfigSelector:
    """The process-wide selector for the current ``TILEOPS_CACHE_DIR``."""
    directory = default_cache_dir()
    name = str(directory)
    with _defaults_lock:
        selector = _defaults.get(name)
        if selector is None:
            selector = ConfigSelector(directory)
            _defaults[name] = selector
            while len(_defaults) > _MAX_DEFAULTS:
                _defaults.popitem(last=False)
        else:
            _defaults.move_to_end(name)
        return selector


def active_selector() -> ConfigSelector:
    """The selector ``using_selector`` installed in this context, else the default one."""
    return _selector_var.get() or default_selector()


@contextlib.contextmanager
def using_selector(selector: ConfigSelector) -> Iterator[ConfigSelector]:
    """Route config selection in the enclosed code (this context only) to ``selector``."""
    token = _selector_var.set(selector)
    try:
        yield selector
    finally:
        _selector_var.reset(token)
