// Thread-block clusters (sm_90): the few PTX instructions a kernel needs to let the CTAs of a
// cluster write into each other's shared memory and signal each other's mbarriers.
//
// Addresses of another CTA's shared memory are 32-bit `.shared::cluster` addresses obtained with
// map_to_cta(); the same byte offset maps to the same variable in every CTA of the cluster when
// they run the same kernel.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace dsv4::cuda::ptx {

// This CTA's rank in its cluster (0 .. cluster size − 1).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// The `.shared::cluster` address of the byte at local shared-memory pointer `p`, in CTA `rank`.
__device__ __forceinline__ uint32_t map_to_cta(const void* p, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(smem_addr(p)), "r"(rank));
  return out;
}

// Every thread of every CTA of the cluster arrives and waits: this thread's earlier memory
// operations are released to, and everyone else's acquired from, the whole cluster. Needed once
// after mbarrier init (before any remote arrival) and once before exit (no CTA may leave while
// a peer can still write its shared memory). All threads of each warp must execute it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n\t"
      "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// One arrival on an mbarrier of another CTA, for a consumer handing a buffer back to the peer's
// producer (default semantics, as CUTLASS's cluster pipelines release a remote stage). The
// ordering it must give is write-after-read: the buffer's reads — by wgmma, complete once
// wgmma.wait_group returned — precede the peer's next writes. Completed reads cannot see later
// writes, so no cluster-scope release is needed; `.release.cluster` compiled to a GPU-wide
// MEMBAR + ERRBAR per arrival on the consumers' path (docs/notes/decode.md).
__device__ __forceinline__ void mbarrier_arrive_remote(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) of this CTA's shared memory at `src`
// copied by the TMA unit into another CTA's shared memory at `cluster_dst`, completing as
// transaction bytes on that CTA's mbarrier `cluster_bar` (whose phase must expect them through
// mbarrier_arrive_expect_tx). The source is read by the async proxy: writes to it must be made
// visible first (fence_proxy_async_smem, then a barrier with the issuing thread), and it must not
// be rewritten before the destination's barrier has completed.
__device__ __forceinline__ void bulk_copy_to_cta(uint32_t cluster_dst, const void* src, uint32_t bytes,
                                                 uint32_t cluster_bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          cluster_dst),
      "r"(smem_addr(src)), "r"(bytes), "r"(cluster_bar)
      : "memory");
}

}  // namespace dsv4::cuda::ptx
