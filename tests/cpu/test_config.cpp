// Model configs: built-ins, per-layer kinds and RoPE (docs/spec.md §1, §3), loading real-style
// config.json files (Hugging Face and inference ModelArgs naming) from a temp directory, and
// rejection of invalid configs with an error naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>

#include "dsv4/config.h"
#include "dsv4/status.h"

namespace {

using dsv4::LayerKind;
using dsv4::ModelConfig;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dsv4::Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(ConfigBuiltin, EveryBuiltinValidates) {
  const auto names = ModelConfig::builtin_names();
  for (const char* want : {"v4-flash", "v4-pro", "v3.2", "tiny", "tiny-h64"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  for (const auto& n : names) {
    const ModelConfig c = ModelConfig::builtin(n);
    EXPECT_EQ(c.name, n);
    EXPECT_NO_THROW(c.validate()) << n;
  }
  const std::string err = error_of([] { ModelConfig::builtin("v5"); });
  EXPECT_NE(err.find("'v5'"), std::string::npos) << err;
  EXPECT_NE(err.find("v4-flash"), std::string::npos) << err;
}

TEST(ConfigBuiltin, V4FlashMatchesSpecTable) {
  const ModelConfig c = ModelConfig::builtin("v4-flash");
  EXPECT_EQ(c.family, "v4");
  EXPECT_EQ(c.dim, 4096);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_head_dim, 64);
  EXPECT_EQ(c.nope_dim(), 448);
  EXPECT_EQ(c.v_head_dim, 512);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.window_size, 128);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  // 43 layers + 1 MTP: [0, 0, 4, 128, 4, ..., 128, 4, 0].
  ASSERT_EQ(c.n_layers(), 44);
  EXPECT_EQ(c.n_mtp_layers, 1);
  EXPECT_EQ(c.layer_kind(0), LayerKind::swa);
  EXPECT_EQ(c.layer_kind(1), LayerKind::swa);
  EXPECT_EQ(c.layer_kind(2), LayerKind::c4a);
  EXPECT_EQ(c.layer_kind(3), LayerKind::c128a);
  EXPECT_EQ(c.layer_kind(41), LayerKind::c128a);
  EXPECT_EQ(c.layer_kind(42), LayerKind::c4a);
  EXPECT_EQ(c.layer_kind(43), LayerKind::swa);
  EXPECT_THROW(c.layer_kind(44), dsv4::Error);
  EXPECT_THROW(c.layer_kind(-1), dsv4::Error);
  EXPECT_EQ(dsv4::layer_kind_name(LayerKind::c128a), "C128A");
}

TEST(ConfigBuiltin, TinyAndV32Shapes) {
  const ModelConfig t = ModelConfig::builtin("tiny");
  EXPECT_EQ(t.n_heads, 16);
  EXPECT_EQ(t.dim, 256);
  EXPECT_EQ(t.q_lora_rank, 128);
  EXPECT_EQ(t.o_groups, 4);
  EXPECT_EQ(t.o_lora_rank, 64);
  EXPECT_EQ(t.window_size, 16);
  EXPECT_EQ(t.index_n_heads, 4);
  EXPECT_EQ(t.index_topk, 16);
  EXPECT_EQ(t.compress_ratios, (std::vector<int>{0, 4, 128, 4}));
  EXPECT_EQ(ModelConfig::builtin("tiny-h64").n_heads, 64);
  EXPECT_EQ(ModelConfig::builtin("v4-pro").n_heads, 128);

  const ModelConfig v = ModelConfig::builtin("v3.2");
  EXPECT_EQ(v.family, "v3.2");
  EXPECT_EQ(v.n_heads, 128);
  EXPECT_EQ(v.head_dim, 576);
  EXPECT_EQ(v.v_head_dim, 512);
  EXPECT_EQ(v.index_topk, 2048);
}

TEST(ConfigRope, PerLayerKindFollowsSpec) {
  const ModelConfig c = ModelConfig::builtin("v4-flash");
  const dsv4::RopeConfig swa = c.rope_for_layer(0);
  EXPECT_EQ(swa.theta, 10000.0);
  EXPECT_FALSE(swa.yarn);
  EXPECT_EQ(swa.rope_dims, 64);
  for (int layer : {2, 3}) {
    const dsv4::RopeConfig r = c.rope_for_layer(layer);
    EXPECT_EQ(r.theta, 160000.0) << layer;
    EXPECT_TRUE(r.yarn);
    EXPECT_EQ(r.factor, 16.0);
    EXPECT_EQ(r.original_seq_len, 65536);
    EXPECT_EQ(r.beta_fast, 32.0);
    EXPECT_EQ(r.beta_slow, 1.0);
  }
  // V3.2: one rope for every layer, rope_theta with YaRN (factor 40 over 4096).
  const dsv4::RopeConfig v = ModelConfig::builtin("v3.2").rope_for_layer(0);
  EXPECT_EQ(v.theta, 10000.0);
  EXPECT_TRUE(v.yarn);
  EXPECT_EQ(v.factor, 40.0);
  EXPECT_EQ(v.original_seq_len, 4096);
}

// ---------------------------------------------------------------------------------------------
// config.json loading. The V4 text below has the keys (and values) of DeepSeek-V4-Flash's
// published config.json; MoE / hyper-connection keys are kept to show they are ignored.
const char* kV4FlashHf = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "head_dim": 512, "hidden_size": 4096, "index_head_dim": 128, "index_n_heads": 64,
  "index_topk": 512, "max_position_embeddings": 1048576, "moe_intermediate_size": 2048,
  "n_routed_experts": 256, "num_attention_heads": 64, "num_hidden_layers": 43,
  "num_key_value_heads": 1, "num_nextn_predict_layers": 1, "o_groups": 8, "o_lora_rank": 1024,
  "q_lora_rank": 1024, "qk_rope_head_dim": 64, "hc_mult": 4,
  "quantization_config": {"fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                   "original_max_position_embeddings": 65536, "type": "yarn"},
  "rope_theta": 10000, "sliding_window": 128, "compress_rope_theta": 160000,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                      128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                      4, 128, 4, 128, 4, 0]
})";

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("dsv4_config_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
    return (path_ / name).string();
  }
  std::string dir() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

