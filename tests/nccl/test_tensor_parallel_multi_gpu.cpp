// Tensor parallelism over several GPUs of one process (docs/design.md "Tensor parallelism"): rank
// r's Attention on GPU r, driven by its own host thread (RankThreads), the ranks' y summed by one
// NCCL group (make_nccl_group, ncclCommInitAll) inside each forward. Skipped, naming the counts,
// where fewer than tp GPUs are visible (tp 2, 4, 8).
//
// Cases: V4-Flash's 64 heads and 8 wo_a groups (dim, q_lora_rank and o_lora_rank reduced as in
// tests/cpu/test_tensor_parallel.cpp) for each layer kind and tp 2, 4, 8 (32, 16, 8 heads per
// rank), and the tiny model at tp 2 (its 4 groups of 64 o_lora columns: tp 4 would cut wo_b's
// 128-wide FP8 scale blocks, tp 8 does not divide them). Random FP8 weights; two requests, a
// 260-token prompt (two C128A entries) and a 5-token one, then 4 decode steps of both: the first
// decode runs eagerly, the second is captured into a CUDA graph (the ncclAllReduce inside it) and
// the others replay it, on every rank in lock-step.
//
// Checks:
//  - every rank's y is bit-identical to rank 0's (NCCL's all-reduce hands every rank the same sum);
//  - rank 0's y against the whole layer (tp 1) on GPU 0, per token max|Δy| / max|y| < 2e-3.
//    Why that bound: each rank's q, o and z are its heads' / groups' slices of the whole layer's
//    (same kernels, per-head attention, FP8 activation blocks of 128 columns that no shard
//    boundary splits); wo_b's block-scaled FP8 GEMM promotes each 128-column block's product to
//    fp32 on the same blocks either way, so y differs only by the fp32 order of those block sums
//    (whole K at once, or K/tp per rank and then NCCL's sum): ~1e-6 of |y|. The margin above it
//    covers a cuBLASLt algorithm chosen differently for a rank's narrower wq_b / wo_a / wo_b,
//    whose fp32 reordering can flip the bf16 or FP8 rounding of a few elements (each ~3e-4 of a
//    token's max). A lost, doubled or misplaced rank's share moves y by ~1/tp of it (>= 12%).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/communicator.h"
#include "dsv4/layer.h"
#include "gpu_test_util.h"
#include "layer/rank_threads.h"
#include "layer_test_support.h"
#include "nccl_test_group.h"

