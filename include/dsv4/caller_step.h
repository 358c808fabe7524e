// CallerStep: one forward step of a layer on caller-owned caches (AttentionOptions::caller_caches),
// described the way vLLM's attention metadata describes it. The caller (a serving engine) owns
// the caches (CallerCaches, include/dsv4/paged_cache.h) and assigns their blocks; each step it
// says which tokens belong to which request and where every request's entries live.
//
// R requests, T tokens. Request r's tokens are rows [query_start_loc[r], query_start_loc[r + 1])
// of x, at positions seq_lens[r] - num_new .. seq_lens[r] - 1 (num_new = its row count; the
// first seq_lens[r] - num_new positions were cached by earlier steps). Requests come in kernel
// order: decodes (one new token after cached context) first, then prefill chunks — the order
// vLLM's batch reordering gives.
//
// Every array lives on the host (vLLM keeps *_cpu mirrors of query_start_loc, seq_lens,
// positions, slot_mapping and the block tables): the layer plans the step on the host and sends
// it to the GPU in one copy, as it does for its own caches. Block tables are int32 [R, >= the
// blocks the request needs], any strides; entry i of request r is at slot
// table[r][i / B] * B + i % B (B: the cache's block size). Only the blocks a step reads or writes
// must be valid block ids; the rest (vLLM's -1 or stale entries) are ignored:
//   swa:              token positions; the blocks of the SWA window of the step's tokens
//                     (positions from seq_len - num_new - window + 1 on);
//   compressed,       compressed entries j < seq_len / ratio (every one is attended to, or
//   indexer_keys:     scored by the indexer);
//   compressor_state, the request's ring: ring rows i < coff * ratio (position p in ring row
//   indexer_state:    p mod (coff * ratio); coff = 2 for ratio 4, 1 for 128).
// A table the layer kind does not use must be left undefined.
#pragma once

#include "dsv4/tensor.h"

namespace dsv4 {

struct CallerStep {
  TensorView query_start_loc;  // int32 [R + 1], from 0, non-decreasing; the last is T
  TensorView seq_lens;         // int32 [R]: tokens of each request after this step
  TensorView positions;        // int64 [T]: must be each request's consecutive new positions
  TensorView slot_mapping;     // int64 [T]: each token's SWA cache slot (as its block table says)
  TensorView swa_block_table;               // int32 [R, *]
  TensorView compressed_block_table;        // int32 [R, *] (C4A, C128A)
  TensorView compressor_state_block_table;  // int32 [R, *] (C4A, C128A)
  TensorView indexer_keys_block_table;      // int32 [R, *] (C4A)
  TensorView indexer_state_block_table;     // int32 [R, *] (C4A)
};

}  // namespace dsv4
