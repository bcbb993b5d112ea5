"""bfloat16 elements of a local buffer widened to float32 with one integer instruction each.

A bfloat16 is the high half of the float32 it widens to.  The conversions TileLang's CUDA calls
(cutlass's scalar one, CUDA's ``__bfloat1622float2``) first unpack the 16-bit value from the
32-bit register that holds two of them, so an element in a high half takes a ``PRMT`` and a
shift.  ``tileops_bf16_at`` reads the element's whole word instead: ``w << 16`` for the low
element, ``w & 0xffff0000`` for the high one (the buffers are little-endian, element 2k in the low
half of word k).  Indices must be constants once the loops are unrolled, as they are where the
kernels use it; a runtime index would put the buffer in local memory.
"""

from typing import Any

__all__ = ["BF16_WIDEN_PRELUDE", "to_float32"]

BF16_WIDEN = "tileops_bf16_at"
BF16_WIDEN_PRELUDE = r"""
__device__ __forceinline__ float tileops_bf16_at(const void* buffer, int index) {
  const unsigned int word = reinterpret_cast<const unsigned int*>(buffer)[index >> 1];
  return __uint_as_float((index & 1) ? (word & 0xffff0000u) : (word << 16));
}
"""


def widens_by_word(value: Any) -> bool:
    """Whether ``value`` is an element of a one-axis local bfloat16 buffer (a buffer load: it has
    ``buffer`` and ``indices``)."""
    buffer, indices = getattr(value, "buffer", None), getattr(value, "indices", None)
    return (buffer is not None and indices is not None and len(indices) == 1
            and str(buffer.dtype) == "bfloat16" and buffer.scope() == "local")


def to_float32(T: Any, value: Any) -> Any:
    """``value`` in float32: local bfloat16 elements through ``BF16_WIDEN_PRELUDE``'s function (the
    kernel must name that prelude), anything else by a plain cast."""
    if widens_by_word(value):
        return T.call_extern("float32", BF16_WIDEN, T.address_of(value.buffer[0]), value.indices[0])
    return T.cast(value, "float32")
