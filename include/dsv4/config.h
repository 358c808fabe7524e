// Model configurations: the attention settings of DeepSeek-V4 (flash, pro), V3.2 and tiny test
// configs, built in or parsed from a checkpoint's config.json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

enum class LayerKind : uint8_t { swa, c4a, c128a };
std::string_view layer_kind_name(LayerKind k);  // "SWA", "C4A", "C128A"

// RoPE frequencies of one layer (docs/spec.md §3). yarn == false: plain theta^(-2i/R).
struct RopeConfig {
  double theta = 10000.0;
  int rope_dims = 64;  // R: the LAST R dims of the head rotate, GPT-J interleaved pairs
  bool yarn = false;
  double factor = 1.0;
  long long original_seq_len = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct ModelConfig {
  std::string name;            // "v4-flash", "v3.2", "tiny", or the path it was loaded from
  std::string family = "v4";   // "v4" or "v3.2" (v3.2: sparse MLA over all tokens, every layer
                               // "SWA"-kind with ratio 0, no window, no grouped output: o_* = 0)
  int dim = 4096;              // hidden size
  int n_heads = 64;            // H
  int head_dim = 512;          // D (d_qk; 576 for v3.2's latent + rope)
  int rope_head_dim = 64;      // R
  int v_head_dim = 512;        // d_v of the sparse attention
  int q_lora_rank = 1024;
  int o_groups = 8;            // G
  int o_lora_rank = 1024;
  int window_size = 128;       // W (v3.2 has no sliding window: 0)
  std::vector<int> compress_ratios;  // one per attention layer, each in {0, 4, 128}
  int n_mtp_layers = 0;        // trailing compress_ratios entries that belong to MTP blocks
  int index_n_heads = 64;
  int index_head_dim = 128;
  int index_topk = 512;
  double norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  double rope_factor = 16.0;
  long long original_seq_len = 65536;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int max_position = 1 << 20;  // max_position_embeddings
  // V3.2's multi-head latent attention before absorption (unused by V4): per head, q has
  // qk_nope_head_dim nope dims (+ rope_head_dim), which W_UK maps into the nope_dim() latent, and
  // W_UV maps the latent output back to mla_v_head_dim values (the HF config's v_head_dim).
  int qk_nope_head_dim = 128;
  int mla_v_head_dim = 128;
  double mscale_all_dim = 0.0;  // YaRN attention scale: softmax scale *= mscale² (0: none)

  int n_layers() const { return static_cast<int>(compress_ratios.size()); }  // incl. MTP layers
  int nope_dim() const { return head_dim - rope_head_dim; }
  LayerKind layer_kind(int layer) const;   // throws for a layer out of range
  int compress_ratio(int layer) const;
  RopeConfig rope_for_layer(int layer) const;  // docs/spec.md §3: ratio > 0 → compress theta + YaRN
  RopeConfig rope_for_kind(LayerKind kind) const;
  // V3.2: the softmax scale of the absorbed attention, (qk_nope_head_dim + rope_head_dim)^-0.5
  // times mscale² with mscale = 0.1 · mscale_all_dim · ln(rope_factor) + 1 under YaRN (vLLM's
  // yarn_get_mscale; the official model applies it when max_seq_len > original_seq_len).
  double mla_softmax_scale() const;

  // Throws dsv4::Error naming the field for: heads outside 1..128, head_dim not 512/576,
  // ratio not in {0, 4, 128}, window <= 0, non-positive ranks, o_groups not dividing heads, ...
  void validate() const;

  static ModelConfig builtin(std::string_view name);  // throws for an unknown name
  // v4-flash, v4-pro, v3.2, tiny (H 16, ratios [0,4,128,4]), tiny-h64 (H 64), tiny-v3.2 (H 16).
  static std::vector<std::string> builtin_names();
  static ModelConfig from_json_string(std::string_view json, std::string name = "json");
  // `path` is a config.json file or a directory containing one.
  static ModelConfig from_json_file(const std::string& path);
};

// Human-readable summary of the attention settings and per-layer kinds (`dsv4 info --config`).
std::string describe(const ModelConfig& cfg);

}  // namespace dsv4
