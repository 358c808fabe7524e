// The sparse FP8 decode kernel (split-KV), templated on the cache layout.
//
// Per CTA: one query token row, 64 heads, one split of the index list; 3 warpgroups.
// Producer (warpgroup 2), per tile of 64 index slots:
//   gather  — each slot's bytes (fp8 nope, scales, bf16 rope) are loaded from the paged cache
//             into registers (2 threads per slot, 16-byte loads) one tile ahead of their use, the
//             rows of the tile after are prefetched into L2;
//   dequant — fp8 · scale → bf16 (exact) into one of two K-major SW128 KV stages in shared memory
//             (mbarriers full/empty), which is K for S = Q·Kᵀ and, through its first 512
//             columns, V.
// Consumers (warpgroups 0, 1 = `half`), per tile:
//   S       — warpgroup `half` computes S for all 64 heads × keys 32·half..+32 (wgmma, Q and K in
//             shared memory); the halves exchange row maxima through shared memory;
//   softmax — online, base 2 (logits pre-multiplied by scale·log2 e); P (bf16) goes to shared
//             memory because each warpgroup multiplies all 64 keys;
//   O += PV — warpgroup `half` owns value dims 256·half..+256 (wgmma, 64×256 accumulators).
// The producer fills stage t+1 while the consumers multiply stage t.
#pragma once

#include <cmath>

#include "cuda/attention/sparse_decode/config.h"
#include "cuda/common/check.h"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/fp8_convert.cuh"
#include "cuda/common/prefetch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/wgmma.cuh"
#include "dsv4/dtype.h"

#if !defined(DSV4_HAVE_CUTLASS)
#error "the sparse decode kernel needs CuTe (third_party/cutlass)"
#endif

