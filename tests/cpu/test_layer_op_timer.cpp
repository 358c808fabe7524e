// The host-clock op timer of `dsv4 bench layer` (tools/dsv4/layer_op_timer.h), the medians it
// folds repeated forwards into, and the CUDA-event timer's refusal without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "dsv4/device_tensor.h"
#include "dsv4/status.h"
#include "layer_op_timer.h"

namespace {

using dsv4::bench::ForwardTimes;
using dsv4::bench::HostOpTimer;
using dsv4::bench::OpTime;
using dsv4::bench::median_times;

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(LayerOpTimer, HostTimerSpansOpsFromMarkToMarkAndAddsRepeats) {
  HostOpTimer t;
  t.begin("a", nullptr);
  sleep_ms(20);
  t.begin("b", nullptr);
  sleep_ms(5);
  t.begin("a", nullptr);  // a name marked twice adds up
  sleep_ms(20);
  t.end(nullptr);
  const ForwardTimes f = t.collect();
  ASSERT_EQ(f.ops.size(), 2u);
  EXPECT_EQ(f.ops[0].name, "a");
  EXPECT_EQ(f.ops[1].name, "b");
  EXPECT_GE(f.ops[0].gpu_us, 40e3);
  EXPECT_GE(f.ops[1].gpu_us, 5e3);
  EXPECT_LT(f.ops[1].gpu_us, f.ops[0].gpu_us);
  EXPECT_DOUBLE_EQ(f.ops[0].gpu_us + f.ops[1].gpu_us, f.gpu_us);  // the spans tile the forward
  EXPECT_DOUBLE_EQ(f.gpu_us, f.host_us);
  // collect() consumed the forward; a forward that never ended is refused.
  EXPECT_THROW(t.collect(), dsv4::Error);
  t.begin("a", nullptr);
  EXPECT_THROW(t.collect(), dsv4::Error);
  t.reset();
  t.set_enabled(false);
  t.begin("a", nullptr);
  t.end(nullptr);
  EXPECT_THROW(t.collect(), dsv4::Error);  // nothing was recorded while disabled
}

TEST(LayerOpTimer, MediansPerOpAndOfTotals) {
  auto run = [](double a, double b) {
    return ForwardTimes{{OpTime{"a", a, 2 * a}, OpTime{"b", b, 2 * b}}, a + b, 2 * (a + b)};
  };
  ForwardTimes only_a{{OpTime{"a", 7, 7}}, 7, 7};
  const ForwardTimes m = median_times({run(1, 10), run(3, 30), run(2, 20), only_a});
  ASSERT_EQ(m.ops.size(), 2u);
  EXPECT_EQ(m.ops[0].name, "a");
  EXPECT_DOUBLE_EQ(m.ops[0].gpu_us, 2.5);     // 1, 2, 3, 7
  EXPECT_DOUBLE_EQ(m.ops[1].gpu_us, 15);      // 0 (missing), 10, 20, 30
  EXPECT_DOUBLE_EQ(m.ops[1].host_us, 30);
  EXPECT_DOUBLE_EQ(m.gpu_us, (11 + 22) / 2.0);  // 7, 11, 22, 33
  EXPECT_DOUBLE_EQ(dsv4::bench::median({5, 1, 3}), 3);
  EXPECT_DOUBLE_EQ(dsv4::bench::median({}), 0);
}

// Without the CUDA backend the CUDA-event timer cannot be made; with it but no device, its first
// mark (the first event) fails. Either way a dsv4::Error, never a timing of nothing.
TEST(LayerOpTimer, CudaEventTimerWithoutGpuIsAnError) {
  if (dsv4::cuda_available()) GTEST_SKIP() << "a CUDA device is present (the GPU suite runs bench layer)";
  if (!dsv4::cuda_built()) {
    try {
      dsv4::bench::CudaEventOpTimer timer;
      ADD_FAILURE() << "a CUDA event timer without the CUDA backend";
    } catch (const dsv4::Error& e) {
      EXPECT_NE(std::string(e.what()).find("CUDA event timer: this build has no CUDA backend"), std::string::npos)
          << e.what();
    }
    return;
  }
  dsv4::bench::CudaEventOpTimer timer;
  EXPECT_THROW(timer.begin("a", nullptr), dsv4::Error);
}

}  // namespace
