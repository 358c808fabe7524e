// The DeepSeek-V3.2 sparse-MLA layer on CUDA (SparseMlaAttention with Backend::cuda) against the
// CPU backend and the float64 reference on tiny-v3.2, over a serving-like schedule: two prefills
// (one chunked, token counts not multiples of 4, so the CUDA step pads its GEMM rows), then decodes
// riding along with a continuing chunk and a new request, then decode-only steps. Also: device
// inputs only (a host x is refused naming it, and changes nothing), run-to-run determinism,
// reserve() covering the CUDA step's temporaries, the FP8 options FP8 weights need, and
// `dsv4 run --model v3.2 --layers 0,1 --backend cuda --check`. Skipped without a GPU.
//
// Tolerances (per token: max |y − y_ref| / max |y_ref| over the row). Inputs are bf16-representable,
// so both backends see the same x. They then differ as the V4 layer's backends do
// (tests/cuda/test_attention_layer_cuda.cpp states each effect and its H100 measurements):
//   (a) fp32 summation order in GEMMs (batched_linear's per-head absorptions included), norms and
//       attention (~1e-6);
//   (b) the softmax weights P, fed to the P·V tensor-core MMA as bf16 on the GPU (~2^-9 relative);
//   (c) the bf16 roundings after (a), and the FP8 roundings of the V32_FP8 cache's latent, flip on
//       the other side for a few elements (a whole bf16 / FP8 step each);
//   (d) with FP8 weights, the FP8 tensor cores' short accumulator (~1e-2 of |y| where the terms
//       cancel), which flips the FP8 rounding of a share of each FP8 GEMM input (the normed q, the
//       W_UV output before wo): for V4 measured median 2.6e-2, max 5.0e-2 per token on the H100;
//   (e) the indexer's scores, summed on FP8 tensor cores (include/dsv4/indexer.h bounds them): two
//       tokens whose scores tie that closely at the top-k boundary may be selected differently,
//       and such a token's output moves by what the swapped tokens contribute.
// The V3.2 layer has the V4 C4A layer's mix of these (FP8 projections, an FP8 cache, an indexer
// selecting top-16 of up to 148 tokens), so it takes that layer's bounds: with FP8 weights the
// median < 4e-2 and every token < 8e-2; with bf16 weights (no FP8 GEMM input) the median < 4e-3
// and every token < 2e-2; with bf16 weights up to 2% of the tokens (at least one) may exceed the
// per-token bound by (e), each still < 0.3. A semantic error (a head mapping, a scale, a position,
// a missing write, a wrong selection) moves every token by O(1).
// FP8 weights together with tiny-v3.2's top-16 selection are not compared token by token: (d)
// moves the indexer's query and key projections (FP8 GEMMs whose FP8 inputs round differently on
// the two backends) far more than (e) alone, and at 16 of up to 148 tokens the near-ties it flips
// moved 12 of 205 tokens above 8e-2, up to 0.67, on the H200 (2026-11-27). So the FP8-weight cases
// run a copy of the config whose index_topk (256) keeps every token: the whole FP8 path at the
// bounds above with no allowance; the selection itself is compared with bf16 weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "cpu/cli_test_support.h"
#include "dsv4/device_tensor.h"
#include "dsv4/sparse_mla_layer.h"
#include "dsv4/sparse_mla_reference.h"
#include "dsv4/sparse_mla_weights.h"
#include "gpu_test_util.h"
#include "layer_test_support.h"

