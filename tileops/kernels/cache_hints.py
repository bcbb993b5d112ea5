"""16-byte global loads that tell L2 how long to keep their lines.

A program that reads its input twice (partial results, then the output) keeps the
lines of the first read in L2 with ``evict_last`` and lets the second read drop them
with ``evict_first``, so the second read comes from L2 and the output's lines do not
push the input out first.

TileLang has no spelling for these hints, so the loads are device functions in the
kernel's prelude (``CACHE_HINT_PRELUDE``), called with ``T.call_extern`` on the
addresses of a local buffer's vector and of the global vector it copies.

Programs that read their input once (RMSNorm, LayerNorm, the fused residual add, softmax
rows, the elementwise kernels) load it with ``evict_last`` too, but only on calls whose inputs
take ``HINTED_MIN_MIB`` or more.  There the hint let them match or pass torch.compile,
presumably because the lines they write leave L2 first; on calls of 64 and 128 MiB it cost
1.7-8.6 % (H100 figures in each kernel's default config).  The cross-entropy backward, which
reads its logits once too, hints by row length instead (``hinted_min_classes``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["CACHE_HINT_PRELUDE", "EVICT_FIRST", "EVICT_LAST", "HINTED_BYTES", "HINTED_MIN_MIB", "hinted_load",
           "hinted_min_bytes", "takes_hint", "vector_load"]

EVICT_FIRST = "evict_first"
EVICT_LAST = "evict_last"
# The width of a hinted load: narrower vectors load without a hint.
HINTED_BYTES = 16
# Single-read programs hint calls whose inputs take this many MiB or more (see above): on the
# H100 the hint lost at 128 MiB and gained at 192 MiB.
HINTED_MIN_MIB = 160

CACHE_HINT_PRELUDE = r"""
#define TILEOPS_HINTED_LOAD(POLICY)                                                              \
__device__ __forceinline__ void tileops_load_##POLICY(void* dst, const void* src) {             \
  unsigned long long policy;                                                                     \
  asm("createpolicy.fractional.L2::" #POLICY ".b64 %0, 1.0;" : "=l"(policy));                   \
  uint4 v;                                                                                       \
  asm("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"             \
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src), "l"(policy));                     \
  *reinterpret_cast<uint4*>(dst) = v;                                                            \
}
TILEOPS_HINTED_LOAD(evict_first)
TILEOPS_HINTED_LOAD(evict_last)
#undef TILEOPS_HINTED_LOAD
"""


def takes_hint(policy: Optional[str], vector: int, dtype: str) -> bool:
    """Whether loads of ``vector`` elements of ``dtype`` (TileLang's name) carry ``policy`` (None: no hint)."""
    if policy not in (None, EVICT_FIRST, EVICT_LAST):
        raise ValueError(f"cache hints: unknown policy {policy!r}; expected {EVICT_FIRST!r} or {EVICT_LAST!r}")
    return policy is not None and vector * getattr(torch, dtype).itemsize == HINTED_BYTES


def hinted_min_bytes(min_mib: int) -> int:
    """The input bytes from which a single-read program's call is hinted, for a config's
    ``hinted_min_mib`` (the one rule every such kernel applies: a call whose inputs, all together,
    take this many bytes or more)."""
    return min_mib << 20


def hinted_load(T: Any, policy: str, dst: Any, src: Any) -> Any:
    """The call that copies the 16 bytes at ``src`` (a global element) to ``dst`` (a local element)."""
    return T.call_extern("handle", f"tileops_load_{policy}", T.address_of(dst), T.address_of(src))


def vector_load(T: Any, policy: Optional[str], vector: int, dtype: str) -> Any:
    """A macro ``load(buf, start, src, *index)`` copying the ``vector`` elements of ``src`` from
    ``index`` on (along its last, unit-stride axis) to ``buf[start:]``: one load with ``policy``
    where ``takes_hint``, else a plain vectorized copy."""
    hinted = takes_hint(policy, vector, dtype)

    @T.macro
    def load(buf, start, src, *index):
        if hinted:
            hinted_load(T, policy, buf[start], src[index])
        else:
            for k in T.vectorized(vector):
                buf[start + k] = src[(*index[:-1], index[-1] + k)]

    return load
