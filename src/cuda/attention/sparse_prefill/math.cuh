// The two math warpgroups (WG0, WG1) of the sparse prefill kernel (kernel.cuh).
//
// Math WG w ∈ {0,1} owns the item's tiles i ≡ w (mod 2). Iteration over its own tile i:
//   A. own P·V of tile i-2 finished → release buffer (i-2)%2 to the producer
//   C. tile i-1 belongs to the other WG: wait for its published P and row stats, rescale O,
//      O += P_{i-1}·V_{i-1}[:, my half] (A from smem), wait for it → release buffer (i-1)%2
//   B. issue S_i = Q·K_iᵀ (async)
//   D. S_i done → mask, online softmax (base 2), publish P_i + stats, rescale O,
//      issue O += P_i·V_i[:, my half] (A from registers)
// Both WGs see every tile's scale factor, so their O halves and partial row sums stay in step;
// the row sums are added across WGs at the end (fixed order: deterministic).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention/sparse_prefill/config.h"
#include "cuda/attention/sparse_prefill/trace.cuh"
#include "cuda/attention/sparse_prefill/work_item.cuh"
#include "cuda/common/attention_tile.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/wgmma.cuh"
#include "math/softmax_scale.h"

namespace dsv4::cuda::sparse_prefill_detail {

__device__ __forceinline__ float fast_exp2(float x) { return exp2f(x); }  // ex2.approx

template <int D_QK>
struct MathWarpgroup {
  using Cfg = Config<D_QK>;
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
  const int wg, tid;
  const int row0;  // this thread's rows: row0 = acc_row(0) and row0 + 8

  FragO rO;
  FragS rS;
  FragP rP;
  // Per row, in base-2 units. m_run: the reference max P and l are relative to (moves lazily,
  // see kLazyRescaleSlack); m_seen: the true running max (max_logits); l_part: the sum over this
  // thread's columns only, reduced at the end.
  float m_run[2], m_seen[2], l_part[2];
  // Publications of the other WG's tiles seen so far (mod 2): WG w only ever waits on
  // p_ready[1 - w], once per completed phase.
  uint32_t remote_phase = 0;
  WorkItem it;     // the current item
  uint32_t g = 0;  // CTA-wide number of the current item's tile 0

  __device__ __forceinline__ MathWarpgroup(const Params& params, Plan& shared, int warpgroup)
      : p(params), plan(shared), work(params), wg(warpgroup), tid(threadIdx.x % 128), row0(acc_row(0, tid)) {}

  // ---- shared-memory views ------------------------------------------------------------------
  __device__ __forceinline__ int buf_of(int t) const { return static_cast<int>((g + t) & 1); }
  __device__ __forceinline__ auto q_tile() const {
    using namespace cute;
    return make_tensor(make_smem_ptr(reinterpret_cast<bf16_t*>(plan.q)), SmemTileK<kHeads, D_QK>{});
  }
  __device__ __forceinline__ auto k_tile(int buf) const {
    using namespace cute;
    return make_tensor(make_smem_ptr(reinterpret_cast<bf16_t*>(plan.k[buf])), SmemTileK<kTile, D_QK>{});
  }
  // This WG's half of V: tile columns [256·wg, 256·wg + 256) = 4 column blocks.
  __device__ __forceinline__ auto v_half(int buf) const {
    using namespace cute;
    auto* base = reinterpret_cast<bf16_t*>(plan.k[buf] + wg * 4 * kTile * 128);
    return make_tensor(make_smem_ptr(base), SmemTileKTransposed<kTile, Cfg::kDvPerWarpgroup>{});
  }
  // P of local tile t (in buffer buf): d 576 keeps it in the tile's rope block, d 512 in p[t&1].
  __device__ __forceinline__ uint8_t* p_bytes(int t, int buf) const {
    if constexpr (Cfg::kPInRopeBlock) return plan.k[buf] + Cfg::kPOffsetInTile;
    else return plan.p[t & 1];
  }
  __device__ __forceinline__ auto p_tile(int t, int buf) const {
    using namespace cute;
    return make_tensor(make_smem_ptr(reinterpret_cast<bf16_t*>(p_bytes(t, buf))), SmemTileK<kHeads, kTile>{});
  }

