"""Config selection for tileops kernels: keys, caches, policy, tuner, device fingerprint.

Selection order for a kernel's config (``ConfigSelector.choose``):
explicit override -> context overlay -> memory cache -> persistent cache ->
autotune (when the policy allows) -> heuristic -> ``ConfigSelectionError``.

Everyday use::

    from tileops.tuning import policy_override, overlay

    with policy_override(autotune=True):      # tune on a cache miss, in this context
        op = RMSNormFwdOp(...)
    with overlay({RMSNormFwdKernel: {"per_thread": 8}}):   # pin a config, in this context
        op = RMSNormFwdOp(...)

``TILEOPS_AUTOTUNE=1`` turns tuning on for the process; ``TILEOPS_CACHE_DIR``
moves the persistent cache (default ``~/.cache/tileops``).  Names are loaded on
first use, so importing this package does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Invocation": "keys",
    "TensorSpec": "keys",
    "canonical_json": "keys",
    "stable_digest": "keys",
    "DeviceFingerprint": "fingerprint",
    "device_fingerprint": "fingerprint",
    "CacheDirectory": "cache",
    "CacheEntry": "cache",
    "MemoryCache": "cache",
    "PersistentCache": "cache",
    "default_cache_dir": "cache",
    "TuningPolicy": "policy",
    "current_policy": "policy",
    "overlay": "policy",
    "policy_override": "policy",
    "CudaEventTimer": "tuner",
    "Tuner": "tuner",
    "TuningError": "tuner",
    "TuningUnavailable": "tuner",
    "ConfigSelectionError": "selector",
    "ConfigSelector": "selector",
    "Selection": "selector",
    "active_selector": "selector",
    "default_selector": "selector",
    "using_selector": "selector",
    "autotune_kernel": "kernels",
    "select_kernel_config": "kernels",
    "autotune_op": "ops",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tileops.tuning' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tileops.tuning.{module}"), name)
