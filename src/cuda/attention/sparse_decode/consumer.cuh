// The sparse decode kernel's consumer warpgroups (kernel.cuh): Q into shared memory, then per
// tile S, the online softmax and O's first value half (warpgroup 0: consume_softmax) and O's
// second half from the published P (warpgroup 1: consume_pv); each ends by storing its O half
// (out_rows.cuh).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/attention/sparse_decode/config.h"
#include "cuda/attention/sparse_decode/out_rows.cuh"
#include "cuda/attention/sparse_decode/trace.cuh"
#include "cuda/attention/sparse_decode/work.cuh"
#include "cuda/common/attention_tile.cuh"
#include "cuda/common/cluster.cuh"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/fp8_convert.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/wgmma.cuh"
#include "math/softmax_scale.h"

namespace dsv4::cuda::decode::detail {

// ---- the products of a tile (MmaS, MmaPvRegs, MmaPvSmem: attention_tile.cuh) ----------------
// A CTA of its own launches 512 threads (two producer warpgroups), at most 128 registers each
// until setmaxnreg: its P·V products go as 64×128 instructions (the same fragments).
template <int kCluster>
using PvRegs = std::conditional_t<kCluster == 1, MmaPvRegsN128, MmaPvRegs>;
template <int kCluster>
using PvSmem = std::conditional_t<kCluster == 1, MmaPvSmemN128, MmaPvSmem>;
// Q (64 heads × d_qk) and a whole KV stage (64 keys × d_qk), K-major.
template <int kRows, KvLayout L>
__device__ __forceinline__ auto k_major_tile(const uint8_t* bytes) {
  using namespace cute;
  return make_tensor(make_smem_ptr(reinterpret_cast<const bf16_t*>(bytes)),
                     SmemTileK<kRows, LayoutTraits<L>::kDqk>{});
}
// Value dims [256·half, +256) of a stage, read MN-major (K = V: the same bytes as the keys).
__device__ __forceinline__ auto v_half(const uint8_t* stage, int half) {
  using namespace cute;
  return make_tensor(make_smem_ptr(reinterpret_cast<const bf16_t*>(stage + half * 4 * kTileKeys * 128)),
                     SmemTileKTransposed<kTileKeys, kDv / 2>{});
}

// Both consumer warpgroups: Q rows of this head block (zero rows past H) into shared memory, in
// the same tile layout as the KV stages, as bf16 whatever q's dtype: bf16 rows are copied by
// cp.async; an FP8 q's 8 codes of each 16-byte bf16 chunk are loaded (8 bytes, aligned: q rows
// start 16-byte aligned) and converted to the query they mean, bf16(fp8 · q_scale) — the CPU
// twin's and the insert's rule — so the products are unchanged.
template <KvLayout L>
__device__ __forceinline__ void load_q(const DecodeParams& p, const CtaWork& w, uint8_t* q_tile) {
  constexpr int kChunks = LayoutTraits<L>::kDqk / 8;
  const int64_t row = p.q_strides.row_offset(w.batch, w.seq);
  if (p.q_fp8) {
    const uint8_t* q_row = static_cast<const uint8_t*>(p.q) + row;
    for (int i = threadIdx.x; i < kHeadsPerCta * kChunks; i += kConsumerThreads) {
      const int r = i / kChunks, c = i - r * kChunks;
      const int h = w.head_block * kHeadsPerCta + r;
      uint4 chunk = make_uint4(0u, 0u, 0u, 0u);
      if (h < p.num_heads) {
        const uint2 codes = __ldg(reinterpret_cast<const uint2*>(q_row + static_cast<int64_t>(h) * p.q_strides.h + c * 8));
        chunk = fp8x8_to_bf16x8_scaled(codes, p.q_scale);
      }
      *reinterpret_cast<uint4*>(q_tile + sw128_chunk_offset<kHeadsPerCta>(r, c)) = chunk;
    }
  } else {
    const uint16_t* q_row = static_cast<const uint16_t*>(p.q) + row;
    for (int i = threadIdx.x; i < kHeadsPerCta * kChunks; i += kConsumerThreads) {
      const int r = i / kChunks, c = i - r * kChunks;
      const int h = w.head_block * kHeadsPerCta + r;
      const bool ok = h < p.num_heads;
      const uint16_t* src = q_row + static_cast<int64_t>(ok ? h : 0) * p.q_strides.h + c * 8;
      ptx::cp_async_16_zfill(q_tile + sw128_chunk_offset<kHeadsPerCta>(r, c), src, ok);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
  }
  ptx::fence_proxy_async_smem();  // Q is read by wgmma (the FP8 path's plain stores included)
  ptx::named_barrier_sync(kBarConsumers, kConsumerThreads);
}

// A consumer waits for stage t%2, about to be read by wgmma (async proxy). Rows stored by the
// producer's threads were fenced to the async proxy by their writers before they arrived (as
// CUTLASS orders thread-written wgmma operands), and a cluster peer's half arrives by bulk copy,
// itself async proxy: no fence is needed here. Rows copied by cp.async (kCopiedRows) land without
// a writer-side fence, so their readers fence after the wait.
template <KvLayout L, int kCluster>
__device__ __forceinline__ const uint8_t* wait_stage(SharedPlan<L>& plan, int t) {
  ptx::mbarrier_wait(&plan.full[t & 1], (t >> 1) & 1);
  if constexpr (kCopiedRows<L, kCluster>) ptx::fence_proxy_async_smem();
  return plan.kv[t & 1];
}

// A consumer warp is done with stage t%2 (its wgmma reads completed): one arrival per warp on
// the stage's `empty` barrier of this CTA and, in a cluster, of the peer (whose producer also
// writes this CTA's stage).
template <KvLayout L, int kCluster>
__device__ __forceinline__ void release_stage(SharedPlan<L>& plan, uint32_t peer_empty, int t) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) {
    ptx::mbarrier_arrive(&plan.empty[t & 1]);
    if constexpr (kCluster == 2)
      ptx::mbarrier_arrive_remote(peer_empty + (t & 1) * static_cast<uint32_t>(sizeof(uint64_t)));
  }
}