namespace dsv4::cuda::decode {

namespace detail {

// Global slot of position `pos` of the concatenated list [main | extra] of query row `row`, or
// −1 when the position is past the split, past topk_length, −1, or outside the cache. Scope
// fields are picked one by one with selects: a run-time choice of a whole struct inside the
// kernel parameters could be copied to local memory.
__device__ __forceinline__ int32_t slot_of(const DecodeParams& p, int row, int pos, int split_end) {
  if (pos >= split_end) return -1;
  const bool in_main = pos < p.main.topk;
  const int topk = in_main ? p.main.topk : p.extra.topk;
  const int32_t* lengths = in_main ? p.main.topk_length : p.extra.topk_length;
  const int local = in_main ? pos : pos - p.main.topk;
  const int len = lengths != nullptr ? min(topk, lengths[row / p.s_q]) : topk;
  if (local >= len) return -1;
  const int32_t idx = (in_main ? p.main.indices : p.extra.indices)[static_cast<int64_t>(row) * topk + local];
  return idx >= 0 && idx < (in_main ? p.main.num_slots : p.extra.num_slots) ? idx : -1;
}

// One tile's share of a thread, in registers: its slot's fp8 chunks, rope chunks and scales.
template <KvLayout L>
struct TileRegs {
  uint4 fp8[kFp8ChunksPerThread<L>];
  uint4 rope[kRopeChunksPerThread];
  uint4 scales;  // MODEL1: 7 UE8M0 bytes (+pad) in .x/.y; V32: 4 fp32 scales
  bool valid;
};

// Where a valid slot's bytes live: its data row (V32: the whole token) and, for MODEL1, its
// 8-byte scale row. The scope is picked by the slot's position `pos` in the concatenated list.
struct SlotBytes {
  const uint8_t* data;
  const uint8_t* scales;
};
template <KvLayout L>
__device__ __forceinline__ SlotBytes slot_bytes(const DecodeParams& p, int pos, int32_t slot) {
  const bool in_main = pos < p.main.topk;
  const int block_size = in_main ? p.main.block_size : p.extra.block_size;
  const int block = slot / block_size;
  const int offset = slot - block * block_size;
  const uint8_t* base = (in_main ? p.main.cache : p.extra.cache) +
                        block * (in_main ? p.main.block_stride : p.extra.block_stride);
  if constexpr (L == KvLayout::model1_fp8) {
    return {base + offset * model1::kDataBytes,
            base + static_cast<int64_t>(block_size) * model1::kDataBytes + offset * model1::kScaleBytes};
  } else {
    const uint8_t* data = base + offset * v32::kTokenBytes;
    return {data, data + v32::kScaleOffset};
  }
}

// Pulls a valid slot's bytes into L2 (no registers): thread 0 of the slot prefetches the data
// row in one bulk request, thread 1 the MODEL1 scale row. Issued two tiles ahead, so the
// register loads one tile ahead hit L2 instead of waiting on DRAM.
template <KvLayout L>
__device__ __forceinline__ void prefetch_slot(const DecodeParams& p, int pos, int32_t slot, int sub) {
  if (slot < 0) return;
  const SlotBytes bytes = slot_bytes<L>(p, pos, slot);
  if (sub == 0) {
    ptx::prefetch_l2_bulk(bytes.data, L == KvLayout::model1_fp8 ? model1::kDataBytes : v32::kTokenBytes);
  } else if (L == KvLayout::model1_fp8 && sub == 1) {
    ptx::prefetch_l2(bytes.scales);
  }
}

// Issues the register loads of slot `slot`: nothing is read for an invalid slot.
template <KvLayout L>
__device__ __forceinline__ void load_slot(const DecodeParams& p, int pos, int32_t slot, int sub,
                                          TileRegs<L>& regs) {
  using T = LayoutTraits<L>;
  regs.valid = slot >= 0;
  if (!regs.valid) return;
  const SlotBytes bytes = slot_bytes<L>(p, pos, slot);
  if constexpr (L == KvLayout::model1_fp8) {
    const uint2 s = __ldg(reinterpret_cast<const uint2*>(bytes.scales));
    regs.scales = make_uint4(s.x, s.y, 0u, 0u);
  } else {
    regs.scales = __ldg(reinterpret_cast<const uint4*>(bytes.scales));
  }
#pragma unroll
  for (int i = 0; i < kFp8ChunksPerThread<L>; ++i)
    regs.fp8[i] = __ldg(reinterpret_cast<const uint4*>(bytes.data + 16 * (sub + kThreadsPerKey * i)));
#pragma unroll
  for (int i = 0; i < kRopeChunksPerThread; ++i)
    regs.rope[i] = __ldg(reinterpret_cast<const uint4*>(bytes.data + T::kRopeOffset + 16 * (sub + kThreadsPerKey * i)));
}

// Dequantizes a thread's share into row `key` of a KV stage (zeros for an invalid slot, so
// masked keys contribute 0 · 0 to P·V, never NaN).
template <KvLayout L>
__device__ __forceinline__ void store_slot(const TileRegs<L>& regs, int key, int sub, uint8_t* stage) {
  using T = LayoutTraits<L>;
  constexpr int kChunksPerScale = T::kQuantBlock / 16 / kThreadsPerKey;  // fp8 chunks i per scale
#pragma unroll
  for (int i = 0; i < kFp8ChunksPerThread<L>; ++i) {
    const int blk = i / kChunksPerScale;
    float scale;
    if constexpr (L == KvLayout::model1_fp8) {
      const uint32_t word = blk < 4 ? regs.scales.x : regs.scales.y;
      scale = ue8m0_to_float(static_cast<uint8_t>(word >> (8 * (blk % 4))));
    } else {
      scale = __uint_as_float(blk == 0 ? regs.scales.x : blk == 1 ? regs.scales.y
                              : blk == 2 ? regs.scales.z : regs.scales.w);
    }
    uint4 lo = make_uint4(0u, 0u, 0u, 0u), hi = lo;
    if (regs.valid) fp8x16_to_bf16x16(regs.fp8[i], scale, lo, hi);
    const int c = sub + kThreadsPerKey * i;  // fp8 chunk → bf16 chunks 2c, 2c+1
    *reinterpret_cast<uint4*>(stage + sw128_chunk_offset<kTileKeys>(key, 2 * c)) = lo;
    *reinterpret_cast<uint4*>(stage + sw128_chunk_offset<kTileKeys>(key, 2 * c + 1)) = hi;
  }
#pragma unroll
  for (int i = 0; i < kRopeChunksPerThread; ++i) {
    const int r = sub + kThreadsPerKey * i;
    *reinterpret_cast<uint4*>(stage + sw128_chunk_offset<kTileKeys>(key, T::kNope / 8 + r)) =
        regs.valid ? regs.rope[i] : make_uint4(0u, 0u, 0u, 0u);
  }
}

// ---- the two products of a tile, per warpgroup (half) -------------------------------------
// Accumulators are m64nN wgmma fragments: element i of warp w sits at row 16w + lane/4 +
// 8·((i/2)%2), column 8·(i/4) + 2·(lane%4) + i%2.
using MmaQK = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x32x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>{}));
using MmaPV = decltype(cute::make_tiled_mma(
    cute::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::MN>{}));

