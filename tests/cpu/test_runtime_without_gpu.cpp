// The runtime services `dsv4 bench` sets its cases up with (src/runtime/: random fills, the
// ceiling GEMM, streams, synchronization) on a machine without a GPU: a dsv4::Error naming the
// caller, never a crash, and what needs no device works. Which of the two builds this is comes
// from the library at run time (dsv4::cuda_built()): without the CUDA backend the *_none.cpp
// implementations answer ("CUDA backend not built"); with it, the CUDA runtime finds no device.
// On a GPU machine the GPU suite and `dsv4 bench` exercise the real thing.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "dsv4/device_tensor.h"
#include "dsv4/status.h"
#include "runtime/ceiling_gemm.h"
#include "runtime/device_runtime.h"
#include "runtime/random_fill.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;
using dsv4::TensorView;

// Runs `call`, expects a dsv4::Error containing `needle`.
template <class Call>
void expect_error(Call&& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A view that claims to live on the GPU (never dereferenced: each call here fails first).
TensorView on_cuda(const HostTensor& t) {
  TensorView v = t.view();
  v.device = dsv4::Device::cuda;
  return v;
}

class RuntimeWithoutGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (dsv4::cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  }
  bool built = dsv4::cuda_built();
};

TEST_F(RuntimeWithoutGpu, ReportsTheBuildAndNoDevice) {
  EXPECT_EQ(dsv4::rt::built(), built);
  EXPECT_FALSE(dsv4::rt::device_available());
  std::string why;
  EXPECT_TRUE(dsv4::rt::devices(&why).empty());
  EXPECT_FALSE(why.empty());
}

TEST_F(RuntimeWithoutGpu, RandomFillsNeedADeviceUnlessEmpty) {
  HostTensor host(DType::int32, {16});
  // An empty fill is nothing to do, in either build.
  dsv4::rt::fill_random_bf16(host.view().data, 0, 1, -1.0f, 1.0f, nullptr);
  dsv4::rt::fill_random_int32(host.data<int32_t>(), 0, 1, 7, nullptr);
  const std::string suffix = built ? "" : ": CUDA backend not built";
  expect_error([&] { dsv4::rt::fill_random_bf16(host.view().data, 16, 1, -1.0f, 1.0f, nullptr); },
               "fill_random_bf16" + suffix);
  expect_error([&] { dsv4::rt::fill_random_int32(host.data<int32_t>(), 16, 1, 7, nullptr); },
               "fill_random_int32" + suffix);
}

TEST_F(RuntimeWithoutGpu, CeilingGemmNeedsTheCudaBackend) {
  const HostTensor a(DType::bf16, {128, 128}), b(DType::bf16, {128, 128}), d(DType::bf16, {128, 128});
  const HostTensor d_fp32(DType::fp32, {128, 128}), workspace(DType::uint8, {1024});
  if (!built) {
    expect_error([&] { dsv4::rt::CeilingGemm("ceilings", on_cuda(a), on_cuda(b), on_cuda(d), on_cuda(workspace)); },
                 "ceilings: CUDA backend not built");
    return;
  }
  // Built with CUDA: the arguments are checked before any CUDA call, then the missing device fails.
  expect_error([&] { dsv4::rt::CeilingGemm("ceilings", on_cuda(a), on_cuda(b), on_cuda(d_fp32), on_cuda(workspace)); },
               "ceilings: d.dtype");
  expect_error([&] { dsv4::rt::CeilingGemm("ceilings", on_cuda(a), b.view(), on_cuda(d), on_cuda(workspace)); },
               "ceilings: b.device");
  EXPECT_THROW(dsv4::rt::CeilingGemm("ceilings", on_cuda(a), on_cuda(b), on_cuda(d), on_cuda(workspace)),
               dsv4::Error);
}

TEST_F(RuntimeWithoutGpu, StreamsAndSynchronization) {
  EXPECT_THROW(dsv4::rt::OwnedStream(), dsv4::Error);
  if (built) {
    // The CUDA runtime has no device to wait for.
    expect_error([] { dsv4::rt::synchronize_stream(nullptr, "setup"); }, "setup");
    expect_error([] { dsv4::rt::synchronize_device("setup"); }, "setup");
  } else {
    // Nothing can have been enqueued: there is nothing to wait for.
    dsv4::rt::synchronize_stream(nullptr, "setup");
    dsv4::rt::synchronize_device("setup");
  }
}

}  // namespace
