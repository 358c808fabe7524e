// ModelConfig from a checkpoint's config.json. Two naming styles exist and both are accepted:
//   - Hugging Face config.json (DeepSeek-V4-Flash/Pro, DeepSeek-V3.2-Exp): hidden_size,
//     num_attention_heads, num_hidden_layers, qk_rope_head_dim, sliding_window, rms_norm_eps,
//     max_position_embeddings, num_nextn_predict_layers, rope_scaling {factor,
//     original_max_position_embeddings, beta_fast, beta_slow}, kv_lora_rank (V3.2), ...
//   - the official inference ModelArgs json (inference/config.json): dim, n_heads, n_layers,
//     rope_head_dim, window_size, norm_eps, max_seq_len, n_mtp_layers, rope_factor,
//     original_seq_len, beta_fast, beta_slow, ...
// Keys the attention layer does not use (MoE, hyper-connections, ...) are ignored.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "dsv4/config.h"
#include "dsv4/status.h"

namespace dsv4 {

namespace {

using nlohmann::json;

// Reads the first present, non-null key of `keys` from `j` as T; `fallback` when none is.
// Exact: an integer field takes a JSON integer (or an integral number like 64.0) within T's range
// — never a boolean, a fraction or a value that would wrap (4294967552 is not 256); a floating-
// point field takes a finite number, not a boolean; a string field a string.
class JsonReader {
 public:
  JsonReader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  template <typename T>
  T get(std::initializer_list<const char*> keys, T fallback) const {
    for (const char* key : keys)
      if (has(key)) return convert<T>(j_.at(key), key);
    return fallback;
  }

 private:
  // `name`: the key, or "key[i]" for a list element (messages say "key 'name'").
  template <typename T>
  T convert(const json& v, const std::string& name) const {
    const std::string what = "key '" + name + "'";
    if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) fail_expected(where_, what, "a string", v.dump());
      return v.get<std::string>();
    } else if constexpr (std::is_same_v<T, double>) {
      if (!v.is_number() || !std::isfinite(v.get<double>()))
        fail_expected(where_, what, "a finite number", v.dump());
      return v.get<double>();
    } else if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(integer(v, what, std::numeric_limits<T>::min(),
                                    std::numeric_limits<T>::max()));
    } else {  // std::vector<int>
      if (!v.is_array()) fail_expected(where_, what, "a list of integers", v.dump());
      T out;
      for (size_t i = 0; i < v.size(); ++i)
        out.push_back(convert<typename T::value_type>(v[i], name + "[" + std::to_string(i) + "]"));
      return out;
    }
  }

  int64_t integer(const json& v, const std::string& what, int64_t lo, int64_t hi) const {
    const std::string expected = detail::concat("an integer in [", lo, ", ", hi, "]");
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(hi)) fail_expected(where_, what, expected, v.dump());
      return static_cast<int64_t>(v.get<uint64_t>());
    }
    if (v.is_number_integer()) {
      if (v.get<int64_t>() < lo || v.get<int64_t>() > hi) fail_expected(where_, what, expected, v.dump());
      return v.get<int64_t>();
    }
    if (v.is_number_float()) {
      // An integral float (64.0) is the integer it spells; a fraction or an out-of-range value
      // is an error. (`d < -lo`: for int64, hi rounds up to 2^63 in double, -lo is exactly 2^63.)
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && d >= static_cast<double>(lo) &&
          d < -static_cast<double>(lo) && d <= static_cast<double>(hi))
        return static_cast<int64_t>(d);
    }
    fail_expected(where_, what, expected, v.dump());
  }

  const json& j_;
  std::string where_;
};

// The most bytes a config file read takes (real config.json files are a few kB).
constexpr size_t kMaxConfigBytes = size_t{1} << 20;
// The most layers a config may declare without listing them (DeepSeek models have < 100).
constexpr int64_t kMaxLayers = 1 << 16;

std::string family_of(const json& j) {
  const std::string type = j.contains("model_type") && j["model_type"].is_string()
                               ? j["model_type"].get<std::string>()
                               : std::string();
  if (type.find("deepseek_v4") != std::string::npos) return "v4";
  if (type.find("deepseek_v3") != std::string::npos) return "v3.2";
  // Inference-style json has no model_type: V4 is recognised by its compressed layers / grouped
  // output, V3.2 by its latent KV rank.
  if (j.contains("compress_ratios") || j.contains("o_groups")) return "v4";
  if (j.contains("kv_lora_rank")) return "v3.2";
  return "v4";
}

}  // namespace

