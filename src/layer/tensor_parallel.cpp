// Slicing a layer's weights into one tensor-parallel rank's shard (include/dsv4/tensor_parallel.h).
#include "dsv4/tensor_parallel.h"

#include <string>

#include "dsv4/status.h"

namespace dsv4 {

namespace {

// A copy of dimension `dim`'s range [begin, begin + count) of a contiguous host tensor.
HostTensor slice_copy(const HostTensor& t, int dim, int64_t begin, int64_t count) {
  TensorView v = t.view();
  v.data = static_cast<uint8_t*>(v.data) + begin * v.strides[dim] * static_cast<int64_t>(dtype_size(v.dtype));
  v.shape[dim] = count;
  return HostTensor::copy_of(v);
}

// Dimension `dim` (counted from the end: -1 = columns, -2 = rows) of a GEMM weight, sliced to
// [begin, begin + count): the value, and for an FP8 weight its 128-wide scale blocks, which the
// slice must cover whole.
Weight slice_weight(const Weight& w, int dim_from_end, int64_t begin, int64_t count,
                    const char* name) {
  const int dim = static_cast<int>(w.value.shape().size()) + dim_from_end;
  Weight out;
  out.value = slice_copy(w.value, dim, begin, count);
  if (w.quantized()) {
    if (begin % kWeightScaleBlock != 0 || count % kWeightScaleBlock != 0)
      fail("shard_attention_weights: ", name, ": expected a slice of whole ", kWeightScaleBlock,
           "-wide scale blocks for an FP8 weight, got [", begin, ", ", begin + count, ")");
    out.scale = slice_copy(w.scale, dim, begin / kWeightScaleBlock, count / kWeightScaleBlock);
  }
  return out;
}

}  // namespace

void check_tensor_parallel(const ModelConfig& cfg, const TensorParallel& tp, const char* where) {
  if (tp.size < 1) fail_expected(where, "tp.size", ">= 1", tp.size);
  if (tp.rank < 0 || tp.rank >= tp.size)
    fail_expected(where, "tp.rank", "0.." + std::to_string(tp.size - 1), tp.rank);
  if (cfg.n_heads % tp.size != 0)
    fail_expected(where, "tp.size", "a divisor of n_heads " + std::to_string(cfg.n_heads), tp.size);
  if (cfg.o_groups % tp.size != 0)
    fail_expected(where, "tp.size", "a divisor of o_groups " + std::to_string(cfg.o_groups), tp.size);
  if (tp.communicator) {
    if (tp.communicator->size() != tp.size)
      fail_expected(where, "tp.communicator->size()", tp.size, tp.communicator->size());
    if (tp.communicator->rank() != tp.rank)
      fail_expected(where, "tp.communicator->rank()", tp.rank, tp.communicator->rank());
  }
}

ModelConfig tensor_parallel_config(const ModelConfig& cfg, int size) {
  check_tensor_parallel(cfg, TensorParallel{0, size, nullptr}, "tensor_parallel_config");
  ModelConfig rank_cfg = cfg;
  rank_cfg.n_heads = cfg.n_heads / size;
  rank_cfg.o_groups = cfg.o_groups / size;
  return rank_cfg;
}

AttentionWeights shard_attention_weights(const AttentionWeights& w, const ModelConfig& cfg,
                                         const TensorParallel& tp) {
  check_tensor_parallel(cfg, tp, "shard_attention_weights");
  validate_attention_weights(w, cfg, "shard_attention_weights");
  if (tp.size == 1) return w;
  const int64_t heads = cfg.n_heads / tp.size, groups = cfg.o_groups / tp.size;
  const int64_t q_rows = heads * cfg.head_dim, z_cols = groups * cfg.o_lora_rank;
  AttentionWeights s = w;  // replicated tensors: shared buffers
  s.wq_b = slice_weight(w.wq_b, -2, tp.rank * q_rows, q_rows, "wq_b");
  s.attn_sink = slice_copy(w.attn_sink, 0, tp.rank * heads, heads);
  // wo_a [G, o_lora, H/G·D]: whole groups, so whole 128×128 scale grids.
  s.wo_a.value = slice_copy(w.wo_a.value, 0, tp.rank * groups, groups);
  if (w.wo_a.quantized()) s.wo_a.scale = slice_copy(w.wo_a.scale, 0, tp.rank * groups, groups);
  s.wo_b = slice_weight(w.wo_b, -1, tp.rank * z_cols, z_cols, "wo_b");
  validate_attention_weights(s, tensor_parallel_config(cfg, tp.size), "shard_attention_weights");
  return s;
}

}  // namespace dsv4
