// Tensor parallelism of one attention layer over tp ranks, as vLLM shards DeepSeek-V4
// (docs/design.md "Tensor parallelism"):
//   replicated on every rank: wq_a, wkv, q_norm, kv_norm, the compressor, the indexer, and the KV
//     caches (one MQA head, identical on every rank);
//   split over heads: wq_b's rows (rank r: heads [r·H/tp, (r+1)·H/tp)), attn_sink, wo_a's groups
//     (rank r: groups [r·G/tp, (r+1)·G/tp), exactly the groups of its heads);
//   row-parallel wo_b: rank r multiplies its groups' o_lora columns of wo_b's input, giving a
//     partial y; the sum of the ranks' partial y's (an all-reduce) is the layer's y.
// A rank runs the unchanged layer with H/tp heads and G/tp groups (tensor_parallel_config). Head
// padding: the CUDA sparse kernels take any head count and pad it inside to a multiple of 64
// with zero query rows that are never stored, so per-rank heads below 64 (V4-Flash tp 2/4/8:
// 32/16/8; V4-Pro tp 4/8: 32/16) cost a 64-head attention and need no padded weights; the CPU
// takes any head count.
#pragma once

#include "dsv4/communicator.h"
#include "dsv4/config.h"
#include "dsv4/weights.h"

namespace dsv4 {

// Which shard of a tensor-parallel layer this is (AttentionOptions::tp).
struct TensorParallel {
  int rank = 0;  // 0..size-1
  int size = 1;  // tp ranks; must divide n_heads and o_groups
  // Sums y over the ranks at the end of each forward (not owned; rank() and size() must match).
  // nullptr: y is left as this rank's partial sum and the caller reduces it (the Python option
  // with a reduce callback, and the CPU tests summing the ranks themselves).
  Communicator* communicator = nullptr;
};

// Throws dsv4::Error naming `where` and the field unless 1 <= size, 0 <= rank < size, size divides
// n_heads and o_groups, and a communicator (if any) has this rank and size.
void check_tensor_parallel(const ModelConfig& cfg, const TensorParallel& tp, const char* where);

// The config one rank runs: n_heads / size heads, o_groups / size groups, the rest unchanged.
ModelConfig tensor_parallel_config(const ModelConfig& cfg, int size);

// Rank `tp.rank`'s weights (copies of its slices; the replicated ones shared with `w`):
// validate_attention_weights(result, tensor_parallel_config(cfg, tp.size)) holds. An FP8 weight's
// slice must cover whole 128-wide scale blocks (wq_b: H/tp·head_dim rows; wo_b: G/tp·o_lora
// columns), which holds for every released model; throws otherwise.
AttentionWeights shard_attention_weights(const AttentionWeights& w, const ModelConfig& cfg,
                                         const TensorParallel& tp);

}  // namespace dsv4
