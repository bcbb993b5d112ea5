"""bfloat16 elements of a local buffer widened to float32 with one integer instruction each.

A bfloat16 is the high half of the float32 it widens to.  The conversions TileLang's CUDA calls
(cutlass's scalar one, CUDA's ``__bfloat1622float2``) first unpack the 16-bit value from the
32-bit register that holds two of them, so an element in a high half takes a ``PRMT`` and a
shift.  ``tileops_bf16_at`` reads the element's whole word instead: ``w << 16`` for the low
element, ``w & 0xffff0000`` for the high one (the buffers are little-endian, element 2k in the low
half of word k).  Indices must be constants once the loops are unrolled, as they are where the
kernels use it; a runtime index would put the buffer in local memory.

It pays where a program's instructions, not its memory, set the pace: the norm backwards
(``NormBwdKernel.widening_pays``).  The norm forwards, at copy bandwidth already, ran no faster
with it (H200, bf16, RMSNorm 8192 x 32768 259.8 µs either way).
"""

from typing import Any, Callable, Optional

__all__ = ["BF16_PAIR_MAX_PRELUDE", "BF16_WIDEN_PRELUDE", "float32_of", "pair_max", "pair_max_init", "larger_of_pair",
           "to_float32", "widening_prelude"]

BF16_WIDEN = "tileops_bf16_at"
BF16_WIDEN_PRELUDE = r"""
__device__ __forceinline__ float tileops_bf16_at(const void* buffer, int index) {
  const unsigned int word = reinterpret_cast<const unsigned int*>(buffer)[index >> 1];
  return __uint_as_float((index & 1) ? (word & 0xffff0000u) : (word << 16));
}
"""


# The maximum of bfloat16 elements two at a time: ``max.bf16x2`` on the words that hold them, then
# the larger half of the running pair widened once.  Half the instructions of widening every
# element first, where a program's instructions set its pace (the softmax's held rows).
BF16_PAIR_MAX_PRELUDE = r"""
__device__ __forceinline__ unsigned int tileops_bf16x2_max(unsigned int running, const void* buffer, int pair) {
  unsigned int result;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(result) : "r"(running), "r"(reinterpret_cast<const unsigned int*>(buffer)[pair]));
  return result;
}
__device__ __forceinline__ float tileops_bf16x2_larger(unsigned int pair) {
  return fmaxf(__uint_as_float(pair << 16), __uint_as_float(pair & 0xffff0000u));
}
"""
# Two bfloat16 -inf: the running pair before any element.
_BF16_PAIR_NEG_INF = 0xFF80FF80


def pair_max_init(T: Any) -> Any:
    return T.uint32(_BF16_PAIR_NEG_INF)


def pair_max(T: Any, running: Any, buffer: Any, pair: int) -> Any:
    """``running`` (a pair of bfloat16 in a uint32) against the pair of elements ``2 * pair`` and
    ``2 * pair + 1`` of the local bfloat16 ``buffer`` (``BF16_PAIR_MAX_PRELUDE``)."""
    return T.call_extern("uint32", "tileops_bf16x2_max", running, T.address_of(buffer[0]), pair)


def larger_of_pair(T: Any, running: Any) -> Any:
    """The larger of a running pair's two bfloat16 values, in float32."""
    return T.call_extern("float32", "tileops_bf16x2_larger", running)


def _is_local_bfloat16_element(value: Any) -> bool:
    """Whether ``value`` is an element of a one-axis local bfloat16 buffer (a buffer load: it has
    ``buffer`` and ``indices``)."""
    buffer, indices = getattr(value, "buffer", None), getattr(value, "indices", None)
    return (buffer is not None and indices is not None and len(indices) == 1
            and str(buffer.dtype) == "bfloat16" and buffer.scope() == "local")


def to_float32(T: Any, value: Any) -> Any:
    """``value`` in float32: local bfloat16 elements through ``BF16_WIDEN_PRELUDE``'s function (the
    kernel must take ``widening_prelude``), anything else by a plain cast."""
    if _is_local_bfloat16_element(value):
        return T.call_extern("float32", BF16_WIDEN, T.address_of(value.buffer[0]), value.indices[0])
    return T.cast(value, "float32")


def widening_prelude(widen: bool, prelude: Optional[str] = None) -> Optional[str]:
    """A kernel's ``prelude`` (None: none) with ``BF16_WIDEN_PRELUDE`` ahead of it when ``widen``."""
    if not widen:
        return prelude
    return BF16_WIDEN_PRELUDE + (prelude or "")


def float32_of(T: Any, widen: bool) -> Callable[[Any], Any]:
    """The float32 conversion of a program's elements: ``to_float32`` when it ``widen``s (its kernel
    taking ``widening_prelude``), else a plain cast."""
    if widen:
        return lambda value: to_float32(T, value)
    return lambda value: T.cast(value, "float32")
