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

#include <cmath>

#include "cuda/attention/sparse_decode/config.h"
#include "cuda/common/attention_tile.cuh"
#include "cuda/common/check.h"
#include "cuda/common/cluster.cuh"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/fp8_convert.cuh"
#include "cuda/common/kernel_trace.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/per_device_once.h"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"
#include "cuda/common/wgmma.cuh"
#include "dsv4/dtype.h"
#include "math/softmax_scale.h"

#if !defined(DSV4_HAVE_CUTLASS)
#error "the sparse decode kernel needs CuTe (third_party/cutlass)"
#endif

namespace dsv4::cuda::decode {

namespace detail {

// The valid lengths of a query row's two scopes (topk_length applied, negative lengths as 0),
// read once per CTA so no later index read waits on them.
//
// Positions are compacted: a row's work is the list [main 0..len.main | extra 0..len.extra) of
// only its valid-length entries, and the splits cut that list. Slots past a scope's topk_length
// are never gathered, so a row with short lengths runs fewer tiles (a split past the row's end
// runs none and reports an empty row: lse −inf, zero output), as FlashMLA skips them too.
struct RowLengths {
  int main, extra;
  __device__ __forceinline__ int total() const { return main + extra; }
  // Whether compact position `pos` lies in the main scope.
  __device__ __forceinline__ bool in_main(int pos) const { return pos < main; }
};
__device__ __forceinline__ int scope_length(const DecodeScope& s, int b) {
  return s.topk_length != nullptr ? max(0, min(s.topk, __ldg(s.topk_length + b))) : s.topk;
}
__device__ __forceinline__ RowLengths row_lengths(const DecodeParams& p, int b) {
  return {scope_length(p.main, b), scope_length(p.extra, b)};
}

// The query row of this CTA (row = batch · s_q + seq): blockIdx.y, or with length tensors the
// rows in launch_rank order (config.h) — batch launch_rank⁻¹(blockIdx.y / s_q), all s_q rows of a
// batch adjacent. The batches' lengths and the chosen batch pass through `scratch` (P's bytes,
// not yet in use) with one block-wide barrier; the caller's barrier after the mbarrier init
// publishes the choice (read it with chosen_row). The choice lies past the lengths, not before
// them: the compiler reads the lengths 16 bytes at a time from an aligned base, and with the
// lengths at scratch + 1 those reads took in the word being written (a racecheck hazard).
__device__ __forceinline__ bool orders_rows(const DecodeParams& p) {
  const int batches = p.num_rows / p.s_q;
  return (p.main.topk_length != nullptr || p.extra.topk_length != nullptr) && batches > 1 &&
         batches <= kMaxOrderedBatches;
}
__device__ __forceinline__ void choose_row(const DecodeParams& p, int* scratch) {
  const int batches = p.num_rows / p.s_q;
  int* len = scratch;
  for (int i = threadIdx.x; i < batches; i += blockDim.x) len[i] = row_lengths(p, i).total();
  __syncthreads();
  const int rank = blockIdx.y / p.s_q;
  for (int i = threadIdx.x; i < batches; i += blockDim.x)
    if (launch_rank(len, batches, i) == rank) scratch[kMaxOrderedBatches] = i;
}
__device__ __forceinline__ int chosen_row(const DecodeParams& p, const int* scratch) {
  return scratch[kMaxOrderedBatches] * p.s_q + blockIdx.y % p.s_q;
}

// The index at compact position `pos` of query row (batch, seq), or −1 (nothing read) when the
// position is past the split (whose end is at most len.total(), so the scope-local position is
// within its valid length). Not yet range-checked: slot_in_cache() does that where the value is
// used, so issuing the read does not wait for it. Scope fields are picked one by one with
// selects: a run-time choice of a whole struct inside the kernel parameters could be copied to
// local memory.
__device__ __forceinline__ int32_t raw_index(const DecodeParams& p, int batch, int seq, int pos,
                                             int split_end, const RowLengths& len) {
  if (pos >= split_end) return -1;
  const bool in_main = len.in_main(pos);
  const int local = in_main ? pos : pos - len.main;
  const int64_t row_offset =
      static_cast<int64_t>(batch) * (in_main ? p.main.indices_b_stride : p.extra.indices_b_stride) +
      static_cast<int64_t>(seq) * (in_main ? p.main.indices_s_stride : p.extra.indices_s_stride);
  return __ldg((in_main ? p.main.indices : p.extra.indices) + row_offset + local);
}
// The cache slot of index `idx` of the main (in_main) or extra scope, or −1 when it is −1 or
// outside that scope's cache.
__device__ __forceinline__ int32_t slot_in_cache(const DecodeParams& p, bool in_main, int32_t idx) {
  return idx >= 0 && idx < (in_main ? p.main.num_slots : p.extra.num_slots) ? idx : -1;
}

// One tile's share of a thread, in registers: its slot's fp8 chunks, bf16 (rope) chunks and
// scales. (Arrays hold at least one element; loops run to the real counts.)
template <KvLayout L, int kCluster>
struct TileRegs {
  uint4 fp8[kFp8ChunksPerThread<L, kCluster> > 0 ? kFp8ChunksPerThread<L, kCluster> : 1];
  uint4 rope[kBf16ChunksPerThread<L, kCluster> > 0 ? kBf16ChunksPerThread<L, kCluster> : 1];
  uint4 scales;  // MODEL1: 7 UE8M0 bytes (+pad) in .x/.y; V32: 4 fp32 scales; per tensor: .x
  bool valid;
};

// Tiles of registers a producer thread keeps in flight: two when a cluster halves a MODEL1 share
// (38 registers each). V3.2's halved share (44 registers) fits twice too, but measured slower
// (docs/notes/decode.md, v7: 520 vs 511 µs), so it keeps one.
template <KvLayout L, int kCluster>
inline constexpr int kProducerBuffers =
    kCluster == 2 && (L == KvLayout::model1_fp8 || L == KvLayout::fp8_per_tensor) ? 2 : 1;

// Whether the producer refills its registers chunk by chunk while it stores a tile (store_slot)
// or with the whole next slot once the tile is stored and arrived on. Storing first puts a whole
// load latency on every tile's period: without a cluster the interleaved refill runs the V4-Flash
// H64 anchors at 0.94-0.97x the time, and in a cluster, since the peer's half goes by bulk copy
// (send_warp_rows), the FP8 layouts' H128 anchors at 0.94-0.97x (V3.2, V4-Pro, CONFIG4, peak
// H128; H200, 2026-11-29). BF16 in a cluster (no conversion: a tile's stores are plain copies)
// ran 1.08x the time with it, so it keeps the refill after the arrive: loads skipped for an
// invalid slot, offsets recomputed per store (docs/notes/decode.md).
template <KvLayout L, int kCluster>
inline constexpr bool kRefillWhileStoring = kCluster == 1 || L != KvLayout::bf16;

#if defined(DSV4_KERNEL_TRACE)
// kernel_trace.cuh's events (a -DDSV4_KERNEL_TRACE build only). Traced: the grid's first row's
// first two CTAs (a cluster's pair). Per tile row t: the producer's thread 0 records 0 before
// its `empty` wait, 1 after it, 2 with the tile stored, 3 after the `full` arrive, 4 with the
// refill issued; warpgroup 0's thread 0: 5 before its stage wait, 6 after it, 7 with S done,
// 8 after the p_free wait, 9 after the p_ready arrive, 10 with P·V done and the stage released;
// warpgroup 1's thread 0: 11 before its stage wait, 12 after it, 13 after the p_ready wait, 14
// with P·V done and the stage released. Once row: 0 kernel entry, 1 past the block-wide barrier,
// 2 Q loaded, 3 warpgroup 0's last tile done, 4 its O stored, 5 / 6 the producer's start / end,
// 7 warpgroup 1's O stored.
__device__ __forceinline__ int trace_cta() {
  const int x = static_cast<int>(blockIdx.x);
  return blockIdx.y == 0 && x < trace::kCtas ? x : -1;
}
__device__ __forceinline__ int trace_tile(int t) { return t < trace::kOnceRow ? t : -1; }
#endif

// Where a valid slot's bytes live: its data row (V32: the whole token) and, for MODEL1, its
// 8-byte scale row, in the main (in_main) or the extra scope's cache.
struct SlotBytes {
  const uint8_t* data;
  const uint8_t* scales;
};
template <KvLayout L>
__device__ __forceinline__ SlotBytes slot_bytes(const DecodeParams& p, bool in_main, int32_t slot) {
  const int block_size = in_main ? p.main.block_size : p.extra.block_size;
  const int block = slot / block_size;
  const int offset = slot - block * block_size;
  const uint8_t* base = (in_main ? p.main.cache : p.extra.cache) +
                        block * (in_main ? p.main.block_stride : p.extra.block_stride);
  if constexpr (L == KvLayout::model1_fp8) {
    return {base + offset * model1::kDataBytes,
            base + static_cast<int64_t>(block_size) * model1::kDataBytes + offset * model1::kScaleBytes};
  } else if constexpr (L == KvLayout::v32_fp8) {
    const uint8_t* data = base + offset * v32::kTokenBytes;
    return {data, data + v32::kScaleOffset};
  } else {  // BF16, FP8_PER_TENSOR: data rows only
    return {base + offset * LayoutTraits<L>::kDataBytes, nullptr};
  }
}

// Where a slot's bytes are read from: its data and scale rows (a slot in the main scope when
// in_main, else the extra one), or nothing for an invalid slot (−1).
struct SlotSource {
  SlotBytes bytes;
  float tensor_scale;  // FP8_PER_TENSOR's scale of the slot's cache
  bool valid;
};
template <KvLayout L>
__device__ __forceinline__ SlotSource slot_source(const DecodeParams& p, bool in_main, int32_t slot) {
  SlotSource src{{nullptr, nullptr}, in_main ? p.main.tensor_scale : p.extra.tensor_scale, slot >= 0};
  if (src.valid) src.bytes = slot_bytes<L>(p, in_main, slot);
  return src;
}

// The register loads of one slot ask L2 for 256-byte fetches, so a row's DRAM reads come in few
// bursts. (A bulk L2 prefetch of each row one tile ahead, which this replaced, cost 3-7 %:
// docs/notes/decode.md.) An invalid slot reads nothing. With kRefillWhileStoring it gets zero
// codes and scales (predicated loads; finite: a UE8M0 0 is 2^-127), so its conversion gives
// zeros without a branch around it; without, load_slot skips it and store_slot branches on it.
template <KvLayout L, int kCluster>
__device__ __forceinline__ void load_scales(const SlotSource& src, TileRegs<L, kCluster>& regs) {
  constexpr bool kRefill = kRefillWhileStoring<L, kCluster>;  // else never called for an invalid slot
  regs.valid = src.valid;
  if constexpr (L == KvLayout::model1_fp8) {
    const uint2 s = kRefill ? ptx::ld_nc_v2_or_zero(src.bytes.scales, src.valid)
                            : __ldg(reinterpret_cast<const uint2*>(src.bytes.scales));
    regs.scales = make_uint4(s.x, s.y, 0u, 0u);
  } else if constexpr (L == KvLayout::v32_fp8) {
    regs.scales = kRefill ? ptx::ld_nc_l2_256_or_zero(src.bytes.scales, src.valid)
                          : __ldg(reinterpret_cast<const uint4*>(src.bytes.scales));
  } else {
    regs.scales = make_uint4(__float_as_uint(src.valid ? src.tensor_scale : 0.0f), 0u, 0u, 0u);
  }
}
template <KvLayout L, int kCluster>
__device__ __forceinline__ uint4 load_chunk(const SlotSource& src, const uint8_t* at) {
  if constexpr (kRefillWhileStoring<L, kCluster>) return ptx::ld_nc_l2_256_or_zero(at, src.valid);
  return ptx::ld_nc_l2_256(at);  // never called for an invalid slot
}
template <KvLayout L, int kCluster>
__device__ __forceinline__ void load_fp8_chunk(const SlotSource& src, int sub, int i, TileRegs<L, kCluster>& regs) {
  regs.fp8[i] = load_chunk<L, kCluster>(src, src.bytes.data + 16 * (sub + kThreadsPerKey<kCluster> * i));
}
template <KvLayout L, int kCluster>
__device__ __forceinline__ void load_rope_chunk(const SlotSource& src, int sub, int i, TileRegs<L, kCluster>& regs) {
  regs.rope[i] = load_chunk<L, kCluster>(
      src, src.bytes.data + LayoutTraits<L>::kBf16Offset + 16 * (sub + kThreadsPerKey<kCluster> * i));
}
// A whole slot's share into registers (the first tiles of a split).
template <KvLayout L, int kCluster>
__device__ __forceinline__ void load_slot(const SlotSource& src, int sub, TileRegs<L, kCluster>& regs) {
  if (!kRefillWhileStoring<L, kCluster> && !src.valid) {  // nothing read; store_slot zeroes it under `valid`
    regs.valid = false;
    return;
  }
  load_scales<L, kCluster>(src, regs);
#pragma unroll
  for (int i = 0; i < kFp8ChunksPerThread<L, kCluster>; ++i) load_fp8_chunk<L, kCluster>(src, sub, i, regs);
#pragma unroll
  for (int i = 0; i < kBf16ChunksPerThread<L, kCluster>; ++i) load_rope_chunk<L, kCluster>(src, sub, i, regs);
}

// One 16-byte chunk of a key row into this CTA's stage.
__device__ __forceinline__ void put_chunk(uint8_t* stage, uint32_t offset, const uint4& v) {
  *reinterpret_cast<uint4*>(stage + offset) = v;
}

// In a cluster, a producer warp's rows of a stored stage (its 8 keys, 128 bytes of each 64-dim
// span, so one contiguous kilobyte per span under the SW128 layout) copied into the same place of
// the peer's stage by the TMA unit, one bulk copy per span, counted on the peer's `full` barrier.
// Per-thread st.async of every chunk to the peer, which this replaced, ran the H 128 FP8 anchors
// at 1.06-1.13x this time (docs/notes/decode.md): the producer's instruction stream no longer
// waits for a second store per chunk to drain. Called by every lane after its stores and its
// proxy fence; lane 0 issues the copies.
template <KvLayout L>
__device__ __forceinline__ void send_warp_rows(const uint8_t* stage, uint32_t peer_stage, uint32_t peer_full,
                                               int first_key) {
  constexpr int kSpans = LayoutTraits<L>::kDqk / 64;
  constexpr uint32_t kWarpRowBytes = 32 / kThreadsPerKey<2> * 128;
  __syncwarp();
  if ((threadIdx.x & 31) != 0) return;
  const uint32_t at = static_cast<uint32_t>(first_key) * 128;
#pragma unroll
  for (int span = 0; span < kSpans; ++span) {
    const uint32_t offset = span * kTileKeys * 128 + at;
    ptx::bulk_copy_to_cta(peer_stage + offset, stage + offset, kWarpRowBytes, peer_full);
  }
}

// Where a producer thread's chunks go in a stage (bytes). Under the SW128 swizzle chunk c of row
// `key` sits at (c / 8) · 8 KB + key · 128 + ((c % 8) ^ (key % 8)) · 16 (smem_layout.cuh). The
// thread's fp8 chunk i becomes bf16 chunks 2c, 2c + 1 with c = sub + kStep · i, whose place in
// its 8-chunk span repeats every kPeriod values of i: every such store is one of 2 · kPeriod
// per-thread bases plus a compile-time multiple of 8 KB. Its bf16 (rope) chunk i is chunk
// kNope / 8 + r, r = sub + kStep · i: span i / (8 / kStep) past the nope ones, place
// r % 8 = sub + kStep · (i % (8 / kStep)), and (place ^ key % 8) splits into sub's low bits,
// fixed per thread, and the rest, one XOR with an immediate. A handful of registers held across tiles,
// where the generic formula per store cost ~5 integer instructions, and hoisting it whole ~30
// live registers (the producer spilled).
template <KvLayout L, int kCluster>
struct ChunkOffsets {
  static constexpr int kStep = kThreadsPerKey<kCluster>;
  static constexpr int kPeriod = 4 / kStep;
  static constexpr uint32_t kSpanBytes = kTileKeys * 128;
  static constexpr int kBf16PerSpan = 8 / kStep;  // bf16 chunks i per span
  static_assert(LayoutTraits<L>::kNope % 64 == 0, "the bf16 dims start a span");
  uint32_t nope[kPeriod][2];
  uint32_t rope;      // key's row in the rope span, sub's low position bits
  uint32_t rope_xor;  // the key's position bits above sub's, << 4
  __device__ __forceinline__ ChunkOffsets(int key, int sub) {
    const uint32_t row = static_cast<uint32_t>(key) * 128, k7 = key & 7;
#pragma unroll
    for (int par = 0; par < kPeriod; ++par)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        nope[par][half] = row + (((2 * sub + half + 2 * kStep * par) ^ k7) << 4);
    rope = (LayoutTraits<L>::kNope / 64) * kSpanBytes + row + ((sub ^ (k7 & (kStep - 1))) << 4);
    rope_xor = (k7 & ~static_cast<uint32_t>(kStep - 1)) << 4;
  }
  __device__ __forceinline__ uint32_t fp8(int i, int half) const {
    return nope[i % kPeriod][half] + (i / kPeriod) * kSpanBytes;
  }
  __device__ __forceinline__ uint32_t rope_chunk(int i) const {
    return rope + (i / kBf16PerSpan) * kSpanBytes + ((static_cast<uint32_t>(kStep * (i % kBf16PerSpan)) << 4) ^ rope_xor);
  }
};

// Dequantizes a thread's share into row `key` of a KV stage (zeros for an invalid slot, so
// masked keys contribute 0 · 0 to P·V, never NaN). With kRefillWhileStoring it refills the
// registers with the share of slot `next` as they free up: each chunk's load is issued right
// after that chunk is stored, so the next slot's loads fly while the rest of this one converts.
template <KvLayout L, int kCluster>
__device__ __forceinline__ void store_slot(TileRegs<L, kCluster>& regs, const ChunkOffsets<L, kCluster>& at,
                                           int key, int sub, uint8_t* to, const SlotSource& next) {
  using T = LayoutTraits<L>;
  constexpr int kStep = kThreadsPerKey<kCluster>;
  constexpr int kChunksPerScale = T::kQuantBlock / 16 / kStep;  // fp8 chunks i per scale
  constexpr bool kRefill = kRefillWhileStoring<L, kCluster>;
  const uint4 scales = regs.scales;  // this slot's; the next slot's are loaded first
  const bool valid = regs.valid;
  if constexpr (kRefill) load_scales<L, kCluster>(next, regs);
  // Without the refill, each store's offset is recomputed (a few integer ops) instead of being
  // held across tiles: that path's code stays as it was measured (kRefillWhileStoring).
  if constexpr (!kRefill) {
    key = ptx::opaque(key);
    sub = ptx::opaque(sub);
  }
  auto chunk_offset = [&](int c) { return sw128_chunk_offset<kTileKeys>(key, c); };
  // Every layout with fp8 chunks refills (only BF16 in a cluster does not: kRefillWhileStoring).
  static_assert(kFp8ChunksPerThread<L, kCluster> == 0 || kRefill, "fp8 chunks are stored with the refill");
#pragma unroll
  for (int i = 0; i < kFp8ChunksPerThread<L, kCluster>; ++i) {
    const int blk = i / kChunksPerScale;
    float scale;
    if constexpr (L == KvLayout::model1_fp8) {
      const uint32_t word = blk < 4 ? scales.x : scales.y;
      scale = ue8m0_to_float(static_cast<uint8_t>(word >> (8 * (blk % 4))));
    } else if constexpr (L == KvLayout::fp8_per_tensor) {
      scale = __uint_as_float(scales.x);
    } else {
      scale = __uint_as_float(blk == 0 ? scales.x : blk == 1 ? scales.y : blk == 2 ? scales.z : scales.w);
    }
    // The block-scaled layouts convert in bf16 (their scales are bf16 values: UE8M0 bytes, and
    // V3.2's fp32 read as bf16, spec §7); FP8_PER_TENSOR's float scale keeps the float multiply.
    // An invalid slot's codes and scales are zeros already (load_chunk, load_scales), so
    // converting them gives the zeros it needs: the block-scaled layouts convert unconditionally
    // (V3.2's H 64 producer loop: 1209 → 974 instructions a tile, with 4 local loads from a
    // 20-byte spill; with FP8_PER_TENSOR's branch 1097 and none).
    uint4 lo, hi;
    if constexpr (L == KvLayout::model1_fp8) {
      fp8x16_to_bf16x16_bf16_scale(regs.fp8[i], pow2_scale_bf16x2(scale), lo, hi);  // UE8M0: a power of two
    } else if constexpr (L == KvLayout::v32_fp8) {
      fp8x16_to_bf16x16_bf16_scale(regs.fp8[i], rounded_scale_bf16x2(scale), lo, hi);
    } else if (valid) {
      fp8x16_to_bf16x16(regs.fp8[i], scale, lo, hi);
    } else {
      lo = hi = make_uint4(0u, 0u, 0u, 0u);
    }
    load_fp8_chunk<L, kCluster>(next, sub, i, regs);
    put_chunk(to, at.fp8(i, 0), lo);
    put_chunk(to, at.fp8(i, 1), hi);
  }
#pragma unroll
  for (int i = 0; i < kBf16ChunksPerThread<L, kCluster>; ++i) {
    if constexpr (kRefill) {
      const uint4 rope = regs.rope[i];  // zeros for an invalid slot
      load_rope_chunk<L, kCluster>(next, sub, i, regs);
      put_chunk(to, at.rope_chunk(i), rope);
    } else {
      put_chunk(to, chunk_offset(T::kNope / 8 + sub + kStep * i), valid ? regs.rope[i] : make_uint4(0u, 0u, 0u, 0u));
    }
  }
}

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

// Where one CTA works: its query row (= batch · s_q + seq), head block, split of the row's
// compact list and rank in its cluster.
struct CtaWork {
  int row, batch, seq, head_block, split, split_begin, split_end, num_tiles, rank;
  RowLengths len;  // the row's valid lengths: its compact list is len.total() long
};

// Named barrier (0 is __syncthreads) of both consumer warpgroups (256 threads): Q loaded, and the
// output factors written. The per-tile hand-off between them goes through two mbarriers instead
// (SharedPlan::p_ready: P and the tile's O factor published by warpgroup 0; p_free: warpgroup 1
// has read them), whose release/acquire racecheck models (a named-barrier arrive it does not).
inline constexpr int kBarConsumers = 1;
// Named barriers 2 and 3: warpgroup 0's / 1's O rows are in shared memory (its 128 threads).
inline constexpr int kBarOutRows = 2;

// The producer warpgroups: per tile t, this thread's slot (my_key) is loaded into registers
// kBuffers tiles ahead of its dequantization (two buffers when a cluster halves a thread's share,
// so a tile's load latency overlaps two tile periods). Each buffer's next index is read kBuffers
// tiles before it is needed, into a register of its own (refill_index[b]) overwritten in place: a
// pair of indices rotated per tile made ptxas copy the one just requested at the unrolled loop's
// end, which waited out a whole load latency every two tiles (MODEL1's cluster kernel's SASS). The
// registers are dequantized into stage t%2 (of both CTAs of a cluster) once the consumers (of both)
// have released it. The stage's key-valid flags cover the whole tile in every CTA: in a cluster
// thread `sub` 1 of each key also records the peer's key at the same place.
template <KvLayout L, int kCluster>
__device__ __forceinline__ void produce(const DecodeParams& p, const CtaWork& w, SharedPlan<L>& plan) {
  using Plan = SharedPlan<L>;
  constexpr int kStep = kThreadsPerKey<kCluster>;
  constexpr int kKeysPerCta = kTileKeys / kCluster;
  constexpr int kBuffers = kProducerBuffers<L, kCluster>;
  constexpr uint32_t kPeerBytes = kKeysPerCta * Plan::kRowBytes;  // what the peer writes into a stage
  const int tid = threadIdx.x - kConsumerThreads;
  const int my_key = w.rank * kKeysPerCta + tid / kStep, my_sub = tid % kStep;
  const int peer_key = (1 - w.rank) * kKeysPerCta + tid / kStep;  // kCluster == 2 only
  const int warp_first_key = w.rank * kKeysPerCta + tid / 32 * (32 / kStep);
  const bool records_peer = kCluster == 2 && my_sub == 1;
  const ChunkOffsets<L, kCluster> offsets(my_key, my_sub);
  const int my_pos = w.split_begin + my_key;  // my slot's position in tile 0
  const int peer_pos = w.split_begin + peer_key;
  const RowLengths& len = w.len;
  uint32_t peer_stages = 0, peer_full = 0;
  if constexpr (kCluster == 2) {
    peer_stages = ptx::map_to_cta(plan.kv[0], 1 - w.rank);
    peer_full = ptx::map_to_cta(&plan.full[0], 1 - w.rank);
  }
  auto index_at = [&](int pos) { return raw_index(p, w.batch, w.seq, pos, w.split_end, len); };

  TileRegs<L, kCluster> regs[kBuffers];
  int32_t peer_index[kBuffers];
#pragma unroll
  for (int b = 0; b < kBuffers; ++b) {
    const int pos = my_pos + b * kTileKeys;
    const bool in_main = len.in_main(pos);
    load_slot<L, kCluster>(slot_source<L>(p, in_main, slot_in_cache(p, in_main, index_at(pos))), my_sub, regs[b]);
    peer_index[b] = records_peer ? index_at(peer_pos + b * kTileKeys) : -1;
  }
  int32_t refill_index[kBuffers];  // buffer b's next tile: t + kBuffers at its tile t
#pragma unroll
  for (int b = 0; b < kBuffers; ++b) refill_index[b] = index_at(my_pos + (b + kBuffers) * kTileKeys);
  if (tid == 0) DSV4_TRACE(trace_cta(), trace::kOnceRow, 5);
  for (int t0 = 0; t0 < w.num_tiles; t0 += kBuffers) {
#pragma unroll
    for (int b = 0; b < kBuffers; ++b) {
      const int t = t0 + b;
      if (t >= w.num_tiles) break;
      const int stage = t & 1;
      if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 0);
      if (t >= 2) ptx::mbarrier_wait(&plan.empty[stage], ((t >> 1) + 1) & 1);  // tile t-2 consumed
      if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 1);
      if (my_sub == 0) plan.key_valid[stage][my_key] = regs[b].valid;
      if (records_peer) {
        const int pos = peer_pos + t * kTileKeys;
        plan.key_valid[stage][peer_key] = slot_in_cache(p, len.in_main(pos), peer_index[b]) >= 0;
      }
      // The buffer is refilled with tile t + kBuffers (−1 past the split: nothing loaded): as the
      // store frees it, or once the stage has been arrived on (kRefillWhileStoring).
      const int next_pos = my_pos + (t + kBuffers) * kTileKeys;
      auto next_slot = [&] {
        const bool in_main = len.in_main(next_pos);
        return slot_source<L>(p, in_main, slot_in_cache(p, in_main, refill_index[b]));
      };
      store_slot<L, kCluster>(regs[b], offsets, my_key, my_sub, plan.kv[stage],
                              kRefillWhileStoring<L, kCluster> ? next_slot() : SlotSource{});
      if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 2);
      ptx::fence_proxy_async_smem();  // the stage is read by wgmma (and, in a cluster, the TMA unit)
      if constexpr (kCluster == 2) {
        send_warp_rows<L>(plan.kv[stage], peer_stages + stage * Plan::kStageBytes,
                          peer_full + stage * static_cast<uint32_t>(sizeof(uint64_t)), warp_first_key);
      }
      if (kCluster == 2 && tid == 0) {
        ptx::mbarrier_arrive_expect_tx(&plan.full[stage], kPeerBytes);  // + the peer's copied bytes
      } else {
        ptx::mbarrier_arrive(&plan.full[stage]);
      }
      if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 3);
      if constexpr (!kRefillWhileStoring<L, kCluster>) load_slot<L, kCluster>(next_slot(), my_sub, regs[b]);
      if (records_peer) peer_index[b] = index_at(peer_pos + (t + kBuffers) * kTileKeys);
      refill_index[b] = index_at(next_pos + kBuffers * kTileKeys);
      if (tid == 0) DSV4_TRACE(trace_cta(), trace_tile(t), 4);
    }
  }
  if (tid == 0) DSV4_TRACE(trace_cta(), trace::kOnceRow, 6);
}

