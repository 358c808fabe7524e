// The two math warpgroups (WG0, WG1) of the sparse prefill kernel (kernel.cuh) in the pair
// schedule (config.h), on pairs of tiles.
//
// WG w owns tile 2j + w of pair j (in buffer w): its S = Q·Kᵀ, masking and softmax. Each WG
// accumulates its half of O's value dims, O[:, 256w, +256), over both tiles of the pair. Per pair:
//   WG0: S0 done → tile max → reference max m0 → P0 = exp2(S0·c − m0) (kept in fp32 too) → m0
//        published (max_ready[0]) → O, l rescaled; O += P0·V0 issued (P from registers) → WG1's
//        m1 read (max_ready[1]; m1 = m0 unless WG1's tile raised the reference) → unless it moved,
//        P0 published from its fp32 copy (p_ready[0]) → own product done: quarter (0, 0) released
//        → if it moved, O, l and P0 moved to m1 and P0 published → P1 awaited (p_ready[1]) →
//        O += P1·V1 issued (P from shared memory) → the next pair's S0 issued on half 0, the remote
//        product done: (1, 0) released → the rest of the next S0.
//   WG1: S1 issued, half 1 first (the producer fills it before half 0) → tile max → m0 read →
//        m1 from m0 and the tile max → m1 published → O, l rescaled → P1 published → O += P1·V1
//        issued → P0 awaited → O += P0·V0 issued → own product done: (1, 1) released; the
//        remote one: (0, 1) released.
// So WG0's softmax runs under WG1's S (WG0 issues its next S first, while WG1 still works on the
// pair before), and WG1's under WG0's first product. Quarter (b, h) is released by WG h, its last
// reader (the other WG's S on it is done before that WG's P is published). An odd last tile is a
// half pair: WG0's tile only, WG1 takes its P. O goes from registers straight to global memory
// (store_o), not through a tile buffer as in the serial schedule: the next item's first pair needs
// both buffers at once, and a staged O held one of them until its store had read it.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention/sparse_prefill/config.h"
#include "cuda/attention/sparse_prefill/math_common.cuh"
#include "cuda/attention/sparse_prefill/trace.cuh"
#include "cuda/common/attention_tile.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/wgmma.cuh"

namespace dsv4::cuda::sparse_prefill_detail {

template <int D_QK, int W>
struct PairMath : MathBase<D_QK, PairConfig<D_QK>> {
  static_assert(W == 0 || W == 1, "two math warpgroups");
  using Base = MathBase<D_QK, PairConfig<D_QK>>;
  DSV4_PREFILL_MATH_STATE(Base);

  const float c;  // |softmax scale| in base 2 (S is computed negated for a negative scale)
  // m_run (Base) is the same in both WGs after every pair; m_seen and l_part cover this WG's
  // tiles only until the epilogue.
  uint32_t uses = 0;  // tiles gathered into buffer W before the current item (CTA-wide)
  // Hand-offs completed before the current pair (CTA-wide): max_ready and p_ready[0] complete
  // once a pair, p_ready[1] once a whole pair; the parity of the count is the phase to wait for.
  uint32_t pairs_done = 0, whole_pairs_done = 0;

  __device__ __forceinline__ PairMath(const Params& params, typename Base::Plan& shared)
      : Base(params, shared), c(fabsf(params.scale_log2)) {}

  // ---- shared-memory views ------------------------------------------------------------------
  // This WG's half of V in buffer buf.
  __device__ __forceinline__ auto v_half(int buf) const { return Base::v_half(buf, W); }
  // Where the P of WG w's tile is published (config.h).
  __device__ __forceinline__ uint8_t* p_bytes(int w) const {
    if constexpr (Cfg::kPInRopeBlock) return w == 0 ? plan.k[0] + Cfg::kPOffsetInTile : plan.p[0];
    else return plan.p[w];
  }
  __device__ __forceinline__ auto p_tile(int w) const {
    using namespace cute;
    return make_tensor(make_smem_ptr(reinterpret_cast<bf16_t*>(p_bytes(w))), SmemTileK<kHeads, kTile>{});
  }
  __device__ __forceinline__ void release(int buf, int half) { ptx::mbarrier_arrive(&plan.k_empty[buf][half]); }

