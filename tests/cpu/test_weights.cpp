// AttentionWeights: the official checkpoint names and shapes (written out here independently),
// tiny checkpoints saved and loaded back bit-exactly, fp8 block quantization against a formula
// written here, and the documented errors for missing / mis-shaped / mis-typed tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dsv4/config.h"
#include "dsv4/safetensors.h"
#include "dsv4/weights.h"
#include "weights_test_support.h"

namespace {

namespace fs = std::filesystem;
using dsv4::AttentionWeights;
using dsv4::DType;
using dsv4::HostTensor;
using dsv4::ModelConfig;
using dsv4_test::expect_error;
using dsv4_test::TempDir;
using Shape = std::vector<int64_t>;

constexpr uint64_t kSeed = 20240607;

// A checkpoint directory: config.json + model.safetensors holding `tensors`.
void write_checkpoint(const std::string& dir, const ModelConfig& cfg,
                      const dsv4::TensorMap& tensors) {
  dsv4_test::write_config_json(dir, cfg);
  dsv4::write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors,
                          {{"format", "pt"}});
}

std::vector<AttentionWeights> all_layers(const ModelConfig& cfg, bool fp8, uint64_t seed = kSeed) {
  std::vector<AttentionWeights> layers;
  for (int l = 0; l < cfg.n_layers(); ++l)
    layers.push_back(dsv4::random_attention_weights(cfg, l, seed, fp8));
  return layers;
}

dsv4::TensorMap tensors_of(const ModelConfig& cfg, const std::vector<AttentionWeights>& layers) {
  dsv4::TensorMap m;
  for (const auto& w : layers) dsv4::add_attention_tensors(w, cfg, m);
  return m;
}

// Every tensor of the struct, by field (listed here, not taken from the library's own table).
std::vector<std::pair<std::string, const HostTensor*>> fields(const AttentionWeights& w) {
  std::vector<std::pair<std::string, const HostTensor*>> f = {
      {"wq_a", &w.wq_a.value},       {"wq_a.scale", &w.wq_a.scale}, {"q_norm", &w.q_norm},
      {"wq_b", &w.wq_b.value},       {"wq_b.scale", &w.wq_b.scale}, {"wkv", &w.wkv.value},
      {"wkv.scale", &w.wkv.scale},   {"kv_norm", &w.kv_norm},       {"wo_a", &w.wo_a.value},
      {"wo_a.scale", &w.wo_a.scale}, {"wo_b", &w.wo_b.value},       {"wo_b.scale", &w.wo_b.scale},
      {"attn_sink", &w.attn_sink}};
  auto add_compressor = [&](const std::string& p, const dsv4::CompressorWeights& c) {
    f.push_back({p + "wkv", &c.wkv.value});
    f.push_back({p + "wkv.scale", &c.wkv.scale});
    f.push_back({p + "wgate", &c.wgate.value});
    f.push_back({p + "wgate.scale", &c.wgate.scale});
    f.push_back({p + "ape", &c.ape});
    f.push_back({p + "norm", &c.norm});
  };
  if (w.compressor) add_compressor("compressor.", *w.compressor);
  if (w.indexer) {
    f.push_back({"indexer.wq_b", &w.indexer->wq_b.value});
    f.push_back({"indexer.wq_b.scale", &w.indexer->wq_b.scale});
    f.push_back({"indexer.weights_proj", &w.indexer->weights_proj.value});
    f.push_back({"indexer.weights_proj.scale", &w.indexer->weights_proj.scale});
    add_compressor("indexer.compressor.", w.indexer->compressor);
  }
  return f;
}

// Bit-exact equality of two weight sets: same optional parts, same fields, same dtype, shape and
// bytes (undefined scales on both sides for non-fp8 weights).
void expect_identical(const AttentionWeights& a, const AttentionWeights& b) {
  EXPECT_EQ(a.layer, b.layer);
  EXPECT_EQ(a.compress_ratio, b.compress_ratio);
  ASSERT_EQ(a.compressor.has_value(), b.compressor.has_value());
  ASSERT_EQ(a.indexer.has_value(), b.indexer.has_value());
  const auto fa = fields(a), fb = fields(b);
  ASSERT_EQ(fa.size(), fb.size());
  for (size_t i = 0; i < fa.size(); ++i) {
    SCOPED_TRACE("layer " + std::to_string(a.layer) + " " + fa[i].first);
    const HostTensor& x = *fa[i].second;
    const HostTensor& y = *fb[i].second;
    ASSERT_EQ(x.view().defined(), y.view().defined());
    if (!x.view().defined()) continue;
    EXPECT_EQ(x.dtype(), y.dtype());
    ASSERT_EQ(x.shape(), y.shape());
    EXPECT_EQ(std::memcmp(x.data<uint8_t>(), y.data<uint8_t>(), x.nbytes()), 0);
  }
}

struct Expected {
  Shape shape;
  const char* dtype;
};