namespace {

using dsv4::BatchPlan;
using dsv4::ModelConfig;

struct MultiGpuCase {
  const char* model;  // "v4-flash" (small projections) or "tiny"
  dsv4::LayerKind kind;
  int tp;
};

std::string case_name(const MultiGpuCase& c) {
  return dsv4_test::real_heads_case_name({c.model, c.kind}) + "_tp" + std::to_string(c.tp);
}

ModelConfig case_config(const MultiGpuCase& c) {
  ModelConfig cfg = ModelConfig::builtin(c.model);
  if (std::string(c.model) == "v4-flash") {  // the real heads and head_dim; small projections
    cfg.dim = 512;
    cfg.q_lora_rank = 256;
    cfg.o_lora_rank = 128;
  }
  cfg.validate();
  return cfg;
}

// Every case's steps: two prefills, then four decode steps of both requests (graph bucket 2).
std::vector<BatchPlan> steps() {
  std::vector<BatchPlan> plans{BatchPlan::make({{7, 0, 260}, {9, 0, 5}})};
  for (int i = 0; i < 4; ++i) plans.push_back(BatchPlan::make({{7, 260 + i, 1}, {9, 5 + i, 1}}));
  return plans;
}

dsv4::AttentionOptions cuda_options(dsv4::TensorParallel tp) {
  dsv4::AttentionOptions opts;
  opts.backend = dsv4::Backend::cuda;
  opts.tp = tp;
  return opts;
}

class TensorParallelMultiGpu : public ::testing::TestWithParam<MultiGpuCase> {};

TEST_P(TensorParallelMultiGpu, AllReducedOutputsMatchOneGpuAndAgreeBitForBit) {
  const MultiGpuCase& c = GetParam();
  DSV4_SKIP_WITHOUT_GPUS(c.tp);
  const ModelConfig cfg = case_config(c);
  const int layer = dsv4_test::first_layer_of_kind(cfg, c.kind);
  ASSERT_GE(layer, 0);
  const dsv4::AttentionWeights w = dsv4::random_attention_weights(cfg, layer, 3, /*fp8=*/true);
  const std::vector<BatchPlan> plans = steps();

  dsv4_test::LayerOutputs whole;
  {
    dsv4::Attention one(cfg, layer, w, cuda_options({}));  // GPU 0 (the thread's current)
    for (const BatchPlan& plan : plans) {
      dsv4_test::StepIo io = dsv4_test::step_io(plan, cfg.dim, 11, /*bf16_representable=*/true);
      one.forward(plan, io.x, io.y);
      dsv4_test::record_outputs(plan, io.y, cfg.dim, whole);
    }
  }

  auto group = dsv4_test::nccl_group(c.tp);
  dsv4::RankThreads threads(c.tp, dsv4_test::first_gpus(c.tp));
  std::vector<std::unique_ptr<dsv4::Attention>> ranks(static_cast<size_t>(c.tp));
  // Each rank built on its own thread, so its weights, caches and workspaces land on its GPU.
  threads.run([&](int r) {
    ranks[static_cast<size_t>(r)] = std::make_unique<dsv4::Attention>(
        cfg, layer, w, cuda_options({r, c.tp, group[static_cast<size_t>(r)].get()}));
  });
  std::vector<dsv4_test::LayerOutputs> outputs(static_cast<size_t>(c.tp));
  for (const BatchPlan& plan : plans) {
    const dsv4_test::StepIo io = dsv4_test::step_io(plan, cfg.dim, 11, /*bf16_representable=*/true);
    std::vector<dsv4::HostTensor> ys;
    for (int r = 0; r < c.tp; ++r) ys.push_back(dsv4::HostTensor::copy_of(io.y));  // NaN-poisoned
    threads.run([&](int r) { ranks[static_cast<size_t>(r)]->forward(plan, io.x, ys[static_cast<size_t>(r)]); });
    for (int r = 0; r < c.tp; ++r)
      dsv4_test::record_outputs(plan, ys[static_cast<size_t>(r)], cfg.dim, outputs[static_cast<size_t>(r)]);
  }
  // The decodes ran through graphs, and every rank took the same eager / capture / replay path.
  EXPECT_GE(ranks[0]->graph_captures(), 1);
  EXPECT_GE(ranks[0]->graph_replays(), 1);
  for (int r = 1; r < c.tp; ++r) {
    EXPECT_EQ(ranks[static_cast<size_t>(r)]->graph_captures(), ranks[0]->graph_captures()) << "rank " << r;
    EXPECT_EQ(ranks[static_cast<size_t>(r)]->graph_replays(), ranks[0]->graph_replays()) << "rank " << r;
  }
  threads.run([&](int r) { ranks[static_cast<size_t>(r)].reset(); });  // freed on its GPU

  for (int r = 1; r < c.tp; ++r) {
    const dsv4_test::LayerOutputs& mine = outputs[static_cast<size_t>(r)];
    ASSERT_EQ(mine.size(), outputs[0].size());
    for (const auto& [key, row] : outputs[0])
      ASSERT_EQ(0, std::memcmp(mine.at(key).data(), row.data(), row.size() * sizeof(float)))
          << "rank " << r << "'s y of request " << key.first << " position " << key.second << " differs from rank 0's";
  }
  double worst = 0;
  ASSERT_EQ(outputs[0].size(), whole.size());
  for (const auto& [key, row] : whole) worst = std::max(worst, dsv4_test::row_rel_err(outputs[0].at(key), row));
  std::printf("%s: worst token error against tp 1 on one GPU %.3g\n", case_name(c).c_str(), worst);
  EXPECT_LT(worst, 2e-3);
}

std::vector<MultiGpuCase> cases() {
  std::vector<MultiGpuCase> out;
  for (int tp : {2, 4, 8})
    for (dsv4::LayerKind kind : {dsv4::LayerKind::swa, dsv4::LayerKind::c4a, dsv4::LayerKind::c128a})
      out.push_back({"v4-flash", kind, tp});
  for (dsv4::LayerKind kind : {dsv4::LayerKind::swa, dsv4::LayerKind::c4a, dsv4::LayerKind::c128a})
    out.push_back({"tiny", kind, 2});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Gpus, TensorParallelMultiGpu, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