  // ---- S of the own tile of pair j, by column halves ------------------------------------------
  // Half kHalf of the own buffer as it is gathered, each part after its k_full wait and a proxy
  // fence (cp.async writes through the generic proxy, wgmma reads through the async one): the
  // half filled first (kHalf == W) whole, the other by its two pieces (config.h); one commit
  // group; zero_init on the half issued first.
  template <int kHalf>
  __device__ __forceinline__ void issue_s_half(int j, bool zero_init) {
    const uint32_t row = g + 2 * j + W;
    const uint32_t phase = (uses + j) & 1;
    constexpr int kBegin = kHalf == 0 ? 0 : Cfg::kSplitKSteps;
    constexpr int kEnd = kHalf == 0 ? Cfg::kSplitKSteps : -1;
    if constexpr (kHalf == W) {
      trace_tile_event(tid, row, kPairFullWaitFirst);
      ptx::mbarrier_wait(&plan.k_full[W][0], phase);
      trace_tile_event(tid, row, kPairFullDoneFirst);
      ptx::fence_proxy_async_smem();
      issue_s_steps<kBegin, kEnd>(zero_init);
    } else {
      constexpr int kMid = Cfg::kPieceSplitBlock[kHalf] * 64 / 16;  // in K steps of 16 columns
      ptx::mbarrier_wait(&plan.k_full[W][1], phase);
      ptx::fence_proxy_async_smem();
      issue_s_steps<kBegin, kMid>(zero_init);
      ptx::mbarrier_wait(&plan.k_full[W][2], phase);
      trace_tile_event(tid, row, kPairFullDoneSecond);
      ptx::fence_proxy_async_smem();
      issue_s_steps<kMid, kEnd>(false);
    }
    wgmma_commit();
  }
  // K steps [kBegin, kEnd) of S (-1: to the end). With a negative softmax scale S is computed
  // negated (the branch is on a kernel parameter: uniform).
  template <int kBegin, int kEnd>
  __device__ __forceinline__ void issue_s_steps(bool zero_init) {
    if (p.scale_log2 < 0.f) wgmma_ss<kBegin, kEnd>(MmaSNegated{}, q_tile(), k_tile(W), rS, zero_init);
    else wgmma_ss<kBegin, kEnd>(MmaS{}, q_tile(), k_tile(W), rS, zero_init);
  }

