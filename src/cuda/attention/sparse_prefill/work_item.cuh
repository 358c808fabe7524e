// The sparse prefill kernel's unit of work and its walk over the CTAs (kernel.cuh).
//
// A work item is one query token × one group of 64 heads (config.h). Persistent CTAs take items
// round-robin (item blockIdx.x, + gridDim.x, ...) so the next item's Q and first tiles load while
// this item finishes; every role of a CTA walks the same sequence. Tiles are numbered per item for
// ownership and published P/stats, and per CTA (`g`, counted by each role) for the two-buffer
// ring.
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

  __device__ __forceinline__ WorkItem at(const Params& p, int item) const {
    WorkItem it;
    it.token = token_of(item);
    it.head0 = head0_of(item);
    it.valid_len = p.topk;
    if (p.topk_length != nullptr) it.valid_len = max(0, min(p.topk, __ldg(p.topk_length + it.token)));
    it.num_tiles = (it.valid_len + Cfg::kTile - 1) / Cfg::kTile;
    it.indices = p.indices + it.token * p.indices_row_stride;
    return it;
  }
};

}  // namespace dsv4::cuda::sparse_prefill_detail
