// The two math warpgroups (WG0, WG1) of the sparse prefill kernel (kernel.cuh) in the serial
// schedule (config.h).
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
#include "cuda/attention/sparse_prefill/math_common.cuh"
#include "cuda/attention/sparse_prefill/trace.cuh"
#include "cuda/common/attention_tile.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma.cuh"

namespace dsv4::cuda::sparse_prefill_detail {

template <int D_QK>
struct SerialMath : MathBase<D_QK, SerialConfig<D_QK>> {
  using Base = MathBase<D_QK, SerialConfig<D_QK>>;
  DSV4_PREFILL_MATH_STATE(Base);

  const int wg;
  // Publications of the other WG's tiles seen so far (mod 2): WG w only ever waits on
  // p_ready[1 - w], once per completed phase.
  uint32_t remote_phase = 0;

  __device__ __forceinline__ SerialMath(const Params& params, typename Base::Plan& shared, int warpgroup)
      : Base(params, shared), wg(warpgroup) {}

  // ---- shared-memory views ------------------------------------------------------------------
  __device__ __forceinline__ int buf_of(int t) const { return static_cast<int>((g + t) & 1); }
  // This WG's half of V in buffer buf.
  __device__ __forceinline__ auto v_half(int buf) const { return Base::v_half(buf, wg); }
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
      Base::store_o(wg, factor);
    }
  }

  __device__ __forceinline__ void run() {
    for (int k = 0; Base::next_item(k); ++k) {
      const int n = it.num_tiles;
      if (wg == 0) trace_tile_event(tid, g, kTraceQSeen);
      if (wg >= n) ptx::mbarrier_arrive(&plan.q_empty);  // no own tile: Q not needed
      run_tiles();
      if (n >= 1) trace_tile_event(tid, g + n - 1, wg == 0 ? kTraceEpilogueStart : kTraceEpilogueStartWg1);
      // The last tile's buffer is released only after O has been staged in it (write_o).
      const int stage_buf = n >= 1 ? buf_of(n - 1) : 0;
      g += n;

      // ---- epilogue: total row sums across the two WGs, sink, normalise, store.
      float l_total[2], factor[2];
      Base::template total_row_sums<false>(k, wg, l_total);
      if (wg == 0 && n >= 1) trace_tile_event(tid, g - 1, kTraceRowSumsExchanged);
      Base::output_factors(l_total, factor);
      if (wg == 0 && n >= 1) trace_tile_event(tid, g - 1, kTraceFactors);
      write_o(stage_buf, factor);
      if (wg == 0 && n >= 1) trace_tile_event(tid, g - 1, kTraceOStaged);
      Base::write_row_stats(wg, l_total);
    }
  }
};

}  // namespace dsv4::cuda::sparse_prefill_detail
