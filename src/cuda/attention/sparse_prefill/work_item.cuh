// The sparse prefill kernel's unit of work and its walk over the CTAs (kernel.cuh).
//
// A work item is one query token × one group of 64 heads (config.h). Each persistent CTA starts
// with item blockIdx.x and decides its next item one item ahead (so the next item's Q and first
// tiles load while this item finishes): round-robin (item + gridDim.x) for the first
// Params::round_robin_items, then, with a work counter in global memory (Params::work_counter,
// zeroed by the launch), the counter's next item, so the launch's last items go to the CTAs that
// finish first and every SM stays busy to its end. Round-robin first because it starts a token's
// head groups (items 2t and 2t + 1 at H 128) on neighbouring CTAs at the same moment, where they
// gather the same rows: with every item from the counter, V4-Pro's varying top-k lengths took
// 5-8 % longer (docs/notes/prefill.md, "Items from a work counter"). The producer warpgroup
// decides (producer_common.cuh) and announces each item to the math warpgroups in an ItemSlot
// written before its Q's arrival on q_full; a slot with item −1 ends the CTA's walk. Tiles are
// numbered per item for ownership and published P/stats, and per CTA (`g`, counted by each role)
// for the two-buffer ring.
#pragma once

#include <cstdint>

#include "cuda/attention/sparse_prefill/config.h"

namespace dsv4::cuda::sparse_prefill_detail {

struct WorkItem {
  int token, head0;   // query token; first head of the group
  int valid_len;      // index slots in use: min(topk, topk_length[token]), ≥ 0
  int num_tiles;      // ceil(valid_len / kTile)
  const int32_t* indices;  // the token's index row
};

// The items of the whole launch and how they map to (token, head group).
template <int D_QK>
struct WorkList {
  using Cfg = Config<D_QK>;
  int head_groups, num_items;

  __device__ __forceinline__ explicit WorkList(const Params& p)
      : head_groups((p.num_heads + Cfg::kHeads - 1) / Cfg::kHeads), num_items(p.s_q * head_groups) {}

  __device__ __forceinline__ int token_of(int item) const { return item / head_groups; }
  __device__ __forceinline__ int head0_of(int item) const { return (item % head_groups) * Cfg::kHeads; }

  // Item `item` with `valid_len` slots in use.
  __device__ __forceinline__ WorkItem at(const Params& p, int item, int valid_len) const {
    WorkItem it;
    it.token = token_of(item);
    it.head0 = head0_of(item);
    it.valid_len = valid_len;
    it.num_tiles = (valid_len + Cfg::kTile - 1) / Cfg::kTile;
    it.indices = p.indices + it.token * p.indices_row_stride;
    return it;
  }
  // Item `item`, its slots in use read from topk_length.
  __device__ __forceinline__ WorkItem at(const Params& p, int item) const {
    int valid_len = p.topk;
    if (p.topk_length != nullptr) valid_len = max(0, min(p.topk, __ldg(p.topk_length + token_of(item))));
    return at(p, item, valid_len);
  }
};

}  // namespace dsv4::cuda::sparse_prefill_detail
