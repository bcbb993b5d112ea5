"""Rows that no 16-byte access can start, read and written in aligned windows.

A row of ``N`` elements, ``N`` not a multiple of a 16-byte vector (GPT-2's 50257 classes, a
row of 127), starts on a 16-byte boundary only every few rows.  Read as they lie, such rows
take accesses of one or two elements, and a thread has too few bytes in flight to keep the
memory busy.  The windowed programs instead see the tensor as one flat run of memory and cut
it into aligned windows of ``vector`` elements: window ``w`` of a row holds its columns
``w * vector - skew`` on, ``skew`` being how far the row starts into its first window.
Windows wholly inside the row are one 16-byte access; the first and last are read element by
element, their elements outside the row left out (and never written).

Tensors that a program reads and writes in windows must agree on every row's skew: their
starts aligned to ``vector`` elements and their row strides equal modulo ``vector``.
"""

# No ``from __future__ import annotations``: TileLang evaluates the annotations of macros.
from typing import Any, Optional, Tuple

import torch

from tileops.kernels.cache_hints import vector_load
from tileops.kernels.sizes import ACCUM, max_vector

__all__ = ["flat_rows", "window_count", "window_macros", "windowed_rows"]


def flat_rows(rows: torch.Tensor) -> torch.Tensor:
    """The elements of ``rows`` (2-D, unit-stride rows) from the first row's start to the last
    row's end, as one 1-D view (the gaps between rows included)."""
    count, width = rows.shape
    return rows.as_strided(((count - 1) * rows.stride(0) + width,), (1,))


def windowed_rows(N: int, dtype: torch.dtype) -> bool:
    """Whether rows of ``N`` elements take the windowed programs: some row start is not 16-byte aligned."""
    return N % max_vector(dtype) != 0


def window_count(N: int, vector: int) -> int:
    """Windows that cover a row of ``N`` elements whatever its skew."""
    return -(-(N + vector - 1) // vector)


def window_macros(T: Any, N: int, vector: int, dtype: str, policy: Optional[str] = None,
                  fill_zero: bool = False) -> Tuple[Any, Any]:
    """Macros ``(load, store)`` of one window ``w`` of a row whose first window is ``first`` (an
    element index over ``vector``) and whose skew is ``skew``.

    ``load(a, offset, X, first, w, skew)`` fills ``a[offset:offset + vector]`` from the flat
    ``X``: -inf outside the row (0 with ``fill_zero``), whole windows loaded with L2
    ``policy``.  ``store(G, a, offset, first, w, skew)`` writes the row's elements of the window
    from ``a`` to the flat ``G``; windows past the row's end load only the fill and store nothing."""
    load_vector = vector_load(T, policy, vector, dtype)

    def fill() -> Any:
        return T.cast(0, dtype) if fill_zero else T.cast(-T.infinity(ACCUM), dtype)

    @T.macro
    def load(a, offset, X, first, w, skew):
        c0 = w * vector - skew
        if T.And(c0 >= 0, c0 + vector <= N):
            load_vector(a, offset, X, (first + w) * vector)
        else:
            for k in T.unroll(vector):
                a[offset + k] = T.if_then_else(T.And(c0 + k >= 0, c0 + k < N), X[(first + w) * vector + k], fill())

    @T.macro
    def store(G, a, offset, first, w, skew):
        c0 = w * vector - skew
        if T.And(c0 >= 0, c0 + vector <= N):
            for k in T.vectorized(vector):
                G[(first + w) * vector + k] = a[offset + k]
        else:
            for k in T.unroll(vector):
                if T.And(c0 + k >= 0, c0 + k < N):
                    G[(first + w) * vector + k] = a[offset + k]

    return load, store
