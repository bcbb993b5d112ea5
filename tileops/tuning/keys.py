"""Stable identities for tuning: canonical JSON, ``TensorSpec`` and ``Invocation``.

A cached config is only as good as its key.  Keys here are sha256 digests of a
canonical JSON rendering (sorted keys, no whitespace, no ``repr`` of objects),
so they are identical across processes, machines and ``PYTHONHASHSEED`` values.
Python's ``hash()`` is never used.  This module does not import torch: tensors
and dtypes are recognised by duck typing so the cache layer stays light.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import math
from typing import Any, Mapping, Optional, Tuple

__all__ = [
    "Config",
    "Invocation",
    "TensorSpec",
    "canonical_json",
    "canonicalize",
    "config_from_json",
    "stable_digest",
]

# A kernel config: tile sizes, thread counts, flags.  Values are JSON scalars or tuples.
Config = Mapping[str, Any]

_KEY_HEX_CHARS = 32  # 128 bits: collisions are not a practical concern


def _dtype_name(dtype: Any) -> str:
    """``torch.float16`` -> ``"float16"``; anything else with the same shape of repr likewise."""
    return str(dtype).replace("torch.", "")


def _is_torch_dtype(value: Any) -> bool:
    return type(value).__module__ == "torch" and type(value).__name__ == "dtype"


def _is_tensor_like(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """The abstract view of a tensor that a config may depend on: shape and dtype."""

    shape: Tuple[Any, ...]
    dtype: str

    @classmethod
    def of(cls, tensor: Any) -> "TensorSpec":
        return cls(tuple(int(s) for s in tensor.shape), _dtype_name(tensor.dtype))


def _string_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"tuning keys need string mapping keys, got {key!r}")
    return key


def canonicalize(value: Any) -> Any:
    """Turn ``value`` into plain JSON data with one spelling per meaning.

    Tuples and lists both become lists, mapping keys must be strings, tensors
    become their ``TensorSpec`` and dtypes their short name.  Anything whose only
    rendering would be a ``repr`` (which may hold a memory address) is refused.
    """
    kind = type(value)
    # Exact-type fast paths first: keys are built on the kernel-construction path.
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        return value
    if kind is dict:
        return {_string_key(key): canonicalize(item) for key, item in value.items()}
    if kind is tuple or kind is list:
        return [canonicalize(item) for item in value]
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return canonicalize(value.value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        # JSON has no NaN/inf; spell them as strings so they still key distinctly.
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, TensorSpec):
        return {"shape": canonicalize(value.shape), "dtype": value.dtype}
    if _is_torch_dtype(value):
        return _dtype_name(value)
    if isinstance(value, Mapping):
        return {_string_key(key): canonicalize(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonicalize(item) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return canonicalize({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if _is_tensor_like(value):
        return canonicalize(TensorSpec.of(value))
    if hasattr(value, "__index__"):  # numpy / torch integer scalars
        return int(value.__index__())
    raise TypeError(
        f"cannot build a stable tuning key from {type(value).__name__} {value!r}; "
        "use JSON scalars, lists, string-keyed dicts, dtypes or tensors"
    )


def canonical_json(value: Any) -> str:
    """The one JSON text for ``value`` (sorted keys, compact, ASCII)."""
    return json.dumps(
        canonicalize(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def stable_digest(value: Any, length: int = _KEY_HEX_CHARS) -> str:
    """Hex sha256 of ``canonical_json(value)``, truncated to ``length`` characters."""
    return hashlib.sha256(canonical_json(value).encode("ascii")).hexdigest()[:length]


def config_from_json(value: Any) -> Any:
    """Undo JSON's list-for-tuple change so configs read back stay hashable."""
    if isinstance(value, list):
        return tuple(config_from_json(item) for item in value)
    if isinstance(value, dict):
        return {key: config_from_json(item) for key, item in value.items()}
    return value


@dataclasses.dataclass(frozen=True, eq=False)
class Invocation:
    """What a config is chosen for.

    Attributes:
        op_id: the kernel or op identity (module-qualified class name).
        version: bumped by the author when a config's meaning changes.
        params: construction-time values: static sizes, dtype, scalar parameters.
        args: abstract inputs (``TensorSpec`` or scalars) when the call has them.
        workload: the representative problem a tuner times on (e.g. ``{"rows": 4096}``).
    """

    op_id: str
    version: str = "1"
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    args: Tuple[Any, ...] = ()
    workload: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_tensors(
        cls,
        op_id: str,
        tensors: Tuple[Any, ...],
        *,
        version: str = "1",
        params: Optional[Mapping[str, Any]] = None,
    ) -> "Invocation":
        """An invocation whose inputs are the abstract shapes and dtypes of ``tensors``."""
        args = tuple(TensorSpec.of(t) if _is_tensor_like(t) else t for t in tensors)
        return cls(op_id, str(version), dict(params or {}), args)

    def describe(self) -> dict:
        """Plain-data form, stored beside cached configs so a person can read them."""
        return canonicalize(
            {
                "op": self.op_id,
                "version": str(self.version),
                "params": self.params,
                "args": self.args,
                "workload": self.workload,
            }
        )

    @functools.cached_property
    def call_key(self) -> str:
        """Stable digest of op, version, params, abstract args and workload."""
        return stable_digest(self.describe())

    @property
    def versioned_op_id(self) -> str:
        return f"{self.op_id}@{self.version}"

    # Equal identities are equal invocations, whatever the mapping order or container type.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Invocation) and other.call_key == self.call_key

    def __hash__(self) -> int:
        return hash(self.call_key)