namespace dsv4 {
namespace {

constexpr uint64_t kSeed = 42;
using Outputs = dsv4_test::LayerOutputs;
using dsv4_test::row_rel_err;

SparseMlaAttention make_layer(const ModelConfig& cfg, Backend backend, bool fp8_weights = true) {
  SparseMlaOptions opts;
  opts.backend = backend;
  opts.cache_blocks = 64;
  opts.block_size = 16;  // several blocks per request: block tables matter
  return SparseMlaAttention(cfg, 0, random_sparse_mla_weights(cfg, 0, kSeed, fp8_weights), opts);
}

// One step; x and y on the layer's device (x bf16 there, exact: the inputs are bf16-representable).
void step(SparseMlaAttention& a, const std::vector<RequestStep>& steps, Outputs& out) {
  const BatchPlan plan = BatchPlan::make(steps);
  const int dim = a.config().dim;
  dsv4_test::StepIo io = dsv4_test::step_io(plan, dim, kSeed, /*bf16_representable=*/true);
  if (a.backend() == Backend::cpu) {
    a.forward(plan, io.x, io.y);
  } else {
    const DeviceTensor x = DeviceTensor::from_host(HostTensor::copy_of(io.x, DType::bf16));
    DeviceTensor y(DType::fp32, {plan.num_tokens(), dim});
    y.fill_bytes(0xFF);  // NaN: an unwritten row shows
    a.forward(plan, x, y);
    io.y = y.to_host();
  }
  dsv4_test::record_outputs(plan, io.y, dim, out);
}

// Requests 1 (chunks of 48) and 2 (30 tokens) prefill together (78 tokens: padded to 80 GEMM rows
// on CUDA); then request 2 decodes beside request 1's next chunk, then beside its last chunk and
// request 3's 17-token prompt; then four decode-only steps of all three.
Outputs run_schedule(SparseMlaAttention& a) {
  Outputs out;
  step(a, {{1, 0, 48}, {2, 0, 30}}, out);
  step(a, {{2, 30, 1}, {1, 48, 48}}, out);
  step(a, {{2, 31, 1}, {1, 96, 48}, {3, 0, 17}}, out);
  for (int i = 0; i < 4; ++i) step(a, {{1, 144 + i, 1}, {2, 32 + i, 1}, {3, 17 + i, 1}}, out);
  return out;
}

void expect_close(std::vector<double> errs, bool fp8_weights, const char* what) {
  ASSERT_FALSE(errs.empty());
  for (double e : errs) ASSERT_FALSE(std::isnan(e)) << what;
  std::sort(errs.begin(), errs.end());
  const double median = errs[errs.size() / 2], worst = errs.back();
  const double bound = fp8_weights ? 8e-2 : 2e-2;
  const size_t above = static_cast<size_t>(errs.end() - std::upper_bound(errs.begin(), errs.end(), bound));
  std::printf("  %s: median %.3e, max %.3e over %zu tokens (%zu above %.0e)\n", what, median, worst,
              errs.size(), above, bound);
  ::testing::Test::RecordProperty("median_rel_err", std::to_string(median));
  ::testing::Test::RecordProperty("max_rel_err", std::to_string(worst));
  if (fp8_weights) {
    EXPECT_LT(worst, bound) << what;  // every token selected: no near-tie allowance
  } else {
    EXPECT_LE(above, std::max<size_t>(1, errs.size() / 50)) << what << ": tokens above " << bound;
    EXPECT_LT(worst, 0.3) << what;
  }
  EXPECT_LT(median, fp8_weights ? 4e-2 : 4e-3) << what;
}

// tiny-v3.2, with FP8 weights its copy that selects every token (see the top of the file).
ModelConfig config_for(bool fp8_weights) {
  ModelConfig cfg = ModelConfig::builtin("tiny-v3.2");
  if (fp8_weights) cfg.index_topk = 256;
  return cfg;
}

class SparseMlaCudaTest : public ::testing::TestWithParam<bool /*fp8 weights*/> {
 protected:
  ModelConfig cfg = config_for(GetParam());
};

TEST_P(SparseMlaCudaTest, MatchesCpuBackendOverMixedBatches) {
  DSV4_SKIP_WITHOUT_GPU();
  SparseMlaAttention cpu = make_layer(cfg, Backend::cpu, GetParam());
  SparseMlaAttention gpu = make_layer(cfg, Backend::cuda, GetParam());
  const Outputs want = run_schedule(cpu);
  const Outputs got = run_schedule(gpu);
  ASSERT_EQ(want.size(), got.size());
  std::vector<double> errs;
  for (const auto& [key, row] : want)
    errs.push_back(row_rel_err(got.at(key), std::vector<double>(row.begin(), row.end())));
  expect_close(errs, GetParam(), "cuda vs cpu");
}

// Request 1 of the schedule (a prefill in three chunks with decodes beside it, then decodes)
// against the unbatched float64 reference over its 148 positions, as the CPU suite checks the CPU
// layer.
TEST_P(SparseMlaCudaTest, MatchesFloat64Reference) {
  DSV4_SKIP_WITHOUT_GPU();
  SparseMlaAttention gpu = make_layer(cfg, Backend::cuda, GetParam());
  const Outputs got = run_schedule(gpu);
  const int L = 148;
  std::vector<double> x;
  for (int p = 0; p < L; ++p) {
    const std::vector<float> h = dsv4_test::layer_hidden(cfg.dim, 1, p, kSeed, true);
    x.insert(x.end(), h.begin(), h.end());
  }
  const std::vector<double> ref =
      reference_sparse_mla_layer(cfg, random_sparse_mla_weights(cfg, 0, kSeed, GetParam()), x);
  std::vector<double> errs;
  for (int p = 0; p < L; ++p)
    errs.push_back(row_rel_err(got.at({1, p}), std::vector<double>(ref.begin() + int64_t{p} * cfg.dim,
                                                               ref.begin() + int64_t{p + 1} * cfg.dim)));
  expect_close(errs, GetParam(), "cuda vs float64 reference");
}

// Same weights, same steps: the same bits (deterministic kernels, the upload ring reused).
TEST_P(SparseMlaCudaTest, RunToRunBitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  SparseMlaAttention a = make_layer(cfg, Backend::cuda, GetParam());
  SparseMlaAttention b = make_layer(cfg, Backend::cuda, GetParam());
  const Outputs oa = run_schedule(a), ob = run_schedule(b);
  for (const auto& [key, row] : oa)
    ASSERT_EQ(0, std::memcmp(row.data(), ob.at(key).data(), row.size() * sizeof(float)))
        << "request " << key.first << " position " << key.second;
}

INSTANTIATE_TEST_SUITE_P(Weights, SparseMlaCudaTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "fp8_weights" : "bf16_weights"; });

// A CUDA layer takes x and y on the GPU only, x in bf16: anything else is refused naming the
// argument, and changes nothing (afterwards the layer gives the bits of one that never saw it).
TEST(SparseMlaCuda, DeviceInputsOnlyAndBadInputChangesNothing) {
  DSV4_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = ModelConfig::builtin("tiny-v3.2");
  SparseMlaAttention a = make_layer(cfg, Backend::cuda), b = make_layer(cfg, Backend::cuda);
  Outputs oa, ob;
  step(a, {{5, 0, 20}}, oa);
  step(b, {{5, 0, 20}}, ob);
  const BatchPlan plan = BatchPlan::make({{5, 20, 2}});
  const auto expect_refused = [&](const TensorView& x, const TensorView& y, const char* names) {
    try {
      a.forward(plan, x, y);
      ADD_FAILURE() << "expected dsv4::Error naming " << names;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
  };
  HostTensor x_host(DType::bf16, {2, cfg.dim}), y_host(DType::fp32, {2, cfg.dim});
  DeviceTensor x(DType::bf16, {2, cfg.dim}), x32(DType::fp32, {2, cfg.dim}), y(DType::fp32, {2, cfg.dim});
  DeviceTensor x3(DType::bf16, {3, cfg.dim}), x1(DType::bf16, {1, cfg.dim}), y1(DType::fp32, {1, cfg.dim});
  expect_refused(x_host, y, "x.device");
  expect_refused(x, y_host, "y.device");
  expect_refused(x32, y, "x");  // a GPU x must be bf16
  expect_refused(x3, y, "x.shape");
  EXPECT_THROW(a.forward(BatchPlan::make({{5, 19, 1}}), x1, y1), Error);  // wrong context
  step(a, {{5, 20, 2}}, oa);
  step(b, {{5, 20, 2}}, ob);
  for (int p = 20; p < 22; ++p)
    ASSERT_EQ(0, std::memcmp(oa.at({5, p}).data(), ob.at({5, p}).data(), cfg.dim * sizeof(float)));
}

// After reserve() the schedule's steps take no more device memory than reserved: the arena and the
// step upload keep their size (so those steps allocated nothing), the CUDA-only tensors included.
TEST(SparseMlaCuda, ReserveCoversTheSchedule) {
  DSV4_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = ModelConfig::builtin("tiny-v3.2");
  SparseMlaAttention a = make_layer(cfg, Backend::cuda);
  const LayerMemory reserved = a.reserve(/*max_tokens=*/96, /*max_requests=*/3, /*max_context=*/160);
  run_schedule(a);
  const LayerMemory after = a.memory();
  EXPECT_GT(after.workspace_used, 0);
  EXPECT_LE(after.workspace_used, reserved.workspace);
  EXPECT_EQ(after.workspace, reserved.workspace);
  EXPECT_EQ(after.step_upload, reserved.step_upload);
}

// FP8 weights run on FP8 tensor cores, which take FP8 inputs only: the options that would feed
// them bf16 are refused at construction, naming the option.
TEST(SparseMlaCuda, Fp8WeightsNeedFp8Activations) {
  DSV4_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = ModelConfig::builtin("tiny-v3.2");
  SparseMlaOptions opts;
  opts.backend = Backend::cuda;
  opts.fp8_gemm_activations = false;
  try {
    SparseMlaAttention(cfg, 0, random_sparse_mla_weights(cfg, 0, kSeed, true), opts);
    ADD_FAILURE() << "expected dsv4::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_gemm_activations"), std::string::npos) << e.what();
  }
  opts.fp8_gemm_activations = true;
  opts.fp8_activations = false;
  EXPECT_THROW(SparseMlaAttention(cfg, 0, random_sparse_mla_weights(cfg, 0, kSeed, true), opts), Error);
  EXPECT_NO_THROW(SparseMlaAttention(cfg, 0, random_sparse_mla_weights(cfg, 0, kSeed, false), opts));
}

