// The sparse decode kernel's producer warpgroups (kernel.cuh): each tile's index slots gathered
// from the paged cache into registers and dequantized into the KV stages (produce; in a cluster
// this CTA's half, sent on to the peer), or BF16 rows copied by cp.async (produce_by_copy).
#pragma once

#include <cstdint>

#include "cuda/attention/sparse_decode/config.h"
#include "cuda/attention/sparse_decode/trace.cuh"
#include "cuda/attention/sparse_decode/work.cuh"
#include "cuda/common/cluster.cuh"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/fp8_convert.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"

namespace dsv4::cuda::decode::detail {

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

// Whether the producer reads the indices of tile t + 2 · kBuffers at the start of tile t, before
// its refill loads, or after its arrive. With one buffer, tile t + 1 begins by computing the
// addresses of tile t + 2's refill from those indices, so read after tile t's arrive their load
// latency sits in every period. Side by side with FlashMLA (H200, 2026-12-01), MODEL1 without a
// cluster ran V4-Flash b 128 / b 256 and CONFIG3 at 0.96-0.98x main's time with the hoisted
// addressing alone (IndexRows, the block divider) and 0.89-0.91x with the early reads too, peak
// H 64 d 512 at 0.97x and 0.86x. The other kernels ran 1-3 % slower with the early reads: V3.2's
// (H 64 and H 128; consumer-bound), MODEL1's in a cluster (two buffers: its indices are read two
// periods ahead either way) and FP8_PER_TENSOR's without a cluster (1.5 %, V4-Flash b 128). BF16
// without a cluster copies by cp.async (produce_by_copy), its indices two tiles ahead.
template <KvLayout L, int kCluster>
inline constexpr bool kEarlyIndexReads = kCluster == 1 && L == KvLayout::model1_fp8;

// How a MODEL1 producer turns a chunk's UE8M0 scale byte into its bf16 factor: branch-free
// (ue8m0_scale_bf16x2) in a cluster, else through the float decode (ue8m0_to_float, whose two
// special cases are two branches a scale). Side by side with FlashMLA (H200, 2026-12-01) the
// branch-free form ran MODEL1's cluster kernel at 0.97x the time (peak H 128 d 512 2623 against
// 2710 µs, V4-Pro and CONFIG4 0.98x), its producer loop 1088 SASS instructions for two tiles
// against 1173. Without a cluster it ran 1.05-1.06x (V4-Flash b 128 / b 256, CONFIG3) and 1.20x
// (peak H 64 d 512), at 509 instructions a tile against 549: in that single-buffer loop ptxas then
// copied three refill loads (the scales, two rope chunks) into the loop's registers 110-119
// instructions after issuing them, so each tile waited out a load's latency; with the branches it
// copies them in the next tile (sass_stats.py's early reads; docs/notes/decode.md).
template <KvLayout L, int kCluster>
inline constexpr bool kBranchFreeScales = L == KvLayout::model1_fp8 && kCluster == 2;

// Whether store_slot stores (and refills) a slot's rope chunks before its fp8 chunks. V3.2 without
// a cluster: stored last, two of its rope refill loads were copied into the loop's registers 58-64
// instructions after issue, in the same tile (sass_stats.py's early reads); stored first they are
// not, at 8 bytes of spill. Side by side with FlashMLA (H200, 2026-12-01) it ran peak H 64 d 576
// at 0.91x main's time (1579 against 1742 µs). Measured with MODEL1's branch-free scales in both
// its kernels, the same order ran the others slower: MODEL1 without a cluster 1.05x (V4-Flash
// b 128 / b 256) and 1.16x (peak H 64 d 512), MODEL1 in a cluster 1.01-1.04x, V3.2 in a cluster
// 1.007x (docs/notes/decode.md).
template <KvLayout L, int kCluster>
inline constexpr bool kRopeFirst = L == KvLayout::v32_fp8 && kCluster == 1;

// MODEL1's scale of chunk block `blk` (UE8M0 bytes 0-6 in scales.x / .y) as the bf16x2 factor of
// fp8x16_to_bf16x16_bf16_scale, from the byte (kBranchFree) or through its float (a power of two).
template <bool kBranchFree>
__device__ __forceinline__ uint32_t model1_scale_bf16x2(const uint4& scales, int blk) {
  const uint32_t word = blk < 4 ? scales.x : scales.y;
  if constexpr (kBranchFree) return ue8m0_scale_bf16x2(word, blk % 4);
  return pow2_scale_bf16x2(ue8m0_to_float(static_cast<uint8_t>(word >> (8 * (blk % 4)))));
}

// Where a valid slot's bytes live: its data row (V32: the whole token) and, for MODEL1, its
// 8-byte scale row, in the main (in_main) or the extra scope's cache.
struct SlotBytes {
  const uint8_t* data;
  const uint8_t* scales;
};
template <KvLayout L>
__device__ __forceinline__ SlotBytes slot_bytes(const DecodeParams& p, bool in_main, int32_t slot) {
  const cutlass::FastDivmod& block_size = in_main ? p.main.block_size : p.extra.block_size;
  int block, offset;
  block_size(block, offset, slot);
  const uint8_t* base = (in_main ? p.main.cache : p.extra.cache) +
                        block * (in_main ? p.main.block_stride : p.extra.block_stride);
  if constexpr (L == KvLayout::model1_fp8) {
    return {base + offset * model1::kDataBytes,
            base + static_cast<int64_t>(block_size.divisor) * model1::kDataBytes + offset * model1::kScaleBytes};
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
// proxy fence; lane s issues span s's copy, so the warp issues all of them in one instruction
// (lane 0 issuing them one after another held the warp for each).
template <KvLayout L>
__device__ __forceinline__ void send_warp_rows(const uint8_t* stage, uint32_t peer_stage, uint32_t peer_full,
                                               int first_key) {
  constexpr int kSpans = LayoutTraits<L>::kDqk / 64;
  static_assert(kSpans <= 32, "a lane a span");
  constexpr uint32_t kWarpRowBytes = 32 / kThreadsPerKey<2> * 128;
  __syncwarp();
  const int span = threadIdx.x & 31;
  if (span >= kSpans) return;
  const uint32_t offset = span * kTileKeys * 128 + static_cast<uint32_t>(first_key) * 128;
  ptx::bulk_copy_to_cta(peer_stage + offset, stage + offset, kWarpRowBytes, peer_full);
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
  auto store_fp8_chunks = [&] {
#pragma unroll
    for (int i = 0; i < kFp8ChunksPerThread<L, kCluster>; ++i) {
      const int blk = i / kChunksPerScale;
      float scale = 0.0f;  // FP8_PER_TENSOR's and V3.2's (MODEL1's factor: model1_scale_bf16x2)
      if constexpr (L == KvLayout::fp8_per_tensor) {
        scale = __uint_as_float(scales.x);
      } else if constexpr (L == KvLayout::v32_fp8) {
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
        fp8x16_to_bf16x16_bf16_scale(regs.fp8[i], model1_scale_bf16x2<kBranchFreeScales<L, kCluster>>(scales, blk),
                                     lo, hi);
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
  };
  auto store_rope_chunks = [&] {
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
  };
  // Which kind of chunk is stored (and refilled) first: kRopeFirst.
  if constexpr (kRopeFirst<L, kCluster>) {
    store_rope_chunks();
    store_fp8_chunks();
  } else {
    store_fp8_chunks();
    store_rope_chunks();
  }
}

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
  const IndexRows rows = index_rows(p, w.batch, w.seq);
  auto index_at = [&](int pos) { return raw_index(rows, pos, w.split_end, len); };

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
      // The indices this buffer's next tile after that needs (next_slot has read refill_index[b]).
      auto read_next_indices = [&] {
        if (records_peer) peer_index[b] = index_at(peer_pos + (t + kBuffers) * kTileKeys);
        refill_index[b] = index_at(next_pos + kBuffers * kTileKeys);
      };
      const SlotSource next = kRefillWhileStoring<L, kCluster> ? next_slot() : SlotSource{};
      if constexpr (kEarlyIndexReads<L, kCluster>) read_next_indices();
      store_slot<L, kCluster>(regs[b], offsets, my_key, my_sub, plan.kv[stage], next);
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
      if constexpr (!kEarlyIndexReads<L, kCluster>) read_next_indices();
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
  const IndexRows rows = index_rows(p, w.batch, w.seq);
  auto index_at = [&](int pos) { return raw_index(rows, pos, w.split_end, len); };
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
}  // namespace dsv4::cuda::decode::detail