// s[16] = Q (64 heads × d_qk) · K[32·half .. +32]ᵀ (waits for the result).
template <KvLayout L>
__device__ __forceinline__ void qk_product(float (&s)[16], const uint8_t* q_tile, const uint8_t* stage,
                                           int half) {
  using namespace cute;
  constexpr int kDqk = LayoutTraits<L>::kDqk;
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<const bf16_t*>(q_tile)), SmemTileK<kHeadsPerCta, kDqk>{});
  Tensor sK = local_tile(make_tensor(make_smem_ptr(reinterpret_cast<const bf16_t*>(stage)),
                                     SmemTileK<kTileKeys, kDqk>{}),
                         Shape<_32, Int<kDqk>>{}, make_coord(half, 0));
  Tensor rS = make_tensor(make_rmem_ptr(&s[0]), partition_fragment_C(MmaQK{}, Shape<_64, _32>{}).layout());
  wgmma_ss(MmaQK{}, sQ, sK, rS, true);
  wgmma_commit();
  wgmma_wait<0>();
  warpgroup_fence_operand(rS);
}

// Issues o[128] += P (64 heads × 64 keys, bf16) · V[:, 256·half .. +256]; pv_wait() completes it.
template <KvLayout L>
__device__ __forceinline__ void pv_issue(float (&o)[128], const uint8_t* p_tile, const uint8_t* stage,
                                         int half) {
  using namespace cute;
  constexpr int kDqk = LayoutTraits<L>::kDqk;
  Tensor sP = make_tensor(make_smem_ptr(reinterpret_cast<const bf16_t*>(p_tile)), SmemTileK<kHeadsPerCta, kTileKeys>{});
  Tensor sV = local_tile(make_tensor(make_smem_ptr(reinterpret_cast<const bf16_t*>(stage)),
                                     SmemTileKTransposed<kTileKeys, kDqk>{}),
                         Shape<_256, Int<kTileKeys>>{}, make_coord(half, 0));
  Tensor rO = make_tensor(make_rmem_ptr(&o[0]), partition_fragment_C(MmaPV{}, Shape<_64, _256>{}).layout());
  wgmma_ss(MmaPV{}, sP, sV, rO, false);
  wgmma_commit();
}
__device__ __forceinline__ void pv_wait(float (&o)[128]) {
  using namespace cute;
  wgmma_wait<0>();
  Tensor rO = make_tensor(make_rmem_ptr(&o[0]), partition_fragment_C(MmaPV{}, Shape<_64, _256>{}).layout());
  warpgroup_fence_operand(rO);  // no use of o may be scheduled before the wait
}

// Where one CTA works: its query row, head block and split.
struct CtaWork {
  int row, head_block, split, split_begin, split_end, num_tiles;
};

// Named barriers (0 is __syncthreads): 1..4 pair warp w of both consumer warpgroups, 5 all
// consumers.
inline constexpr int kBarConsumers = 5;

