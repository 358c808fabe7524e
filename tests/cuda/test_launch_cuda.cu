// launch_kernel (src/cuda/common/launch.cuh), on the GPU: kernels launched as programmatic
// dependents still see everything the kernels before them wrote. Each producer calls
// grid_dependency_entry() first, which lets its successor launch at once; the successor's CTAs
// are then resident while the producer still spins, so a successor that did not wait would read
// the poison. Covered: a direct successor, a successor two kernels down (the wait is transitive
// only because the kernel between waits too), a successor on another stream behind an event, a
// captured graph replayed over fresh poison, and a bad launch naming its op.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/common/launch.cuh"
#include "dsv4/status.h"
#include "gpu_test_util.h"

namespace {

using dsv4::cuda::grid_dependency_entry;
using dsv4::cuda::launch_kernel;
using dsv4::cuda::LaunchShape;
using dsv4::test::DeviceBuffer;

constexpr int kN = 4096;
constexpr long long kSpin = 2'000'000;  // ~1 ms: far longer than a launch takes
constexpr int32_t kPoison = -1;

// Spins ~`cycles` clocks after its entry (its successor may launch meanwhile), then writes
// value + i to out[i].
__global__ void late_fill(int32_t* out, int n, int32_t value, long long cycles) {
  grid_dependency_entry();
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = value + i;
}

// Touches nothing: only waits, as every kernel of the library does.
__global__ void waits_only(int) { grid_dependency_entry(); }

// dst[i] = src[i] + 1.
__global__ void add_one(const int32_t* src, int32_t* dst, int n) {
  grid_dependency_entry();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i] + 1;
}

const LaunchShape kShape{dim3(8), dim3(128)};

class ProgrammaticLaunch : public ::testing::Test {
 protected:
  void SetUp() override {
    DSV4_SKIP_WITHOUT_GPU();
    DSV4_ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    src = std::make_unique<DeviceBuffer<int32_t>>(kN);
    dst = std::make_unique<DeviceBuffer<int32_t>>(kN);
  }
  void TearDown() override {
    if (s) cudaStreamDestroy(s);
  }
  void poison() {
    DSV4_ASSERT_CUDA(cudaMemsetAsync(src->data(), 0xFF, sizeof(int32_t) * kN, s));
    DSV4_ASSERT_CUDA(cudaMemsetAsync(dst->data(), 0xFF, sizeof(int32_t) * kN, s));
  }
  // Waits for `s` and checks dst[i] == value + i + 1 everywhere.
  void expect_filled_plus_one(int32_t value) {
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const std::vector<int32_t> got = dst->download();
    int bad = 0;
    for (int i = 0; i < kN; ++i) bad += got[static_cast<size_t>(i)] != value + i + 1;
    EXPECT_EQ(bad, 0) << "dst[0] = " << got[0] << " (poison " << kPoison << ")";
  }
  cudaStream_t s = nullptr;
  std::unique_ptr<DeviceBuffer<int32_t>> src, dst;
};

TEST_F(ProgrammaticLaunch, ASuccessorSeesItsPredecessorsWrites) {
  for (int32_t value : {3, 1000}) {
    poison();
    launch_kernel("late_fill", late_fill, kShape, s, src->data(), kN, value, kSpin);
    launch_kernel("add_one", add_one, kShape, s, src->data(), dst->data(), kN);
    expect_filled_plus_one(value);
  }
}

TEST_F(ProgrammaticLaunch, TheWaitIsTransitiveThroughAKernelThatOnlyWaits) {
  poison();
  launch_kernel("late_fill", late_fill, kShape, s, src->data(), kN, 7, kSpin);
  for (int k = 0; k < 3; ++k) launch_kernel("waits_only", waits_only, kShape, s, k);
  launch_kernel("add_one", add_one, kShape, s, src->data(), dst->data(), kN);
  expect_filled_plus_one(7);
}

TEST_F(ProgrammaticLaunch, ASuccessorOnAnotherStreamWaitsForTheEvent) {
  cudaStream_t other = nullptr;
  cudaEvent_t filled = nullptr;
  DSV4_ASSERT_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  DSV4_ASSERT_CUDA(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming));
  poison();
  launch_kernel("late_fill", late_fill, kShape, s, src->data(), kN, 11, kSpin);
  DSV4_ASSERT_CUDA(cudaEventRecord(filled, s));
  DSV4_ASSERT_CUDA(cudaStreamWaitEvent(other, filled, 0));
  launch_kernel("add_one", add_one, kShape, other, src->data(), dst->data(), kN);
  DSV4_ASSERT_CUDA(cudaEventRecord(filled, other));
  DSV4_ASSERT_CUDA(cudaStreamWaitEvent(s, filled, 0));
  expect_filled_plus_one(11);
  cudaEventDestroy(filled);
  cudaStreamDestroy(other);
}

TEST_F(ProgrammaticLaunch, ACapturedChainReplaysInOrder) {
  cudaGraph_t graph = nullptr;
  DSV4_ASSERT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  launch_kernel("late_fill", late_fill, kShape, s, src->data(), kN, 21, kSpin);
  launch_kernel("waits_only", waits_only, kShape, s, 0);
  launch_kernel("add_one", add_one, kShape, s, src->data(), dst->data(), kN);
  DSV4_ASSERT_CUDA(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  DSV4_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    poison();
    DSV4_ASSERT_CUDA(cudaGraphLaunch(exec, s));
    expect_filled_plus_one(21);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_F(ProgrammaticLaunch, ABadLaunchThrowsNamingTheOp) {
  const LaunchShape too_wide{dim3(1), dim3(4096)};  // over the 1024 threads a block may have
  try {
    launch_kernel("the_op", waits_only, too_wide, s, 0);
    FAIL() << "expected dsv4::Error";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the_op"), std::string::npos) << e.what();
  }
  // The stream still works.
  poison();
  launch_kernel("late_fill", late_fill, kShape, s, src->data(), kN, 5, 0);
  launch_kernel("add_one", add_one, kShape, s, src->data(), dst->data(), kN);
  expect_filled_plus_one(5);
}

}  // namespace
