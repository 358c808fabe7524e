// The sparse decode kernel (split-KV), templated on the cache layout and the cluster size: the FP8
// layouts (MODEL1, V3.2, per-tensor) are dequantized by the producer, BF16 rows are copied as is
// (by cp.async without a cluster: produce_by_copy).
//
// Per CTA: one query token row, 64 heads, one split of the index list; 2 consumer warpgroups
// and the producer's (warpgroups 2 and 3 without a cluster, 2 in one: config.h), per tile of 64
// index slots (with a cluster of two CTAs, this CTA's half of them):
//   gather  — each slot's bytes (fp8 nope, scales, bf16 rope) are loaded from the paged cache
//             into registers (16-byte loads whose L2 misses fetch 256 bytes) one or two tiles
//             ahead of their use (kProducerBuffers), and no index read is waited on before the
//             tile that needs it;
//   dequant — fp8 · scale → bf16 (exact) into one of two K-major SW128 KV stages in shared memory
//             (mbarriers full/empty), which is K for S = Q·Kᵀ and, through its first 512
//             columns, V; in a cluster each warp's converted rows are then copied into the peer
//             CTA's stage by the TMA unit (counted as transaction bytes on the peer's `full`
//             barrier).
// Consumers, per tile:
//   warpgroup 0 — S = Q·Kᵀ for 64 heads × 64 keys (wgmma, Q and K in shared memory); online
//             softmax in base 2 (logits pre-multiplied by scale·log2 e; the reference max
//             moves lazily, so most tiles skip both warpgroups' O rescale); P (bf16) and the
//             tile's O factor go to shared memory for warpgroup 1; O[:, 0:256] += P·V with P
//             from registers;
//   warpgroup 1 — O[:, 256:512] += P·V with P from shared memory; while it multiplies tile t,
//             warpgroup 0 already computes S of tile t+1 (the tensor cores never wait on a
//             softmax of the other warpgroup).
// The producer fills stage t+1 while the consumers multiply stage t.
#pragma once

#if !defined(DSV4_HAVE_CUTLASS)
#error "the sparse decode kernel needs CuTe (third_party/cutlass)"
#endif

#include "cuda/attention/sparse_decode/config.h"
#include "cuda/attention/sparse_decode/consumer.cuh"
#include "cuda/attention/sparse_decode/producer.cuh"
#include "cuda/attention/sparse_decode/trace.cuh"
#include "cuda/attention/sparse_decode/work.cuh"
#include "cuda/common/cluster.cuh"
#include "cuda/common/kernel_trace.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/per_device_once.h"
#include "cuda/common/ptx.cuh"

