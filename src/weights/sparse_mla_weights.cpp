// SparseMlaWeights: the V3.2 layer's slot table (weight_slots.h), in both naming styles.
#include "dsv4/sparse_mla_weights.h"

#include <utility>

#include "weights/weight_slots.h"

namespace dsv4 {

namespace {

using namespace weights_detail;  // NOLINT(google-build-using-namespace): the slot table's vocabulary

void check_layer(const ModelConfig& cfg, int layer, const char* where) {
  if (cfg.family != "v3.2")
    fail(where, ": config '", cfg.name, "' is family ", cfg.family,
         "; sparse-MLA weights are DeepSeek-V3.2's");
  if (layer < 0 || layer >= cfg.n_layers())
    fail_expected(where, "layer", "0.." + std::to_string(cfg.n_layers() - 1), layer);
}

enum class Naming : uint8_t { inference, hugging_face };

// The layer's tensors, pointing into `w`, under the inference code's keys or the Hugging Face
// checkpoint's (only the MLA projections and norms are spelled differently).
std::vector<Slot> layer_slots(SparseMlaWeights& w, const ModelConfig& cfg, Naming naming) {
  const bool hf = naming == Naming::hugging_face;
  const int64_t dim = cfg.dim, heads = cfg.n_heads, q_lora = cfg.q_lora_rank;
  const int64_t nope = cfg.qk_nope_head_dim, rope = cfg.rope_head_dim, latent = cfg.nope_dim();
  const int64_t v = cfg.mla_v_head_dim, ih = cfg.index_n_heads, id = cfg.index_head_dim;
  SparseMlaIndexerWeights& ix = w.indexer;
  std::vector<Slot> s;
  s.push_back(linear_slot(hf ? "q_a_proj" : "wq_a", w.wq_a, {q_lora, dim}, true));
  s.push_back(norm_slot(hf ? "q_a_layernorm" : "q_norm", w.q_norm, q_lora));
  s.push_back(linear_slot(hf ? "q_b_proj" : "wq_b", w.wq_b, {heads * (nope + rope), q_lora}, true));
  s.push_back(linear_slot(hf ? "kv_a_proj_with_mqa" : "wkv_a", w.wkv_a, {latent + rope, dim}, true));
  s.push_back(norm_slot(hf ? "kv_a_layernorm" : "kv_norm", w.kv_norm, latent));
  s.push_back(linear_slot(hf ? "kv_b_proj" : "wkv_b", w.wkv_b, {heads * (nope + v), latent}, true));
  s.push_back(linear_slot(hf ? "o_proj" : "wo", w.wo, {dim, heads * v}, true));
  s.push_back(linear_slot("indexer.wq_b", ix.wq_b, {ih * id, q_lora}, true));
  s.push_back(linear_slot("indexer.wk", ix.wk, {id, dim}, true));
  s.push_back(norm_slot("indexer.k_norm", ix.k_norm, id));
  s.push_back(bias_slot("indexer.k_norm", ix.k_norm_bias, id));
  s.push_back(linear_slot("indexer.weights_proj", ix.weights_proj, {ih, dim}, false));
  return s;
}

std::string hf_prefix(int layer) { return "model.layers." + std::to_string(layer) + ".self_attn."; }

}  // namespace

std::string sparse_mla_tensor_prefix(const ModelConfig& cfg, int layer) {
  check_layer(cfg, layer, "sparse_mla_tensor_prefix");
  return "layers." + std::to_string(layer) + ".attn.";
}

std::vector<std::string> sparse_mla_tensor_names(const SparseMlaWeights& w, const ModelConfig& cfg) {
  TensorMap tensors;
  add_sparse_mla_tensors(w, cfg, tensors);
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  return names;
}

SparseMlaWeights random_sparse_mla_weights(const ModelConfig& cfg, int layer, uint64_t seed,
                                           bool fp8) {
  check_layer(cfg, layer, "random_sparse_mla_weights");
  SparseMlaWeights w;
  w.layer = layer;
  fill_random_slots(layer_slots(w, cfg, Naming::inference), seed, layer, fp8,
                    "random_sparse_mla_weights");
  return w;
}

void validate_sparse_mla_weights(const SparseMlaWeights& w, const ModelConfig& cfg,
                                 const char* where) {
  check_layer(cfg, w.layer, where);
  SparseMlaWeights view = w;  // shares the buffers; layer_slots needs a mutable object
  validate_slots(layer_slots(view, cfg, Naming::inference), sparse_mla_tensor_prefix(cfg, w.layer),
                 where);
}

SparseMlaWeights load_sparse_mla_weights(const Checkpoint& ckpt, const ModelConfig& cfg,
                                         int layer) {
  return load_sparse_mla_weights(CheckpointSource(ckpt), cfg, layer);
}

SparseMlaWeights load_sparse_mla_weights(const TensorMap& tensors, const ModelConfig& cfg,
                                         int layer) {
  return load_sparse_mla_weights(TensorMapSource(tensors), cfg, layer);
}

SparseMlaWeights load_sparse_mla_weights(const TensorSource& source, const ModelConfig& cfg,
                                         int layer) {
  const char* where = "load_sparse_mla_weights";
  check_layer(cfg, layer, where);
  SparseMlaWeights w;
  w.layer = layer;
  // The naming style: Hugging Face's when its q_a_proj is there, else the inference code's.
  const bool hf = source.contains(hf_prefix(layer) + "q_a_proj.weight");
  load_slots(source, layer_slots(w, cfg, hf ? Naming::hugging_face : Naming::inference),
             hf ? hf_prefix(layer) : sparse_mla_tensor_prefix(cfg, layer), where);
  validate_sparse_mla_weights(w, cfg, where);
  return w;
}

void add_sparse_mla_tensors(const SparseMlaWeights& w, const ModelConfig& cfg, TensorMap& out) {
  validate_sparse_mla_weights(w, cfg, "add_sparse_mla_tensors");
  SparseMlaWeights view = w;
  add_slot_tensors(layer_slots(view, cfg, Naming::inference), sparse_mla_tensor_prefix(cfg, w.layer),
                   out, "add_sparse_mla_tensors");
}

}  // namespace dsv4