// The producer for a layout stored as the tensor cores read it (BF16) without a cluster: per tile t
// the thread's slot row is copied by cp.async straight into stage t%2 (zero-filled for an invalid
// slot, which reads nothing) and the index of tile t+1 read. The copies of tile t+1 fly while the
// consumers multiply tile t. The stage's `full` barrier counts two arrivals per thread: one
// (release) for its key_valid flag, one when its copies have landed
// (cp.async.mbarrier.arrive.noinc).
template <KvLayout L>
__device__ __forceinline__ void produce_by_copy(const DecodeParams& p, const CtaWork& w, SharedPlan<L>& plan) {
  constexpr int kStep = kThreadsPerKey<1>;
  constexpr int kChunks = LayoutTraits<L>::kDataBytes / 16;  // 16-byte chunks of a row
  const int tid = threadIdx.x - kConsumerThreads;
  const int my_key = tid / kStep, my_sub = tid % kStep;
  const int my_pos = w.split_begin + my_key;
  const RowLengths& len = w.len;
  auto index_at = [&](int pos) { return raw_index(p, w.batch, w.seq, pos, w.split_end, len); };
  int32_t index0 = index_at(my_pos), index1 = index_at(my_pos + kTileKeys);
  for (int t = 0; t < w.num_tiles; ++t) {
    const int stage = t & 1, pos = my_pos + t * kTileKeys;
    const bool in_main = len.in_main(pos);
    const int32_t slot = slot_in_cache(p, in_main, index0);
    if (t >= 2) ptx::mbarrier_wait(&plan.empty[stage], ((t >> 1) + 1) & 1);  // tile t-2 consumed
    const uint8_t* row = slot >= 0 ? slot_bytes<L>(p, in_main, slot).data : p.main.cache;
#pragma unroll 8
    for (int i = 0; i < kChunks / kStep; ++i) {
      const int c = my_sub + kStep * i;
      ptx::cp_async_16_zfill(plan.kv[stage] + sw128_chunk_offset<kTileKeys>(my_key, c), row + 16 * c, slot >= 0);
    }
    if (my_sub == 0) plan.key_valid[stage][my_key] = slot >= 0;
    ptx::mbarrier_arrive(&plan.full[stage]);
    ptx::cp_async_arrive_noinc(&plan.full[stage]);
    index0 = index1;
    index1 = index_at(pos + 2 * kTileKeys);
  }
  // No copy of this thread is left in flight when it leaves.
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
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

// This thread's part of a warpgroup's O half (256 columns), times factor[r] for rows acc_row(2r),
// into `rows` (64 rows of kOutRowPitch<T> bytes): fp32, or rounded to bf16 (T = uint16_t).
template <class T, class Frag>
__device__ __forceinline__ void stage_o_rows(const Frag& rO, const float (&factor)[2], uint8_t* rows, int tid) {
  const int col0 = acc_col(0, tid);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    T* const row = reinterpret_cast<T*>(rows + acc_row(2 * r, tid) * kOutRowPitch<T>) + col0;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float a = rO(4 * j + 2 * r) * factor[r], b = rO(4 * j + 2 * r + 1) * factor[r];
      if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float2*>(row + 8 * j) = make_float2(a, b);
      } else {
        *reinterpret_cast<uint32_t*>(row + 8 * j) = pack_bf16x2(a, b);
      }
    }
  }
}