  // ---- the steps of a tile (A-D above) ------------------------------------------------------
  // A. this WG's P·V of tile t-2 has finished (caller waited) → its buffer goes back.
  __device__ __forceinline__ void release_own_tile(int t) {
    if (t >= 2) {
      trace_tile_event(tid, g + t - 2, kTraceOwnPvDone);
      ptx::mbarrier_arrive(&plan.k_empty[buf_of(t)]);
    }
  }
  // B. issue S = Q·K_tᵀ once both halves of the tile have arrived, after one proxy fence: the rows
  // were written by cp.async (generic proxy) and are read by wgmma (async proxy); the other WG's
  // P·V on them is ordered after this WG's published P. One fence per tile rather than one per
  // half (starting S on the first half early) measured faster (docs/notes/prefill.md).
  __device__ __forceinline__ void issue_s(int t) {
    const uint32_t phase = ((g + t) >> 1) & 1;
    trace_tile_event(tid, g + t, kTraceFullWait);
    ptx::mbarrier_wait(&plan.k_full[buf_of(t)][0], phase);
    ptx::mbarrier_wait(&plan.k_full[buf_of(t)][1], phase);
    trace_tile_event(tid, g + t, kTraceFullDone);
    ptx::fence_proxy_async_smem();
    // With a negative softmax scale S is computed negated, so the softmax always sees |scale|
    // (softmax_publish). The branch is on a kernel parameter: uniform, both sides whole wgmma
    // sequences.
    if (p.scale_log2 < 0.f) issue_s_products(MmaSNegated{}, t);
    else issue_s_products(MmaS{}, t);
    wgmma_commit();
  }
  template <class Mma>
  __device__ __forceinline__ void issue_s_products(Mma mma, int t) {
    wgmma_ss<0, Cfg::kSplitKSteps>(mma, q_tile(), k_tile(buf_of(t)), rS, /*zero_init=*/true);
    wgmma_ss<Cfg::kSplitKSteps>(mma, q_tile(), k_tile(buf_of(t)), rS, /*zero_init=*/false);
  }
  // After S of tile t is complete: Q is free once this was the WG's last own tile.
  __device__ __forceinline__ void s_done(int t) {
    if (t + 2 >= it.num_tiles) ptx::mbarrier_arrive(&plan.q_empty);
  }
  // C. the other WG's tile t: take its P and row stats, accumulate my half of O.
  __device__ __forceinline__ void accumulate_remote(int t) {
    trace_tile_event(tid, g + t, kTraceRemoteWait);
    ptx::mbarrier_wait(&plan.p_ready[t & 1], remote_phase);
    trace_tile_event(tid, g + t, kTraceRemoteSeen);
    remote_phase ^= 1;
    float scale[2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      scale[r] = plan.row_scale[t & 1][row0 + 8 * r];
      m_run[r] = plan.row_max[t & 1][row0 + 8 * r];
      m_seen[r] = plan.row_seen_max[t & 1][row0 + 8 * r];
      l_part[r] *= scale[r];
    }
    rescale_o_rows(rO, scale);
    wgmma_ss(MmaPvSmem{}, p_tile(t, buf_of(t)), v_half(buf_of(t)), rO, false);
    wgmma_commit();
  }
  // Validity of this thread's 16 S columns of tile t (slot < topk_length, index in [0, s_kv)), as
  // the producer recorded it per row (key_valid) before its arrival on the first half's k_full:
  // call after that wait.
  __device__ __forceinline__ uint32_t column_mask(int t) const {
    return column_valid_bits(plan.key_valid[buf_of(t)], tid);
  }
  // D1. S of the own tile t is complete: masked online softmax (base 2), publish P and the row
  // stats for the other WG; `scale` is the factor O must be multiplied by.
  __device__ __forceinline__ void softmax_publish(int t, uint32_t valid_bits, float (&scale)[2]) {
    float tile_max[2];
    online_softmax_tile</*kScaleInExponent=*/true>(rS, rP, valid_bits, fabsf(p.scale_log2), m_run, l_part, scale,
                                                   kLazyRescaleSlack, tile_max);
    m_seen[0] = fmaxf(m_seen[0], tile_max[0]);
    m_seen[1] = fmaxf(m_seen[1], tile_max[1]);
    store_p_tile<kHeads>(rP, p_bytes(t, buf_of(t)), tid);
    if ((tid & 3) == 0) {
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        plan.row_max[t & 1][row0 + 8 * r] = m_run[r];
        plan.row_scale[t & 1][row0 + 8 * r] = scale[r];
        plan.row_seen_max[t & 1][row0 + 8 * r] = m_seen[r];
      }
    }
    ptx::fence_proxy_async_smem();
    ptx::mbarrier_arrive(&plan.p_ready[t & 1]);
  }
  // D2. (no P·V in flight) rescale O, issue O += P·V_t.
  __device__ __forceinline__ void accumulate_own(int t, const float scale[2]) {
    rescale_o_rows(rO, scale);
    wgmma_rs(MmaPvRegs{}, rP, v_half(buf_of(t)), rO, false);
    wgmma_commit();
  }
  // B-D of own tile t, after the wait for its predecessors.
  __device__ __forceinline__ void own_tile(int t) {
    issue_s(t);
    const uint32_t valid_bits = column_mask(t);  // read while S runs
    wgmma_wait<0>();  // S done
    trace_tile_event(tid, g + t, kTraceSDone);
    s_done(t);
    float scale[2];
    softmax_publish(t, valid_bits, scale);
    trace_tile_event(tid, g + t, kTracePublished);
    accumulate_own(t, scale);
  }

