// Weights of one DeepSeek-V3.2 sparse-MLA attention layer (multi-head latent attention with the
// lightning indexer): random generation, loading from a checkpoint under the official tensor
// names, saving under the same names.
//
// Checkpoint naming: DeepSeek's inference code (`P` = "layers.{i}.attn.", every layer, the MTP
// block included, as DeepSeek-V3.2's convert.py writes them), with the Hugging Face checkpoint's
// spelling (`P` = "model.layers.{i}.self_attn.", the names in parentheses, scales
// "<w>.weight_scale_inv") also accepted when loading. H = n_heads, n = qk_nope_head_dim,
// r = rope_head_dim, c = kv_lora_rank (= nope_dim()), v = mla_v_head_dim, I = index_n_heads,
// d = index_head_dim:
//   P wq_a.weight [q_lora, dim]      (q_a_proj)              fp8 in the checkpoint
//   P q_norm.weight [q_lora]         (q_a_layernorm)
//   P wq_b.weight [H*(n+r), q_lora]  (q_b_proj)              fp8
//   P wkv_a.weight [c+r, dim]        (kv_a_proj_with_mqa)    fp8
//   P kv_norm.weight [c]             (kv_a_layernorm)
//   P wkv_b.weight [H*(n+v), c]      (kv_b_proj)             fp8; per head n rows of W_UK, then v
//                                                            rows of W_UV
//   P wo.weight [dim, H*v]           (o_proj)                fp8
//   P indexer.wq_b.weight [I*d, q_lora]                      fp8
//   P indexer.wk.weight [d, dim]                             fp8
//   P indexer.k_norm.weight [d], P indexer.k_norm.bias [d]   (a LayerNorm)
//   P indexer.weights_proj.weight [I, dim]                   bf16
// dtypes as for V4 (weights.h): a linear weight is bf16 / fp16 / fp32, or fp8 e4m3 with ue8m0 or
// fp32 scales per 128x128 block; norm weights and the bias bf16 or fp32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv4/config.h"
#include "dsv4/safetensors.h"
#include "dsv4/weights.h"

namespace dsv4 {

// The V3.2 lightning indexer's own projections: queries from the normed q_lora, one key per token
// from the hidden state.
struct SparseMlaIndexerWeights {
  Weight wq_b;            // [I*d, q_lora]
  Weight wk;              // [d, dim]
  HostTensor k_norm;      // [d] LayerNorm weight
  HostTensor k_norm_bias; // [d] LayerNorm bias
  Weight weights_proj;    // [I, dim]
};

struct SparseMlaWeights {
  int layer = 0;
  Weight wq_a;         // [q_lora, dim]
  HostTensor q_norm;   // [q_lora]
  Weight wq_b;         // [H*(n+r), q_lora]
  Weight wkv_a;        // [c+r, dim]
  HostTensor kv_norm;  // [c]
  Weight wkv_b;        // [H*(n+v), c]
  Weight wo;           // [dim, H*v]
  SparseMlaIndexerWeights indexer;
};

// "layers.{i}.attn." Throws for a config that is not V3.2 or a layer out of range.
std::string sparse_mla_tensor_prefix(const ModelConfig& cfg, int layer);
// Every checkpoint tensor name of the layer's weights (scales included for fp8 weights), sorted.
std::vector<std::string> sparse_mla_tensor_names(const SparseMlaWeights& w, const ModelConfig& cfg);

// Deterministic random weights (same (cfg, layer, seed, fp8), same bytes on every platform), with
// random_attention_weights's distributions; fp8 == true: the weights marked fp8 above are fp8 with
// ue8m0 block scales, the rest bf16.
SparseMlaWeights random_sparse_mla_weights(const ModelConfig& cfg, int layer, uint64_t seed,
                                           bool fp8);
// Presence, shape and dtype of every tensor; throws dsv4::Error naming the tensor.
void validate_sparse_mla_weights(const SparseMlaWeights& w, const ModelConfig& cfg,
                                 const char* where = "validate_sparse_mla_weights");
// Reads the layer's tensors (either naming style); throws dsv4::Error naming a missing or
// mis-shaped tensor.
SparseMlaWeights load_sparse_mla_weights(const Checkpoint& ckpt, const ModelConfig& cfg, int layer);
SparseMlaWeights load_sparse_mla_weights(const TensorMap& tensors, const ModelConfig& cfg,
                                         int layer);
SparseMlaWeights load_sparse_mla_weights(const TensorSource& source, const ModelConfig& cfg,
                                         int layer);
// Adds the layer's tensors under the inference-code names.
void add_sparse_mla_tensors(const SparseMlaWeights& w, const ModelConfig& cfg, TensorMap& out);

}  // namespace dsv4