// The official names, shapes and dtypes of a tiny layer ("tiny": dim 256, H 16, D 512, q_lora 128,
// G 4, o_lora 64, indexer 4 heads x 128), fp8 weights with ue8m0 scales of 128x128 blocks.
std::map<std::string, Expected> expected_tiny_layer(const std::string& p, int ratio) {
  std::map<std::string, Expected> m = {{p + "wq_a.weight", {{128, 256}, "F8_E4M3"}},
                                       {p + "wq_a.scale", {{1, 2}, "F8_E8M0"}},
                                       {p + "q_norm.weight", {{128}, "BF16"}},
                                       {p + "wq_b.weight", {{8192, 128}, "F8_E4M3"}},
                                       {p + "wq_b.scale", {{64, 1}, "F8_E8M0"}},
                                       {p + "wkv.weight", {{512, 256}, "F8_E4M3"}},
                                       {p + "wkv.scale", {{4, 2}, "F8_E8M0"}},
                                       {p + "kv_norm.weight", {{512}, "BF16"}},
                                       {p + "wo_a.weight", {{256, 2048}, "F8_E4M3"}},
                                       {p + "wo_a.scale", {{2, 16}, "F8_E8M0"}},
                                       {p + "wo_b.weight", {{256, 256}, "F8_E4M3"}},
                                       {p + "wo_b.scale", {{2, 2}, "F8_E8M0"}},
                                       {p + "attn_sink", {{16}, "F32"}}};
  if (ratio > 0) {
    const int64_t width = ratio == 4 ? 1024 : 512;
    m[p + "compressor.wkv.weight"] = {{width, 256}, "BF16"};
    m[p + "compressor.wgate.weight"] = {{width, 256}, "BF16"};
    m[p + "compressor.ape"] = {{ratio, width}, "F32"};
    m[p + "compressor.norm.weight"] = {{512}, "BF16"};
  }
  if (ratio == 4) {
    m[p + "indexer.wq_b.weight"] = {{512, 128}, "F8_E4M3"};
    m[p + "indexer.wq_b.scale"] = {{4, 1}, "F8_E8M0"};
    m[p + "indexer.weights_proj.weight"] = {{4, 256}, "BF16"};
    m[p + "indexer.compressor.wkv.weight"] = {{256, 256}, "BF16"};
    m[p + "indexer.compressor.wgate.weight"] = {{256, 256}, "BF16"};
    m[p + "indexer.compressor.ape"] = {{4, 256}, "F32"};
    m[p + "indexer.compressor.norm.weight"] = {{128}, "BF16"};
  }
  return m;
}

class TinyWeights : public ::testing::Test {
 protected:
  ModelConfig cfg_ = ModelConfig::builtin("tiny");
  TempDir dir_;
};

// ---- names, shapes, round trip --------------------------------------------------------------

TEST_F(TinyWeights, CheckpointHoldsTheOfficialNamesShapesAndDtypes) {
  ASSERT_EQ(cfg_.compress_ratios, (std::vector<int>{0, 4, 128, 4}));
  write_checkpoint(dir_.str(), cfg_, tensors_of(cfg_, all_layers(cfg_, true)));
  const auto ckpt = dsv4::Checkpoint::open(dir_.str());
  std::map<std::string, Expected> expected;
  for (int l = 0; l < cfg_.n_layers(); ++l)
    expected.merge(
        expected_tiny_layer("layers." + std::to_string(l) + ".attn.", cfg_.compress_ratios[l]));
  std::vector<std::string> names;
  for (const auto& [name, e] : expected) names.push_back(name);
  EXPECT_EQ(ckpt.names(), names);
  for (const auto& [name, e] : expected) {
    if (!ckpt.contains(name)) continue;
    EXPECT_EQ(ckpt.entry(name).shape, e.shape) << name;
    EXPECT_EQ(dsv4::safetensors_dtype_name(ckpt.entry(name).dtype), e.dtype) << name;
  }
  // attention_tensor_names lists the same names for one layer.
  const auto w1 = dsv4::random_attention_weights(cfg_, 1, kSeed, true);
  std::vector<std::string> layer1;
  for (const auto& [name, e] : expected_tiny_layer("layers.1.attn.", 4)) layer1.push_back(name);
  EXPECT_EQ(dsv4::attention_tensor_names(w1, cfg_), layer1);
  // In memory, wo_a is split per group: [G, o_lora, H*D/G].
  const auto w = dsv4::random_attention_weights(cfg_, 0, kSeed, true);
  EXPECT_EQ(w.wo_a.value.shape(), (Shape{4, 64, 2048}));
  EXPECT_EQ(dsv4::attention_tensor_prefix(cfg_, 3), "layers.3.attn.");
}

class TinyRoundTrip : public TinyWeights, public ::testing::WithParamInterface<bool> {};

