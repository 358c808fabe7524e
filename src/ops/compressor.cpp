// CompressorConfig (docs/spec.md §4): the static shape of the attention and indexer compressors, and its
// validation. The compressor's ops: compressor_project.cpp and compressor_update_and_emit.cpp
// here (front doors), src/cpu/compressor_*.cpp and src/cuda/compressor/ (kernels); the ring's
// PagedCache bookkeeping: src/cache/compressor_state.cpp.
#include "dsv4/compressor.h"

namespace dsv4 {

CompressorConfig CompressorConfig::attention(const ModelConfig& cfg, int ratio) {
  CompressorConfig c;
  c.head_dim = cfg.head_dim;
  c.ratio = ratio;
  c.rope_dims = cfg.rope_head_dim;
  c.eps = static_cast<float>(cfg.norm_eps);
  c.target = CompressorTarget::kv_cache;
  return c;
}

CompressorConfig CompressorConfig::indexer(const ModelConfig& cfg) {
  CompressorConfig c;
  c.head_dim = cfg.index_head_dim;
  c.ratio = 4;
  c.rope_dims = cfg.rope_head_dim;
  c.eps = static_cast<float>(cfg.norm_eps);
  c.target = CompressorTarget::indexer_keys;
  return c;
}

void CompressorConfig::validate(const char* where) const {
  if (ratio != 4 && ratio != 128) fail_expected(where, "cfg.ratio", "4 or 128", ratio);
  if (target == CompressorTarget::kv_cache) {
    if (head_dim != model1::kDim)
      fail_expected(where, "cfg.head_dim", "512 (the KV cache entry dim)", head_dim);
  } else if (head_dim != indexer_keys::kDim) {
    fail_expected(where, "cfg.head_dim", "128 (the indexer key dim)", head_dim);
  }
  if (rope_dims <= 0 || rope_dims > head_dim || rope_dims % 2 != 0)
    fail_expected(where, "cfg.rope_dims", "even, in (0, head_dim]", rope_dims);
  // kv_cache entries round their nope dims in FP8 blocks of 64.
  if (target == CompressorTarget::kv_cache && (head_dim - rope_dims) % model1::kQuantBlock != 0)
    fail_expected(where, "cfg.rope_dims", "head_dim - rope_dims a multiple of 64", rope_dims);
  if (!(eps > 0.0f)) fail_expected(where, "cfg.eps", "> 0", eps);
}

}  // namespace dsv4
