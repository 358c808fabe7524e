// What both schedules' math warpgroups (math_serial.cuh, math_pair.cuh) hold and do alike: the
// accumulator fragments and row statistics of the current item, the shared-memory views of Q, the
// tile buffers and V's halves, and the item's epilogue (row sums across the two WGs, sink,
// normalisation, O, max_logits and lse).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention/sparse_prefill/config.h"
#include "cuda/attention/sparse_prefill/work_item.cuh"
#include "cuda/common/attention_tile.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/wgmma.cuh"
#include "math/softmax_scale.h"

namespace dsv4::cuda::sparse_prefill_detail {

__device__ __forceinline__ float fast_exp2(float x) { return exp2f(x); }  // ex2.approx

template <int D_QK, class ScheduleCfg>
struct MathBase {
  using Cfg = ScheduleCfg;
  using Plan = typename Cfg::SharedPlan;
  static constexpr int kTile = Cfg::kTile;
  static constexpr int kHeads = Cfg::kHeads;
  using FragO = decltype(cute::partition_fragment_C(
      MmaPvRegs{}, cute::Shape<cute::Int<kHeads>, cute::Int<Cfg::kDvPerWarpgroup>>{}));
  using FragS = decltype(cute::partition_fragment_C(MmaS{}, cute::Shape<cute::Int<kHeads>, cute::Int<kTile>>{}));
  using FragP = decltype(cute::make_tensor<bf16_t>(
      cute::partition_shape_A(MmaPvRegs{}, cute::Shape<cute::Int<kHeads>, cute::Int<kTile>>{})));
  static_assert(decltype(cute::size(FragS{}))::value == decltype(cute::size(FragP{}))::value, "P mirrors S");

  const Params& p;
  Plan& plan;
  const WorkList<D_QK> work;
  const int tid;
  const int row0;  // this thread's rows: row0 = acc_row(0) and row0 + 8

  FragO rO;
  FragS rS;
  FragP rP;
  // Per row, in base-2 units. m_run: the reference max P and l are relative to (moves lazily,
  // see kLazyRescaleSlack); m_seen: the true running max (max_logits); l_part: the sum over this
  // thread's columns only, reduced at the end.
  float m_run[2], m_seen[2], l_part[2];
  WorkItem it;     // the current item
  uint32_t g = 0;  // CTA-wide number of the current item's tile 0

  __device__ __forceinline__ MathBase(const Params& params, Plan& shared)
      : p(params), plan(shared), work(params), tid(threadIdx.x % 128), row0(acc_row(0, tid)) {}

  // ---- shared-memory views ------------------------------------------------------------------
  __device__ __forceinline__ auto q_tile() const {
    using namespace cute;
    return make_tensor(make_smem_ptr(reinterpret_cast<bf16_t*>(plan.q)), SmemTileK<kHeads, D_QK>{});
  }
  __device__ __forceinline__ auto k_tile(int buf) const {
    using namespace cute;
    return make_tensor(make_smem_ptr(reinterpret_cast<bf16_t*>(plan.k[buf])), SmemTileK<kTile, D_QK>{});
  }
  // Half `half` of V in buffer buf: tile columns [256·half, 256·half + 256) = 4 column blocks.
  __device__ __forceinline__ auto v_half(int buf, int half) const {
    using namespace cute;
    auto* base = reinterpret_cast<bf16_t*>(plan.k[buf] + half * 4 * kTile * 128);
    return make_tensor(make_smem_ptr(base), SmemTileKTransposed<kTile, Cfg::kDvPerWarpgroup>{});
  }

  // The CTA's item number k as the producer announced it (work_item.cuh), once its Q has arrived;
  // false when the CTA's walk is over.
  __device__ __forceinline__ bool next_item(int k) {
    ptx::mbarrier_wait(&plan.q_full, k & 1);
    const ItemSlot slot = plan.item;
    if (slot.item < 0) return false;
    begin_item(slot);
    return true;
  }
  // The item begins: its tile count broadcast from lane 0 (every lane read the same length), so
  // that it, and the tile numbers advanced by it, are warp-uniform: the buffer indices, the
  // shared-memory addresses and the wgmma descriptors made from them then stay in uniform
  // registers instead of being formed per thread and moved over (R2UR) for every product. O and
  // the row statistics start empty.
  __device__ __forceinline__ void begin_item(const ItemSlot& slot) {
    it = work.at(p, slot.item, slot.valid_len);
    it.num_tiles = __shfl_sync(0xffffffffu, it.num_tiles, 0);
    cute::clear(rO);
    m_run[0] = m_run[1] = m_seen[0] = m_seen[1] = -INFINITY;
    l_part[0] = l_part[1] = 0.f;
  }