TEST(ConfigJson, LoadsV4FlashConfigFromDirectoryAndFile) {
  TempDir tmp;
  const std::string file = tmp.write("config.json", kV4FlashHf);
  for (const std::string& path : {tmp.dir(), file}) {
    const ModelConfig c = ModelConfig::from_json_file(path);
    EXPECT_EQ(c.name, path);
    EXPECT_EQ(c.family, "v4");
    EXPECT_EQ(c.dim, 4096);
    EXPECT_EQ(c.n_heads, 64);
    EXPECT_EQ(c.head_dim, 512);
    EXPECT_EQ(c.window_size, 128);
    EXPECT_EQ(c.o_groups, 8);
    EXPECT_EQ(c.n_layers(), 44);
    EXPECT_EQ(c.n_mtp_layers, 1);
    EXPECT_EQ(c.compress_ratios, ModelConfig::builtin("v4-flash").compress_ratios);
    EXPECT_EQ(c.rope_factor, 16.0);
    EXPECT_EQ(c.original_seq_len, 65536);
    EXPECT_EQ(c.compress_rope_theta, 160000.0);
    EXPECT_EQ(c.max_position, 1048576);
    EXPECT_EQ(c.norm_eps, 1e-6);
  }
  const std::string text = dsv4::describe(ModelConfig::from_json_file(file));
  EXPECT_NE(text.find("21 C4A"), std::string::npos) << text;
  EXPECT_NE(text.find("20 C128A"), std::string::npos) << text;
  EXPECT_NE(text.find("3 SWA"), std::string::npos) << text;
  EXPECT_NE(text.find("theta 160000, YaRN factor 16"), std::string::npos) << text;
}