// A warpgroup's staged O rows (those of heads below `valid_rows`) to global memory, row i at
// dst(i), in 16-byte pieces: a warp's store covers 512 contiguous bytes of one row, four whole
// 128-byte lines.
template <class T, class Dst>
__device__ __forceinline__ void copy_out_rows(const uint8_t* rows, int valid_rows, int tid, Dst&& dst) {
  constexpr int kChunksPerRow = kDv / 2 * static_cast<int>(sizeof(T)) / 16;
  constexpr int kChunks = kHeadsPerCta * kChunksPerRow;
  static_assert(kChunks % 128 == 0 && kChunksPerRow % 32 == 0, "whole warps per row");
#pragma unroll 8
  for (int c = tid; c < kChunks; c += 128) {
    const int i = c / kChunksPerRow, k = c - i * kChunksPerRow;
    if (i < valid_rows)
      reinterpret_cast<uint4*>(dst(i))[k] = *reinterpret_cast<const uint4*>(rows + i * kOutRowPitch<T> + 16 * k);
  }
}

// The same rows stored from the accumulators straight to global memory: the bf16 output in
// 16-byte chunks through a quad transpose (a warp store covers 64 bytes of 8 rows), the fp32
// partial in 8-byte pairs (32 bytes of 8 rows).
template <int kHalf, class Frag>
__device__ __forceinline__ void store_o_rows_direct(const DecodeParams& p, const CtaWork& w, const Frag& rO,
                                                    const float (&factor)[2], int tid) {
  if (p.num_splits == 1) {
    uint16_t* out_row = p.out + p.out_strides.row_offset(w.batch, w.seq) + kHalf * (kDv / 2);
    for_each_o_chunk(rO, factor, tid, [&](int r, int col, uint4 chunk) {
      const int h = w.head_block * kHeadsPerCta + acc_row(2 * r, tid);
      if (h >= p.num_heads) return;
      *reinterpret_cast<uint4*>(out_row + static_cast<int64_t>(h) * p.out_strides.h + col) = chunk;
    });
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = w.head_block * kHeadsPerCta + acc_row(2 * r, tid);
    if (h >= p.num_heads) continue;
    const int64_t out_row = static_cast<int64_t>(w.row) * p.num_heads + h;
    const int col0 = kHalf * (kDv / 2) + acc_col(0, tid);
    float* dst = p.partial_o + (out_row * p.num_splits + w.split) * kDv + col0;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<float2*>(dst + j * 8) = make_float2(rO(4 * j + 2 * r) * factor[r], rO(4 * j + 2 * r + 1) * factor[r]);
  }
}