namespace dsv4::cuda::decode {

template <KvLayout L, int kCluster>
__global__ void __launch_bounds__(kThreads<kCluster>, 1) sparse_decode_kernel(const __grid_constant__ DecodeParams p) {
  grid_dependency_entry();
  extern __shared__ __align__(1024) uint8_t smem[];
  SharedPlan<L>& plan = *reinterpret_cast<SharedPlan<L>*>(smem);
  if (threadIdx.x == 0) DSV4_TRACE(detail::trace_cta(), trace::kOnceRow, 0);
  int* const order_scratch = reinterpret_cast<int*>(plan.p);
  const bool ordered = detail::orders_rows(p);
  if (ordered) detail::choose_row(p, order_scratch);

  if (threadIdx.x == 0) {
    // Every producer thread arrives (twice when it copies: its flags, then its landed copies).
    constexpr uint32_t kFullArrivals = kProducerThreads<kCluster> * (kCopiedRows<L, kCluster> ? 2 : 1);
    ptx::mbarrier_init(&plan.full[0], kFullArrivals);
    ptx::mbarrier_init(&plan.full[1], kFullArrivals);
    ptx::mbarrier_init(&plan.empty[0], 8 * kCluster);     // every consumer warp of the cluster
    ptx::mbarrier_init(&plan.empty[1], 8 * kCluster);
    ptx::mbarrier_init(&plan.p_ready, 128);               // warpgroup 0's threads
    ptx::mbarrier_init(&plan.p_free, 128);                // warpgroup 1's threads
    ptx::fence_barrier_init();
  }
  // The last block-wide barrier (cluster-wide: the peer arrives on these barriers): the roles
  // below sync among themselves.
  if constexpr (kCluster == 2) ptx::cluster_sync(); else __syncthreads();
  if (threadIdx.x == 0) DSV4_TRACE(detail::trace_cta(), trace::kOnceRow, 1);
  detail::CtaWork w;
  const int num_head_blocks = (p.num_heads + kHeadsPerCta - 1) / kHeadsPerCta;
  w.head_block = blockIdx.x % num_head_blocks;
  w.split = blockIdx.x / num_head_blocks;
  w.row = ordered ? detail::chosen_row(p, order_scratch) : static_cast<int>(blockIdx.y);
  w.batch = w.row / p.s_q;
  w.seq = w.row - w.batch * p.s_q;
  w.split_begin = w.split * p.split_len;
  w.len = detail::row_lengths(p, w.batch);
  w.split_end = min(w.split_begin + p.split_len, w.len.total());
  w.num_tiles = w.split_end > w.split_begin ? (w.split_end - w.split_begin + kTileKeys - 1) / kTileKeys : 0;
  w.rank = kCluster == 2 ? static_cast<int>(ptx::cluster_ctarank()) : 0;
  const uint32_t peer_empty = kCluster == 2 ? ptx::map_to_cta(&plan.empty[0], 1 - w.rank) : 0u;
  if (threadIdx.x >= kConsumerThreads) {
    constexpr uint32_t kRegs = kProducerRegs<kCluster>;
    ptx::warpgroup_regs_decrease<kRegs>();
    if constexpr (kCopiedRows<L, kCluster>) {
      detail::produce_by_copy<L>(p, w, plan);
    } else {
      detail::produce<L, kCluster>(p, w, plan);
    }
  } else if (threadIdx.x >= 128) {
    // From the launch's 168 registers (a cluster CTA) down, or from 128 (512 threads) up.
    if constexpr (kCluster == 1) ptx::warpgroup_regs_increase<kPvRegs>();
    else ptx::warpgroup_regs_decrease<kPvRegs>();
    detail::consume_pv<L, kCluster>(p, w, plan, peer_empty);
  } else {
    ptx::warpgroup_regs_increase<kSoftmaxRegs>();
    detail::consume_softmax<L, kCluster>(p, w, plan, peer_empty);
  }
  // No CTA of a cluster exits while its peer may still write its stages or arrive on its barriers.
  if constexpr (kCluster == 2) ptx::cluster_sync();
}

namespace detail {
template <KvLayout L, int kCluster>
void launch_with_cluster(const DecodeParams& params, cudaStream_t stream) {
  constexpr int kSmem = kSmemBytes<L>;
  static PerDeviceOnce smem_opt_in;
  opt_in_dynamic_smem(smem_opt_in, sparse_decode_kernel<L, kCluster>, kSmem, "sparse_decode");
  const int num_head_blocks = (params.num_heads + kHeadsPerCta - 1) / kHeadsPerCta;
  const LaunchShape shape{dim3(num_head_blocks * params.num_splits, params.num_rows), dim3(kThreads<kCluster>), kSmem,
                          kCluster};
  launch_kernel("sparse_decode", sparse_decode_kernel<L, kCluster>, shape, stream, params);
  DSV4_TRACE_DUMP(stream);
}
}  // namespace detail

// Head blocks in pairs (H 128, 256, ...): adjacent CTAs of a split (head blocks 2k, 2k+1) form a
// cluster and share the gather (and the conversion). Otherwise each CTA gathers its own tiles.
template <KvLayout L>
void launch_sparse_decode(const DecodeParams& params, cudaStream_t stream) {
  const int num_head_blocks = (params.num_heads + kHeadsPerCta - 1) / kHeadsPerCta;
  if (num_head_blocks % 2 == 0) {
    detail::launch_with_cluster<L, 2>(params, stream);
  } else {
    detail::launch_with_cluster<L, 1>(params, stream);
  }
}

}  // namespace dsv4::cuda::decode
