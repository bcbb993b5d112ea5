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
must order every thread's reads before the next copy into it: a block barrier, or an mbarrier
every reader arrives on once it has read, which the copying thread waits on and follows with
``T.fence_proxy_async()`` (the reads go through the generic proxy, the copy through the async
one; the norm backwards' ``cluster_stage_early``).  It must wait for every copy it started
before it exits.

Blocks of a cluster swap a few values (their shares of a row's sums) the same way, counted on the
receiver's mbarrier: ``send`` stores two or four floats from the sender's registers straight into a
peer's shared memory (``st.async``).  A bulk copy would need them in the sender's shared memory
first, and the block barriers that order that write before the copy stall every warp of the block.
"""

from typing import Any

__all__ = ["BULK_COPY_PRELUDE", "CLUSTER_SEND_PRELUDE", "arrive_expecting", "bulk_load", "send"]

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

CLUSTER_SEND_PRELUDE = r"""
__device__ __forceinline__ void tileops_peer_addresses(void* slot, void* barrier, int peer, unsigned& remote_slot,
                                                       unsigned& remote_barrier, unsigned bytes) {
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote_slot) : "r"((unsigned)__cvta_generic_to_shared(slot)), "r"(peer));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote_barrier) : "r"((unsigned)__cvta_generic_to_shared(barrier)), "r"(peer));
  // The arrival announces the bytes; the phase completes once the store has landed, in either order.
  asm volatile("mbarrier.arrive.expect_tx.shared::cluster.b64 _, [%0], %1;" :: "r"(remote_barrier), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void tileops_send_two(void* slot, void* barrier, int peer, float a, float b) {
  unsigned remote_slot, remote_barrier;
  tileops_peer_addresses(slot, barrier, peer, remote_slot, remote_barrier, 8);
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];"
               :: "r"(remote_slot), "r"(__float_as_uint(a)), "r"(__float_as_uint(b)), "r"(remote_barrier)
               : "memory");
}
__device__ __forceinline__ void tileops_send_four(void* slot, void* barrier, int peer, float a, float b, float c,
                                                  float d) {
  unsigned remote_slot, remote_barrier;
  tileops_peer_addresses(slot, barrier, peer, remote_slot, remote_barrier, 16);
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
               :: "r"(remote_slot), "r"(__float_as_uint(a)), "r"(__float_as_uint(b)), "r"(__float_as_uint(c)),
                  "r"(__float_as_uint(d)), "r"(remote_barrier) : "memory");
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


def send(T: Any, slot: Any, barrier: Any, peer: Any, values: Any) -> Any:
    """Store the two or four float32 ``values`` at shared element ``slot`` (aligned to their size) of
    block ``peer`` of the cluster, with one arrival on that block's ``barrier`` (the same element of
    its ``T.alloc_cluster_barrier``) that expects their bytes."""
    name = {2: "tileops_send_two", 4: "tileops_send_four"}[len(values)]
    return T.call_extern("handle", name, T.address_of(slot), T.address_of(barrier), peer, *values)
