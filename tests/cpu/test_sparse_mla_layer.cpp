// dsv4::SparseMlaAttention (DeepSeek-V3.2) on tiny-v3.2: agreement with the float64 reference
// layer, the layer's consistency properties (chunking, prefill vs decode, batch composition), bad
// input, and its weights' checkpoint names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/sparse_mla_layer.h"
#include "dsv4/sparse_mla_reference.h"
#include "dsv4/sparse_mla_weights.h"
#include "layer_test_support.h"

namespace {

using dsv4::BatchPlan;
using dsv4::DType;
using dsv4::HostTensor;
using dsv4::ModelConfig;
using dsv4::RequestStep;
using dsv4::SparseMlaAttention;
using dsv4_test::row_rel_err;
using Outputs = dsv4_test::LayerOutputs;

constexpr uint64_t kSeed = 17;

class SparseMlaLayerTest : public ::testing::Test {
 protected:
  ModelConfig cfg = ModelConfig::builtin("tiny-v3.2");

  SparseMlaAttention make_layer(int layer = 0) const {
    dsv4::SparseMlaOptions opts;
    opts.cache_blocks = 32;
    opts.block_size = 16;  // several blocks per request: block tables matter
    return SparseMlaAttention(cfg, layer, dsv4::random_sparse_mla_weights(cfg, layer, kSeed, true),
                              opts);
  }
  void step(SparseMlaAttention& a, const std::vector<RequestStep>& steps, Outputs& out) const {
    const BatchPlan plan = BatchPlan::make(steps);
    dsv4_test::StepIo io = dsv4_test::step_io(plan, cfg.dim, kSeed);  // y poisoned with NaN
    a.forward(plan, io.x, io.y);
    dsv4_test::record_outputs(plan, io.y, cfg.dim, out);
  }
  // One request of `len` tokens in chunks of `chunk`, then `decodes` single tokens.
  Outputs run_request(int64_t len, int64_t chunk, int64_t decodes = 0) const {
    SparseMlaAttention a = make_layer();
    Outputs out;
    for (int64_t done = 0; done < len; done += chunk) step(a, {{7, done, std::min(chunk, len - done)}}, out);
    for (int64_t i = 0; i < decodes; ++i) step(a, {{7, len + i, 1}}, out);
    return out;
  }
  std::vector<double> reference(int64_t len) const {
    std::vector<double> x;
    for (int64_t p = 0; p < len; ++p) {
      const std::vector<float> h = dsv4_test::layer_hidden(cfg.dim, 7, p, kSeed);
      x.insert(x.end(), h.begin(), h.end());
    }
    return dsv4::reference_sparse_mla_layer(cfg, dsv4::random_sparse_mla_weights(cfg, 0, kSeed, true), x);
  }
};

// The batched CPU layer against the float64 reference, token by token: 64 tokens, so from token
// 16 on the indexer's top-16 is a real selection among up to 64 tokens, and a prefill then decodes
// (the two attention paths). The reference rounds where the layer stores bf16 / FP8, so what
// remains is fp32-vs-double accumulation, which rarely moves a value across a bf16 or FP8
// rounding boundary (a flip in an FP8 quantization moves a token by ~1e-2 of its row max, as for
// the V4 layer) or swaps two near-tied indexer scores. Bounds as for the V4 layer: every token
// under 5e-2 (`dsv4 run --check`'s bound) and the median under 1e-4 — a wrong scale, rope,
// selection or head mapping moves every token by far more.
TEST_F(SparseMlaLayerTest, MatchesFloat64Reference) {
  const int64_t L = 64, prefill = 40;
  const Outputs got = run_request(prefill, prefill, L - prefill);
  const std::vector<double> ref = reference(L);
  std::vector<double> errs;
  for (int64_t p = 0; p < L; ++p) {
    const std::vector<double> r(ref.begin() + p * cfg.dim, ref.begin() + (p + 1) * cfg.dim);
    const double e = row_rel_err(got.at({7, p}), r);
    ASSERT_FALSE(std::isnan(e)) << "position " << p;
    errs.push_back(e);
  }
  std::sort(errs.begin(), errs.end());
  std::printf("  median %.3e, p90 %.3e, max %.3e\n", errs[errs.size() / 2],
              errs[errs.size() * 9 / 10], errs.back());
  EXPECT_LT(errs.back(), 5e-2);
  EXPECT_LT(errs[errs.size() / 2], 1e-4);
}

// The reference is sensitive to what the layer must get right: with another layer's weights (same
// shapes) every token differs by O(1).
TEST_F(SparseMlaLayerTest, ReferenceDetectsWrongWeights) {
  const int64_t L = 8;
  const Outputs got = run_request(L, L);
  std::vector<double> x;
  for (int64_t p = 0; p < L; ++p) {
    const std::vector<float> h = dsv4_test::layer_hidden(cfg.dim, 7, p, kSeed);
    x.insert(x.end(), h.begin(), h.end());
  }
  auto other = dsv4::random_sparse_mla_weights(cfg, 1, kSeed, true);
  other.layer = 0;
  const std::vector<double> ref = dsv4::reference_sparse_mla_layer(cfg, other, x);
  for (int64_t p = 0; p < L; ++p) {
    const std::vector<double> r(ref.begin() + p * cfg.dim, ref.begin() + (p + 1) * cfg.dim);
    EXPECT_GT(row_rel_err(got.at({7, p}), r), 0.2) << "position " << p;
  }
}

// One prefill = chunked prefill (chunks 1, 5, 24) = prefill + token-by-token decode. The cached
// bytes are the same either way (insert and key insert are per token; FP8·2^k values are exact
// in the bf16 prefill workspace), so the paths differ only in fp32 summation order (split-KV,
// GEMM blocking) before the bf16/FP8 roundings: tolerance 2e-2 of the row max.
TEST_F(SparseMlaLayerTest, ChunkingAndDecodeAgree) {
  const int64_t L = 48;
  const Outputs whole = run_request(L, L);
  for (int64_t chunk : {1, 5, 24}) {
    const Outputs chunked = run_request(L, chunk);
    for (int64_t p = 0; p < L; ++p)
      ASSERT_LT(row_rel_err(chunked.at({7, p}), whole.at({7, p})), 2e-2) << "chunk " << chunk << " position " << p;
  }
  const Outputs decoded = run_request(20, 20, L - 20);
  for (int64_t p = 0; p < L; ++p)
    ASSERT_LT(row_rel_err(decoded.at({7, p}), whole.at({7, p})), 2e-2) << "decode, position " << p;
}

// A request's outputs do not depend on which other requests share its steps, nor their order.
TEST_F(SparseMlaLayerTest, BatchCompositionIndependent) {
  SparseMlaAttention alone = make_layer();
  Outputs a;
  step(alone, {{1, 0, 20}}, a);
  step(alone, {{1, 20, 13}}, a);
  for (int i = 0; i < 4; ++i) step(alone, {{1, 33 + i, 1}}, a);

  SparseMlaAttention shared = make_layer();
  Outputs b;
  step(shared, {{9, 0, 11}, {1, 0, 20}}, b);
  step(shared, {{1, 20, 13}, {9, 11, 1}, {5, 0, 30}}, b);
  for (int i = 0; i < 4; ++i) {
    if (i % 2)
      step(shared, {{5, 30 + i, 1}, {1, 33 + i, 1}, {9, 12 + i, 1}}, b);
    else
      step(shared, {{9, 12 + i, 1}, {1, 33 + i, 1}, {5, 30 + i, 1}}, b);
  }
  for (int p = 0; p < 37; ++p) {
    const auto& x = a.at({1, p});
    const auto& y = b.at({1, p});
    ASSERT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << "position " << p;
  }
}

// Bad input is rejected before any state changes; release returns the blocks.
TEST_F(SparseMlaLayerTest, BadInputChangesNothing) {
  SparseMlaAttention a = make_layer();
  Outputs out, junk;
  step(a, {{7, 0, 20}}, out);
  EXPECT_THROW(step(a, {{7, 19, 1}}, junk), dsv4::Error);             // context mismatch
  EXPECT_THROW(step(a, {{7, 20, 1}, {4, 5, 2}}, junk), dsv4::Error);  // unknown request w/ context
  EXPECT_THROW(step(a, {{7, 20, 1}, {4, 0, 33 * 16}}, junk), dsv4::Error);  // cache exhausted
  {
    const BatchPlan plan = BatchPlan::make({{7, 20, 2}});
    HostTensor x(DType::fp32, {2, cfg.dim + 1}), y(DType::fp32, {2, cfg.dim});
    EXPECT_THROW(a.forward(plan, x, y), dsv4::Error);
    HostTensor x2(DType::fp32, {2, cfg.dim}), y2(DType::bf16, {2, cfg.dim});
    EXPECT_THROW(a.forward(plan, x2, y2), dsv4::Error);
  }
  step(a, {{7, 20, 5}}, out);
  const Outputs ref = run_request(25, 20);
  for (int p = 20; p < 25; ++p)
    ASSERT_EQ(0, std::memcmp(out.at({7, p}).data(), ref.at({7, p}).data(), cfg.dim * sizeof(float)));
  const int32_t free_before = a.kv_cache().pool().num_free();
  a.release(7);
  EXPECT_GT(a.kv_cache().pool().num_free(), free_before);
  EXPECT_THROW(a.release(7), dsv4::Error);
}

// reserve() sizes the temporaries' arena and the step upload for steps within its limits: such
// steps (prefill chunks with decodes riding along, then decodes) take no more than it reserved and
// the upload never grows. The CPU scratch counts its tensors as the CUDA arena carves them, so this
// checks the bound the CUDA layer reserves too (less the tensors only CUDA takes, which the GPU
// suite's run of this schedule covers).
TEST_F(SparseMlaLayerTest, ReserveCoversItsSteps) {
  SparseMlaAttention a = make_layer();
  const dsv4::LayerMemory reserved = a.reserve(/*max_tokens=*/64, /*max_requests=*/3, /*max_context=*/120);
  EXPECT_EQ(reserved.workspace_used, 0);
  EXPECT_GT(reserved.weights, 0);
  EXPECT_EQ(reserved.caches, 32 * 16 * (656 + 132));  // 32 blocks of 16 tokens: latent + key bytes
  Outputs out;
  step(a, {{1, 0, 40}, {2, 0, 24}}, out);
  step(a, {{2, 24, 1}, {1, 40, 60}, {3, 0, 3}}, out);
  for (int i = 0; i < 8; ++i) step(a, {{1, 100 + i, 1}, {2, 25 + i, 1}, {3, 3 + i, 1}}, out);
  const dsv4::LayerMemory after = a.memory();
  EXPECT_GT(after.workspace_used, 0);
  EXPECT_LE(after.workspace_used, reserved.workspace);
  EXPECT_EQ(after.workspace, reserved.workspace);
  EXPECT_EQ(after.step_upload, reserved.step_upload);
  EXPECT_THROW(a.reserve(4, 5, 100), dsv4::Error);  // more requests than tokens
  EXPECT_THROW(a.reserve(4, 1, cfg.max_position + 1), dsv4::Error);
}

// reserve() is tight as well as sufficient: it reserves at most twice what the largest step within
// its limits uses. The steps are the worst the limits allow (64 tokens over up to 4 requests,
// sequences up to 128): a whole 64-token prompt, a chunk reaching context 128 beside three
// decodes, and four decodes. The config selects V3.2's top-2048, which multiplies the decode
// split-KV partials: a bound that sized them by every token of the step (max_tokens) instead of
// the decodes a step can hold (max_requests) reserved 12x the use here, and 2.2 GB for 140 MB in
// `dsv4 run --model v3.2`. (The CPU scratch counts tensors as the CUDA arena carves them; the GPU
// suite checks the CUDA layer's bound, graph buckets included.)
TEST_F(SparseMlaLayerTest, ReserveIsWithinTwiceTheLargestStep) {
  cfg.index_topk = 2048;
  SparseMlaAttention a = make_layer();
  const dsv4::LayerMemory reserved = a.reserve(/*max_tokens=*/64, /*max_requests=*/4, /*max_context=*/128);
  Outputs out;
  step(a, {{1, 0, 20}, {2, 0, 20}, {3, 0, 20}}, out);
  step(a, {{4, 0, 64}}, out);
  step(a, {{1, 20, 1}, {2, 20, 1}, {3, 20, 1}, {4, 64, 61}}, out);
  step(a, {{1, 21, 1}, {2, 21, 1}, {3, 21, 1}, {4, 125, 1}}, out);
  const dsv4::LayerMemory after = a.memory();
  std::printf("  reserved %lld bytes, the largest step used %lld\n",
              static_cast<long long>(reserved.workspace), static_cast<long long>(after.workspace_used));
  EXPECT_LE(after.workspace_used, reserved.workspace);
  EXPECT_EQ(after.workspace, reserved.workspace);
  EXPECT_EQ(after.step_upload, reserved.step_upload);
  EXPECT_LE(reserved.workspace, 2 * after.workspace_used);
}

// The backend's device: a CPU layer takes host tensors only (the error names the argument); a
// CUDA layer where no GPU can run it is refused at construction, naming the backend.
TEST_F(SparseMlaLayerTest, DevicesNamedInErrors) {
  SparseMlaAttention a = make_layer();
  EXPECT_EQ(a.backend(), dsv4::Backend::cpu);
  const BatchPlan plan = BatchPlan::make({{7, 0, 2}});
  HostTensor x(DType::bf16, {2, cfg.dim}), y(DType::fp32, {2, cfg.dim});
  dsv4::TensorView x_gpu = x.view();
  x_gpu.device = dsv4::Device::cuda;
  try {
    a.forward(plan, x_gpu, y);
    ADD_FAILURE() << "expected dsv4::Error";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.device"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.kv_cache().pool().num_free(), a.kv_cache().pool().num_blocks());  // nothing booked
  if (!dsv4::cuda_available()) {
    dsv4::SparseMlaOptions opts;
    opts.backend = dsv4::Backend::cuda;
    try {
      SparseMlaAttention(cfg, 0, dsv4::random_sparse_mla_weights(cfg, 0, kSeed, true), opts);
      ADD_FAILURE() << "expected dsv4::Error";
    } catch (const dsv4::Error& e) {
      EXPECT_NE(std::string(e.what()).find("backend cuda"), std::string::npos) << e.what();
    }
  }
}

TEST_F(SparseMlaLayerTest, RejectsOtherFamiliesAndMismatchedWeights) {
  const ModelConfig v4 = ModelConfig::builtin("tiny");
  EXPECT_THROW(dsv4::random_sparse_mla_weights(v4, 0, kSeed, true), dsv4::Error);
  auto w = dsv4::random_sparse_mla_weights(cfg, 0, kSeed, true);
  EXPECT_THROW(SparseMlaAttention(cfg, 1, w), dsv4::Error);  // weights of layer 0
  w.wo.value = HostTensor(DType::bf16, {cfg.dim, 3});
  w.wo.scale = HostTensor();
  EXPECT_THROW(SparseMlaAttention(cfg, 0, w), dsv4::Error);
}

// The padded head count of the kernels and the softmax scale of V3.2 (YaRN mscale²).
TEST(SparseMlaConfig, PaddedHeadsAndSoftmaxScale) {
  EXPECT_EQ(dsv4::sparse_mla_padded_heads(16), 64);
  EXPECT_EQ(dsv4::sparse_mla_padded_heads(64), 64);
  EXPECT_EQ(dsv4::sparse_mla_padded_heads(128), 128);
  const ModelConfig v32 = ModelConfig::builtin("v3.2");
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(v32.mla_softmax_scale(), mscale * mscale / std::sqrt(192.0), 1e-15);
  const ModelConfig j = ModelConfig::from_json_string(
      R"({"model_type": "deepseek_v32", "hidden_size": 7168, "num_attention_heads": 128,
          "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
          "qk_nope_head_dim": 128, "v_head_dim": 128, "num_hidden_layers": 61,
          "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                           "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1},
          "max_position_embeddings": 163840})");
  EXPECT_EQ(j.qk_nope_head_dim, 128);
  EXPECT_EQ(j.mla_v_head_dim, 128);
  EXPECT_EQ(j.v_head_dim, 512);
  EXPECT_NEAR(j.mla_softmax_scale(), v32.mla_softmax_scale(), 1e-15);
}