// Warpgroup 2: per tile t, the slot (my_key) of this thread is loaded into registers one tile
// ahead, the rows of the tile after are prefetched into L2, and the index of the one after that
// is read; the registers are dequantized into stage t%2 once the consumers have released it.
template <KvLayout L>
__device__ __forceinline__ void produce(const DecodeParams& p, const CtaWork& w, uint8_t* smem) {
  using S = SmemPlan<L>;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* empty = full + 2;
  uint8_t* key_valid = smem + S::kKeyValid;
  const int tid = threadIdx.x - kConsumerThreads;
  const int my_key = tid / kThreadsPerKey, my_sub = tid % kThreadsPerKey;
  const int my_pos = w.split_begin + my_key;  // my slot's position in tile 0
  TileRegs<L> regs;
  load_slot<L>(p, my_pos, slot_of(p, w.row, my_pos, w.split_end), my_sub, regs);
  int32_t slot_ahead1 = slot_of(p, w.row, my_pos + kTileKeys, w.split_end);
  int32_t slot_ahead2 = slot_of(p, w.row, my_pos + 2 * kTileKeys, w.split_end);
  prefetch_slot<L>(p, my_pos + kTileKeys, slot_ahead1, my_sub);
  for (int t = 0; t < w.num_tiles; ++t) {
    const int stage = t & 1;
    if (t >= 2) ptx::mbarrier_wait(&empty[stage], ((t >> 1) + 1) & 1);  // tile t-2 consumed
    store_slot<L>(regs, my_key, my_sub, smem + S::kKv + stage * S::kKvStage);
    if (my_sub == 0) key_valid[stage * kTileKeys + my_key] = regs.valid;
    ptx::fence_proxy_async_smem();  // the stage is read by wgmma
    ptx::mbarrier_arrive(&full[stage]);
    const int pos1 = my_pos + (t + 1) * kTileKeys;
    load_slot<L>(p, pos1, slot_ahead1, my_sub, regs);  // −1 past the split: nothing loaded
    prefetch_slot<L>(p, pos1 + kTileKeys, slot_ahead2, my_sub);
    slot_ahead1 = slot_ahead2;
    slot_ahead2 = slot_of(p, w.row, pos1 + 2 * kTileKeys, w.split_end);
  }
}