  // ---- one item ---------------------------------------------------------------------------------
  // Every tile of the item: the own ones (A-D) and the other WG's (C), ending with no wgmma in
  // flight. The waits are unconditional so ptxas can prove no accumulator is touched while a
  // wgmma writing it is in flight (otherwise it serializes every wgmma: warning C7514).
  __device__ __forceinline__ void run_tiles() {
    const int n = it.num_tiles;
    int t = wg;
    if (wg == 0 && n > 0) {  // WG0's first tile has no remote predecessor
      own_tile(0);
      t = 2;
    }
    // The remote P·V is issued and waited for BEFORE the own S so that buffer of tile t-1 is
    // released as early as possible — not after S_t has waited for tile t's gather, which put
    // one whole gather per tile on the critical path (docs/notes/prefill.md, v2 and v8).
    for (; t < n; t += 2) {
      wgmma_wait<0>();  // A: own P·V of tile t-2 done
      release_own_tile(t);
      accumulate_remote(t - 1);  // C
      wgmma_wait<0>();           // P·V of tile t-1 done → its buffer is free
      trace_tile_event(tid, g + t - 1, kTraceRemotePvDone);
      ptx::mbarrier_arrive(&plan.k_empty[buf_of(t - 1)]);
      own_tile(t);               // B, D
    }
    if (t == n && t >= 1) {  // the item's last tile is the other WG's
      wgmma_wait<0>();
      release_own_tile(t);
      accumulate_remote(t - 1);
    }
    wgmma_wait<0>();
  }