TEST_P(TinyRoundTrip, EveryLayerLoadsBackBitExactly) {
  const bool fp8 = GetParam();
  const auto layers = all_layers(cfg_, fp8);
  dsv4_test::write_config_json(dir_.str(), cfg_);
  dsv4::save_attention_weights(dir_.file("model.safetensors"), cfg_, layers);

  const ModelConfig loaded_cfg = ModelConfig::from_json_file(dir_.str());
  EXPECT_EQ(loaded_cfg.compress_ratios, cfg_.compress_ratios);
  const auto ckpt = dsv4::Checkpoint::open(dir_.str());
  EXPECT_EQ(ckpt.files().front().metadata().at("format"), "pt");
  for (int l = 0; l < cfg_.n_layers(); ++l) {
    const AttentionWeights back = dsv4::load_attention_weights(ckpt, loaded_cfg, l);
    expect_identical(layers[l], back);
    EXPECT_EQ(back.wq_a.value.dtype(), fp8 ? DType::fp8_e4m3 : DType::bf16);
    EXPECT_EQ(back.wq_a.quantized(), fp8);
  }
}

// The same through an in-memory TensorMap (the TensorSource path a Python state dict takes).
TEST_P(TinyRoundTrip, EveryLayerLoadsBackFromATensorMap) {
  const auto layers = all_layers(cfg_, GetParam());
  const dsv4::TensorMap tensors = tensors_of(cfg_, layers);
  for (int l = 0; l < cfg_.n_layers(); ++l)
    expect_identical(layers[l], dsv4::load_attention_weights(tensors, cfg_, l));
}

INSTANTIATE_TEST_SUITE_P(Fp8AndBf16, TinyRoundTrip, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "fp8" : "bf16"; });

TEST_F(TinyWeights, ShardedCheckpointWithIndex) {
  const auto layers = all_layers(cfg_, true);
  dsv4_test::write_config_json(dir_.str(), cfg_);
  nlohmann::json weight_map = nlohmann::json::object();
  for (int shard = 0; shard < 2; ++shard) {
    const std::vector<AttentionWeights> part(layers.begin() + 2 * shard,
                                             layers.begin() + 2 * shard + 2);
    const std::string file = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
    const auto m = tensors_of(cfg_, part);
    dsv4::write_safetensors(dir_.file(file), m);
    for (const auto& [name, t] : m) weight_map[name] = file;
  }
  std::ofstream(dir_.file("model.safetensors.index.json"))
      << nlohmann::json{{"weight_map", weight_map}}.dump();
  const auto ckpt = dsv4::Checkpoint::open(dir_.str());
  EXPECT_EQ(ckpt.files().size(), 2u);
  for (int l = 0; l < cfg_.n_layers(); ++l)
    expect_identical(layers[l], dsv4::load_attention_weights(ckpt, cfg_, l));
}

// The transformers spelling: model.layers.{i}.self_attn.* and *.weight_scale_inv.
TEST_F(TinyWeights, HuggingFaceSpellingLoads) {
  const auto layers = all_layers(cfg_, true);
  dsv4::TensorMap renamed;
  for (const auto& [name, t] : tensors_of(cfg_, layers)) {
    std::string n = "model." + name;
    n.replace(n.find(".attn."), 6, ".self_attn.");
    if (n.size() > 6 && n.compare(n.size() - 6, 6, ".scale") == 0)
      n = n.substr(0, n.size() - 6) + ".weight_scale_inv";
    renamed[n] = t;
  }
  ASSERT_TRUE(renamed.count("model.layers.1.self_attn.indexer.wq_b.weight_scale_inv"));
  write_checkpoint(dir_.str(), cfg_, renamed);
  const auto ckpt = dsv4::Checkpoint::open(dir_.str());
  for (int l = 0; l < cfg_.n_layers(); ++l)
    expect_identical(layers[l], dsv4::load_attention_weights(ckpt, cfg_, l));
}

// MTP blocks (the trailing n_mtp_layers entries of compress_ratios) are stored as mtp.{j}.attn.*.
TEST_F(TinyWeights, MtpLayerNaming) {
  cfg_.n_mtp_layers = 1;
  EXPECT_EQ(dsv4::attention_tensor_prefix(cfg_, 2), "layers.2.attn.");
  EXPECT_EQ(dsv4::attention_tensor_prefix(cfg_, 3), "mtp.0.attn.");
  const auto layers = all_layers(cfg_, true);
  write_checkpoint(dir_.str(), cfg_, tensors_of(cfg_, layers));
  const auto ckpt = dsv4::Checkpoint::open(dir_.str());
  EXPECT_TRUE(ckpt.contains("mtp.0.attn.indexer.compressor.ape"));
  EXPECT_FALSE(ckpt.contains("layers.3.attn.wq_a.weight"));
  expect_identical(layers[3], dsv4::load_attention_weights(ckpt, cfg_, 3));
}