TEST(ConfigJson, InferenceStyleKeysGiveTheSameConfig) {
  // The official inference/config.json (ModelArgs) spelling of a tiny V4 model.
  const char* json = R"({"dim": 256, "n_heads": 16, "n_layers": 4, "q_lora_rank": 128,
    "head_dim": 512, "rope_head_dim": 64, "norm_eps": 1e-6, "o_groups": 4, "o_lora_rank": 64,
    "window_size": 16, "compress_ratios": [0, 4, 128, 4], "compress_rope_theta": 160000.0,
    "original_seq_len": 65536, "rope_theta": 10000.0, "rope_factor": 16, "beta_fast": 32,
    "beta_slow": 1, "index_n_heads": 4, "index_head_dim": 128, "index_topk": 16,
    "max_seq_len": 65536})";
  const ModelConfig c = ModelConfig::from_json_string(json, "inference");
  const ModelConfig t = ModelConfig::builtin("tiny");
  EXPECT_EQ(c.dim, t.dim);
  EXPECT_EQ(c.n_heads, t.n_heads);
  EXPECT_EQ(c.window_size, t.window_size);
  EXPECT_EQ(c.compress_ratios, t.compress_ratios);
  EXPECT_EQ(c.o_lora_rank, t.o_lora_rank);
  EXPECT_EQ(c.index_topk, t.index_topk);
  EXPECT_EQ(c.rope_factor, 16.0);
  EXPECT_EQ(c.original_seq_len, 65536);
  EXPECT_EQ(c.max_position, 65536);
  EXPECT_TRUE(c.rope_for_layer(1).yarn);
  // Without any YaRN key, no YaRN (original_seq_len 0).
  const ModelConfig plain = ModelConfig::from_json_string(
      R"({"dim": 256, "n_heads": 16, "o_groups": 4, "compress_ratios": [4]})", "plain");
  EXPECT_EQ(plain.original_seq_len, 0);
  EXPECT_FALSE(plain.rope_for_layer(0).yarn);
}