  // The item's full row sums (this WG's partial sums reduced over the quad, then added across
  // the two WGs in the same order in both) → l_total.
  __device__ __forceinline__ void total_row_sums(int k, float (&l_total)[2]) {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      l_part[r] += __shfl_xor_sync(0xffffffffu, l_part[r], 1);
      l_part[r] += __shfl_xor_sync(0xffffffffu, l_part[r], 2);
    }
    float(&row_sum)[2][kHeads] = plan.row_sum[k & 1];  // double-buffered across items
    if ((tid & 3) == 0) {
      row_sum[wg][row0] = l_part[0];
      row_sum[wg][row0 + 8] = l_part[1];
    }
    ptx::named_barrier_sync(Cfg::kBarLExchange, 256);
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) l_total[r] = row_sum[0][row0 + 8 * r] + row_sum[1][row0 + 8 * r];
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

  // This WG's half of the normalised O. With a tile, into its last buffer `stage_buf` (both
  // WGs' P·V on it are done: the row-sum exchange) in the out map's 64×64 SW128 boxes, which the
  // producer TMA-stores (rows past H are clipped) once the buffer is released here. With no tile
  // (no buffer) the zero rows go out directly.
  __device__ __forceinline__ void write_o(int stage_buf, const float (&factor)[2]) {
    if (it.num_tiles >= 1) {
      stage_o_tile<kHeads>(rO, factor, plan.k[stage_buf], wg * Cfg::kDvPerWarpgroup / 8, tid);
      if (wg == 0) trace_tile_event(tid, g - 1, kTraceOStores);
      ptx::fence_proxy_async_smem();
      ptx::mbarrier_arrive(&plan.k_empty[stage_buf]);
    } else {
      auto* out_base = static_cast<uint8_t*>(p.out) + it.token * p.out_stride_s * 2;
      for_each_o_chunk(rO, factor, tid, [&](int r, int col, uint4 chunk) {
        const int head = it.head0 + row0 + 8 * r;
        if (head >= p.num_heads) return;
        __stcs(reinterpret_cast<uint4*>(out_base + (head * p.out_stride_h + wg * Cfg::kDvPerWarpgroup + col) * 2),
               chunk);
      });
    }
  }

  // max_logits and lse of the item's rows (natural-log units), written by WG0.
  __device__ __forceinline__ void write_row_stats(const float (&l_total)[2]) const {
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

  __device__ __forceinline__ void run() {
    int k = 0;
    for (int item = blockIdx.x; item < work.num_items; item += gridDim.x, ++k) {
      it = work.at(p, item);
      // Broadcast from lane 0 (every lane read the same length): the tile count, and the CTA tile
      // number g it advances, are then warp-uniform, so the buffer indices, the shared-memory
      // addresses and the wgmma descriptors made from them stay in uniform registers instead of
      // being formed per thread and moved over (R2UR) for every product.
      it.num_tiles = __shfl_sync(0xffffffffu, it.num_tiles, 0);
      const int n = it.num_tiles;
      cute::clear(rO);
      m_run[0] = m_run[1] = m_seen[0] = m_seen[1] = -INFINITY;
      l_part[0] = l_part[1] = 0.f;

      ptx::mbarrier_wait(&plan.q_full, k & 1);
      if (wg == 0) trace_tile_event(tid, g, kTraceQSeen);
      if (wg >= n) ptx::mbarrier_arrive(&plan.q_empty);  // no own tile: Q not needed
      run_tiles();
      if (n >= 1) trace_tile_event(tid, g + n - 1, wg == 0 ? kTraceEpilogueStart : kTraceEpilogueStartWg1);
      // The last tile's buffer is released only after O has been staged in it (write_o).
      const int stage_buf = n >= 1 ? buf_of(n - 1) : 0;
      g += n;

      // ---- epilogue: total row sums across the two WGs, sink, normalise, store.
      float l_total[2], factor[2];
      total_row_sums(k, l_total);
      if (wg == 0 && n >= 1) trace_tile_event(tid, g - 1, kTraceRowSumsExchanged);
      output_factors(l_total, factor);
      if (wg == 0 && n >= 1) trace_tile_event(tid, g - 1, kTraceFactors);
      write_o(stage_buf, factor);
      if (wg == 0 && n >= 1) trace_tile_event(tid, g - 1, kTraceOStaged);
      write_row_stats(l_total);
    }
  }
};

}  // namespace dsv4::cuda::sparse_prefill_detail