// Warpgroup 0: S, online softmax, P → shared memory, its P·V half; then the row's lse and the
// factor both halves of O are scaled by.
template <KvLayout L, int kCluster>
__device__ __forceinline__ void consume_softmax(const DecodeParams& p, const CtaWork& w, SharedPlan<L>& plan,
                                                uint32_t peer_empty) {
  using namespace cute;
  const int tid = threadIdx.x % 128, q4 = tid % 4;
  const int row0 = acc_row(0, tid);  // this thread's rows: row0, row0 + 8

  load_q<L>(p, w, plan.q);
  if (tid == 0) DSV4_TRACE(trace_cta(), trace::kOnceRow, 2);
  const auto sQ = k_major_tile<kHeadsPerCta, L>(plan.q);
  Tensor rO = partition_fragment_C(PvRegs<kCluster>{}, Shape<Int<kHeadsPerCta>, Int<kDv / 2>>{});
  Tensor rS = partition_fragment_C(MmaS{}, Shape<Int<kHeadsPerCta>, Int<kTileKeys>>{});
  Tensor rP = make_tensor<bf16_t>(partition_shape_A(PvRegs<kCluster>{}, Shape<Int<kHeadsPerCta>, Int<kTileKeys>>{}));
  static_assert(decltype(size(rS))::value == decltype(size(rP))::value, "P mirrors S");
  clear(rO);
  float m_run[2] = {-INFINITY, -INFINITY};  // base-2 running maxima of rows row0, row0 + 8
  float l_run[2] = {0.0f, 0.0f};            // this thread's share of the row sums

  for (int t = 0; t < w.num_tiles; ++t) {
    if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 5);
    const uint8_t* stage = wait_stage<L, kCluster>(plan, t);
    if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 6);
    wgmma_ss(MmaS{}, sQ, k_major_tile<kTileKeys, L>(stage), rS, /*zero_init=*/true);
    wgmma_commit();
    // Validity of this thread's 16 key columns while S is in flight.
    const uint32_t valid_bits = column_valid_bits(plan.key_valid[t & 1], tid);
    wgmma_wait<0>();
    warpgroup_fence_operand(rS);
    if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 7);
    if (t > 0) ptx::mbarrier_wait(&plan.p_free, (t - 1) & 1);  // warpgroup 1 is done with P
    if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 8);

    // ---- masked online softmax (base 2), P and the tile's O factor for warpgroup 1 ------------
    float scale[2];
    online_softmax_tile(rS, rP, valid_bits, p.scale_log2, m_run, l_run, scale, kLazyRescaleSlack);
    if (q4 == 0) {
      plan.row_scale[row0] = scale[0];
      plan.row_scale[row0 + 8] = scale[1];
    }
    store_p_tile<kHeadsPerCta>(rP, plan.p, tid);
    rescale_o_rows(rO, scale);
    ptx::fence_proxy_async_smem();  // P is read by warpgroup 1's wgmma
    ptx::mbarrier_arrive(&plan.p_ready);
    if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 9);

    // ---- O[:, 0:256] += P·V, P from registers ---------------------------------------------------
    wgmma_rs(PvRegs<kCluster>{}, rP, v_half(stage, 0), rO, /*zero_init=*/false);
    wgmma_commit();
    wgmma_wait<0>();
    warpgroup_fence_operand(rO);
    release_stage<L, kCluster>(plan, peer_empty, t);
    if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 10);
  }
  if (tid == 0) DSV4_TRACE(trace_cta(), trace::kOnceRow, 3);

  // ---- finish: full row sums, lse, the factor of both O halves ---------------------------------
  float factor[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_run[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int hr = row0 + 8 * r;
    const int h = w.head_block * kHeadsPerCta + hr;
    const bool empty_row = !(l > 0.0f);
    const float lse = empty_row ? -INFINITY : (m_run[r] + log2f(l)) * math::kLn2;
    factor[r] = empty_row ? 0.0f : 1.0f / l;
    if (h < p.num_heads) {
      if (p.num_splits == 1) {
        if (!empty_row && p.sink != nullptr) factor[r] /= 1.0f + expf(p.sink[h] - lse);
        if (q4 == 0)
          p.lse[p.lse_strides.row_offset(w.batch, w.seq) + static_cast<int64_t>(h) * p.lse_strides.h] =
              empty_row ? INFINITY : lse;
      } else if (q4 == 0) {
        const int64_t out_row = static_cast<int64_t>(w.row) * p.num_heads + h;
        p.partial_lse[out_row * p.num_splits + w.split] = lse;
      }
    }
    if (q4 == 0) plan.out_scale[hr] = factor[r];
  }
  ptx::named_barrier_sync(kBarConsumers, kConsumerThreads);  // out_scale written
  store_o_half<L, kCluster, 0>(p, w, plan, rO, factor);
  if (tid == 0) DSV4_TRACE(trace_cta(), trace::kOnceRow, 4);
}

