// AttentionWeights: one table of the layer's tensors (checkpoint name, shape, dtype rules, init)
// drives random generation, validation, loading and saving (weight_slots.h), so the four cannot
// drift apart.
#include "dsv4/weights.h"
#include "weights/weight_slots.h"

namespace dsv4 {

namespace {

using namespace weights_detail;  // NOLINT(google-build-using-namespace): the slot table's vocabulary

int layer_ratio(const ModelConfig& cfg, int layer, const char* where) {
  if (cfg.family != "v4")
    fail(where, ": config '", cfg.name, "' is family ", cfg.family,
         "; only DeepSeek-V4 attention weights are supported");
  if (layer < 0 || layer >= cfg.n_layers())
    fail_expected(where, "layer", "0.." + std::to_string(cfg.n_layers() - 1), layer);
  return cfg.compress_ratios[static_cast<size_t>(layer)];
}

void add_compressor_slots(std::vector<Slot>& slots, CompressorWeights& c, const std::string& key,
                          int64_t head_dim, int ratio, int64_t dim) {
  const int64_t width = (ratio == 4 ? 2 : 1) * head_dim;  // coff * head_dim
  slots.push_back(linear_slot(key + ".wkv", c.wkv, {width, dim}, false));
  slots.push_back(linear_slot(key + ".wgate", c.wgate, {width, dim}, false));
  slots.push_back(param_slot(key + ".ape", c.ape, {ratio, width}, 0.5));
  slots.push_back(norm_slot(key + ".norm", c.norm, head_dim));
}

// The layer's tensors, pointing into `w`. Creates (or drops) the optional compressor and indexer
// to match the layer's ratio, so `w` must already have been checked where that matters.
std::vector<Slot> layer_slots(AttentionWeights& w, const ModelConfig& cfg) {
  const int64_t dim = cfg.dim, heads = cfg.n_heads, hd = cfg.head_dim, q_lora = cfg.q_lora_rank;
  const int64_t groups = cfg.o_groups, o_lora = cfg.o_lora_rank;
  const int64_t group_in = groups > 0 ? heads * hd / groups : 0;
  std::vector<Slot> s;
  s.push_back(linear_slot("wq_a", w.wq_a, {q_lora, dim}, true));
  s.push_back(norm_slot("q_norm", w.q_norm, q_lora));
  s.push_back(linear_slot("wq_b", w.wq_b, {heads * hd, q_lora}, true));
  s.push_back(linear_slot("wkv", w.wkv, {hd, dim}, true));
  s.push_back(norm_slot("kv_norm", w.kv_norm, hd));
  s.push_back(
      linear_slot("wo_a", w.wo_a, {groups, o_lora, group_in}, {groups * o_lora, group_in}, true));
  s.push_back(linear_slot("wo_b", w.wo_b, {dim, groups * o_lora}, true));
  s.push_back(param_slot("attn_sink", w.attn_sink, {heads}, 1.0));

  if (w.compress_ratio > 0) {
    if (!w.compressor) w.compressor.emplace();
    add_compressor_slots(s, *w.compressor, "compressor", hd, w.compress_ratio, dim);
  } else {
    w.compressor.reset();
  }
  if (w.compress_ratio == 4) {
    if (!w.indexer) w.indexer.emplace();
    IndexerWeights& ix = *w.indexer;
    const int64_t ih = cfg.index_n_heads, id = cfg.index_head_dim;
    s.push_back(linear_slot("indexer.wq_b", ix.wq_b, {ih * id, q_lora}, true));
    s.push_back(linear_slot("indexer.weights_proj", ix.weights_proj, {ih, dim}, false));
    add_compressor_slots(s, ix.compressor, "indexer.compressor", id, 4, dim);
  } else {
    w.indexer.reset();
  }
  return s;
}

// ---- checkpoint names -----------------------------------------------------------------------

// Prefixes a checkpoint may use for the layer, the official one first.
std::vector<std::string> prefix_candidates(const ModelConfig& cfg, int layer) {
  std::vector<std::string> out{attention_tensor_prefix(cfg, layer)};
  const int n_main = cfg.n_layers() - cfg.n_mtp_layers;
  if (layer < n_main) {
    const std::string i = std::to_string(layer);
    out.push_back("model.layers." + i + ".self_attn.");
    out.push_back("model.layers." + i + ".attn.");
  }
  return out;
}

}  // namespace

std::string attention_tensor_prefix(const ModelConfig& cfg, int layer) {
  layer_ratio(cfg, layer, "attention_tensor_prefix");
  const int n_main = cfg.n_layers() - cfg.n_mtp_layers;
  if (layer >= n_main) return "mtp." + std::to_string(layer - n_main) + ".attn.";
  return "layers." + std::to_string(layer) + ".attn.";
}

std::vector<std::string> attention_tensor_names(const AttentionWeights& w, const ModelConfig& cfg) {
  TensorMap tensors;
  add_attention_tensors(w, cfg, tensors);
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  return names;
}

AttentionWeights random_attention_weights(const ModelConfig& cfg, int layer, uint64_t seed,
                                          bool fp8) {
  AttentionWeights w;
  w.layer = layer;
  w.compress_ratio = layer_ratio(cfg, layer, "random_attention_weights");
  fill_random_slots(layer_slots(w, cfg), seed, layer, fp8, "random_attention_weights");
  return w;
}

void validate_attention_weights(const AttentionWeights& w, const ModelConfig& cfg,
                                const char* where) {
  const int ratio = layer_ratio(cfg, w.layer, where);
  if (w.compress_ratio != ratio)
    fail_expected(where, "compress_ratio of layer " + std::to_string(w.layer), ratio,
                  w.compress_ratio);
  if (w.compressor.has_value() != (ratio > 0))
    fail(where, ": layer ", w.layer, " (ratio ", ratio, "): compressor weights ",
         ratio > 0 ? "missing" : "present but the layer does not compress");
  if (w.indexer.has_value() != (ratio == 4))
    fail(where, ": layer ", w.layer, " (ratio ", ratio, "): indexer weights ",
         ratio == 4 ? "missing" : "present but only ratio-4 layers have an indexer");

  AttentionWeights view = w;  // shares the buffers; layer_slots needs a mutable object
  validate_slots(layer_slots(view, cfg), attention_tensor_prefix(cfg, w.layer), where);
}

AttentionWeights load_attention_weights(const Checkpoint& ckpt, const ModelConfig& cfg, int layer) {
  return load_attention_weights(CheckpointSource(ckpt), cfg, layer);
}

AttentionWeights load_attention_weights(const TensorMap& tensors, const ModelConfig& cfg,
                                        int layer) {
  return load_attention_weights(TensorMapSource(tensors), cfg, layer);
}

AttentionWeights load_attention_weights(const TensorSource& source, const ModelConfig& cfg,
                                        int layer) {
  const char* where = "load_attention_weights";
  AttentionWeights w;
  w.layer = layer;
  w.compress_ratio = layer_ratio(cfg, layer, where);
  // The naming style: the first candidate prefix under which the layer's wq_a exists.
  const std::string prefix = pick_prefix(source, prefix_candidates(cfg, layer), "wq_a.weight");
  load_slots(source, layer_slots(w, cfg), prefix, where);
  validate_attention_weights(w, cfg, where);
  return w;
}

void add_attention_tensors(const AttentionWeights& w, const ModelConfig& cfg, TensorMap& out) {
  validate_attention_weights(w, cfg, "add_attention_tensors");
  AttentionWeights view = w;
  add_slot_tensors(layer_slots(view, cfg), attention_tensor_prefix(cfg, w.layer), out,
                   "add_attention_tensors");
}

void save_attention_weights(const std::string& path, const ModelConfig& cfg,
                            const std::vector<AttentionWeights>& layers,
                            const MetadataMap& metadata) {
  TensorMap tensors;
  for (const AttentionWeights& w : layers) add_attention_tensors(w, cfg, tensors);
  write_safetensors(path, tensors, metadata);
}

}  // namespace dsv4
