// StepPlanner, the host half of a layer step: every array it puts into the step upload checked
// against the paged caches' own answers (slot_of, block_table) and the BatchPlan, for prefill,
// mixed, eager-padded and graph-bucketed decode steps of each layer kind; the graph key of a
// bucket stable across steps; errors before any state changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/config.h"
#include "dsv4/paged_cache.h"
#include "layer/step_planner.h"
#include "layer/step_upload.h"

namespace {

using namespace dsv4;

template <class T>
std::vector<T> read(const StepUpload& up, const StepUpload::Array& a) {
  const TensorView v = up.view(a);
  const T* p = static_cast<const T*>(v.data);
  return std::vector<T>(p, p + v.numel());
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

struct Layer {
  ModelConfig cfg = ModelConfig::builtin("tiny");
  int layer;
  LayerCaches caches;
  StepPlanner planner;
  StepUpload upload{Device::cpu};

  explicit Layer(int l, int32_t swa_blocks = 64)
      : layer(l), caches(make_layer_caches(cfg, cfg.layer_kind(l), options(swa_blocks))),
        planner(cfg, l, caches, /*prefill_group_requests=*/2) {}
  static LayerCacheOptions options(int32_t swa_blocks) {
    LayerCacheOptions o;
    o.swa_blocks = swa_blocks;
    o.compressed_blocks = 64;
    o.state_blocks = 64;
    return o;
  }

  // What Attention::forward does on the host: check, register, plan, commit (CPU: no copy).
  StepPlan step(const BatchPlan& plan, int64_t rows, bool graph) {
    planner.check(plan);
    planner.add_requests(plan);
    StepPlan sp = planner.plan(plan, rows, graph, upload);
    upload.commit(nullptr);
    return sp;
  }

  // Every array of `sp` against the caches and the plan.
  void expect_consistent(const BatchPlan& plan, const StepPlan& sp, bool graph) const {
    const int64_t T = plan.num_tokens(), rows = sp.T;
    const int R = plan.num_requests();
    ASSERT_EQ(sp.R, graph ? R + (rows - T) : R);
    const auto pos = read<int64_t>(upload, sp.positions);
    const auto slots = read<int64_t>(upload, sp.slot_mapping);
    const auto t2r = read<int32_t>(upload, sp.token_to_req);
    ASSERT_EQ(static_cast<int64_t>(pos.size()), rows);
    for (int64_t t = 0; t < rows; ++t) {
      if (t < T) {
        const int64_t req = plan.requests[plan.token_to_req[t]].req_id;
        EXPECT_EQ(pos[t], plan.positions[t]) << "token " << t;
        EXPECT_EQ(t2r[t], plan.token_to_req[t]) << "token " << t;
        EXPECT_EQ(slots[t], caches.swa->slot_of(req, plan.positions[t])) << "token " << t;
        EXPECT_GE(slots[t], 0);
      } else {
        EXPECT_EQ(pos[t], 0) << "padding token " << t;
        EXPECT_EQ(t2r[t], graph ? R + (t - T) : -1) << "padding token " << t;
        EXPECT_EQ(slots[t], -1) << "padding token " << t;
      }
    }
    auto expect_tables = [&](const PagedCache& c, const StepUpload::Array& a) {
      size_t longest = 1;
      for (const RequestStep& s : plan.requests) longest = std::max(longest, c.block_table(s.req_id).size());
      const int64_t width = graph ? round_up_pow2(static_cast<int64_t>(longest)) : static_cast<int64_t>(longest);
      ASSERT_EQ(a.shape, (std::vector<int64_t>{sp.R, width})) << c.spec().name;
      const auto t = read<int32_t>(upload, a);
      for (int r = 0; r < sp.R; ++r)
        for (int64_t k = 0; k < width; ++k) {
          int32_t want = -1;
          if (r < R) {
            const auto& bt = c.block_table(plan.requests[r].req_id);
            if (k < static_cast<int64_t>(bt.size())) want = bt[static_cast<size_t>(k)];
          }
          EXPECT_EQ(t[static_cast<size_t>(r * width + k)], want) << c.spec().name << " row " << r << " col " << k;
        }
    };
    expect_tables(*caches.swa, sp.swa_table);
    if (!caches.compressed) return;
    const auto ctx = read<int64_t>(upload, sp.compressed.context);
    for (int r = 0; r < sp.R; ++r) EXPECT_EQ(ctx[r], r < R ? plan.requests[r].context : 0) << "row " << r;
    expect_tables(*caches.compressor_state, sp.compressed.state_table);
    expect_tables(*caches.compressed, sp.compressed.out_table);
    if (caches.indexer_keys) {
      expect_tables(*caches.indexer_state, sp.compressed.index_state_table);
      expect_tables(*caches.indexer_keys, sp.compressed.index_key_table);
    }
  }
};

class StepPlannerTest : public ::testing::TestWithParam<int> {};

TEST_P(StepPlannerTest, UploadMatchesTheCachesForPrefillMixedAndGraphDecodeSteps) {
  Layer L(GetParam());
  // Prefill chunks (eager, rounded up to 4 rows as the CUDA backend does), then a mixed step.
  const std::vector<int64_t> lens{150, 70, 9};
  std::vector<RequestStep> steps;
  for (size_t i = 0; i < lens.size(); ++i) steps.push_back({static_cast<int64_t>(i), 0, lens[i]});
  BatchPlan plan = BatchPlan::make(steps);
  StepPlan sp = L.step(plan, (plan.num_tokens() + 3) / 4 * 4, false);
  L.expect_consistent(plan, sp, false);
  EXPECT_EQ(sp.prefill_groups.size(), 2u);  // groups of 2 requests

  plan = BatchPlan::make({{0, 150, 1}, {1, 70, 1}, {2, 9, 30}});
  sp = L.step(plan, plan.num_tokens(), false);
  L.expect_consistent(plan, sp, false);
  ASSERT_EQ(sp.nd, 2);

  // Decode steps as graph buckets (3 requests → 4 rows); the key of one bucket is the same at
  // every step whose widths stay within their powers of two.
  std::vector<int64_t> ctx{151, 71, 39};
  std::vector<int64_t> first_key;
  for (int i = 0; i < 12; ++i) {
    std::vector<RequestStep> d;
    for (int64_t r = 0; r < 3; ++r) d.push_back({r, ctx[static_cast<size_t>(r)], 1});
    plan = BatchPlan::make(d);
    sp = L.step(plan, 4, true);
    SCOPED_TRACE("decode step " + std::to_string(i));
    L.expect_consistent(plan, sp, true);
    EXPECT_EQ(sp.nd, 4);
    if (first_key.empty()) first_key = sp.shape_key();
    EXPECT_EQ(sp.shape_key(), first_key);
    for (int64_t& c : ctx) ++c;
  }
}

// Decode steps of the same batch patch the last step's arrays (positions, slots, contexts, the
// table rows that changed) instead of packing them again: across block boundaries of every cache,
// MTP steps, and batches that change (a full pack, then patches again), every array must read as
// a fresh one would.
TEST_P(StepPlannerTest, SameBatchDecodeStepsPatchTheLastUpload) {
  Layer L(GetParam());
  const std::vector<int64_t> lens{150, 70, 9, 40};
  std::vector<RequestStep> steps;
  for (size_t i = 0; i < lens.size(); ++i) steps.push_back({static_cast<int64_t>(i), 0, lens[i]});
  L.step(BatchPlan::make(steps), 272, false);
  std::vector<int64_t> ctx = lens;
  int64_t steps_run = 0;
  auto run = [&](const std::vector<int64_t>& reqs, int64_t n_new, int count, bool graph) {
    for (int i = 0; i < count; ++i) {
      std::vector<RequestStep> d;
      for (int64_t r : reqs) d.push_back({r, ctx[static_cast<size_t>(r)], n_new});
      const BatchPlan plan = BatchPlan::make(d);
      const int64_t T = plan.num_tokens();
      const StepPlan sp = L.step(plan, graph ? round_up_pow2(std::max<int64_t>(T, 4)) : T, graph);
      SCOPED_TRACE("step " + std::to_string(steps_run));
      L.expect_consistent(plan, sp, graph);
      EXPECT_EQ(sp.key, sp.shape_key());  // the key packed with the plan still describes it
      for (int64_t r : reqs) ctx[static_cast<size_t>(r)] += n_new;
      ++steps_run;
    }
  };
  const int64_t before = L.planner.patched_steps();
  run({0, 1, 2}, 1, 140, true);     // crosses SWA blocks and compressed entries of every request
  EXPECT_GT(L.planner.patched_steps() - before, 100);
  run({0, 1, 2}, 2, 30, true);      // MTP: another shape, then patched again
  run({0, 2}, 1, 20, true);         // a request left the batch
  run({0, 1, 2, 3}, 1, 20, false);  // eager (no rounding): widths grow one block at a time
  EXPECT_GT(L.planner.patched_steps() - before, 170);
  L.planner.release(1);             // and the next step packs afresh
  const int64_t patched = L.planner.patched_steps();
  run({0, 2, 3}, 1, 1, true);
  EXPECT_EQ(L.planner.patched_steps(), patched);
}

TEST_P(StepPlannerTest, ErrorsComeBeforeAnyStateChanges) {
  Layer L(GetParam(), /*swa_blocks=*/4);
  const BatchPlan first = BatchPlan::make({{7, 0, 20}});
  L.step(first, 20, false);
  const int64_t entries = L.caches.swa->num_entries(7);
  EXPECT_NE(error_of([&] { L.planner.check(BatchPlan::make({{7, 5, 1}})); }).find("context of request 7"),
            std::string::npos);
  EXPECT_NE(error_of([&] { L.planner.check(BatchPlan::make({{7, 20, 1000}})); }).find("exhausted"),
            std::string::npos);
  EXPECT_EQ(L.caches.swa->num_entries(7), entries);
  // The same requests as the last decode step are checked through the planner's handles, alike.
  L.step(BatchPlan::make({{7, 20, 1}}), 4, true);
  EXPECT_NE(error_of([&] { L.planner.check(BatchPlan::make({{7, 20, 1}})); }).find("context of request 7"),
            std::string::npos);
  EXPECT_NE(error_of([&] { L.planner.check(BatchPlan::make({{7, 21, 1000}})); }).find("exhausted"),
            std::string::npos);
  EXPECT_EQ(L.caches.swa->num_entries(7), entries + 1);
  L.planner.release(7);
  EXPECT_FALSE(L.caches.swa->has_request(7));
  EXPECT_NE(error_of([&] { L.planner.release(7); }).find("unknown request 7"), std::string::npos);
}

// What a resumed step sends: the span of the bytes marked since the last commit — including a
// step that was put but never committed (its forward threw), whose marks carry over.
TEST(StepUploadDirty, ResumedStepsSendWhatWasMarkedSinceTheLastCommit) {
  StepUpload up(Device::cpu);
  up.begin();
  const StepUpload::Array a = up.put_uninit(DType::int64, {64});
  const StepUpload::Array b = up.put_uninit(DType::int32, {32, 8});
  EXPECT_EQ(up.pending_bytes(), up.size());  // a fresh layout: everything
  up.commit(nullptr);
  EXPECT_EQ(up.pending_bytes(), 0);
  up.resume();
  up.mark_dirty(a.offset, 16);
  EXPECT_EQ(up.pending_bytes(), 16);
  up.resume();  // the step above was never committed
  up.mark_dirty(b.offset + 4 * 8 * 4, 8 * 4);
  EXPECT_EQ(up.pending_bytes(), b.offset + 5 * 8 * 4 - a.offset);
  up.commit(nullptr);
  EXPECT_EQ(up.pending_bytes(), 0);
  up.resume();
  EXPECT_EQ(up.pending_bytes(), 0);
}

INSTANTIATE_TEST_SUITE_P(Kinds, StepPlannerTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(i.param == 0 ? "SWA" : i.param == 1 ? "C4A" : "C128A");
                         });

}  // namespace
