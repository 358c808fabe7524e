// dsv4::Attention on caller-owned caches (AttentionOptions::caller_caches): the same steps give
// bit-identical outputs on the layer's own caches and on a caller's caches laid out differently
// (padded block stride, scrambled block assignment, garbage outside the blocks a step uses), for
// every layer kind; bad arguments are refused by name and change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "caller_caches_support.h"
#include "dsv4/layer.h"
#include "dsv4/weights.h"
#include "layer_test_support.h"

namespace {

using dsv4::Attention;
using dsv4::AttentionOptions;
using dsv4::BatchPlan;
using dsv4::ModelConfig;
using dsv4::RequestStep;

constexpr uint64_t kSeed = 17;

AttentionOptions options(bool caller) {
  AttentionOptions o;
  o.caches.swa_blocks = 64;
  o.caches.compressed_blocks = 64;
  o.caches.state_blocks = 64;
  o.caller_caches = caller;
  return o;
}

// A prefill of two requests, a chunk continuing one beside a decode, a new request joining, then
// decodes across the SWA window, ratio-4 windows and (req 9) the 128 boundary.
std::vector<std::vector<RequestStep>> step_sequence() {
  std::vector<std::vector<RequestStep>> steps = {
      {{7, 0, 150}, {9, 0, 40}},
      {{7, 150, 1}, {9, 40, 87}},
      {{7, 151, 1}, {9, 127, 1}, {11, 0, 5}},
  };
  for (int i = 0; i < 6; ++i) steps.push_back({{7, 152 + i, 1}, {9, 128 + i, 1}, {11, 5 + i, 1}});
  return steps;
}

struct KindCase {
  int layer;  // of the tiny config: 0 SWA, 1 C4A, 2 C128A
  const char* name;
};
std::ostream& operator<<(std::ostream& os, const KindCase& c) { return os << c.name; }

class CallerCachesTest : public ::testing::TestWithParam<KindCase> {
 protected:
  ModelConfig cfg = ModelConfig::builtin("tiny");
  int layer() const { return GetParam().layer; }
  dsv4::AttentionWeights weights() const {
    return dsv4::random_attention_weights(cfg, layer(), kSeed, true);
  }
};

TEST_P(CallerCachesTest, SameOutputsAsSelfManaged) {
  Attention own(cfg, layer(), weights(), options(false));
  Attention caller(cfg, layer(), weights(), options(true));
  dsv4_test::CallerCacheSim sim(cfg, layer(), options(true).caches, 48, /*pad_bytes=*/64,
                                dsv4::Device::cpu);
  caller.bind_caches(sim.caches());
  EXPECT_TRUE(caller.caller_caches());
  EXPECT_EQ(caller.memory().caches, 0) << "the caller's caches are not the layer's memory";
  int n = 0;
  for (const std::vector<RequestStep>& steps : step_sequence()) {
    const BatchPlan plan = BatchPlan::make(steps);
    dsv4_test::StepIo a = dsv4_test::step_io(plan, cfg.dim, kSeed);
    dsv4_test::StepIo b = dsv4_test::step_io(plan, cfg.dim, kSeed);
    own.forward(plan, a.x, a.y);
    dsv4_test::CallerCacheSim::Step st = sim.step(plan.requests);
    caller.forward(st.view, b.x, b.y);
    for (int64_t i = 0; i < a.y.numel(); ++i) ASSERT_FALSE(std::isnan(b.y.data<float>()[i])) << i;
    ASSERT_EQ(std::memcmp(a.y.data<float>(), b.y.data<float>(), a.y.nbytes()), 0)
        << "step " << n << ": outputs differ";
    ++n;
  }
}

TEST_P(CallerCachesTest, BadInputIsRefusedByNameAndChangesNothing) {
  Attention caller(cfg, layer(), weights(), options(true));
  dsv4_test::CallerCacheSim sim(cfg, layer(), options(true).caches, 16, 32, dsv4::Device::cpu);
  const BatchPlan plan = BatchPlan::make({{3, 0, 20}});
  dsv4_test::StepIo io = dsv4_test::step_io(plan, cfg.dim, kSeed);
  dsv4_test::CallerCacheSim::Step st = sim.step(plan.requests);
  auto refused = [&](const dsv4::CallerStep& bad, const std::string& names) {
    const std::vector<uint8_t> before = sim.snapshot();
    try {
      caller.forward(bad, io.x, io.y);
      ADD_FAILURE() << "accepted; expected an error naming " << names;
    } catch (const dsv4::Error& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
    EXPECT_TRUE(sim.snapshot() == before) << names << ": the caches changed";
    for (int64_t i = 0; i < io.y.numel(); ++i) ASSERT_TRUE(std::isnan(io.y.data<float>()[i]));
  };
  refused(st.view, "bind_caches");  // nothing bound yet

  // The caches: a stride under the block's bytes, a missing one, a cache the kind lacks.
  dsv4::CallerCaches c = sim.caches();
  c.swa.strides[0] = c.swa.shape[1] - 16;
  EXPECT_THROW(caller.bind_caches(c), dsv4::Error);
  c = sim.caches();
  c.swa = {};
  EXPECT_THROW(caller.bind_caches(c), dsv4::Error);
  c = sim.caches();
  if (layer() == 0) {
    c.compressed = c.swa;
    try {
      caller.bind_caches(c);
      ADD_FAILURE() << "an SWA layer took a compressed cache";
    } catch (const dsv4::Error& e) {
      EXPECT_NE(std::string(e.what()).find("caches.compressed"), std::string::npos) << e.what();
    }
  } else {
    c.compressor_state.strides[0] += 16;  // rings must be dense
    c.compressor_state.shape[0] -= 1;
    try {
      caller.bind_caches(c);
      ADD_FAILURE() << "a padded ring was taken";
    } catch (const dsv4::Error& e) {
      EXPECT_NE(std::string(e.what()).find("caches.compressor_state.strides[0]"), std::string::npos)
          << e.what();
    }
  }
  caller.bind_caches(sim.caches());

  // The step.
  dsv4::HostTensor slots = dsv4::HostTensor::copy_of(st.slots);
  slots.data<int64_t>()[5] += 1;
  dsv4::CallerStep bad = st.view;
  bad.slot_mapping = slots;
  refused(bad, "step.slot_mapping[5]");
  dsv4::HostTensor positions = dsv4::HostTensor::copy_of(st.positions);
  positions.data<int64_t>()[2] = 7;
  bad = st.view;
  bad.positions = positions;
  refused(bad, "step.positions[2]");
  dsv4::HostTensor table = dsv4::HostTensor::copy_of(st.tables[0]);
  table.data<int32_t>()[0] = 16;  // one past the last block
  bad = st.view;
  bad.swa_block_table = table;
  refused(bad, "step.swa_block_table[0][0]");
  dsv4::HostTensor seq = dsv4::HostTensor::copy_of(st.seq_lens);
  seq.data<int32_t>()[0] = 19;  // fewer than its new tokens
  bad = st.view;
  bad.seq_lens = seq;
  refused(bad, "step.seq_lens[0]");
  bad = st.view;
  bad.indexer_keys_block_table = layer() == 1 ? dsv4::TensorView{} : st.tables[0];
  refused(bad, "step.indexer_keys_block_table");
  dsv4::HostTensor qsl = dsv4::HostTensor::copy_of(st.qsl);
  qsl.data<int32_t>()[1] = 19;
  bad = st.view;
  bad.query_start_loc = qsl;
  refused(bad, "step.query_start_loc[R]");

  // The mode's other entry points.
  EXPECT_THROW(caller.forward(plan, io.x, io.y), dsv4::Error);
  EXPECT_THROW(caller.release(3), dsv4::Error);
  Attention own(cfg, layer(), weights(), options(false));
  EXPECT_THROW(own.bind_caches(sim.caches()), dsv4::Error);
  EXPECT_THROW(own.forward(st.view, io.x, io.y), dsv4::Error);

  // And the good step runs.
  caller.forward(st.view, io.x, io.y);
  for (int64_t i = 0; i < io.y.numel(); ++i) ASSERT_FALSE(std::isnan(io.y.data<float>()[i]));
}

INSTANTIATE_TEST_SUITE_P(Kinds, CallerCachesTest,
                         ::testing::Values(KindCase{0, "SWA"}, KindCase{1, "C4A"}, KindCase{2, "C128A"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