// The serving simulation through the V3.2 stack on the GPU (the residual stream and both layers
// on the device), checked against the float64 reference at the CUDA tolerance of `dsv4 run`:
// DeepSeek-V3.2's own shapes (random FP8 weights) with prompts below its top-2048, so every token
// is selected (tiny-v3.2's top-16 selection with FP8 weights is not comparable token by token; see
// the top of the file). Measured on the H200: 3.3e-2 / 3.5e-2.
TEST(SparseMlaCuda, CliRunV32PassesCheck) {
  DSV4_SKIP_WITHOUT_GPU();
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("dsv4_run_v32_" + std::to_string(::getpid()) + ".json")).string();
  const dsv4_test::CliResult r = dsv4_test::run_cli(
      "run --model v3.2 --layers 0,1 --backend cuda --requests 2 --prompt-len 256,128 --decode-steps 4 "
      "--chunk 200 --check --quiet --json " + json);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("0(MLA) 1(MLA)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("check: passed"), std::string::npos) << r.output;
  nlohmann::json j;
  std::ifstream(json) >> j;
  std::filesystem::remove(json);
  EXPECT_EQ(j["backend"].get<std::string>(), "cuda");
  ASSERT_EQ(j["check"]["layers"].size(), 2u);
  for (const auto& l : j["check"]["layers"]) {
    EXPECT_EQ(l["tokens"].get<int64_t>(), 260);  // the checked request: 256 prompt + 4 decodes
    std::printf("  layer %d: max rel err %.3e\n", l["layer"].get<int>(), l["max_rel_err"].get<double>());
  }
}

}  // namespace
}  // namespace dsv4
