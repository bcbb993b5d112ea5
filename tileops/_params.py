"""The manifest's param types: which values each accepts, and the value an op keeps.

The loader checks manifest defaults with these rules and every generated ``__init__``
checks its arguments with them, so a type means the same thing in both places.  Pure
Python, no torch import, so the generator can use it too.

Sequence types read a single int as a one-element sequence, as PyTorch's ``int[1]``
arguments do (``torch.sum(x, dim=-1)``), and are kept as tuples: an op's params are
part of its identity (shared instances, kernel caches) and must not change after
construction.  As in PyTorch, an int may be any integer type (a NumPy integer) and a
float any real one; the op keeps them as Python ``int`` and ``float``, which the custom
ops' schemas and the kernels take.
"""

from __future__ import annotations

import numbers
import operator
from typing import Any, Dict

__all__ = ["DTYPE_NAMES", "PARAM_TYPES", "ParamTypeError", "accepts", "annotation", "described", "is_int",
           "normalized"]

# The names a dtype param may be given by (a manifest workload's ``out_dtype: float32``); an op
# keeps the torch.dtype.
DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")

# type name -> how an error describes the values it accepts
PARAM_TYPES: Dict[str, str] = {
    "int": "an int",
    "float": "a float",
    "bool": "a bool",
    "str": "a str",
    "Optional[int]": "an int or None",
    "Optional[float]": "a float or None",
    "Optional[str]": "a str or None",
    "Sequence[int]": "an int or a sequence of ints",
    "Optional[Sequence[int]]": "an int, a sequence of ints or None",
    "Optional[dtype]": "a torch.dtype, the name of a floating-point one, or None",
}


# type name -> the annotation generated code gives it, where the name alone would mislead: a
# sequence type takes a single int too.
_ANNOTATIONS: Dict[str, str] = {
    "Sequence[int]": "Union[int, Sequence[int]]",
    "Optional[Sequence[int]]": "Optional[Union[int, Sequence[int]]]",
    "Optional[dtype]": "Optional[torch.dtype]",
}


def annotation(type_name: str) -> str:
    """The Python annotation of a param of manifest type ``type_name`` in generated code."""
    _base(type_name)  # an unknown type is an error here too
    return _ANNOTATIONS.get(type_name, type_name)


class ParamTypeError(TypeError):
    """A param value outside its manifest type."""


def is_int(value: Any) -> bool:
    """An integer of any integer type (``int``, a NumPy integer), but no bool: bool is an int
    subclass, but True as an axis or a count is a mistake."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _accepts_base(base: str, value: Any) -> bool:
    if base == "int":
        return is_int(value)
    if base == "float":
        return _is_real(value)
    if base == "bool":
        return isinstance(value, bool)
    if base == "str":
        return isinstance(value, str)
    if base == "dtype":  # known by its type's name: this module imports no torch
        return (type(value).__name__ == "dtype" and type(value).__module__ == "torch") or value in DTYPE_NAMES
    if base == "Sequence[int]":
        return is_int(value) or (isinstance(value, (list, tuple)) and all(is_int(v) for v in value))
    raise KeyError(base)


def _plain(base: str, value: Any) -> Any:
    """``value`` of an accepted ``base`` type as plain Python (``int``, ``float``, a tuple of ints)."""
    if base == "int":
        return operator.index(value)
    if base == "float":
        return operator.index(value) if is_int(value) else float(value)
    if base == "Sequence[int]":
        return (operator.index(value),) if is_int(value) else tuple(operator.index(v) for v in value)
    return value


def _base(type_name: str) -> "tuple[str, bool]":
    if type_name not in PARAM_TYPES:
        raise KeyError(f"unknown param type {type_name!r}; known: {', '.join(PARAM_TYPES)}")
    if type_name.startswith("Optional[") and type_name.endswith("]"):
        return type_name[len("Optional["):-1], True
    return type_name, False


def accepts(type_name: str, value: Any) -> bool:
    """Whether ``value`` is a value of the manifest param type ``type_name``."""
    base, optional = _base(type_name)
    return (optional and value is None) or _accepts_base(base, value)


def described(value: Any) -> str:
    """``value`` as an error shows what came: its repr and type, or for an array of one or more
    dims (a tensor passed where a number belongs) its type, shape and dtype, whose repr would
    print the values."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None and len(shape) > 0:
        return f"a {type(value).__name__} of shape {tuple(shape)} and dtype {dtype}"
    return f"{value!r} ({type(value).__name__})"


def normalized(type_name: str, value: Any) -> Any:
    """``value`` as an op keeps it (plain Python numbers, sequences as tuples, a single int as a
    one-element tuple); ``ParamTypeError`` if it is not of the type."""
    if not accepts(type_name, value):
        raise ParamTypeError(f"must be {PARAM_TYPES[type_name]}, got {described(value)}")
    base, _ = _base(type_name)
    return None if value is None else _plain(base, value)