ModelConfig ModelConfig::from_json_string(std::string_view text, std::string name) {
  const std::string where = "config '" + name + "'";
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(where, ": invalid JSON: ", e.what());
  }
  if (!j.is_object()) fail(where, ": expected a JSON object at the top level");

  const JsonReader top(j, where);
  // Hugging Face nests YaRN settings in rope_scaling (newer transformers: rope_parameters).
  json rope_obj = json::object();
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (top.has(key)) {
      if (!j[key].is_object()) fail(where, ": key '", key, "': expected an object");
      rope_obj = j[key];
      break;
    }
  }
  const JsonReader rope(rope_obj, where + " rope_scaling");
  const std::string rope_type = rope.get<std::string>({"type", "rope_type"}, "yarn");
  if (!rope_obj.empty() && rope_type != "yarn" && rope_type != "default")
    fail_expected(where, "rope_scaling.type", "\"yarn\"", "\"" + rope_type + "\"");

  ModelConfig c;
  c.name = std::move(name);
  c.family = family_of(j);
  const bool v4 = c.family == "v4";

  c.dim = top.get<int>({"hidden_size", "dim"}, c.dim);
  c.n_heads = top.get<int>({"num_attention_heads", "n_heads"}, c.n_heads);
  c.rope_head_dim = top.get<int>({"qk_rope_head_dim", "rope_head_dim"}, c.rope_head_dim);
  c.q_lora_rank = top.get<int>({"q_lora_rank"}, c.q_lora_rank);
  if (v4) {
    c.head_dim = top.get<int>({"head_dim"}, c.head_dim);
    c.v_head_dim = c.head_dim;  // K = V: attention returns the whole head
    c.o_groups = top.get<int>({"o_groups"}, c.o_groups);
    c.o_lora_rank = top.get<int>({"o_lora_rank"}, c.o_lora_rank);
    c.window_size = top.get<int>({"sliding_window", "window_size"}, c.window_size);
  } else {
    // V3.2 sparse MLA in its absorbed form: one latent KV head of kv_lora_rank + rope dims, the
    // attention output is the latent (d_v = kv_lora_rank).
    const int kv_lora_rank = top.get<int>({"kv_lora_rank"}, 512);
    c.head_dim = kv_lora_rank + c.rope_head_dim;
    c.v_head_dim = kv_lora_rank;
    c.qk_nope_head_dim = top.get<int>({"qk_nope_head_dim"}, c.qk_nope_head_dim);
    c.mla_v_head_dim = top.get<int>({"v_head_dim"}, c.mla_v_head_dim);
    c.mscale_all_dim = rope.get<double>({"mscale_all_dim"}, 0.0);
    c.o_groups = 0;
    c.o_lora_rank = 0;
    c.window_size = 0;
  }
  c.index_n_heads = top.get<int>({"index_n_heads"}, c.index_n_heads);
  c.index_head_dim = top.get<int>({"index_head_dim"}, c.index_head_dim);
  c.index_topk = top.get<int>({"index_topk"}, v4 ? c.index_topk : 2048);
  c.norm_eps = top.get<double>({"rms_norm_eps", "norm_eps"}, c.norm_eps);
  c.rope_theta = top.get<double>({"rope_theta"}, c.rope_theta);
  c.compress_rope_theta =
      top.get<double>({"compress_rope_theta"}, v4 ? c.compress_rope_theta : c.rope_theta);
  // YaRN: absent everywhere → no YaRN (original_seq_len 0), as the reference does.
  c.rope_factor = rope.get<double>({"factor"}, top.get<double>({"rope_factor"}, 1.0));
  c.original_seq_len = rope.get<long long>({"original_max_position_embeddings"},
                                           top.get<long long>({"original_seq_len"}, 0));
  c.beta_fast = rope.get<double>({"beta_fast"}, top.get<double>({"beta_fast"}, c.beta_fast));
  c.beta_slow = rope.get<double>({"beta_slow"}, top.get<double>({"beta_slow"}, c.beta_slow));
  c.max_position = top.get<int>({"max_position_embeddings", "max_seq_len"}, c.max_position);

  // Layers: compress_ratios lists every attention layer, MTP blocks included (V4-Flash: 43 + 1).
  const int64_t n_main = top.get<int>({"num_hidden_layers", "n_layers"}, -1);
  const int64_t n_mtp = top.get<int>({"num_nextn_predict_layers", "n_mtp_layers"}, 0);
  if (n_mtp < 0) fail_expected(where, "num_nextn_predict_layers", ">= 0", n_mtp);
  if (top.has("compress_ratios")) {
    c.compress_ratios = top.get<std::vector<int>>({"compress_ratios"}, {});
    const int n = c.n_layers();
    if (n_main < 0) {
      c.n_mtp_layers = 0;
    } else if (n == n_main) {
      c.n_mtp_layers = 0;
    } else if (n == n_main + n_mtp) {
      c.n_mtp_layers = static_cast<int>(n_mtp);
    } else {
      fail_expected(where, "compress_ratios.size()",
                    std::to_string(n_main) + " (num_hidden_layers) or " +
                        std::to_string(n_main + n_mtp) + " (+ MTP layers)",
                    n);
    }
  } else {
    if (v4) fail(where, ": compress_ratios: expected a list of per-layer ratios, got none");
    // The layer list is built from these counts: bound them before allocating it.
    if (n_main <= 0 || n_main > kMaxLayers)
      fail_expected(where, "num_hidden_layers", detail::concat("1..", kMaxLayers), n_main);
    if (n_mtp > kMaxLayers) fail_expected(where, "num_nextn_predict_layers", detail::concat("0..", kMaxLayers), n_mtp);
    c.compress_ratios.assign(static_cast<size_t>(n_main + n_mtp), 0);
    c.n_mtp_layers = static_cast<int>(n_mtp);
  }
  c.validate();
  return c;
}

ModelConfig ModelConfig::from_json_file(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file(path);
  std::error_code ec;
  if (fs::is_directory(file, ec)) file /= "config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("config: cannot open '", file.string(), "'");
  // A config.json is a few kB; reading stops past the cap, so a path like /dev/zero or a huge
  // file is an error, not an unbounded read.
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) fail("config: cannot read '", file.string(), "'");
  if (static_cast<size_t>(in.gcount()) > kMaxConfigBytes)
    fail("config '", file.string(), "': expected a file of at most ", kMaxConfigBytes,
         " bytes (a config.json), got more");
  text.resize(static_cast<size_t>(in.gcount()));
  return from_json_string(text, path);
}

}  // namespace dsv4