// Checkpoint names: the inference code's names round-trip; the Hugging Face spelling loads to the
// same weights; a missing tensor is named.
TEST(SparseMlaWeights, CheckpointNames) {
  const ModelConfig cfg = ModelConfig::builtin("tiny-v3.2");
  const auto w = dsv4::random_sparse_mla_weights(cfg, 1, kSeed, true);
  const std::vector<std::string> names = dsv4::sparse_mla_tensor_names(w, cfg);
  for (const char* want : {"layers.1.attn.wq_a.weight", "layers.1.attn.wq_a.scale",
                           "layers.1.attn.wkv_b.weight", "layers.1.attn.wo.scale",
                           "layers.1.attn.indexer.k_norm.bias", "layers.1.attn.indexer.wk.scale",
                           "layers.1.attn.indexer.weights_proj.weight"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  EXPECT_EQ(std::find(names.begin(), names.end(), "layers.1.attn.indexer.weights_proj.scale"), names.end());

  dsv4::TensorMap tensors;
  dsv4::add_sparse_mla_tensors(w, cfg, tensors);
  const auto same = [](const dsv4::Weight& a, const dsv4::Weight& b) {
    return a.value.nbytes() == b.value.nbytes() &&
           std::memcmp(a.value.data<uint8_t>(), b.value.data<uint8_t>(), a.value.nbytes()) == 0;
  };
  const auto loaded = dsv4::load_sparse_mla_weights(tensors, cfg, 1);
  EXPECT_TRUE(same(loaded.wkv_b, w.wkv_b));
  EXPECT_TRUE(same(loaded.indexer.wk, w.indexer.wk));

  const std::map<std::string, std::string> hf = {
      {"wq_a", "q_a_proj"}, {"q_norm", "q_a_layernorm"}, {"wq_b", "q_b_proj"},
      {"wkv_a", "kv_a_proj_with_mqa"}, {"kv_norm", "kv_a_layernorm"}, {"wkv_b", "kv_b_proj"},
      {"wo", "o_proj"}};
  dsv4::TensorMap hf_tensors;
  for (const auto& [name, t] : tensors) {
    std::string rest = name.substr(std::string("layers.1.attn.").size());
    const size_t dot = rest.rfind('.');
    std::string key = rest.substr(0, dot), suffix = rest.substr(dot);
    if (hf.count(key)) key = hf.at(key);
    if (suffix == ".scale") suffix = ".weight_scale_inv";
    hf_tensors["model.layers.1.self_attn." + key + suffix] = t;
  }
  const auto hf_loaded = dsv4::load_sparse_mla_weights(hf_tensors, cfg, 1);
  EXPECT_TRUE(same(hf_loaded.wq_a, w.wq_a));
  EXPECT_TRUE(same(hf_loaded.wo, w.wo));

  tensors.erase("layers.1.attn.indexer.k_norm.bias");
  try {
    dsv4::load_sparse_mla_weights(tensors, cfg, 1);
    FAIL() << "expected dsv4::Error";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1.attn.indexer.k_norm.bias"), std::string::npos) << e.what();
  }
}

}  // namespace