TEST(ConfigJson, LoadsV32ConfigWithLatentHeadDim) {
  TempDir tmp;
  const std::string file = tmp.write("config.json", R"({
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128,
    "num_nextn_predict_layers": 1, "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"}})");
  const ModelConfig c = ModelConfig::from_json_file(tmp.dir());
  EXPECT_EQ(c.family, "v3.2");
  EXPECT_EQ(c.head_dim, 576);   // kv_lora_rank + qk_rope_head_dim
  EXPECT_EQ(c.v_head_dim, 512);  // kv_lora_rank
  EXPECT_EQ(c.n_heads, 128);
  EXPECT_EQ(c.n_layers(), 62);
  EXPECT_EQ(c.n_mtp_layers, 1);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.window_size, 0);
  const auto rope = c.rope_for_layer(5);
  EXPECT_TRUE(rope.yarn);
  EXPECT_EQ(rope.factor, 40.0);
  EXPECT_EQ(rope.original_seq_len, 4096);
  EXPECT_EQ(rope.theta, 10000.0);
  EXPECT_NE(dsv4::describe(c).find("no sliding window"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Invalid configs: each edit of the valid tiny JSON below must be rejected with an error that
// names the field, what was expected and what was found.
struct InvalidCase {
  const char* label;
  std::string json;
  std::vector<std::string> needles;
};

std::string tiny_json(const std::string& replace_key = "", const std::string& value = "") {
  std::vector<std::pair<std::string, std::string>> kv = {
      {"hidden_size", "256"},  {"num_attention_heads", "16"},       {"head_dim", "512"},
      {"qk_rope_head_dim", "64"}, {"q_lora_rank", "128"},          {"o_groups", "4"},
      {"o_lora_rank", "64"},   {"sliding_window", "16"},           {"index_n_heads", "4"},
      {"index_head_dim", "128"}, {"index_topk", "16"},             {"compress_ratios", "[0, 4, 128, 4]"},
      {"num_hidden_layers", "4"}, {"model_type", "\"deepseek_v4\""}};
  std::string s = "{";
  for (const auto& [k, v] : kv) {
    if (s.size() > 1) s.append(", ");
    s.append("\"").append(k).append("\": ").append(k == replace_key ? value : v);
  }
  return s.append("}");
}

class InvalidConfigTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidConfigTest, RejectedWithFieldExpectedAndActual) {
  const InvalidCase& c = GetParam();
  const std::string err = error_of([&] { ModelConfig::from_json_string(c.json, "bad"); });
  for (const auto& needle : c.needles)
    EXPECT_NE(err.find(needle), std::string::npos) << c.label << ": '" << needle << "' not in: " << err;
}

INSTANTIATE_TEST_SUITE_P(
    Fields, InvalidConfigTest,
    ::testing::Values(
        InvalidCase{"heads129", tiny_json("num_attention_heads", "129"), {"n_heads", "1..128", "129"}},
        InvalidCase{"heads0", tiny_json("num_attention_heads", "0"), {"n_heads", "got 0"}},
        InvalidCase{"headdim256", tiny_json("head_dim", "256"), {"head_dim", "512 or 576", "256"}},
        InvalidCase{"ratio8", tiny_json("compress_ratios", "[0, 4, 8, 4]"),
                    {"compress_ratios[2]", "0, 4 or 128", "got 8"}},
        InvalidCase{"window0", tiny_json("sliding_window", "0"), {"window_size", "> 0", "got 0"}},
        InvalidCase{"windowneg", tiny_json("sliding_window", "-5"), {"window_size", "got -5"}},
        InvalidCase{"groups3", tiny_json("o_groups", "3"), {"o_groups", "divisor", "got 3"}},
        InvalidCase{"qlora0", tiny_json("q_lora_rank", "0"), {"q_lora_rank", "got 0"}},
        InvalidCase{"olora0", tiny_json("o_lora_rank", "-1"), {"o_lora_rank", "got -1"}},
        InvalidCase{"topk0", tiny_json("index_topk", "0"), {"index_topk", "got 0"}},
        InvalidCase{"layers", tiny_json("num_hidden_layers", "7"), {"compress_ratios.size()", "got 4"}},
        InvalidCase{"emptyratios", tiny_json("compress_ratios", "[]"), {"compress_ratios"}},
        InvalidCase{"ratio_type", tiny_json("compress_ratios", "\"4\""), {"compress_ratios"}},
        InvalidCase{"heads_type", tiny_json("num_attention_heads", "\"sixteen\""),
                    {"num_attention_heads"}},
        InvalidCase{"no_ratios_v4", R"({"model_type": "deepseek_v4", "hidden_size": 256})",
                    {"compress_ratios"}},
        InvalidCase{"rope_type", R"({"compress_ratios": [0], "rope_scaling": {"type": "linear"}})",
                    {"rope_scaling.type", "linear"}},
        InvalidCase{"bad_json", "{\"hidden_size\": 4096,", {"invalid JSON"}},
        InvalidCase{"not_object", "[1, 2]", {"JSON object"}}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(ConfigValidate, ProgrammaticEditsAreRejected) {
  ModelConfig c = ModelConfig::builtin("tiny");
  c.n_heads = 256;
  EXPECT_NE(error_of([&] { c.validate(); }).find("n_heads"), std::string::npos);
  c = ModelConfig::builtin("v3.2");
  c.compress_ratios[3] = 4;  // v3.2 has no compressed layers
  EXPECT_NE(error_of([&] { c.validate(); }).find("compress_ratios[3]"), std::string::npos);
  c = ModelConfig::builtin("v4-flash");
  c.head_dim = 576;  // v4 is 512
  EXPECT_NE(error_of([&] { c.validate(); }).find("head_dim"), std::string::npos);
}

TEST(ConfigJson, MissingFileIsAClearError) {
  TempDir tmp;
  const std::string err = error_of([&] { ModelConfig::from_json_file(tmp.dir()); });
  EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
  EXPECT_NE(err.find("config.json"), std::string::npos) << err;
}

}  // namespace
