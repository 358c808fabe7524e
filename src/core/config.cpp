// ModelConfig: built-in configurations, per-layer kinds and RoPE, validation and description.
// JSON loading lives in config_json.cpp.
#include "dsv4/config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "dsv4/status.h"

namespace dsv4 {

std::string_view layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::swa: return "SWA";
    case LayerKind::c4a: return "C4A";
    case LayerKind::c128a: return "C128A";
  }
  return "?";
}

int ModelConfig::compress_ratio(int layer) const {
  if (layer < 0 || layer >= n_layers())
    fail_expected("ModelConfig(" + name + ")", "layer", "0.." + std::to_string(n_layers() - 1),
                  layer);
  return compress_ratios[static_cast<size_t>(layer)];
}

LayerKind ModelConfig::layer_kind(int layer) const {
  const int r = compress_ratio(layer);
  switch (r) {
    case 0: return LayerKind::swa;
    case 4: return LayerKind::c4a;
    case 128: return LayerKind::c128a;
    default:
      fail_expected("ModelConfig(" + name + ")", "compress_ratios[" + std::to_string(layer) + "]",
                    "0, 4 or 128", r);
  }
}

RopeConfig ModelConfig::rope_for_kind(LayerKind kind) const {
  RopeConfig rope;
  rope.rope_dims = rope_head_dim;
  // V4: SWA-only layers rotate with rope_theta and no YaRN; compressed layers use
  // compress_rope_theta with YaRN (docs/spec.md §3). V3.2 has one rope for every layer: rope_theta + YaRN.
  const bool plain = family == "v4" && kind == LayerKind::swa;
  rope.theta = (family == "v4" && !plain) ? compress_rope_theta : rope_theta;
  if (!plain && original_seq_len > 0) {
    rope.yarn = true;
    rope.factor = rope_factor;
    rope.original_seq_len = original_seq_len;
    rope.beta_fast = beta_fast;
    rope.beta_slow = beta_slow;
  }
  return rope;
}

double ModelConfig::mla_softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_nope_head_dim + rope_head_dim));
  if (original_seq_len > 0 && rope_factor > 1.0) {
    const double mscale = 0.1 * mscale_all_dim * std::log(rope_factor) + 1.0;
    scale *= mscale * mscale;
  }
  return scale;
}

RopeConfig ModelConfig::rope_for_layer(int layer) const { return rope_for_kind(layer_kind(layer)); }

void ModelConfig::validate() const {
  const std::string where = "config '" + name + "'";
  auto require = [&](bool ok, const char* field, const auto& expected, const auto& actual) {
    if (!ok) fail_expected(where, field, expected, actual);
  };
  const bool v4 = family == "v4";
  require(v4 || family == "v3.2", "family", "\"v4\" or \"v3.2\"", "\"" + family + "\"");
  require(dim > 0, "dim", "> 0", dim);
  require(n_heads >= 1 && n_heads <= 128, "n_heads", "1..128", n_heads);
  require(head_dim == 512 || head_dim == 576, "head_dim", "512 or 576", head_dim);
  require(head_dim == (v4 ? 512 : 576), "head_dim",
          v4 ? "512 for the v4 family" : "576 for the v3.2 family (kv_lora_rank + rope)", head_dim);
  require(rope_head_dim > 0 && rope_head_dim % 2 == 0 && rope_head_dim < head_dim, "rope_head_dim",
          "an even value in 2.." + std::to_string(head_dim - 1), rope_head_dim);
  require(v_head_dim > 0 && v_head_dim <= head_dim, "v_head_dim",
          "1.." + std::to_string(head_dim), v_head_dim);
  require(q_lora_rank > 0, "q_lora_rank", "> 0", q_lora_rank);
  if (v4) {
    require(o_groups > 0 && n_heads % o_groups == 0, "o_groups",
            "a positive divisor of n_heads (" + std::to_string(n_heads) + ")", o_groups);
    require(o_lora_rank > 0, "o_lora_rank", "> 0", o_lora_rank);
    require(window_size > 0, "window_size", "> 0", window_size);
  } else {
    require(window_size >= 0, "window_size", ">= 0", window_size);
    require(qk_nope_head_dim > 0, "qk_nope_head_dim", "> 0", qk_nope_head_dim);
    require(mla_v_head_dim > 0, "mla_v_head_dim", "> 0", mla_v_head_dim);
    require(mscale_all_dim >= 0, "mscale_all_dim", ">= 0", mscale_all_dim);
  }
  require(!compress_ratios.empty(), "compress_ratios", "at least one layer", "none");
  for (size_t l = 0; l < compress_ratios.size(); ++l) {
    const int r = compress_ratios[l];
    const std::string field = "compress_ratios[" + std::to_string(l) + "]";
    if (v4) {
      require(r == 0 || r == 4 || r == 128, field.c_str(), "0, 4 or 128", r);
    } else {
      require(r == 0, field.c_str(), "0 (v3.2 has no compressed layers)", r);
    }
  }
  require(n_mtp_layers >= 0 && n_mtp_layers < n_layers(), "n_mtp_layers",
          "0.." + std::to_string(n_layers() - 1), n_mtp_layers);
  require(index_n_heads > 0, "index_n_heads", "> 0", index_n_heads);
  require(index_head_dim > 0 && index_head_dim % 2 == 0 && index_head_dim >= rope_head_dim,
          "index_head_dim", "an even value >= rope_head_dim", index_head_dim);
  require(index_topk > 0, "index_topk", "> 0", index_topk);
  require(norm_eps > 0, "norm_eps", "> 0", norm_eps);
  require(rope_theta > 0, "rope_theta", "> 0", rope_theta);
  require(compress_rope_theta > 0, "compress_rope_theta", "> 0", compress_rope_theta);
  require(original_seq_len >= 0, "original_seq_len", ">= 0 (0 = no YaRN)", original_seq_len);
  if (original_seq_len > 0) {
    require(rope_factor >= 1.0, "rope_factor", ">= 1", rope_factor);
    require(beta_fast > 0 && beta_slow > 0 && beta_fast >= beta_slow, "beta_fast/beta_slow",
            "beta_fast >= beta_slow > 0",
            std::to_string(beta_fast) + "/" + std::to_string(beta_slow));
  }
  require(max_position > 0, "max_position", "> 0", max_position);
}