// Warpgroup 1: O[:, 256:512] += P·V per tile with P and the tile's O factor from warpgroup 0.
template <KvLayout L, int kCluster>
__device__ __forceinline__ void consume_pv(const DecodeParams& p, const CtaWork& w, SharedPlan<L>& plan,
                                           uint32_t peer_empty) {
  using namespace cute;
  const int tid = threadIdx.x % 128;
  const int row0 = acc_row(0, tid);

  load_q<L>(p, w, plan.q);
  const auto sP = make_tensor(make_smem_ptr(reinterpret_cast<const bf16_t*>(plan.p)),
                              SmemTileK<kHeadsPerCta, kTileKeys>{});
  Tensor rO = partition_fragment_C(PvSmem<kCluster>{}, Shape<Int<kHeadsPerCta>, Int<kDv / 2>>{});
  clear(rO);
#pragma unroll 1
  for (int t = 0; t < w.num_tiles; ++t) {
    if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 11);
    const uint8_t* stage = wait_stage<L, kCluster>(plan, t);
    if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 12);
    ptx::mbarrier_wait(&plan.p_ready, t & 1);  // P and row_scale of tile t
    if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 13);
    const float scale[2] = {plan.row_scale[row0], plan.row_scale[row0 + 8]};
    rescale_o_rows(rO, scale);
    wgmma_ss(PvSmem<kCluster>{}, sP, v_half(stage, 1), rO, /*zero_init=*/false);
    wgmma_commit();
    wgmma_wait<0>();
    warpgroup_fence_operand(rO);
    release_stage<L, kCluster>(plan, peer_empty, t);
    if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 14);
    if (t + 1 < w.num_tiles) ptx::mbarrier_arrive(&plan.p_free);
  }
  ptx::named_barrier_sync(kBarConsumers, kConsumerThreads);  // out_scale written by warpgroup 0
  const float factor[2] = {plan.out_scale[row0], plan.out_scale[row0 + 8]};
  store_o_half<L, kCluster, 1>(p, w, plan, rO, factor);
  if (tid == 0) DSV4_TRACE(trace_cta(), trace::kOnceRow, 7);
}

}  // namespace dsv4::cuda::decode::detail
