// Tensor parallelism emulated in one process on the CPU (include/dsv4/tensor_parallel.h): the
// layer split over tp ranks, each rank's partial y (no all-reduce), summed, against the whole
// layer (tp 1) over the same steps — V4-Flash (64 heads, 8 wo_a groups) and V4-Pro (128 heads,
// 16 groups) head counts, tp 2, 4, 8, each layer kind; and the same ranks as threads summing
// through an in-process Communicator.
//
// The real head counts and head_dim are kept; dim, q_lora_rank and o_lora_rank are reduced (the
// sharding never touches them) so the 18 cases run in seconds. Random FP8 weights, a 12-token
// prefill then 3 decodes of one request.
//
// Tolerance: the ranks compute bit-identical q, o and z slices (wq_b rows, heads and wo_a groups
// are independent; the FP8 activation blocks of o and z are per head / per 128 columns, which no
// shard boundary splits), so the only difference is wo_b's fp32 sum over G·o_lora columns taken
// as tp partial sums. Bound: per token max|y_tp − y_1| / max|y_1| < 1e-5 (fp32 rounding of
// 1024–2048-term sums is ~1e-7 relative); a wrong slice moves a token by O(1).
#include <gtest/gtest.h>

#include <thread>

#include "dsv4/communicator.h"
#include "dsv4/layer.h"
#include "dsv4/tensor_parallel.h"
#include "layer_test_support.h"