// fp32 block scales (the other format the official convert.py may emit) load and dequantize to
// the same weights as ue8m0 scales.
TEST_F(TinyWeights, Fp32ScalesLoad) {
  const auto layers = all_layers(cfg_, true);
  auto tensors = tensors_of(cfg_, layers);
  for (auto& [name, t] : tensors) {
    if (name.size() < 6 || name.compare(name.size() - 6, 6, ".scale") != 0) continue;
    HostTensor f(DType::fp32, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i)
      f.data<float>()[i] = std::ldexp(1.0f, static_cast<int>(t.data<uint8_t>()[i]) - 127);
    t = f;
  }
  write_checkpoint(dir_.str(), cfg_, tensors);
  const auto ckpt = dsv4::Checkpoint::open(dir_.str());
  const auto back = dsv4::load_attention_weights(ckpt, cfg_, 1);
  EXPECT_EQ(back.wq_b.scale.dtype(), DType::fp32);
  const HostTensor a = dsv4::dequantize_weight(layers[1].wq_b);
  const HostTensor b = dsv4::dequantize_weight(back.wq_b);
  EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), a.nbytes()), 0);
}

// wo_a: per-group scales in memory, the stacked [G*o_lora, K] grid in the checkpoint. The loaded
// weight dequantizes to exactly the checkpoint matrix, dequantized here from the raw bytes with the
// checkpoint's own grid (tiny: o_lora 64, so groups 2g and 2g+1 share checkpoint block row g).
TEST_F(TinyWeights, WoAScalesSplitPerGroup) {
  const auto layers = all_layers(cfg_, true);
  EXPECT_EQ(layers[0].wo_a.scale.shape(), (Shape{4, 1, 16}));
  write_checkpoint(dir_.str(), cfg_, tensors_of(cfg_, layers));
  const auto ckpt = dsv4::Checkpoint::open(dir_.str());
  const HostTensor value = ckpt.read("layers.0.attn.wo_a.weight");  // [256, 2048]
  const HostTensor scale = ckpt.read("layers.0.attn.wo_a.scale");   // [2, 16]
  ASSERT_EQ(scale.shape(), (Shape{2, 16}));
  const HostTensor loaded =
      dsv4::dequantize_weight(dsv4::load_attention_weights(ckpt, cfg_, 0).wo_a);
  ASSERT_EQ(loaded.shape(), (Shape{4, 64, 2048}));
  for (int64_t r = 0; r < 256; ++r)
    for (int64_t c = 0; c < 2048; ++c) {
      const double want = std::ldexp(
          static_cast<double>(dsv4::fp8_e4m3_to_float(value.data<uint8_t>()[r * 2048 + c])),
          scale.data<uint8_t>()[(r / 128) * 16 + c / 128] - 127);
      ASSERT_EQ(static_cast<double>(loaded.data<float>()[r * 2048 + c]), want) << r << "," << c;
    }
}

TEST_F(TinyWeights, WoAScalesTheCheckpointCannotHold) {
  // Groups 0 and 1 share checkpoint scale row 0: different per-group scales cannot be saved.
  auto w = dsv4::random_attention_weights(cfg_, 0, kSeed, true);
  w.wo_a.scale.data<uint8_t>()[16] ^= 1;  // group 1, column block 0
  dsv4::TensorMap out;
  expect_error([&] { dsv4::add_attention_tensors(w, cfg_, out); },
               {"wo_a.scale", "different scales"});
  // o_lora 192: per-group blocks straddle the checkpoint's 128-row blocks.
  ModelConfig odd = cfg_;
  odd.o_lora_rank = 192;
  expect_error([&] { dsv4::random_attention_weights(odd, 0, kSeed, true); },
               {"wo_a.scale", "straddle"});
  EXPECT_NO_THROW(dsv4::random_attention_weights(odd, 0, kSeed, false));  // bf16: no scales
}

// ---- load errors ----------------------------------------------------------------------------

class TinyLoadErrors : public TinyWeights {
 protected:
  void SetUp() override { tensors_ = tensors_of(cfg_, all_layers(cfg_, true)); }
  // Writes the (modified) tensors and expects loading `layer` to fail naming the fragments.
  void expect_load_error(int layer, const std::vector<std::string>& fragments) {
    write_checkpoint(dir_.str(), cfg_, tensors_);
    const auto ckpt = dsv4::Checkpoint::open(dir_.str());
    expect_error([&] { dsv4::load_attention_weights(ckpt, cfg_, layer); }, fragments);
  }
  dsv4::TensorMap tensors_;
};

TEST_F(TinyLoadErrors, MissingTensor) {
  tensors_.erase("layers.1.attn.compressor.ape");
  expect_load_error(1, {"load_attention_weights", "missing tensor 'layers.1.attn.compressor.ape'",
                        "[4, 1024]", dir_.str()});
  // Other layers do not need it.
  const auto ckpt = dsv4::Checkpoint::open(dir_.str());
  EXPECT_NO_THROW(dsv4::load_attention_weights(ckpt, cfg_, 0));
  // A TensorMap source reports the same tensor, and where it looked.
  expect_error([&] { dsv4::load_attention_weights(tensors_, cfg_, 1); },
               {"missing tensor 'layers.1.attn.compressor.ape'", "in the tensor map"});
}