namespace {

// V4-Flash's published per-layer ratios: 2 SWA layers, then C4A/C128A alternating, the last
// main layer C4A, then the MTP block (SWA).
std::vector<int> flash_ratios() {
  std::vector<int> r = {0, 0};
  for (int l = 2; l < 43; ++l) r.push_back(l % 2 == 0 ? 4 : 128);
  r.push_back(0);  // MTP
  return r;
}

// V4-Pro (61 layers + MTP): 2 C128A layers, then C4A/C128A alternating, then the MTP block.
std::vector<int> pro_ratios() {
  std::vector<int> r = {128, 128};
  for (int l = 2; l < 61; ++l) r.push_back(l % 2 == 0 ? 4 : 128);
  r.push_back(0);  // MTP
  return r;
}

ModelConfig make_v4_flash() {
  ModelConfig c;  // the struct defaults are v4-flash's attention settings
  c.name = "v4-flash";
  c.compress_ratios = flash_ratios();
  c.n_mtp_layers = 1;
  return c;
}

ModelConfig make_v4_pro() {
  ModelConfig c = make_v4_flash();
  c.name = "v4-pro";
  c.dim = 7168;
  c.n_heads = 128;
  c.q_lora_rank = 1536;
  c.o_groups = 16;
  c.index_topk = 1024;
  c.compress_ratios = pro_ratios();
  return c;
}

ModelConfig make_v32() {
  ModelConfig c;
  c.name = "v3.2";
  c.family = "v3.2";
  c.dim = 7168;
  c.n_heads = 128;
  c.head_dim = 576;  // kv_lora_rank 512 + qk_rope_head_dim 64
  c.rope_head_dim = 64;
  c.v_head_dim = 512;
  c.q_lora_rank = 1536;
  c.o_groups = 0;
  c.o_lora_rank = 0;
  c.window_size = 0;
  c.compress_ratios.assign(62, 0);  // 61 layers + MTP
  c.n_mtp_layers = 1;
  c.index_n_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 2048;
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 10000.0;
  c.rope_factor = 40.0;
  c.original_seq_len = 4096;
  c.max_position = 163840;
  c.qk_nope_head_dim = 128;
  c.mla_v_head_dim = 128;
  c.mscale_all_dim = 1.0;
  return c;
}

// Small shapes for fast CPU tests; every layer kind appears.
ModelConfig make_tiny(int heads, const char* name) {
  ModelConfig c = make_v4_flash();
  c.name = name;
  c.dim = 256;
  c.n_heads = heads;
  c.q_lora_rank = 128;
  c.o_groups = 4;
  c.o_lora_rank = 64;
  c.window_size = 16;
  c.compress_ratios = {0, 4, 128, 4};
  c.n_mtp_layers = 0;
  c.index_n_heads = 4;
  c.index_topk = 16;
  c.max_position = 1 << 16;
  return c;
}

ModelConfig make_tiny_v32() {
  ModelConfig c = make_v32();
  c.name = "tiny-v3.2";
  c.dim = 256;
  c.n_heads = 16;
  c.q_lora_rank = 128;
  c.compress_ratios = {0, 0};
  c.n_mtp_layers = 0;
  c.index_n_heads = 4;
  c.index_topk = 16;
  c.max_position = 1 << 16;
  return c;
}

struct Builtin {
  const char* name;
  ModelConfig (*make)();
};
const std::array<Builtin, 6> kBuiltins = {{
    {"v4-flash", make_v4_flash},
    {"v4-pro", make_v4_pro},
    {"v3.2", make_v32},
    {"tiny", [] { return make_tiny(16, "tiny"); }},
    {"tiny-h64", [] { return make_tiny(64, "tiny-h64"); }},
    {"tiny-v3.2", make_tiny_v32},
}};

}  // namespace