namespace {

using dsv4::AttentionOptions;
using dsv4::AttentionWeights;
using dsv4::BatchPlan;
using dsv4::HostTensor;
using dsv4::ModelConfig;

struct TpCase {
  const char* model;
  dsv4::LayerKind kind;
  int tp;
};

std::string case_name(const TpCase& c) {
  return dsv4_test::real_heads_case_name({c.model, c.kind}) + "_tp" + std::to_string(c.tp);
}

// The model's head counts with small projections.
ModelConfig small_projection_config(const char* model) {
  ModelConfig cfg = ModelConfig::builtin(model);
  cfg.dim = 512;
  cfg.q_lora_rank = 256;
  cfg.o_lora_rank = 128;
  cfg.validate();
  return cfg;
}

AttentionOptions cpu_options(dsv4::TensorParallel tp) {
  AttentionOptions opts;
  opts.caches.swa_blocks = 4;
  opts.tp = tp;
  return opts;
}

// The steps of every case: request 7's 12-token prefill, then 3 decodes.
std::vector<BatchPlan> steps() {
  std::vector<BatchPlan> plans{BatchPlan::make({{7, 0, 12}})};
  for (int i = 0; i < 3; ++i) plans.push_back(BatchPlan::make({{7, 12 + i, 1}}));
  return plans;
}

// Runs the steps through `layer`, returning each step's y.
std::vector<HostTensor> run_steps(dsv4::Attention& layer, int dim) {
  std::vector<HostTensor> ys;
  for (const BatchPlan& plan : steps()) {
    dsv4_test::StepIo io = dsv4_test::step_io(plan, dim, 11, /*bf16_representable=*/true);
    layer.forward(plan, io.x, io.y);
    ys.push_back(io.y);
  }
  return ys;
}

// Per token, max|got − want| / max|want| over every step; the worst token's.
double worst_token_error(const std::vector<HostTensor>& got, const std::vector<std::vector<double>>& want,
                         int dim) {
  double worst = 0;
  for (size_t s = 0; s < got.size(); ++s)
    for (int64_t t = 0; t < got[s].shape()[0]; ++t) {
      const float* g = got[s].data<float>() + t * dim;
      const std::vector<float> row(g, g + dim);
      const std::vector<double> ref(want[s].begin() + t * dim, want[s].begin() + (t + 1) * dim);
      worst = std::max(worst, dsv4_test::row_rel_err(row, ref));
    }
  return worst;
}

std::vector<std::vector<double>> as_double(const std::vector<HostTensor>& ys) {
  std::vector<std::vector<double>> out;
  for (const HostTensor& y : ys) out.emplace_back(y.data<float>(), y.data<float>() + y.numel());
  return out;
}

class TensorParallelLayer : public ::testing::TestWithParam<TpCase> {
 protected:
  void SetUp() override {
    cfg = small_projection_config(GetParam().model);
    layer = dsv4_test::first_layer_of_kind(cfg, GetParam().kind);
    weights = dsv4::random_attention_weights(cfg, layer, 3, /*fp8=*/true);
    dsv4::Attention whole(cfg, layer, weights, cpu_options({}));
    whole_y = run_steps(whole, cfg.dim);
  }
  ModelConfig cfg;
  int layer = 0;
  AttentionWeights weights;
  std::vector<HostTensor> whole_y;
};

TEST_P(TensorParallelLayer, SummedPartialOutputsMatchTheWholeLayer) {
  const int tp = GetParam().tp;
  std::vector<std::vector<double>> sum;
  for (int r = 0; r < tp; ++r) {
    dsv4::Attention rank(cfg, layer, weights, cpu_options({r, tp, nullptr}));
    EXPECT_EQ(rank.config().n_heads, cfg.n_heads);
    EXPECT_EQ(rank.weights().attn_sink.shape()[0], cfg.n_heads / tp);
    const std::vector<std::vector<double>> partial = as_double(run_steps(rank, cfg.dim));
    if (sum.empty()) sum.assign(partial.size(), {});
    for (size_t s = 0; s < partial.size(); ++s) {
      sum[s].resize(partial[s].size(), 0.0);
      for (size_t i = 0; i < partial[s].size(); ++i) sum[s][i] += partial[s][i];
    }
  }
  std::vector<HostTensor> sum_f;
  for (size_t s = 0; s < sum.size(); ++s) {
    sum_f.emplace_back(dsv4::DType::fp32, whole_y[s].shape());
    for (size_t i = 0; i < sum[s].size(); ++i) sum_f[s].data<float>()[i] = static_cast<float>(sum[s][i]);
  }
  const double err = worst_token_error(sum_f, as_double(whole_y), cfg.dim);
  std::printf("%s: worst token error %.3g\n", case_name(GetParam()).c_str(), err);
  EXPECT_LT(err, 1e-5);
}

TEST_P(TensorParallelLayer, ThreadsAllReduceInProcess) {
  const int tp = GetParam().tp;
  auto group = dsv4::make_in_process_group(tp);
  std::vector<std::vector<HostTensor>> ys(static_cast<size_t>(tp));
  std::vector<std::string> errors(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      try {
        dsv4::Attention rank(cfg, layer, weights, cpu_options({r, tp, group[static_cast<size_t>(r)].get()}));
        ys[static_cast<size_t>(r)] = run_steps(rank, cfg.dim);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < tp; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  // Every rank holds the same sum (the ranks' partials added in rank order on each).
  for (int r = 1; r < tp; ++r)
    for (size_t s = 0; s < ys[0].size(); ++s)
      ASSERT_EQ(0, std::memcmp(ys[0][s].data<float>(), ys[static_cast<size_t>(r)][s].data<float>(),
                               ys[0][s].nbytes()))
          << "rank " << r << " step " << s;
  EXPECT_LT(worst_token_error(ys[0], as_double(whole_y), cfg.dim), 1e-5);
}

std::vector<TpCase> cases() {
  std::vector<TpCase> out;
  for (const dsv4_test::RealHeadsCase& c : dsv4_test::real_heads_cases())
    for (int tp : {2, 4, 8}) out.push_back({c.model, c.kind, tp});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelLayer, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

TEST(TensorParallel, BadOptionsAreRefusedNamingTheField) {
  const ModelConfig cfg = ModelConfig::builtin("tiny");  // 16 heads, 4 groups
  const AttentionWeights w = dsv4::random_attention_weights(cfg, 0, 1, /*fp8=*/false);
  const auto error_of = [&](dsv4::TensorParallel tp) -> std::string {
    try {
      dsv4::Attention a(cfg, 0, w, cpu_options(tp));
    } catch (const dsv4::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of({0, 8, nullptr}).find("tp.size"), std::string::npos);  // 8 ∤ 4 groups
  EXPECT_NE(error_of({0, 3, nullptr}).find("tp.size"), std::string::npos);
  EXPECT_NE(error_of({2, 2, nullptr}).find("tp.rank"), std::string::npos);
  EXPECT_NE(error_of({0, 0, nullptr}).find("tp.size"), std::string::npos);
  auto group = dsv4::make_in_process_group(2);
  EXPECT_NE(error_of({0, 2, group[1].get()}).find("tp.communicator->rank()"), std::string::npos);
  EXPECT_NE(error_of({0, 4, group[0].get()}).find("tp.communicator->size()"), std::string::npos);
  EXPECT_EQ(error_of({1, 2, group[1].get()}), "");
}

TEST(TensorParallel, ShardSlicesHeadsGroupsAndWoBColumns) {
  const ModelConfig cfg = ModelConfig::builtin("tiny");
  const AttentionWeights w = dsv4::random_attention_weights(cfg, 1, 2, /*fp8=*/false);
  const int tp = 2, r = 1;
  const AttentionWeights s = dsv4::shard_attention_weights(w, cfg, {r, tp, nullptr});
  const int64_t H = cfg.n_heads / tp, D = cfg.head_dim, G = cfg.o_groups / tp, L = cfg.o_lora_rank;
  const int64_t q_lora = cfg.q_lora_rank, per_group = w.wo_a.value.shape()[2];
  for (int64_t i = 0; i < H * D * q_lora; i += 97)
    ASSERT_EQ(s.wq_b.value.get(i), w.wq_b.value.get(r * H * D * q_lora + i));
  for (int64_t h = 0; h < H; ++h) ASSERT_EQ(s.attn_sink.get(h), w.attn_sink.get(r * H + h));
  for (int64_t i = 0; i < G * L * per_group; i += 89)
    ASSERT_EQ(s.wo_a.value.get(i), w.wo_a.value.get(r * G * L * per_group + i));
  const int64_t cols = int64_t{cfg.o_groups} * L;
  for (int64_t row = 0; row < cfg.dim; row += 7)
    for (int64_t c = 0; c < G * L; c += 5)
      ASSERT_EQ(s.wo_b.value.get(row * G * L + c), w.wo_b.value.get(row * cols + r * G * L + c));
  // Replicated weights share the whole layer's buffers.
  EXPECT_EQ(s.wq_a.value.view().data, w.wq_a.value.view().data);
  EXPECT_EQ(s.compressor->wkv.value.view().data, w.compressor->wkv.value.view().data);
}

TEST(TensorParallel, InProcessGroupSumsInRankOrder) {
  auto group = dsv4::make_in_process_group(3);
  std::vector<HostTensor> t;
  for (int r = 0; r < 3; ++r) {
    t.emplace_back(dsv4::DType::fp32, std::vector<int64_t>{2, 3});
    for (int i = 0; i < 6; ++i) t.back().data<float>()[i] = static_cast<float>((r + 1) * 10 + i);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] { group[static_cast<size_t>(r)]->allreduce_sum(t[static_cast<size_t>(r)], nullptr); });
  for (std::thread& th : threads) th.join();
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 6; ++i) EXPECT_EQ(t[static_cast<size_t>(r)].data<float>()[i], 60.0f + 3 * i);
  HostTensor bf16(dsv4::DType::bf16, {2});
  EXPECT_THROW(group[0]->allreduce_sum(bf16, nullptr), dsv4::Error);
  EXPECT_THROW(dsv4::make_in_process_group(0), dsv4::Error);
}

}  // namespace