  // The item's full row sums (this WG's partial sums reduced over the quad, then added across
  // the two WGs in the same order in both) → l_total. With kSeenMaxOfWg1 (the pair schedule,
  // where each WG's m_seen covers its own tiles only) WG0 also folds WG1's m_seen into its own.
  template <bool kSeenMaxOfWg1>
  __device__ __forceinline__ void total_row_sums(int k, int wg, float (&l_total)[2]) {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      l_part[r] += __shfl_xor_sync(0xffffffffu, l_part[r], 1);
      l_part[r] += __shfl_xor_sync(0xffffffffu, l_part[r], 2);
    }
    float(&row_sum)[2][kHeads] = plan.row_sum[k & 1];  // double-buffered across items
    if ((tid & 3) == 0) {
      row_sum[wg][row0] = l_part[0];
      row_sum[wg][row0 + 8] = l_part[1];
      if (kSeenMaxOfWg1 && wg == 1) {
        plan.row_seen_max[k & 1][row0] = m_seen[0];
        plan.row_seen_max[k & 1][row0 + 8] = m_seen[1];
      }
    }
    ptx::named_barrier_sync(Cfg::kBarLExchange, 256);
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      l_total[r] = row_sum[0][row0 + 8 * r] + row_sum[1][row0 + 8 * r];
      if (kSeenMaxOfWg1 && wg == 0) m_seen[r] = fmaxf(m_seen[r], plan.row_seen_max[k & 1][row0 + 8 * r]);
    }
  }

  // The factor O's rows are multiplied by: 1 / (row sum + the head's sink term), 0 for a row
  // with no valid key.
  __device__ __forceinline__ void output_factors(const float (&l_total)[2], float (&factor)[2]) const {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int head = it.head0 + row0 + 8 * r;
      float sink_term = 0.f;
      if (p.attn_sink != nullptr && head < p.num_heads) {
        const float sink_log2 = __ldg(p.attn_sink + head) * math::kLog2e;
        sink_term = fast_exp2(sink_log2 - (m_run[r] == -INFINITY ? 0.f : m_run[r]));
      }
      factor[r] = l_total[r] > 0.f ? 1.f / (l_total[r] + sink_term) : 0.f;
    }
  }

  // WG wg's half of the normalised O straight to global memory, 16 bytes of a row per store
  // (rows past H skipped).
  __device__ __forceinline__ void store_o(int wg, const float (&factor)[2]) const {
    auto* out_base = static_cast<uint8_t*>(p.out) + it.token * p.out_stride_s * 2;
    for_each_o_chunk(rO, factor, tid, [&](int r, int col, uint4 chunk) {
      const int head = it.head0 + row0 + 8 * r;
      if (head >= p.num_heads) return;
      __stcs(reinterpret_cast<uint4*>(out_base + (head * p.out_stride_h + wg * Cfg::kDvPerWarpgroup + col) * 2),
             chunk);
    });
  }

  // max_logits and lse of the item's rows (natural-log units), written by WG0.
  __device__ __forceinline__ void write_row_stats(int wg, const float (&l_total)[2]) const {
    if (wg == 0 && (tid & 3) == 0) {
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int head = it.head0 + row0 + 8 * r;
        if (head >= p.num_heads) continue;
        const bool empty = !(l_total[r] > 0.f);
        p.max_logits[it.token * p.ml_stride_s + head * p.ml_stride_h] = empty ? -INFINITY : m_seen[r] * math::kLn2;
        p.lse[it.token * p.lse_stride_s + head * p.lse_stride_h] =
            empty ? INFINITY : m_run[r] * math::kLn2 + logf(l_total[r]);
      }
    }
  }
};

}  // namespace dsv4::cuda::sparse_prefill_detail

// MathBase's names in a schedule's warpgroup class, which derives from it: the members of a base
// that depends on template parameters are not found by unqualified lookup.
#define DSV4_PREFILL_MATH_STATE(Base) \
  using typename Base::Cfg;           \
  using Base::g;                      \
  using Base::it;                     \
  using Base::k_tile;                 \
  using Base::kHeads;                 \
  using Base::kTile;                  \
  using Base::l_part;                 \
  using Base::m_run;                  \
  using Base::m_seen;                 \
  using Base::p;                      \
  using Base::plan;                   \
  using Base::q_tile;                 \
  using Base::rO;                     \
  using Base::row0;                   \
  using Base::rP;                     \
  using Base::rS;                     \
  using Base::tid;                    \
  using Base::work
