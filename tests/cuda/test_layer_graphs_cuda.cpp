// The device-resident layer on the GPU: decode steps replayed as CUDA graphs against eager steps,
// the residual stream of AttentionStack kept on the GPU, and reserve() sizing every workspace.
//
// Graphs vs eager: a graph step pads the batch to its bucket (1, 2, 4, ... tokens), so its GEMMs
// run at another M and cuBLASLt may pick another algorithm: the fp32 summation order differs,
// which flips bf16 / FP8 roundings downstream exactly as between the CUDA and CPU backends. The
// bounds are therefore those of CudaLayerTest (every token < 5e-2 relative to its row's max, the
// median < 1.5e-2, with FP8 activations). A graph that replays a stale plan, reads the wrong rows
// or misses a write is off by O(1) in whole rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/layer.h"
#include "dsv4/model.h"
#include "dsv4/weights.h"
#include "gpu_test_util.h"
#include "layer_device_step.h"
#include "layer_test_support.h"

namespace dsv4 {
namespace {

constexpr uint64_t kSeed = 7;
using Outputs = dsv4_test::LayerOutputs;

// layout FP8_PER_TENSOR: the decodes read the FP8 queries the insert writes (q_scale 0.6), a
// temporary of the captured step like the others.
Attention make_layer(const ModelConfig& cfg, int layer, bool graphs, KvLayout layout = KvLayout::model1_fp8) {
  AttentionOptions opts;
  opts.backend = Backend::cuda;
  opts.cuda_graphs = graphs;
  opts.caches.layout = layout;
  opts.caches.q_scale = 0.6f;  // read with FP8_PER_TENSOR only
  opts.caches.swa_blocks = 96;
  opts.caches.compressed_blocks = 96;
  opts.caches.state_blocks = 96;
  return Attention(cfg, layer, random_attention_weights(cfg, layer, kSeed, true), opts);
}

using StepFn = std::function<void(Attention&, const std::vector<RequestStep>&, Outputs&)>;

// x and y on the GPU (the serving path), fresh tensors every step.
void step(Attention& a, const std::vector<RequestStep>& steps, Outputs& out) {
  dsv4_test::device_step(a, steps, kSeed, out);
}

// Prefills of five requests, then decode steps whose batches fall in buckets 1, 4 and 8 (each
// bucket seen 3+ times: eager, capture, replays), with contexts crossing block-table widths; then
// MTP steps (2 tokens per request, and a mix of 3, 1 and 2), decode-like steps that are captured
// and replayed too.
Outputs run_decodes(Attention& a, const StepFn& step = dsv4::step) {
  Outputs out;
  std::vector<int64_t> ctx{40, 70, 33, 120, 65};
  step(a, {{0, 0, 40}, {1, 0, 70}, {2, 0, 33}}, out);
  step(a, {{3, 0, 120}, {4, 0, 65}}, out);
  auto decode = [&](const std::vector<int>& reqs) {
    std::vector<RequestStep> s;
    for (int r : reqs) s.push_back({r, ctx[r]++, 1});
    step(a, s, out);
  };
  for (int i = 0; i < 4; ++i) decode({2});
  for (int i = 0; i < 40; ++i) decode({0, 1, 2, 3});  // 4 tokens: a full bucket
  for (int i = 0; i < 5; ++i) decode({0, 1, 2, 3, 4});
  auto mtp = [&](const std::vector<std::pair<int, int>>& reqs) {  // (request, new tokens)
    std::vector<RequestStep> s;
    for (const auto& [r, n] : reqs) {
      s.push_back({r, ctx[r], n});
      ctx[r] += n;
    }
    step(a, s, out);
  };
  for (int i = 0; i < 5; ++i) mtp({{0, 2}, {1, 2}, {2, 2}, {3, 2}});
  for (int i = 0; i < 4; ++i) mtp({{4, 3}, {1, 1}, {2, 2}});
  return out;
}

void expect_close(const Outputs& want, const Outputs& got, const char* what) {
  ASSERT_EQ(want.size(), got.size());
  std::vector<double> errs;
  for (const auto& [key, row] : want) {
    const double e = dsv4_test::row_rel_err(got.at(key), row);
    ASSERT_FALSE(std::isnan(e)) << what << ": request " << key.first << " position " << key.second;
    errs.push_back(e);
  }
  std::sort(errs.begin(), errs.end());
  std::printf("  %s: median %.3e, max %.3e over %zu tokens\n", what, errs[errs.size() / 2],
              errs.back(), errs.size());
  EXPECT_LT(errs.back(), 5e-2) << what;
  EXPECT_LT(errs[errs.size() / 2], 1.5e-2) << what;
}

struct GraphCase {
  int layer;  // of the tiny config: 0 SWA, 1 C4A, 2 C128A
  KvLayout layout;
  const char* name;
};

class GraphLayerTest : public ::testing::TestWithParam<GraphCase> {
 protected:
  ModelConfig cfg = ModelConfig::builtin("tiny");
};

TEST_P(GraphLayerTest, ReplayedDecodesMatchEagerSteps) {
  DSV4_SKIP_WITHOUT_GPU();
  Attention eager = make_layer(cfg, GetParam().layer, false, GetParam().layout);
  Attention graphs = make_layer(cfg, GetParam().layer, true, GetParam().layout);
  const Outputs want = run_decodes(eager);
  const Outputs got = run_decodes(graphs);
  EXPECT_EQ(eager.graph_captures(), 0);
  EXPECT_GE(graphs.graph_captures(), 5);  // decode buckets 1, 4, 8 and the two MTP shapes at least
  EXPECT_GE(graphs.graph_replays(), 35);
  expect_close(want, got, "graphs vs eager");
}

// The caller's x and y at the same addresses every step (a serving engine's fixed buffers): the
// steps that fill their bucket (4 decodes, the 4 x 2 MTP steps) run their graphs on them directly,
// with no copy in or out; the others go through the graphs' own rows. Both match eager steps.
TEST_P(GraphLayerTest, ReplaysOnTheCallersFixedRows) {
  DSV4_SKIP_WITHOUT_GPU();
  Attention eager = make_layer(cfg, GetParam().layer, false, GetParam().layout);
  Attention graphs = make_layer(cfg, GetParam().layer, true, GetParam().layout);
  DeviceTensor x_buf(DType::bf16, {256, cfg.dim}), y_buf(DType::fp32, {256, cfg.dim});
  const StepFn fixed = [&](Attention& a, const std::vector<RequestStep>& s, Outputs& out) {
    dsv4_test::device_step_in(a, s, kSeed, out, x_buf, y_buf);
  };
  const Outputs want = run_decodes(eager);
  const Outputs got = run_decodes(graphs, fixed);
  EXPECT_GE(graphs.graph_captures(), 5);
  EXPECT_GE(graphs.graph_replays(), 35);
  expect_close(want, got, "graphs on the caller's rows vs eager");
  // Alternating between two buffers: never the same addresses twice in a row, so every step
  // goes through the graphs' rows.
  DeviceTensor x2(DType::bf16, {256, cfg.dim}), y2(DType::fp32, {256, cfg.dim});
  int calls = 0;
  const StepFn alternating = [&](Attention& a, const std::vector<RequestStep>& s, Outputs& out) {
    const bool odd = calls++ % 2;
    dsv4_test::device_step_in(a, s, kSeed, out, odd ? x2 : x_buf, odd ? y2 : y_buf);
  };
  Attention graphs2 = make_layer(cfg, GetParam().layer, true, GetParam().layout);
  expect_close(want, run_decodes(graphs2, alternating), "graphs, alternating caller rows, vs eager");
  EXPECT_GE(graphs2.graph_replays(), 35);
}

// reserve() sizes the workspace for the schedule: no forward within the bounds grows it.
TEST_P(GraphLayerTest, ReserveCoversEveryStep) {
  DSV4_SKIP_WITHOUT_GPU();
  Attention a = make_layer(cfg, GetParam().layer, true, GetParam().layout);
  const LayerMemory reserved = a.reserve(/*max_tokens=*/120, /*max_requests=*/5, /*max_context=*/256);
  EXPECT_GT(reserved.weights, 0);
  EXPECT_GT(reserved.caches, 0);
  EXPECT_GT(reserved.workspace, 0);
  run_decodes(a);
  const LayerMemory after = a.memory();
  EXPECT_EQ(after.workspace, reserved.workspace) << "the workspace grew after reserve()";
  EXPECT_EQ(after.step_upload, reserved.step_upload) << "the upload buffer grew after reserve()";
  EXPECT_LE(after.workspace_used, after.workspace);
}

INSTANTIATE_TEST_SUITE_P(Kinds, GraphLayerTest,
                         ::testing::Values(GraphCase{0, KvLayout::model1_fp8, "SWA"},
                                           GraphCase{1, KvLayout::model1_fp8, "C4A"},
                                           GraphCase{2, KvLayout::model1_fp8, "C128A"},
                                           GraphCase{0, KvLayout::fp8_per_tensor, "SWA_fp8_tensor_fp8_query"},
                                           GraphCase{1, KvLayout::fp8_per_tensor, "C4A_fp8_tensor_fp8_query"},
                                           GraphCase{2, KvLayout::fp8_per_tensor, "C128A_fp8_tensor_fp8_query"}),
                         [](const auto& info) { return std::string(info.param.name); });

// The stack keeps its residual on the GPU: x and y on the device give the bits of x and y on the
// host, and the result stays close to the CPU stack.
TEST(GraphStackTest, DeviceResidualMatchesHostIoAndCpu) {
  DSV4_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = ModelConfig::builtin("tiny");
  StackOptions so;
  so.layers = {0, 1, 2};
  so.seed = kSeed;
  so.attention.caches.swa_blocks = 64;
  so.attention.caches.compressed_blocks = 64;
  so.attention.caches.state_blocks = 64;
  StackOptions gpu_opts = so;
  gpu_opts.attention.backend = Backend::cuda;
  AttentionStack cpu(cfg, so), dev_io(cfg, gpu_opts), host_io(cfg, gpu_opts);
  std::vector<int64_t> ctx{0, 0};
  std::vector<double> errs;
  for (int s = 0; s < 8; ++s) {
    const std::vector<RequestStep> steps =
        s == 0 ? std::vector<RequestStep>{{0, 0, 37}, {1, 0, 21}}
               : std::vector<RequestStep>{{0, ctx[0], 1}, {1, ctx[1], 1}};
    const BatchPlan plan = BatchPlan::make(steps);
    for (const RequestStep& r : steps) ctx[r.req_id] += r.num_new;
    const int64_t T = plan.num_tokens();
    HostTensor x = dsv4_test::step_io(plan, cfg.dim, kSeed + s, true).x;
    HostTensor y_cpu(DType::fp32, {T, cfg.dim}), y_host(DType::fp32, {T, cfg.dim});
    cpu.forward(plan, x, y_cpu);
    host_io.forward(plan, x, y_host);
    DeviceTensor xd = DeviceTensor::from_host(x), yd(DType::fp32, {T, cfg.dim});
    yd.fill_bytes(0xFF);
    dev_io.forward(plan, xd, yd);
    const HostTensor y_dev = yd.to_host();
    ASSERT_EQ(0, std::memcmp(y_dev.data<float>(), y_host.data<float>(), y_dev.nbytes())) << "step " << s;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> a(y_dev.data<float>() + t * cfg.dim, y_dev.data<float>() + (t + 1) * cfg.dim);
      std::vector<float> b(y_cpu.data<float>() + t * cfg.dim, y_cpu.data<float>() + (t + 1) * cfg.dim);
      errs.push_back(dsv4_test::row_rel_err(a, b));
    }
  }
  std::sort(errs.begin(), errs.end());
  std::printf("  stack cuda vs cpu: median %.3e, max %.3e over %zu tokens\n", errs[errs.size() / 2],
              errs.back(), errs.size());
  // Each of the three layers differs from its CPU twin within the CudaLayerTest bounds for FP8
  // weights (8e-2 per token, median 4e-2), and feeds the next layer through the residual, which
  // carries the differences forward (the GPU stack also hands the layers bf16 inputs where the
  // CPU's are fp32): at most additive over the layers, so 3x those bounds. Measured on the H100
  // (2026-11-25): median 4.8e-2, max 7.3e-2. A residual-stream error (a missed add, a stale row)
  // is O(1).
  EXPECT_LT(errs.back(), 2.4e-1);
  EXPECT_LT(errs[errs.size() / 2], 1.2e-1);
}

}  // namespace
}  // namespace dsv4