  // ---- the softmax's steps ------------------------------------------------------------------
  // Masks S in place (a column whose key is invalid becomes −inf) and returns each row's max of
  // s·c over the tile (the quad's four lanes reduced); also folds it into m_seen.
  __device__ __forceinline__ void masked_row_max(uint32_t valid_bits, float (&mx)[2]) {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      float m = -INFINITY;
      CUTE_UNROLL
      for (int i = 2 * r; i < cute::size(rS); i += 4) {
        CUTE_UNROLL
        for (int e = 0; e < 2; ++e) {
          const bool v = (valid_bits >> (i / 4 * 2 + e)) & 1u;
          rS(i + e) = v ? rS(i + e) : -INFINITY;
          m = fmaxf(m, rS(i + e));
        }
      }
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      mx[r] = m * c;  // −inf stays −inf (c is a normal float > 0)
      m_seen[r] = fmaxf(m_seen[r], mx[r]);
    }
  }
  // P = exp2(s·c − base) per row into rS (fp32) and rP (bf16); adds the rows' sums to l_part.
  __device__ __forceinline__ void exp2_tile(const float (&base)[2]) {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      float sum = 0.f;
      CUTE_UNROLL
      for (int i = 2 * r; i < cute::size(rS); i += 4) {
        CUTE_UNROLL
        for (int e = 0; e < 2; ++e) {
          const float pe = fast_exp2(fmaf(rS(i + e), c, -base[r]));
          rS(i + e) = pe;
          rP(i + e) = bf16_t(pe);
          sum += pe;
        }
      }
      l_part[r] += sum;
    }
  }
  // The reference moves from m_run to m (a row with no valid key so far keeps base 0): O and l
  // are multiplied by the factor (skipped by the warp when no row moved); returns the base.
  __device__ __forceinline__ void move_reference(const float (&m)[2], float (&base)[2]) {
    float factor[2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      base[r] = m[r] == -INFINITY ? 0.f : m[r];
      factor[r] = fast_exp2(m_run[r] - base[r]);  // m_run = −inf → 0
      m_run[r] = m[r];
      l_part[r] *= factor[r];
    }
    rescale_o_rows(rO, factor);
  }
  __device__ __forceinline__ void publish_rows(const float (&v)[2]) {
    if ((tid & 3) == 0) {
      plan.pair_max[row0] = v[0];
      plan.pair_max[row0 + 8] = v[1];
    }
  }
  __device__ __forceinline__ void read_rows(float (&v)[2]) const {
    v[0] = plan.pair_max[row0];
    v[1] = plan.pair_max[row0 + 8];
  }
  // P of this WG's tile (rP, or its fp32 values in rS) to where the other WG reads it, then announced
  // (trace row: the tile's).
  template <class FragP>
  __device__ __forceinline__ void publish_p(const FragP& from, uint32_t trace_row) {
    store_p_tile<kHeads>(from, p_bytes(W), tid);
    ptx::fence_proxy_async_smem();
    ptx::mbarrier_arrive(&plan.p_ready[W]);
    trace_tile_event(tid, trace_row, kPairPPublished);
  }

  // ---- WG0's pair j ----------------------------------------------------------------------------
  // On entry S0 of pair j is done and `bits` holds its columns' validity; on exit so is the next
  // pair's (after the item's last pair nothing is in flight). Nothing stays in flight across the
  // loop's back edge: ptxas serializes every wgmma otherwise (C7515).
  __device__ __forceinline__ void pair_wg0(int j, int num_pairs, uint32_t& bits) {
    const bool whole = 2 * j + 1 < it.num_tiles;
    const bool last = j + 1 == num_pairs;
    const uint32_t row0_g = g + 2 * j, row1_g = row0_g + 1;
    trace_tile_event(tid, row0_g, kPairSDone);
    if (last) ptx::mbarrier_arrive(&plan.q_empty);  // this WG's last S of the item
    float mx[2], m0[2], base[2];
    masked_row_max(bits, mx);
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) m0[r] = mx[r] > m_run[r] + kLazyRescaleSlack ? mx[r] : m_run[r];
    publish_rows(m0);
    ptx::mbarrier_arrive(&plan.max_ready[0]);
    trace_tile_event(tid, row0_g, kPairMaxPublished);
    move_reference(m0, base);
    exp2_tile(base);
    wgmma_rs(MmaPvRegs{}, rP, v_half(0), rO, false);
    wgmma_commit();
    // WG1's reference is read while the own product runs. Unless it moved, P0 is published from
    // its fp32 copy in rS (rP is the product's A operand until the product is done), so WG1's
    // remote product need not wait for WG0's own one.
    ptx::mbarrier_wait(&plan.max_ready[1], pairs_done & 1);
    trace_tile_event(tid, row0_g, kPairOtherMaxSeen);
    float m1[2];
    read_rows(m1);
    float to_m1[2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      to_m1[r] = m1[r] != m0[r] ? fast_exp2(m0[r] - (m1[r] == -INFINITY ? 0.f : m1[r])) : 1.f;  // m0 = −inf → 0
      m_run[r] = m1[r];
    }
    const bool moved = __any_sync(0xffffffffu, to_m1[0] != 1.f || to_m1[1] != 1.f);
    if (!moved) {
      publish_p(rS, row0_g);
    }
    wgmma_wait<0>();  // own P·V done
    trace_tile_event(tid, row0_g, kPairOwnPvDone);
    release(0, 0);
    if (moved) {  // WG1's tile raised the reference past m0 (rare, by the slack): P0, O and l move to m1
      l_part[0] *= to_m1[0];
      l_part[1] *= to_m1[1];
      rescale_o_rows(rO, to_m1);
      CUTE_UNROLL
      for (int i = 0; i < cute::size(rS); ++i) rP(i) = bf16_t(rS(i) * to_m1[(i >> 1) & 1]);
      publish_p(rP, row0_g);
    }
    if (whole) {
      ptx::mbarrier_wait(&plan.p_ready[1], whole_pairs_done & 1);
      trace_tile_event(tid, row1_g, kPairRemotePSeen);
      wgmma_ss(MmaPvSmem{}, p_tile(1), v_half(1), rO, false);
      wgmma_commit();
      if (!last) {
        issue_s_half<0>(j + 1, true);
        wgmma_wait<1>();  // the remote P·V done (S0 of the next pair may run)
        trace_tile_event(tid, row1_g, kPairRemotePvDone);
        release(1, 0);
        issue_s_half<1>(j + 1, false);
        bits = column_valid_bits(plan.key_valid[0], tid);  // published with (0, 0)
        wgmma_wait<0>();  // S0 of the next pair done
      } else {
        wgmma_wait<0>();
        trace_tile_event(tid, row1_g, kPairRemotePvDone);
        release(1, 0);
      }
    }
    ++pairs_done;
    whole_pairs_done += whole;
  }

  // ---- WG1's pair j ----------------------------------------------------------------------------
  // Nothing in flight on entry or exit.
  __device__ __forceinline__ void pair_wg1(int j) {
    const bool whole = 2 * j + 1 < it.num_tiles;
    const uint32_t row0_g = g + 2 * j, row1_g = row0_g + 1;
    float mx[2] = {-INFINITY, -INFINITY};
    if (whole) {
      issue_s_half<1>(j, true);
      issue_s_half<0>(j, false);
      const uint32_t bits = column_valid_bits(plan.key_valid[1], tid);  // published with (1, 1)
      wgmma_wait<0>();  // S1 done
      trace_tile_event(tid, row1_g, kPairSDone);
      if (2 * j + 3 >= it.num_tiles) ptx::mbarrier_arrive(&plan.q_empty);  // this WG's last S
      masked_row_max(bits, mx);
    }
    ptx::mbarrier_wait(&plan.max_ready[0], pairs_done & 1);
    if (whole) trace_tile_event(tid, row1_g, kPairOtherMaxSeen);
    float m1[2], base[2];
    read_rows(m1);  // m0
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) m1[r] = mx[r] > m1[r] + kLazyRescaleSlack ? mx[r] : m1[r];
    __syncwarp();  // every lane has read m0 before lane 0 of each quad overwrites it
    publish_rows(m1);
    ptx::mbarrier_arrive(&plan.max_ready[1]);
    if (whole) trace_tile_event(tid, row1_g, kPairMaxPublished);
    move_reference(m1, base);
    if (whole) {
      exp2_tile(base);
      // P is stored before the product that reads it from registers is issued: a wgmma's A
      // registers must not be accessed while it is in flight. (Issuing the product first and
      // storing P from rS, as WG0 does, measured 1-2 % slower: WG0 waits for this P.)
      publish_p(rP, row1_g);
      wgmma_rs(MmaPvRegs{}, rP, v_half(1), rO, false);
      wgmma_commit();
    }
    ptx::mbarrier_wait(&plan.p_ready[0], pairs_done & 1);
    trace_tile_event(tid, row0_g, kPairRemotePSeen);
    wgmma_ss(MmaPvSmem{}, p_tile(0), v_half(0), rO, false);
    wgmma_commit();
    if (whole) {
      wgmma_wait<1>();  // own P·V done
      trace_tile_event(tid, row1_g, kPairOwnPvDone);
      release(1, 1);
    }
    wgmma_wait<0>();
    trace_tile_event(tid, row0_g, kPairRemotePvDone);
    release(0, 1);
    ++pairs_done;
    whole_pairs_done += whole;
  }

  // ---- one item ---------------------------------------------------------------------------------
  __device__ __forceinline__ void run_tiles() {
    const int num_pairs = (it.num_tiles + 1) / 2;
    if constexpr (W == 0) {
      uint32_t bits = 0;
      if (num_pairs > 0) {
        issue_s_half<0>(0, true);
        issue_s_half<1>(0, false);
        bits = column_valid_bits(plan.key_valid[0], tid);  // published with (0, 0)
        wgmma_wait<0>();
      }
      for (int j = 0; j < num_pairs; ++j) pair_wg0(j, num_pairs, bits);
    } else {
      for (int j = 0; j < num_pairs; ++j) pair_wg1(j);
    }
  }

  __device__ __forceinline__ void run() {
    // (next_item's uniform tile count also keeps the buffer use count it advances warp-uniform.)
    for (int k = 0; Base::next_item(k); ++k) {
      const int n = it.num_tiles;
      if (W == 0) trace_tile_event(tid, g, kPairQSeen);
      const int own_tiles = W == 0 ? (n + 1) / 2 : n / 2;
      if (own_tiles == 0) ptx::mbarrier_arrive(&plan.q_empty);  // Q not needed
      run_tiles();
      uses += own_tiles;
      if (W == 0 && n >= 1) trace_tile_event(tid, g + n - 1, kPairEpilogueStart);
      g += n;

      // ---- epilogue: total row sums across the two WGs, sink, normalise, store.
      float l_total[2], factor[2];
      Base::template total_row_sums<true>(k, W, l_total);
      Base::output_factors(l_total, factor);
      Base::store_o(W, factor);
      if (W == 0 && n >= 1) trace_tile_event(tid, g - 1, kPairOStored);
      Base::write_row_stats(W, l_total);
    }
  }
};

}  // namespace dsv4::cuda::sparse_prefill_detail
