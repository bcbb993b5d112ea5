"""Contiguous global -> shared copies that run while the block computes (sm_90's bulk copy).

A block that holds one row in registers and spends a while on it (a block-wide sum, an exchange
across a cluster) leaves its SM's memory idle unless the next row is already on its way.  When
the registers are full, the next row can land in shared memory instead: one thread starts a
bulk copy (``cp.async.bulk``, the copy engine of the Hopper SM) of each contiguous slice, which
counts its bytes on an mbarrier; the block waits on that barrier when it reaches the row.

TileLang's ``T.tma_copy`` splits such a copy into 256-element boxes of a tensor map built on the
host; a bulk copy takes the whole slice in one instruction and needs no descriptor, so the
copies are device functions in the kernel's prelude (``BULK_COPY_PRELUDE``), called with
``T.call_extern`` on the addresses of the first elements.

Both addresses and the size must be multiples of 16 bytes.  A block reading the shared buffer
must order every thread's reads before the next copy into it (a block barrier), and must wait for
every copy it started before it exits.
"""

from typing import Any

__all__ = ["BULK_COPY_PRELUDE", "arrive_expecting", "bulk_load"]

BULK_COPY_PRELUDE = r"""
__device__ __forceinline__ void tileops_arrive_expecting(void* barrier, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"((unsigned)__cvta_generic_to_shared(barrier)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tileops_bulk_load(void* dst, const void* src, long long src_offset, void* barrier,
                                                  unsigned bytes) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"((const char*)src + src_offset), "r"(bytes),
                  "r"((unsigned)__cvta_generic_to_shared(barrier)) : "memory");
}
"""


def arrive_expecting(T: Any, barrier: Any, nbytes: int) -> Any:
    """One thread's arrival on ``barrier`` (an element of ``T.alloc_barrier``), which then also waits
    for ``nbytes`` bytes of bulk copies; call it before starting them."""
    return T.call_extern("handle", "tileops_arrive_expecting", T.address_of(barrier), nbytes)


def bulk_load(T: Any, dst: Any, src: Any, barrier: Any, nbytes: int, src_offset: Any = 0) -> Any:
    """Copy ``nbytes`` bytes from ``src_offset`` bytes past global element ``src`` on to shared element
    ``dst`` on, counted on ``barrier``.  (The offset reaches an element whose own index expression
    TileLang cannot take the address of: the start of a row of 2**15 elements, say.)"""
    return T.call_extern("handle", "tileops_bulk_load", T.address_of(dst), T.address_of(src),
                         T.cast(src_offset, "int64"), T.address_of(barrier), nbytes)