std::vector<std::string> ModelConfig::builtin_names() {
  std::vector<std::string> names;
  for (const auto& b : kBuiltins) names.emplace_back(b.name);
  return names;
}

ModelConfig ModelConfig::builtin(std::string_view name) {
  for (const auto& b : kBuiltins)
    if (name == b.name) return b.make();
  std::string known;
  for (const auto& b : kBuiltins) known.append(known.empty() ? "" : ", ").append(b.name);
  fail_expected("ModelConfig::builtin", "name", detail::concat("one of ", known),
                detail::concat("'", name, "'"));
}

namespace {

std::string rope_text(const RopeConfig& r) {
  std::ostringstream os;
  os << "theta " << r.theta;
  if (r.yarn) {
    os << ", YaRN factor " << r.factor << ", original_seq_len " << r.original_seq_len
       << ", beta_fast " << r.beta_fast << ", beta_slow " << r.beta_slow;
  } else {
    os << ", no YaRN";
  }
  return os.str();
}

}  // namespace

std::string describe(const ModelConfig& c) {
  std::ostringstream os;
  const bool v4 = c.family == "v4";
  os << "model          " << c.name << " (family " << c.family << ")\n";
  os << "hidden dim     " << c.dim << "\n";
  os << "heads          " << c.n_heads << " query heads, 1 KV head (MQA), head_dim " << c.head_dim
     << " = " << c.nope_dim() << " nope + " << c.rope_head_dim << " rope, d_v " << c.v_head_dim
     << "\n";
  os << "q_lora_rank    " << c.q_lora_rank << "\n";
  if (v4) {
    os << "output         " << c.o_groups << " groups x o_lora_rank " << c.o_lora_rank << "\n";
    os << "window         " << c.window_size << " tokens\n";
  } else {
    os << "attention      sparse MLA over all tokens (indexer top-k), no sliding window\n";
  }
  os << "indexer        " << c.index_n_heads << " heads x " << c.index_head_dim << ", top-k "
     << c.index_topk << "\n";
  os << "norm_eps       " << c.norm_eps << "\n";
  os << "max position   " << c.max_position << "\n";
  if (v4) {
    os << "rope SWA       " << rope_text(c.rope_for_kind(LayerKind::swa)) << "\n";
    os << "rope C4A/C128A " << rope_text(c.rope_for_kind(LayerKind::c4a)) << "\n";
  } else {
    os << "rope           " << rope_text(c.rope_for_kind(LayerKind::swa)) << "\n";
  }
  int counts[3] = {0, 0, 0};
  for (int l = 0; l < c.n_layers(); ++l) ++counts[static_cast<int>(c.layer_kind(l))];
  os << "layers         " << c.n_layers();
  if (c.n_mtp_layers > 0)
    os << " (" << c.n_layers() - c.n_mtp_layers << " + " << c.n_mtp_layers << " MTP)";
  if (v4) {
    os << ": " << counts[0] << " SWA, " << counts[1] << " C4A, " << counts[2] << " C128A";
  }
  os << "\n";
  if (v4) {
    os << "layer kinds (SWA: window only; C4A: + indexer top-k of ratio-4 entries; C128A: + all "
          "ratio-128 entries)\n";
    constexpr int kPerRow = 8;
    for (int l = 0; l < c.n_layers(); l += kPerRow) {
      char head[32];
      std::snprintf(head, sizeof head, "  %3d-%-3d ", l, std::min(l + kPerRow, c.n_layers()) - 1);
      os << head;
      for (int k = l; k < std::min(l + kPerRow, c.n_layers()); ++k) {
        char cell[16];
        std::snprintf(cell, sizeof cell, " %-6s", std::string(layer_kind_name(c.layer_kind(k))).c_str());
        os << cell;
      }
      os << "\n";
    }
    if (c.n_mtp_layers > 0) os << "  (the last " << c.n_mtp_layers << " layer(s): MTP)\n";
  }
  return os.str();
}

}  // namespace dsv4