TEST_F(TinyLoadErrors, MissingIndexerTensor) {
  tensors_.erase("layers.3.attn.indexer.weights_proj.weight");
  expect_load_error(3, {"missing tensor 'layers.3.attn.indexer.weights_proj.weight'", "[4, 256]"});
}

TEST_F(TinyLoadErrors, MisShapedTensor) {
  tensors_["layers.0.attn.wkv.weight"] = HostTensor::zeros(DType::fp8_e4m3, {511, 256});
  expect_load_error(0, {"layers.0.attn.wkv.weight shape", "expected [512, 256]", "got [511, 256]"});
}

TEST_F(TinyLoadErrors, WoAStoredPerGroupIsMisShaped) {
  // The checkpoint stores wo_a as a 2-d matrix; a 3-d tensor is not the official layout.
  tensors_["layers.0.attn.wo_a.weight"] = HostTensor::zeros(DType::fp8_e4m3, {4, 64, 2048});
  expect_load_error(
      0, {"layers.0.attn.wo_a.weight shape", "expected [256, 2048]", "got [4, 64, 2048]"});
}

TEST_F(TinyLoadErrors, WrongDTypes) {
  tensors_["layers.0.attn.attn_sink"] = HostTensor::zeros(DType::bf16, {16});
  expect_load_error(0, {"layers.0.attn.attn_sink dtype", "expected F32", "got BF16"});
  tensors_ = tensors_of(cfg_, all_layers(cfg_, true));
  tensors_["layers.0.attn.q_norm.weight"] = HostTensor::zeros(DType::int32, {128});
  expect_load_error(0, {"layers.0.attn.q_norm.weight dtype", "BF16 or F32", "got I32"});
  tensors_ = tensors_of(cfg_, all_layers(cfg_, true));
  tensors_["layers.0.attn.wo_b.weight"] = HostTensor::zeros(DType::int64, {256, 256});
  expect_load_error(0, {"layers.0.attn.wo_b.weight dtype", "got I64"});
}

TEST_F(TinyLoadErrors, MissingScaleOfFp8Weight) {
  tensors_.erase("layers.0.attn.wq_a.scale");
  expect_load_error(0, {"missing tensor 'layers.0.attn.wq_a.scale'", "[1, 2]",
                        "fp8 weight layers.0.attn.wq_a.weight"});
}

TEST_F(TinyLoadErrors, MisShapedScale) {
  tensors_["layers.0.attn.wq_b.scale"] = HostTensor::zeros(DType::ue8m0, {64, 2});
  expect_load_error(0, {"layers.0.attn.wq_b.scale shape", "expected [64, 1]", "got [64, 2]"});
  tensors_ = tensors_of(cfg_, all_layers(cfg_, true));
  tensors_["layers.0.attn.wq_b.scale"] = HostTensor::zeros(DType::bf16, {64, 1});
  expect_load_error(0, {"layers.0.attn.wq_b.scale dtype", "F8_E8M0 or F32", "got BF16"});
}

TEST_F(TinyLoadErrors, ScaleOnBf16Weight) {
  tensors_ = tensors_of(cfg_, all_layers(cfg_, false));
  tensors_["layers.2.attn.wkv.scale"] = HostTensor::zeros(DType::ue8m0, {4, 2});
  expect_load_error(2, {"layers.2.attn.wkv.scale", "present but", "is BF16"});
}

TEST_F(TinyWeights, ConfigAndLayerErrors) {
  write_checkpoint(dir_.str(), cfg_, tensors_of(cfg_, all_layers(cfg_, false)));
  const auto ckpt = dsv4::Checkpoint::open(dir_.str());
  expect_error([&] { dsv4::load_attention_weights(ckpt, cfg_, 4); }, {"layer", "0..3", "got 4"});
  expect_error([&] { dsv4::load_attention_weights(ckpt, cfg_, -1); }, {"layer", "got -1"});
  expect_error(
      [&] { dsv4::random_attention_weights(ModelConfig::builtin("tiny-v3.2"), 0, 1, true); },
      {"v3.2", "only DeepSeek-V4"});
  // A checkpoint whose layer 1 has no compressor cannot serve a config where layer 1 is C4A.
  ModelConfig swa_only = cfg_;
  swa_only.compress_ratios = {0, 0, 0, 0};
  write_checkpoint(dir_.str(), swa_only, tensors_of(swa_only, all_layers(swa_only, false)));
  const auto ckpt2 = dsv4::Checkpoint::open(dir_.str());
  expect_error([&] { dsv4::load_attention_weights(ckpt2, cfg_, 1); },
               {"missing tensor 'layers.1.attn.compressor.wkv.weight'"});
}

// ---- validation -----------------------------------------------------------------------------

