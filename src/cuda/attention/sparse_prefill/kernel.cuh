// Sparse prefill attention kernel for Hopper (sm_90a). See config.h for the work split.
//
// Per work item (token t, head group g) of a persistent CTA, n = ceil(topk_length / 64) tiles,
// numbered per item for ownership and per CTA (g) for the two-buffer ring:
//   producer WG2: Q → smem by TMA; for tile i: wait until buffer i%2 is free, gather its 64 rows
//                 (cp.async, invalid rows zero-filled, never read), arrive on k_full[i%2].
//   math WG w ∈ {0,1} owns tiles i ≡ w (mod 2). Iteration over its own tile i:
//     A. own P·V of tile i-2 finished → release buffer (i-2)%2 to the producer
//     C. tile i-1 belongs to the other WG: wait for its published P and row stats, rescale O,
//        O += P_{i-1}·V_{i-1}[:, my half] (A from smem), wait for it → release buffer (i-1)%2
//     B. issue S_i = Q·K_iᵀ (async)
//     D. S_i done → mask, online softmax (base 2), publish P_i + stats, rescale O,
//        issue O += P_i·V_i[:, my half] (A from registers)
//   Both WGs see every tile's scale factor, so their O halves and partial row sums stay in step;
//   the row sums are added across WGs at the end (fixed order: deterministic).
//   Epilogue: O is staged in the item's last tile buffer and TMA-stored by the producer before it
//   gathers into that buffer again (scattered global stores cost ~35 cycles per warp store).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/attention/sparse_prefill/config.h"
#include "cuda/common/attention_tile.cuh"
#include "cuda/common/check.h"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/wgmma.cuh"

namespace dsv4::cuda::sparse_prefill_detail {

__device__ __forceinline__ float fast_exp2(float x) { return exp2f(x); }  // ex2.approx

template <int D_QK>
__global__ void __launch_bounds__(Config<D_QK>::kThreads, 1)
    sparse_prefill_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using namespace cute;
  using Cfg = Config<D_QK>;
  using Plan = typename Cfg::SharedPlan;
  constexpr int kTile = Cfg::kTile;
  constexpr int kHeads = Cfg::kHeads;

