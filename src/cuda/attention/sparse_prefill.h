// CUDA entry point of the sparse prefill (implemented in src/cuda/attention/ .cu files). Called
// by dsv4::sparse_prefill (src/ops/sparse_prefill.cpp) after it validated every argument; index
// values are not checked: -1 and indices >= s_kv are masked by the kernel, as in FlashMLA.
#pragma once

#include <cstdint>

#include "dsv4/ops.h"

namespace dsv4::cuda {

void sparse_prefill(const SparsePrefillArgs& args, Stream stream);

// With a work counter, the items a launch of `ctas` persistent CTAs hands out round-robin before
// the counter takes over (sparse_prefill/work_item.cuh): every round but the last eighth (rounded
// down), so that the counter evens out what round-robin's drift piled up by then. Afterwards the
// counter holds items − this + ctas (each CTA's last claim falls past the end). A launch of fewer
// than eight rounds gets all its items round-robin and leaves the counter untouched.
inline int64_t sparse_prefill_round_robin_items(int64_t items, int64_t ctas) {
  const int64_t rounds = (items + ctas - 1) / ctas;
  const int64_t counted = rounds / 8;
  return items < (rounds - counted) * ctas ? items : (rounds - counted) * ctas;
}

// The kernel's work geometry, here so that the host-side rules below and the kernel's Config
// (sparse_prefill/config.h) read the same numbers: a work item is one token's group of this many
// query heads (the wgmma M), and its top-k slots are gathered this many rows at a time (a tile).
inline constexpr int kSparsePrefillHeadsPerItem = 64;
inline constexpr int kSparsePrefillTileRows = 64;
// The shortest item, in tiles, for which one head group takes the pair schedule (below); and the
// shortest when every item is full (no topk_length) and holds an even number of tiles.
inline constexpr int kSparsePrefillPairMinTiles = 16;
inline constexpr int kSparsePrefillPairMinFullTiles = 8;

// How the kernel's two math warpgroups share the gathered tiles (sparse_prefill/config.h):
// sparse_prefill lets the launch choose (kAuto, sparse_prefill_auto_schedule); the GPU tests run
// every case under both schedules through this entry.
enum class SparsePrefillSchedule { kAuto, kSerial, kPair };
void sparse_prefill_with_schedule(const SparsePrefillArgs& args, Stream stream, SparsePrefillSchedule schedule);

// What kAuto resolves to for `num_heads` query heads, a top-k of `topk` slots (every item full
// when `full_items`: no topk_length) and a kv of `kv_bytes` (rows × d_qk × 2) on a device with
// `l2_bytes` of L2. The pair holds both tile buffers
// at an item's start and on every pair's last quarter, so it wins where items are long and rows
// come from L2, and loses where items are short or rows come from DRAM. Measured side by side with
// FlashMLA's inputs on an H200 (docs/notes/prefill.md, "The schedule for one head group"):
// - two or more head groups (H > 64): the pair (3-7 % faster at H 128; level at s_kv 64k and 128k);
// - one group, top-k ≥ 1024 (kSparsePrefillPairMinTiles tiles an item or more) and the kv within
//   the L2: the pair (5-9 % faster at top-k 1024 and 2048, s_kv 8k and 32k; 5 % with FlashMLA's
//   random topk_length);
// - one group, every item full (no topk_length) with an even tile count of 8 or more, and the kv
//   within the L2: the pair (V4-Flash's top-k 512 at s_kv 8k: 1.6-2.4 % faster; no item then
//   starts or ends on half a pair; docs/notes/prefill.md, "The side by side's order");
// - one group otherwise: serial (the pair lost 1-4 % at s_kv 64k, where the kv exceeds the L2,
//   and 23-29 % on V4-Flash's top-k 512 with topk_length, whose items hold 1-8 tiles).
inline SparsePrefillSchedule sparse_prefill_auto_schedule(int64_t num_heads, int64_t topk, bool full_items,
                                                          int64_t kv_bytes, int64_t l2_bytes) {
  if (num_heads > kSparsePrefillHeadsPerItem) return SparsePrefillSchedule::kPair;
  const int64_t tiles = (topk + kSparsePrefillTileRows - 1) / kSparsePrefillTileRows;
  const bool long_items = tiles >= kSparsePrefillPairMinTiles;
  const bool full_even_items = full_items && tiles >= kSparsePrefillPairMinFullTiles && tiles % 2 == 0;
  return (long_items || full_even_items) && kv_bytes <= l2_bytes ? SparsePrefillSchedule::kPair
                                                                 : SparsePrefillSchedule::kSerial;
}

}  // namespace dsv4::cuda