TEST_F(TinyWeights, ValidateCatchesInconsistentStructs) {
  auto w = dsv4::random_attention_weights(cfg_, 1, kSeed, true);
  EXPECT_NO_THROW(dsv4::validate_attention_weights(w, cfg_));
  auto no_indexer = w;
  no_indexer.indexer.reset();
  expect_error([&] { dsv4::validate_attention_weights(no_indexer, cfg_); },
               {"indexer weights missing"});
  auto relabeled = w;
  relabeled.layer = 2;  // ratio 128
  expect_error([&] { dsv4::validate_attention_weights(relabeled, cfg_); },
               {"compress_ratio of layer 2", "expected 128", "got 4"});
  auto no_scale = w;
  no_scale.wkv.scale = HostTensor();
  expect_error([&] { dsv4::validate_attention_weights(no_scale, cfg_); },
               {"layers.1.attn.wkv.scale", "missing"});
  auto bad_shape = w;
  bad_shape.kv_norm = HostTensor(DType::bf16, {256});
  expect_error([&] { dsv4::validate_attention_weights(bad_shape, cfg_); },
               {"layers.1.attn.kv_norm.weight shape", "expected [512]", "got [256]"});
  // Saving validates first: nothing half-written.
  dsv4::TensorMap out;
  expect_error([&] { dsv4::add_attention_tensors(bad_shape, cfg_, out); }, {"kv_norm"});
  EXPECT_TRUE(out.empty());
}

// ---- random generation ----------------------------------------------------------------------

TEST_F(TinyWeights, RandomIsDeterministicAndSeedDependent) {
  const auto a = dsv4::random_attention_weights(cfg_, 1, kSeed, true);
  expect_identical(a, dsv4::random_attention_weights(cfg_, 1, kSeed, true));
  // Another seed or another layer: different values in every tensor.
  const auto b = dsv4::random_attention_weights(cfg_, 1, kSeed + 1, true);
  const auto c = dsv4::random_attention_weights(cfg_, 3, kSeed, true);  // same ratio as layer 1
  const auto fa = fields(a), fb = fields(b), fc = fields(c);
  for (size_t i = 0; i < fa.size(); ++i) {
    if (!fa[i].second->view().defined() || fa[i].first.find("scale") != std::string::npos) continue;
    EXPECT_NE(std::memcmp(fa[i].second->data<uint8_t>(), fb[i].second->data<uint8_t>(),
                          fa[i].second->nbytes()),
              0)
        << fa[i].first;
    EXPECT_NE(std::memcmp(fa[i].second->data<uint8_t>(), fc[i].second->data<uint8_t>(),
                          fa[i].second->nbytes()),
              0)
        << fa[i].first;
  }
}

struct Moments {
  double mean = 0, std = 0;
};
Moments moments(const HostTensor& t) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s += t.get(i);
    s2 += static_cast<double>(t.get(i)) * t.get(i);
  }
  const double n = static_cast<double>(t.numel());
  return {s / n, std::sqrt(std::max(0.0, s2 / n - (s / n) * (s / n)))};
}

// Scales that keep activations O(1): N(0, 1/fan_in) linear weights (after fp8 rounding), norms
// near 1, ape N(0, 0.25). Tolerances: >= 32k samples, so the sample std is within ~1% of the true
// one; 10% leaves room for fp8 rounding (relative error <= 2^-4 per element, mean-zero).
TEST_F(TinyWeights, RandomScalesKeepActivationsOrderOne) {
  const auto w = dsv4::random_attention_weights(cfg_, 1, kSeed, true);
  const std::pair<const dsv4::Weight*, int64_t> linears[] = {
      {&w.wq_a, 256},         {&w.wq_b, 128}, {&w.wkv, 256},
      {&w.wo_a, 2048},        {&w.wo_b, 256}, {&w.compressor->wkv, 256},
      {&w.indexer->wq_b, 128}};
  for (const auto& [weight, fan_in] : linears) {
    const Moments m = moments(dsv4::dequantize_weight(*weight));
    EXPECT_NEAR(m.std * std::sqrt(static_cast<double>(fan_in)), 1.0, 0.1);
    EXPECT_NEAR(m.mean * std::sqrt(static_cast<double>(fan_in)), 0.0, 0.05);
  }
  const Moments qn = moments(w.q_norm), kn = moments(w.kv_norm), ape = moments(w.compressor->ape);
  EXPECT_NEAR(qn.mean, 1.0, 0.02);
  EXPECT_NEAR(kn.mean, 1.0, 0.02);
  EXPECT_NEAR(kn.std, 0.05, 0.01);
  EXPECT_NEAR(ape.std, 0.5, 0.05);

  // One projection of a unit-variance input: outputs have variance ~1 (tolerance: 512 outputs,
  // sample std within ~6%).
  std::mt19937 rng(5);
  std::normal_distribution<double> normal;
  std::vector<double> x(256);
  for (double& v : x) v = normal(rng);
  const HostTensor wkv = dsv4::dequantize_weight(w.wkv);
  double s2 = 0;
  for (int64_t r = 0; r < 512; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < 256; ++c) acc += wkv.get(r * 256 + c) * x[c];
    s2 += acc * acc;
  }
  EXPECT_NEAR(std::sqrt(s2 / 512), 1.0, 0.15);
}