  extern __shared__ uint8_t smem_raw[];
  Plan& plan = *reinterpret_cast<Plan*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                        ~uintptr_t(1023));

  // Persistent CTAs: work item = (token, 64-head group), taken round-robin (item b, b + grid, ...)
  // so the next item's Q and first tiles load while this item finishes. Tiles are numbered
  // globally per CTA (g) for the buffer ring; ownership and published P/stats use the item-local
  // tile number t.
  const int head_groups = (p.num_heads + kHeads - 1) / kHeads;
  const int num_items = p.s_q * head_groups;
  const int warpgroup = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  struct Item {
    int token, head0, valid_len, num_tiles;
    const int32_t* indices;
  };
  auto item_at = [&](int item) {
    Item it;
    it.token = item / head_groups;
    it.head0 = (item % head_groups) * kHeads;
    it.valid_len = p.topk;
    if (p.topk_length != nullptr) it.valid_len = max(0, min(p.topk, __ldg(p.topk_length + it.token)));
    it.num_tiles = (it.valid_len + kTile - 1) / kTile;
    it.indices = p.indices + it.token * p.indices_row_stride;
    return it;
  };

  if (threadIdx.x == 0) {
    ptx::mbarrier_init(&plan.q_full, 1);     // the producer's expect-tx arrival (+ TMA bytes)
    ptx::mbarrier_init(&plan.q_empty, 256);  // every math thread, after its last S of the item
    for (int b = 0; b < 2; ++b) {
      ptx::mbarrier_init(&plan.k_full[b][0], 128);  // one cp.async arrival per producer thread
      ptx::mbarrier_init(&plan.k_full[b][1], 128);
      ptx::mbarrier_init(&plan.p_ready[b], 128);  // the owner WG's threads
      ptx::mbarrier_init(&plan.k_empty[b], 256);  // every math thread, after its P·V on the tile
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 2) {
    // ============================== producer ==============================
    ptx::warpgroup_regs_decrease<Cfg::kProducerRegs>();
    // Q: 64×64 TMA boxes issued by one thread (heads past H are out of bounds: zero-filled).
    // KV: gathered with cp.async by all 128 threads — thread (group = tid/8, lane8 = tid%8) copies
    // chunk lane8 of every 64-column block of rows group, group+16, ...; a warp moves 4 rows × 128
    // contiguous bytes per instruction; invalid rows are zero-filled without a read. (One-row TMA
    // boxes gather correctly but ran 6.5x slower: docs/notes/prefill.md, v5.)
    constexpr int kBlocks = D_QK / 64;
    const int group = tid / 8, lane8 = tid % 8;
    const auto* kv_base = static_cast<const uint8_t*>(p.kv) + lane8 * 16;
    const int64_t kv_row_bytes = p.kv_row_stride * 2;
    // O of an item leaves through its last tile's buffer: the math WGs stage it there (the out
    // map's box layout) and free the buffer as for any tile; before the next gather into that
    // buffer — or at the end — this WG TMA-stores it, so no math thread waits on global stores.
    // staged0/1: the item whose O buffer 0/1 holds, -1 if none (two scalars: no local memory).
    int staged0 = -1, staged1 = -1;
    auto store_staged_o = [&](int b, int staged_item) {
      if (tid == 0) {
        const int token = staged_item / head_groups, head0 = (staged_item % head_groups) * kHeads;
#pragma unroll
        for (int blk = 0; blk < Cfg::kDv / 64; ++blk)
          ptx::tma_store_3d(&p.out_map, plan.k[b] + blk * kTile * 128, blk * 64, head0, token);
        ptx::bulk_commit();
        ptx::bulk_wait_read<0>();
      }
      ptx::named_barrier_sync(Cfg::kBarProducer, 128);  // no thread gathers into b before it is read
    };
    // This thread's 4 row indices of a tile, read one tile before the gather that needs them —
    // across items too (the next item's tile 0 during this item's last tile), so no gather waits
    // on an index read.
    int32_t next_indices[kTile / 16];
    int prefetched_item = -1;  // the item whose tile-0 indices next_indices holds
    auto read_indices = [&](const Item& of, int t) {
#pragma unroll
      for (int rk = 0; rk < kTile / 16; ++rk) {
        const int slot = t * kTile + group + 16 * rk;
        next_indices[rk] = slot < of.valid_len ? __ldg(of.indices + slot) : -1;
      }
    };
    uint32_t g = 0;
    int k = 0;
    for (int item = blockIdx.x; item < num_items; item += gridDim.x, ++k) {
      const Item it = item_at(item);
      if (tid == 0) {
        // Q of this item once the previous item's S products are done with the buffer.
        if (k >= 1) ptx::mbarrier_wait(&plan.q_empty, (k - 1) & 1);
        ptx::mbarrier_arrive_expect_tx(&plan.q_full, Cfg::kQBytes);
#pragma unroll
        for (int blk = 0; blk < kBlocks; ++blk)
          ptx::tma_load_3d(plan.q + blk * kHeads * 128, &p.q_map, blk * 64, it.head0, it.token, &plan.q_full);
      }
      if (it.num_tiles > 0 && prefetched_item != item) read_indices(it, 0);
      for (int t = 0; t < it.num_tiles; ++t, ++g) {
        const int buf = g & 1;
        const uint8_t* src[kTile / 16];
        bool valid[kTile / 16];
#pragma unroll
        for (int rk = 0; rk < kTile / 16; ++rk) {
          const int idx = next_indices[rk];
          valid[rk] = idx >= 0 && idx < p.s_kv;
          src[rk] = kv_base + (valid[rk] ? idx * kv_row_bytes : 0);
        }
        if (t + 1 < it.num_tiles) {
          read_indices(it, t + 1);
        } else if (item + static_cast<int>(gridDim.x) < num_items) {
          prefetched_item = item + gridDim.x;
          read_indices(item_at(prefetched_item), 0);
        }
        if (g >= 2) ptx::mbarrier_wait(&plan.k_empty[buf], ((g >> 1) - 1) & 1);
        const int staged = buf ? staged1 : staged0;
        if (staged >= 0) {
          store_staged_o(buf, staged);
          if (buf) staged1 = -1;
          else staged0 = -1;
        }
        uint8_t* dst = plan.k[buf];
        auto gather_blocks = [&](int blk_begin, int blk_end) {
#pragma unroll
          for (int rk = 0; rk < kTile / 16; ++rk) {
            const int row = group + 16 * rk;
#pragma unroll
            for (int blk = blk_begin; blk < blk_end; ++blk)
              ptx::cp_async_16_zfill(dst + sw128_chunk_offset<kTile>(row, blk * 8 + lane8), src[rk] + blk * 128,
                                     valid[rk]);
          }
        };
        gather_blocks(0, Cfg::kSplitBlocks);
        ptx::cp_async_arrive_noinc(&plan.k_full[buf][0]);
        gather_blocks(Cfg::kSplitBlocks, kBlocks);
        ptx::cp_async_arrive_noinc(&plan.k_full[buf][1]);
      }
      if (it.num_tiles > 0) {
        if ((g - 1) & 1) staged1 = item;
        else staged0 = item;
      }
    }
    // The last items' O: once the math WGs staged it (the buffer's last use completed), store it.
    for (int b = 0; b < 2; ++b) {
      const int staged = b ? staged1 : staged0;
      if (staged < 0) continue;
      const uint32_t last = ((g - 1) & 1) == static_cast<uint32_t>(b) ? g - 1 : g - 2;
      ptx::mbarrier_wait(&plan.k_empty[b], (last >> 1) & 1);
      store_staged_o(b, staged);
    }
    if (tid == 0) ptx::bulk_wait<0>();  // the stores' global writes, before the CTA exits
  } else {
    // ============================== math ==============================
    ptx::warpgroup_regs_increase<Cfg::kMathRegs>();
    const int wg = warpgroup;

    auto sQ = make_tensor(make_smem_ptr(reinterpret_cast<bf16_t*>(plan.q)), SmemTileK<kHeads, D_QK>{});
    auto k_tile = [&](int buf) {
      return make_tensor(make_smem_ptr(reinterpret_cast<bf16_t*>(plan.k[buf])), SmemTileK<kTile, D_QK>{});
    };
    // This WG's half of V: tile columns [256·wg, 256·wg + 256) = 4 column blocks.
    auto v_half = [&](int buf) {
      auto* base = reinterpret_cast<bf16_t*>(plan.k[buf] + wg * 4 * kTile * 128);
      return make_tensor(make_smem_ptr(base), SmemTileKTransposed<kTile, Cfg::kDvPerWarpgroup>{});
    };
    // P of local tile t (in buffer buf): d 576 keeps it in the tile's rope block, d 512 in p[t&1].
    auto p_bytes = [&](int t, int buf) -> uint8_t* {
      if constexpr (Cfg::kPInRopeBlock) return plan.k[buf] + Cfg::kPOffsetInTile;
      else return plan.p[t & 1];
    };
    auto p_tile = [&](int t, int buf) {
      return make_tensor(make_smem_ptr(reinterpret_cast<bf16_t*>(p_bytes(t, buf))), SmemTileK<kHeads, kTile>{});
    };

    Tensor rO = partition_fragment_C(MmaPvRegs{}, Shape<Int<kHeads>, Int<Cfg::kDvPerWarpgroup>>{});
    Tensor rS = partition_fragment_C(MmaS{}, Shape<Int<kHeads>, Int<kTile>>{});
    Tensor rP = make_tensor<bf16_t>(partition_shape_A(MmaPvRegs{}, Shape<Int<kHeads>, Int<kTile>>{}));
    static_assert(decltype(size(rS))::value == decltype(size(rP))::value, "P mirrors S");

    // Rows of this thread: row0 = acc_row(0) and row0 + 8. Running max in base-2 units.
    const int row0 = acc_row(0, tid);
    // m_run: the reference max P and l are relative to (moves lazily, see kLazyRescaleSlack);
    // m_seen: the true running max (max_logits); l_part: this thread's columns only, reduced at
    // the end.
    float m_run[2] = {-INFINITY, -INFINITY}, m_seen[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.f, 0.f};

    // Publications of the other WG's tiles seen so far (mod 2): WG w only ever waits on
    // p_ready[1 - w], once per completed phase.
    uint32_t remote_phase = 0;
    uint32_t g = 0;  // global number of the current item's tile 0
    int k = 0;
    for (int item = blockIdx.x; item < num_items; item += gridDim.x, ++k) {
      const Item it = item_at(item);
      const int n = it.num_tiles;
      auto buf_of = [&](int t) { return static_cast<int>((g + t) & 1); };
      clear(rO);
      m_run[0] = m_run[1] = m_seen[0] = m_seen[1] = -INFINITY;
      l_part[0] = l_part[1] = 0.f;

      // A. this WG's P·V of tile t-2 has finished (caller waited) → its buffer goes back.
      auto release_own_tile = [&](int t) {
        if (t >= 2) ptx::mbarrier_arrive(&plan.k_empty[buf_of(t)]);
      };
      // B. issue S = Q·K_tᵀ.
      auto issue_s = [&](int t) {
        const uint32_t phase = ((g + t) >> 1) & 1;
        ptx::mbarrier_wait(&plan.k_full[buf_of(t)][0], phase);
        wgmma_ss<0, Cfg::kSplitKSteps>(MmaS{}, sQ, k_tile(buf_of(t)), rS, /*zero_init=*/true);
        ptx::mbarrier_wait(&plan.k_full[buf_of(t)][1], phase);
        wgmma_ss<Cfg::kSplitKSteps>(MmaS{}, sQ, k_tile(buf_of(t)), rS, /*zero_init=*/false);
        wgmma_commit();
      };
      // After S of tile t is complete: Q is free once this was the WG's last own tile.
      auto s_done = [&](int t) {
        if (t + 2 >= n) ptx::mbarrier_arrive(&plan.q_empty);
      };
      // C. the other WG's tile t: take its P and row stats, accumulate my half of O.
      auto accumulate_remote = [&](int t) {
        ptx::mbarrier_wait(&plan.p_ready[t & 1], remote_phase);
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
      };
      // Validity of this thread's 16 S columns of tile t (slot < topk_length, index in [0, s_kv)).
      auto column_mask = [&](int t) {
        uint32_t bits = 0;
        CUTE_UNROLL
        for (int i = 0; i < 32; i += 4) {
          CUTE_UNROLL
          for (int e = 0; e < 2; ++e) {
            const int slot = t * kTile + acc_col(i + e, tid);
            const int idx = slot < it.valid_len ? __ldg(it.indices + slot) : -1;
            if (idx >= 0 && idx < p.s_kv) bits |= 1u << (i / 2 + e);
          }
        }
        return bits;
      };
      // D1. S of the own tile t is complete: masked online softmax (base 2), publish P and the
      // row stats for the other WG; `scale` is the factor O must be multiplied by.
      auto softmax_publish = [&](int t, uint32_t valid_bits, float (&scale)[2]) {
        float tile_max[2];
        online_softmax_tile(rS, rP, valid_bits, p.scale_log2, m_run, l_part, scale, kLazyRescaleSlack, tile_max);
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
      };
      // D2. (no P·V in flight) rescale O, issue O += P·V_t.
      auto accumulate_own = [&](int t, const float scale[2]) {
        rescale_o_rows(rO, scale);
        wgmma_rs(MmaPvRegs{}, rP, v_half(buf_of(t)), rO, false);
        wgmma_commit();
      };

      ptx::mbarrier_wait(&plan.q_full, k & 1);
      if (wg >= n) ptx::mbarrier_arrive(&plan.q_empty);  // no own tile: Q not needed

      // The waits are unconditional so ptxas can prove no accumulator is touched while a wgmma
      // writing it is in flight (otherwise it serializes every wgmma: warning C7514).
      int t = wg;
      if (wg == 0 && n > 0) {  // WG0's first tile has no remote predecessor
        const uint32_t bits = column_mask(0);
        issue_s(0);
        wgmma_wait<0>();
        s_done(0);
        float scale[2];
        softmax_publish(0, bits, scale);
        accumulate_own(0, scale);
        t = 2;
      }
      // The remote P·V is issued and waited for BEFORE the own S so that buffer of tile t-1 is
      // released as early as possible — not after S_t has waited for tile t's gather, which put
      // one whole gather per tile on the critical path (docs/notes/prefill.md, v2 and v8).
      for (; t < n; t += 2) {
        wgmma_wait<0>();  // A: own P·V of tile t-2 done
        release_own_tile(t);
        const uint32_t bits = column_mask(t);
        accumulate_remote(t - 1);  // C
        wgmma_wait<0>();           // P·V of tile t-1 done → its buffer is free
        ptx::mbarrier_arrive(&plan.k_empty[buf_of(t - 1)]);
        issue_s(t);                // B
        wgmma_wait<0>();           // S done
        s_done(t);
        float scale[2];
        softmax_publish(t, bits, scale);  // D
        accumulate_own(t, scale);
      }
      if (t == n && t >= 1) {  // the item's last tile is the other WG's
        wgmma_wait<0>();
        release_own_tile(t);
        accumulate_remote(t - 1);
      }
      wgmma_wait<0>();
      // The last tile's buffer is released only after O has been staged in it (below).
      const int stage_buf = n >= 1 ? buf_of(n - 1) : 0;
      g += n;

      // ---- epilogue: total row sums across the two WGs, sink, normalise, store.
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
      float factor[2], l_total[2];
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        l_total[r] = row_sum[0][row] + row_sum[1][row];  // same order in both WGs
        const int head = it.head0 + row;
        float sink_term = 0.f;
        if (p.attn_sink != nullptr && head < p.num_heads) {
          const float sink_log2 = __ldg(p.attn_sink + head) * 1.4426950408889634f;
          sink_term = fast_exp2(sink_log2 - (m_run[r] == -INFINITY ? 0.f : m_run[r]));
        }
        factor[r] = l_total[r] > 0.f ? 1.f / (l_total[r] + sink_term) : 0.f;
      }
      if (n >= 1) {
        // Into the last tile's buffer (both WGs' P·V on it are done: the exchange above), in the
        // out map's 64×64 SW128 boxes; the producer TMA-stores it (rows past H are clipped).
        uint8_t* stage = plan.k[stage_buf];
        for_each_o_chunk(rO, factor, tid, [&](int r, int col, uint4 chunk) {
          const int chunk_index = (wg * Cfg::kDvPerWarpgroup + col) >> 3;
          *reinterpret_cast<uint4*>(stage + sw128_chunk_offset<kHeads>(row0 + 8 * r, chunk_index)) = chunk;
        });
        ptx::fence_proxy_async_smem();
        ptx::mbarrier_arrive(&plan.k_empty[stage_buf]);
      } else {
        // No tile, no buffer: the zero rows go out directly.
        auto* out_base = static_cast<uint8_t*>(p.out) + it.token * p.out_stride_s * 2;
        for_each_o_chunk(rO, factor, tid, [&](int r, int col, uint4 chunk) {
          const int head = it.head0 + row0 + 8 * r;
          if (head >= p.num_heads) return;
          __stcs(reinterpret_cast<uint4*>(out_base + (head * p.out_stride_h + wg * Cfg::kDvPerWarpgroup + col) * 2),
                 chunk);
        });
      }
      if (wg == 0 && (tid & 3) == 0) {
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
          const int head = it.head0 + row0 + 8 * r;
          if (head >= p.num_heads) continue;
          const bool empty = !(l_total[r] > 0.f);
          constexpr float kLn2 = 0.6931471805599453f;
          p.max_logits[it.token * p.ml_stride_s + head * p.ml_stride_h] = empty ? -INFINITY : m_seen[r] * kLn2;
          p.lse[it.token * p.lse_stride_s + head * p.lse_stride_h] =
              empty ? INFINITY : m_run[r] * kLn2 + logf(l_total[r]);
        }
      }
    }
  }
#endif
}

template <int D_QK>
void launch(const Params& params, CUstream_st* stream) {
  using Cfg = Config<D_QK>;
  static const bool attribute_set = [] {
    DSV4_CUDA_CHECK("sparse_prefill",
                    cudaFuncSetAttribute(sparse_prefill_kernel<D_QK>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
    return true;
  }();
  (void)attribute_set;
  const int head_groups = (params.num_heads + Cfg::kHeads - 1) / Cfg::kHeads;
  const int64_t items = int64_t{params.s_q} * head_groups;
  int device = 0, sms = 0;
  DSV4_CUDA_CHECK("sparse_prefill", cudaGetDevice(&device));
  DSV4_CUDA_CHECK("sparse_prefill", cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const dim3 grid(static_cast<unsigned>(items < sms ? items : sms));  // persistent: one CTA per SM
  sparse_prefill_kernel<D_QK><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  check_launch("sparse_prefill");
}

}  // namespace dsv4::cuda::sparse_prefill_detail