// Warpgroups 0 and 1: S, online softmax, P·V per tile; then the row's output.
template <KvLayout L>
__device__ __forceinline__ void consume(const DecodeParams& p, const CtaWork& w, uint8_t* smem) {
  using T = LayoutTraits<L>;
  using S = SmemPlan<L>;
  uint8_t* q_tile = smem + S::kQ;
  uint8_t* p_tile = smem + S::kP;
  float* row_max_x = reinterpret_cast<float*>(smem + S::kRowMax);
  float* row_sum_x = reinterpret_cast<float*>(smem + S::kRowSum);
  const uint8_t* key_valid = smem + S::kKeyValid;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* empty = full + 2;

  const int warp_id = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp_id % 4, half = warp_id / 4;  // warp in warpgroup, warpgroup
  const int g = lane / 4, q4 = lane % 4;              // fragment row / column pair

  // Query rows of this head block (zero rows past H), same tile layout as the KV stages.
  {
    constexpr int kChunks = T::kDqk / 8;
    for (int i = threadIdx.x; i < kHeadsPerCta * kChunks; i += kConsumerThreads) {
      const int r = i / kChunks, c = i - r * kChunks;
      const int h = w.head_block * kHeadsPerCta + r;
      const bool ok = h < p.num_heads;
      const uint16_t* src = p.q + static_cast<int64_t>(w.row) * p.q_row_stride +
                            static_cast<int64_t>(ok ? h : 0) * p.q_head_stride + c * 8;
      ptx::cp_async_16_zfill(q_tile + sw128_chunk_offset<kHeadsPerCta>(r, c), src, ok);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
    ptx::fence_proxy_async_smem();  // Q is read by wgmma
    ptx::named_barrier_sync(kBarConsumers, kConsumerThreads);
  }

  float o_acc[128];  // 64 heads × 256 value dims of this warpgroup (fragment order)
#pragma unroll
  for (int i = 0; i < 128; ++i) o_acc[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // rows g, g+8 of this warp (base-2 logits)
  float l_run[2] = {0.0f, 0.0f};            // this lane's share of the row sums

  for (int t = 0; t < w.num_tiles; ++t) {
    const int stage_idx = t & 1;
    ptx::mbarrier_wait(&full[stage_idx], (t >> 1) & 1);  // stage and valid flags written
    const uint8_t* stage = smem + S::kKv + stage_idx * S::kKvStage;
    const uint8_t* valid = key_valid + stage_idx * kTileKeys;

    // ---- S = Q·Kᵀ for 64 heads × 32 keys ---------------------------------------------------
    float s_acc[16];
    qk_product<L>(s_acc, q_tile, stage, half);

    // ---- online softmax (base 2) -----------------------------------------------------------
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = half * 32 + j * 8 + 2 * q4;
      const bool v0 = valid[col] != 0, v1 = valid[col + 1] != 0;
      s_acc[4 * j + 0] = v0 ? s_acc[4 * j + 0] * p.scale_log2 : -INFINITY;
      s_acc[4 * j + 1] = v1 ? s_acc[4 * j + 1] * p.scale_log2 : -INFINITY;
      s_acc[4 * j + 2] = v0 ? s_acc[4 * j + 2] * p.scale_log2 : -INFINITY;
      s_acc[4 * j + 3] = v1 ? s_acc[4 * j + 3] * p.scale_log2 : -INFINITY;
      tile_max[0] = fmaxf(tile_max[0], fmaxf(s_acc[4 * j + 0], s_acc[4 * j + 1]));
      tile_max[1] = fmaxf(tile_max[1], fmaxf(s_acc[4 * j + 2], s_acc[4 * j + 3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    }
    if (q4 == 0) {
      row_max_x[half * kHeadsPerCta + group * 16 + g] = tile_max[0];
      row_max_x[half * kHeadsPerCta + group * 16 + g + 8] = tile_max[1];
    }
    ptx::named_barrier_sync(1 + group, 64);  // warp `group` of both warpgroups: same 16 heads
    float corr[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float other = row_max_x[(1 - half) * kHeadsPerCta + group * 16 + g + 8 * r];
      const float m_new = fmaxf(m_run[r], fmaxf(tile_max[r], other));
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: keep exp2 finite
      corr[r] = exp2f(m_run[r] - m_use[r]);           // m_run = -inf → 0
      m_run[r] = m_new;
      l_run[r] *= corr[r];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p0 = exp2f(s_acc[4 * j + 0] - m_use[0]), p1 = exp2f(s_acc[4 * j + 1] - m_use[0]);
      const float p2 = exp2f(s_acc[4 * j + 2] - m_use[1]), p3 = exp2f(s_acc[4 * j + 3] - m_use[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      const int chunk = half * 4 + j;  // 8 keys = one 16-byte chunk of a P row
      const int prow = group * 16 + g;
      *reinterpret_cast<uint32_t*>(p_tile + sw128_chunk_offset<kHeadsPerCta>(prow, chunk) + 4 * q4) =
          pack_bf16x2(p0, p1);
      *reinterpret_cast<uint32_t*>(p_tile + sw128_chunk_offset<kHeadsPerCta>(prow + 8, chunk) + 4 * q4) =
          pack_bf16x2(p2, p3);
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o_acc[4 * j + 0] *= corr[0];
      o_acc[4 * j + 1] *= corr[0];
      o_acc[4 * j + 2] *= corr[1];
      o_acc[4 * j + 3] *= corr[1];
    }
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(kBarConsumers, kConsumerThreads);  // P of both halves written

    // ---- O += P·V for 64 heads × 256 value dims ---------------------------------------------
    pv_issue<L>(o_acc, p_tile, stage, half);
    pv_wait(o_acc);
    ptx::mbarrier_arrive(&empty[stage_idx]);  // this thread is done with the stage
    // Both warpgroups' P·V read all of P: nobody writes the next P before both are done.
    ptx::named_barrier_sync(kBarConsumers, kConsumerThreads);
  }

  // ---- finish: full row sums, normalise, write -----------------------------------------------
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if (q4 == 0) {
    row_sum_x[half * kHeadsPerCta + group * 16 + g] = l_run[0];
    row_sum_x[half * kHeadsPerCta + group * 16 + g + 8] = l_run[1];
  }
  ptx::named_barrier_sync(kBarConsumers, kConsumerThreads);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int hr = group * 16 + g + 8 * r;
    const int h = w.head_block * kHeadsPerCta + hr;
    if (h >= p.num_heads) continue;
    const float l = l_run[r] + row_sum_x[(1 - half) * kHeadsPerCta + hr];
    const bool empty_row = !(l > 0.0f);
    const float lse = empty_row ? -INFINITY : (m_run[r] + log2f(l)) * 0.69314718055994531f;
    const int64_t out_row = static_cast<int64_t>(w.row) * p.num_heads + h;
    float factor = empty_row ? 0.0f : 1.0f / l;
    if (p.num_splits == 1) {
      if (!empty_row && p.sink != nullptr) factor /= 1.0f + expf(p.sink[h] - lse);
      uint16_t* dst = p.out + out_row * kDv + half * 256 + 2 * q4;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<uint32_t*>(dst + j * 8) =
            pack_bf16x2(o_acc[4 * j + 2 * r] * factor, o_acc[4 * j + 2 * r + 1] * factor);
      }
      if (half == 0 && q4 == 0) p.lse[out_row] = empty_row ? INFINITY : lse;
    } else {
      float* dst = p.partial_o + (out_row * p.num_splits + w.split) * kDv + half * 256 + 2 * q4;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(dst + j * 8) =
            make_float2(o_acc[4 * j + 2 * r] * factor, o_acc[4 * j + 2 * r + 1] * factor);
      }
      if (half == 0 && q4 == 0) p.partial_lse[out_row * p.num_splits + w.split] = lse;
    }
  }
}

}  // namespace detail

template <KvLayout L>
__global__ void __launch_bounds__(kThreads, 1) sparse_decode_kernel(const __grid_constant__ DecodeParams p) {
  using S = SmemPlan<L>;
  extern __shared__ __align__(1024) uint8_t smem[];
  detail::CtaWork w;
  const int num_head_blocks = (p.num_heads + kHeadsPerCta - 1) / kHeadsPerCta;
  w.head_block = blockIdx.x % num_head_blocks;
  w.split = blockIdx.x / num_head_blocks;
  w.row = blockIdx.y;
  w.split_begin = w.split * p.split_len;
  w.split_end = min(w.split_begin + p.split_len, p.topk_total);
  w.num_tiles = w.split_end > w.split_begin ? (w.split_end - w.split_begin + kTileKeys - 1) / kTileKeys : 0;

  if (threadIdx.x == 0) {
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
    ptx::mbarrier_init(&bars[0], kProducerThreads);  // full[2]: every producer thread arrives
    ptx::mbarrier_init(&bars[1], kProducerThreads);
    ptx::mbarrier_init(&bars[2], kConsumerThreads);  // empty[2]: every consumer thread arrives
    ptx::mbarrier_init(&bars[3], kConsumerThreads);
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the last block-wide barrier: the roles below sync among themselves
  if (threadIdx.x >= kConsumerThreads) {
    ptx::warpgroup_regs_decrease<kProducerRegs>();
    detail::produce<L>(p, w, smem);
  } else {
    ptx::warpgroup_regs_increase<kConsumerRegs>();
    detail::consume<L>(p, w, smem);
  }
}

template <KvLayout L>
void launch_sparse_decode(const DecodeParams& params, cudaStream_t stream) {
  constexpr int kSmem = SmemPlan<L>::kBytes;
  static const cudaError_t attr_status = cudaFuncSetAttribute(
      sparse_decode_kernel<L>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  check_cuda(attr_status, "sparse_decode", "cudaFuncSetAttribute(max dynamic shared memory)");
  const int num_head_blocks = (params.num_heads + kHeadsPerCta - 1) / kHeadsPerCta;
  const dim3 grid(num_head_blocks * params.num_splits, params.num_rows);
  sparse_decode_kernel<L><<<grid, kThreads, kSmem, stream>>>(params);
  check_launch("sparse_decode");
}

}  // namespace dsv4::cuda::decode