// The real V4-Flash shapes (H 64, D 512) of a C4A layer, with the dtypes of the released
// checkpoint (F8_E4M3 projections with F8_E8M0 128x128 scales, BF16 norms / compressor /
// weights_proj, F32 ape and attn_sink).
TEST(RealShapes, V4FlashC4ALayer) {
  const ModelConfig cfg = ModelConfig::builtin("v4-flash");
  ASSERT_EQ(cfg.compress_ratios[2], 4);
  const auto w = dsv4::random_attention_weights(cfg, 2, kSeed, true);
  EXPECT_NO_THROW(dsv4::validate_attention_weights(w, cfg));
  EXPECT_EQ(w.wq_b.value.shape(), (Shape{64 * 512, 1024}));
  EXPECT_EQ(w.wq_b.scale.shape(), (Shape{256, 8}));
  EXPECT_EQ(w.wo_a.value.shape(), (Shape{8, 1024, 4096}));
  EXPECT_EQ(w.wo_a.scale.shape(), (Shape{8, 8, 32}));  // per group; [64, 32] in the checkpoint
  EXPECT_EQ(w.wo_b.value.shape(), (Shape{4096, 8192}));
  EXPECT_EQ(w.compressor->wkv.value.shape(), (Shape{1024, 4096}));
  EXPECT_EQ(w.compressor->ape.shape(), (Shape{4, 1024}));
  EXPECT_EQ(w.indexer->wq_b.value.shape(), (Shape{64 * 128, 1024}));
  EXPECT_EQ(w.indexer->compressor.ape.shape(), (Shape{4, 256}));
  EXPECT_EQ(w.attn_sink.shape(), (Shape{64}));
  EXPECT_EQ(w.wo_a.value.dtype(), DType::fp8_e4m3);
  EXPECT_EQ(w.wo_a.scale.dtype(), DType::ue8m0);
  EXPECT_EQ(w.indexer->wq_b.value.dtype(), DType::fp8_e4m3);
  EXPECT_EQ(w.indexer->weights_proj.value.dtype(), DType::bf16);
  EXPECT_EQ(w.compressor->wgate.value.dtype(), DType::bf16);
  EXPECT_EQ(w.kv_norm.dtype(), DType::bf16);
  EXPECT_EQ(w.compressor->ape.dtype(), DType::fp32);
  EXPECT_EQ(w.attn_sink.dtype(), DType::fp32);
}

// ---- fp8 block quantization -----------------------------------------------------------------

class QuantizeFp8 : public ::testing::TestWithParam<DType> {};

// Checked against the definition: scale 2^k with k = ceil(log2(max(amax/448, 1e-4))) per 128x128
// block of the 2-d matrix (edge blocks partial), values the nearest fp8 of w / 2^k, i.e. within
// half an fp8 step: 2^-4 relative for normal fp8 values, 2^-10 * 2^k absolute for subnormals.
TEST_P(QuantizeFp8, MatchesTheBlockFormula) {
  const DType scale_dtype = GetParam();
  const int64_t rows = 200, cols = 300;  // 2x3 blocks, the last row/column of blocks partial
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  HostTensor w(DType::fp32, {rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      // Blocks of very different magnitudes; block (1, 2) is all zero (floor scale 1e-4).
      const int64_t br = r / 128, bc = c / 128;
      const float mag =
          br == 1 && bc == 2 ? 0.0f : std::ldexp(1.0f, static_cast<int>(3 * bc - 4 * br));
      w.data<float>()[r * cols + c] = mag * normal(rng);
    }
  const dsv4::Weight q = dsv4::quantize_weight_fp8(w, scale_dtype);
  ASSERT_EQ(q.value.dtype(), DType::fp8_e4m3);
  ASSERT_EQ(q.value.shape(), (Shape{rows, cols}));
  ASSERT_EQ(q.scale.dtype(), scale_dtype);
  ASSERT_EQ(q.scale.shape(), (Shape{2, 3}));
  for (int64_t br = 0; br < 2; ++br)
    for (int64_t bc = 0; bc < 3; ++bc) {
      double amax = 0;
      for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r)
        for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c)
          amax = std::max(amax, std::fabs(static_cast<double>(w.data<float>()[r * cols + c])));
      const int k = static_cast<int>(std::ceil(std::log2(std::max(amax / 448.0, 1e-4))));
      const double scale = std::ldexp(1.0, k);
      const int64_t s = br * 3 + bc;
      if (scale_dtype == DType::ue8m0)
        EXPECT_EQ(q.scale.data<uint8_t>()[s], k + 127) << "block " << br << "," << bc;
      else
        EXPECT_EQ(q.scale.data<float>()[s], scale) << "block " << br << "," << bc;
      for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r)
        for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
          const double x = w.data<float>()[r * cols + c];
          const double got = q.value.get(r * cols + c) * scale;
          ASSERT_LE(std::fabs(got - x), std::max(std::fabs(x) * 0x1p-4, scale * 0x1p-10))
              << r << "," << c;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(ScaleDTypes, QuantizeFp8, ::testing::Values(DType::ue8m0, DType::fp32),
                         [](const auto& info) {
                           return std::string(dsv4::dtype_name(info.param));
                         });

