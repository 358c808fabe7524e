// The sparse decode kernel's work of one CTA (kernel.cuh): the query row it serves (in launch
// order when batches have lengths), the row's valid lengths, its split of the row's compact list,
// and the index reads at positions of that list.
#pragma once

#include <cstdint>

#include "cuda/attention/sparse_decode/config.h"
#include "cuda/attention/sparse_decode/launch_order.h"

namespace dsv4::cuda::decode::detail {

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

// The index lists of a query row (batch, seq) in both scopes, resolved once per CTA, so an index
// read in the producer's loop is one select and one load (recomputed per read, the two rows'
// offsets cost ~20 instructions and a chain of parameter loads a read). A scope without indices
// (no extra scope) keeps a null row, never read: every position of it is past the split.
struct IndexRows {
  const int32_t* main;
  const int32_t* extra;
};
__device__ __forceinline__ const int32_t* index_row(const DecodeScope& s, int batch, int seq) {
  if (s.indices == nullptr) return nullptr;
  return s.indices + static_cast<int64_t>(batch) * s.indices_b_stride + static_cast<int64_t>(seq) * s.indices_s_stride;
}
__device__ __forceinline__ IndexRows index_rows(const DecodeParams& p, int batch, int seq) {
  return {index_row(p.main, batch, seq), index_row(p.extra, batch, seq)};
}

// The index at compact position `pos` of the row, or −1 (nothing read) when the position is past
// the split (whose end is at most len.total(), so the scope-local position is within its valid
// length). Not yet range-checked: slot_in_cache() does that where the value is used, so issuing
// the read does not wait for it.
__device__ __forceinline__ int32_t raw_index(const IndexRows& rows, int pos, int split_end, const RowLengths& len) {
  if (pos >= split_end) return -1;
  return __ldg(len.in_main(pos) ? rows.main + pos : rows.extra + (pos - len.main));
}
// The cache slot of index `idx` of the main (in_main) or extra scope, or −1 when it is −1 or
// outside that scope's cache.
__device__ __forceinline__ int32_t slot_in_cache(const DecodeParams& p, bool in_main, int32_t idx) {
  return idx >= 0 && idx < (in_main ? p.main.num_slots : p.extra.num_slots) ? idx : -1;
}

// Where one CTA works: its query row (= batch · s_q + seq), head block, split of the row's
// compact list and rank in its cluster.
struct CtaWork {
  int row, batch, seq, head_block, split, split_begin, split_end, num_tiles, rank;
  RowLengths len;  // the row's valid lengths: its compact list is len.total() long
};

}  // namespace dsv4::cuda::decode::detail
