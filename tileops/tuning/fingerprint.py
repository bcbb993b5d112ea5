"""Device fingerprint: which machine and software stack a tuned config belongs to.

A config that was fastest on one GPU with one compiler may be slow, or wrong, on
another.  The fingerprint holds the GPU name, its SM version, the CUDA version
and the torch, tilelang and tileops versions; its ``id`` names the persistent
cache file, so an upgrade of any of them starts from an empty cache instead of
reusing stale configs.  Machines without a GPU get a CPU fingerprint so that the
whole tuning layer (and its tests) works there too.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import logging
import platform
import re
import sys
import threading
from typing import Dict, Optional

from tileops.tuning.keys import stable_digest

__all__ = ["DeviceFingerprint", "device_fingerprint", "software_versions"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DeviceFingerprint:
    """The hardware and software a config was tuned on."""

    kind: str  # "cuda" or "cpu"
    name: str  # e.g. "NVIDIA H100 80GB HBM3"
    sm: Optional[str]  # e.g. "90"; None on CPU
    cuda: Optional[str]  # CUDA runtime torch was built with; None on CPU builds
    torch: str
    tilelang: str
    tileops: str

    @functools.cached_property
    def id(self) -> str:
        """File-name-safe identity: readable prefix plus a digest of every field."""
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")[:40] or "unknown"
        arch = f"-sm{self.sm}" if self.sm else ""
        return f"{self.kind}-{slug}{arch}-{stable_digest(self.as_dict(), 12)}"

    def as_dict(self) -> Dict[str, Optional[str]]:
        return dataclasses.asdict(self)

    def versions(self) -> Dict[str, Optional[str]]:
        """The software part, recorded in each cache entry's provenance."""
        return {"cuda": self.cuda, "torch": self.torch, "tilelang": self.tilelang, "tileops": self.tileops}


def _package_version(name: str) -> str:
    # Prefer an already-imported module (it is what actually runs); otherwise read
    # the installed metadata, which avoids importing tilelang (seconds) just for a key.
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None) if module is not None else None
    if version:
        return str(version)
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def software_versions() -> Dict[str, str]:
    """torch, tilelang and tileops versions of this process."""
    import tileops

    return {
        "torch": _package_version("torch"),
        "tilelang": _package_version("tilelang"),
        "tileops": str(tileops.__version__),
    }


_lock = threading.Lock()
# One entry per device index (plus CPU): bounded by the number of devices.
_computed: Dict[int, DeviceFingerprint] = {}
_CPU_INDEX = -1


def _current_index() -> int:
    import torch

    if not torch.cuda.is_available():
        return _CPU_INDEX
    return torch.cuda.current_device()


def _compute(index: int) -> DeviceFingerprint:
    import torch

    versions = software_versions()
    if index == _CPU_INDEX:
        name = platform.machine() or "cpu"  # platform.processor() may spawn `uname`
        return DeviceFingerprint("cpu", name, None, None, **versions)
    props = torch.cuda.get_device_properties(index)
    return DeviceFingerprint(
        "cuda", props.name, f"{props.major}{props.minor}", torch.version.cuda or "unknown", **versions
    )


def device_fingerprint(device: Optional[int] = None) -> DeviceFingerprint:
    """The fingerprint of CUDA device ``device`` (default: current), or of the CPU.

    Computed once per device and process: versions cannot change under a running
    process, and the device query costs more than a key lookup should.
    """
    index = _current_index() if device is None else int(device)
    found = _computed.get(index)
    if found is None:
        with _lock:
            found = _computed.get(index)
            if found is None:
                found = _compute(index)
                _computed[index] = found
                logger.debug("device fingerprint %s: %s", found.id, found.as_dict())
    return found