// dequantize_weight: fp8 value times 2^(scale byte - 127) of its block, computed here element by
// element; a 3-d weight is a stack of matrices, each with its own grid; non-fp8 weights convert
// exactly.
TEST(DequantizeWeight, AppliesTheBlockScale) {
  std::mt19937 rng(3);
  dsv4::Weight w;
  w.value = HostTensor(DType::fp8_e4m3, {2, 130, 140});
  w.scale = HostTensor(DType::ue8m0, {2, 2, 2});
  for (int64_t i = 0; i < w.value.numel(); ++i) {
    uint8_t b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) == 0x7f) b = 0x10;  // no NaN patterns
    w.value.data<uint8_t>()[i] = b;
  }
  for (int64_t i = 0; i < 8; ++i) w.scale.data<uint8_t>()[i] = static_cast<uint8_t>(120 + 2 * i);
  const HostTensor d = dsv4::dequantize_weight(w);
  ASSERT_EQ(d.shape(), w.value.shape());
  ASSERT_EQ(d.dtype(), DType::fp32);
  for (int64_t m = 0; m < 2; ++m)
    for (int64_t r = 0; r < 130; ++r)
      for (int64_t c = 0; c < 140; ++c) {
        const int64_t i = (m * 130 + r) * 140 + c;
        const double v = dsv4::fp8_e4m3_to_float(w.value.data<uint8_t>()[i]);
        const int e = w.scale.data<uint8_t>()[(m * 2 + r / 128) * 2 + c / 128] - 127;
        ASSERT_EQ(static_cast<double>(d.data<float>()[i]), std::ldexp(v, e))
            << m << "," << r << "," << c;
      }

  dsv4::Weight plain;
  plain.value = HostTensor(DType::bf16, {2, 3});
  for (int64_t i = 0; i < 6; ++i) plain.value.set(i, 0.5f * static_cast<float>(i) - 1.0f);
  const HostTensor p = dsv4::dequantize_weight(plain);
  for (int64_t i = 0; i < 6; ++i)
    EXPECT_EQ(p.data<float>()[i], 0.5f * static_cast<float>(i) - 1.0f);
}

// A stack of matrices quantizes each matrix on its own: the same bytes as quantizing the slices.
TEST(QuantizeFp8Stack, EachMatrixHasItsOwnGrid) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  HostTensor w(DType::fp32, {3, 64, 200});
  for (int64_t i = 0; i < w.numel(); ++i)
    w.data<float>()[i] = normal(rng) * static_cast<float>(1 + i / (64 * 200)) * 10.0f;
  const dsv4::Weight q = dsv4::quantize_weight_fp8(w);
  ASSERT_EQ(q.scale.shape(), (Shape{3, 1, 2}));
  EXPECT_EQ(dsv4::weight_scale_shape({3, 64, 200}), (Shape{3, 1, 2}));
  for (int64_t m = 0; m < 3; ++m) {
    HostTensor slice(DType::fp32, {64, 200});
    std::memcpy(slice.data<float>(), w.data<float>() + m * 64 * 200, 64 * 200 * sizeof(float));
    const dsv4::Weight qs = dsv4::quantize_weight_fp8(slice);
    EXPECT_EQ(
        std::memcmp(qs.value.data<uint8_t>(), q.value.data<uint8_t>() + m * 64 * 200, 64 * 200), 0);
    EXPECT_EQ(std::memcmp(qs.scale.data<uint8_t>(), q.scale.data<uint8_t>() + m * 2, 2), 0);
  }
}

TEST(DequantizeWeight, RejectsInconsistentScales) {
  dsv4::Weight w;
  w.value = HostTensor::zeros(DType::fp8_e4m3, {256, 256});
  expect_error([&] { dsv4::dequantize_weight(w); }, {"without a scale"});
  w.scale = HostTensor::zeros(DType::ue8m0, {2, 1});
  expect_error([&] { dsv4::dequantize_weight(w); }, {"scale.shape", "[2, 2]", "[2, 1]"});
  w.value = HostTensor::zeros(DType::fp8_e4m3, {256});
  w.scale = HostTensor::zeros(DType::ue8m0, {2});
  expect_error([&] { dsv4::dequantize_weight(w); }, {"value.ndim", ">= 2"});
  dsv4::Weight b;
  b.value = HostTensor::zeros(DType::bf16, {4, 4});
  b.scale = HostTensor::zeros(DType::ue8m0, {1, 1});
  expect_error([&] { dsv4::dequantize_weight(b); }, {"bf16 with a scale"});
}

}  // namespace