// This warpgroup's O half (value dims 256·kHalf ..), times factor[r] for rows acc_row(2r): the
// bf16 output (one split) or the fp32 partial of this split.
//
// Without a cluster the rows go through shared memory (SharedPlan::out_rows, kOutRowPitch),
// where the warps regroup them into whole lines of one row (copy_out_rows). Stored straight from
// the accumulators, a split CTA of V4-Flash b2 spent some 5600 of its 17400 cycles issuing its
// 128 KB of partials, a warp store's 8 rows of 32 bytes each its own request (H200 trace,
// docs/notes/decode.md). A cluster CTA stores them directly: its stages may still be read by its
// copies of its rows to the peer until the peer's consumers are past the last tile, and waiting
// for that made V4-Pro b1 (H 128, splits) 7 % slower.
template <KvLayout L, int kCluster, int kHalf, class Frag>
__device__ __forceinline__ void store_o_half(const DecodeParams& p, const CtaWork& w, SharedPlan<L>& plan,
                                             const Frag& rO, const float (&factor)[2]) {
  const int tid = threadIdx.x % 128;
  if constexpr (kCluster == 2) {
    store_o_rows_direct<kHalf>(p, w, rO, factor, tid);
  } else {
    const bool partial = p.num_splits > 1;
    uint8_t* const rows = plan.out_rows() + kHalf * kOutHalfBytes<float>;
    if (partial) {
      stage_o_rows<float>(rO, factor, rows, tid);
    } else {
      stage_o_rows<uint16_t>(rO, factor, rows, tid);
    }
    ptx::named_barrier_sync(kBarOutRows + kHalf, 128);
    const int valid_rows = p.num_heads - w.head_block * kHeadsPerCta;
    if (partial) {
      const int64_t first_row = static_cast<int64_t>(w.row) * p.num_heads + w.head_block * kHeadsPerCta;
      copy_out_rows<float>(rows, valid_rows, tid, [&](int i) {
        return p.partial_o + ((first_row + i) * p.num_splits + w.split) * kDv + kHalf * (kDv / 2);
      });
    } else {
      uint16_t* const out_row = p.out + p.out_strides.row_offset(w.batch, w.seq) + kHalf * (kDv / 2);
      copy_out_rows<uint16_t>(rows, valid_rows, tid, [&](int i) {
        return out_row + static_cast<int64_t>(w.head_block * kHeadsPerCta + i) * p.out_strides.h;
      });
    }
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

}  // namespace detail

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
