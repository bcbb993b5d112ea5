"""Tuning policy and config overlays, scoped to the current context.

``TILEOPS_AUTOTUNE`` sets the process default (off: heuristics).  The context
managers below change it, or pin configs, for the code they wrap only: they use
``contextvars``, so another thread or asyncio task keeps its own view and a
nested block restores the outer one on exit.  Nothing here mutates module state.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from typing import Any, Iterator, Mapping, Optional, Tuple, Union

from tileops.tuning.keys import Config, Invocation

__all__ = [
    "AUTOTUNE_ENV",
    "TuningPolicy",
    "current_policy",
    "find_overlay",
    "overlay",
    "policy_override",
]

AUTOTUNE_ENV = "TILEOPS_AUTOTUNE"
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


@dataclasses.dataclass(frozen=True)
class TuningPolicy:
    """What config selection may do on a cache miss.

    Attributes:
        autotune: time candidate configs (needs a GPU; results are persisted).
        heuristics: fall back to the kernel's heuristic config.  With both off, a
            miss is an error, which is how a deployment proves it is fully tuned.
    """

    autotune: bool = False
    heuristics: bool = True


def _policy_from_env() -> TuningPolicy:
    raw = os.environ.get(AUTOTUNE_ENV, "").strip().lower()
    if raw in _TRUE_WORDS:
        return TuningPolicy(autotune=True)
    if raw not in _FALSE_WORDS:
        raise ValueError(f"{AUTOTUNE_ENV}={raw!r} is not understood; use 1/0, true/false, on/off")
    return TuningPolicy(autotune=False)


_policy_var: "contextvars.ContextVar[Optional[TuningPolicy]]" = contextvars.ContextVar(
    "tileops_tuning_policy", default=None
)
# Innermost overlay last; each is a mapping from a normalised key to a config.
_overlay_var: "contextvars.ContextVar[Tuple[Mapping[str, Config], ...]]" = contextvars.ContextVar(
    "tileops_tuning_overlays", default=()
)


def current_policy() -> TuningPolicy:
    """The policy in force here: the innermost ``policy_override``, else the environment."""
    scoped = _policy_var.get()
    return scoped if scoped is not None else _policy_from_env()


@contextlib.contextmanager
def policy_override(*, autotune: Optional[bool] = None, heuristics: Optional[bool] = None) -> Iterator[TuningPolicy]:
    """Change the policy for the enclosed code in this context only.

    >>> with policy_override(autotune=True):
    ...     op = RMSNormFwdOp(...)   # kernels built here are tuned on a cache miss
    """
    base = current_policy()
    policy = TuningPolicy(
        autotune=base.autotune if autotune is None else bool(autotune),
        heuristics=base.heuristics if heuristics is None else bool(heuristics),
    )
    token = _policy_var.set(policy)
    try:
        yield policy
    finally:
        _policy_var.reset(token)


OverlayKey = Union[str, Invocation, type]


def _normalise_overlay_key(key: OverlayKey) -> str:
    if isinstance(key, Invocation):
        return key.call_key
    if isinstance(key, type):
        return f"{key.__module__}.{key.__qualname__}"
    if isinstance(key, str) and key:
        return key
    raise TypeError(f"overlay keys are call keys, op ids, Invocations or classes; got {key!r}")


@contextlib.contextmanager
def overlay(configs: Mapping[OverlayKey, Config]) -> Iterator[None]:
    """Pin configs for the enclosed code in this context only.

    A key is a call key or ``Invocation`` (one exact call), or an op id, a
    versioned op id (``"pkg.mod.Kernel@1"``), a bare class name or the class
    itself (every call of that op).  Overlays are never persisted.
    """
    normalised = {_normalise_overlay_key(k): dict(v) for k, v in configs.items()}
    token = _overlay_var.set(_overlay_var.get() + (normalised,))
    try:
        yield
    finally:
        _overlay_var.reset(token)


def find_overlay(invocation: Invocation) -> Optional[Config]:
    """The config an enclosing ``overlay`` pins for ``invocation``, innermost first."""
    layers = _overlay_var.get()
    if not layers:
        return None
    candidates = (
        invocation.call_key,
        invocation.versioned_op_id,
        invocation.op_id,
        invocation.op_id.rsplit(".", 1)[-1],
    )
    for layer in reversed(layers):
        for key in candidates:
            found = layer.get(key)
            if found is not None:
                return found
    return None


def describe_policy(policy: Any) -> str:
    return f"autotune={'on' if policy.autotune else 'off'}, heuristics={'on' if policy.heuristics else 'off'}"
