// run_fanned_out (src/cuda/common/stream_fanout.h), on the GPU: the pieces see everything the
// caller's stream did before (the fork), the caller's stream sees everything the pieces did (the
// join) — both provoked with slow kernels that would leave poisoned values otherwise — with more
// pieces than streams, inside a stream capture replayed with new inputs, and after a piece throws.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/common/stream_fanout.h"
#include "dsv4/status.h"
#include "gpu_test_util.h"

namespace {

using dsv4::test::DeviceBuffer;

// Spins ~`cycles` clocks, then writes value + i to out[i] (i < n): a late writer.
__global__ void late_fill(int32_t* out, int n, int32_t value, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = value + i;
}

// Spins, then dst[i] = src[i] + 1000 * piece: a late reader and writer.
__global__ void late_copy(const int32_t* src, int32_t* dst, int n, int piece, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i] + 1000 * piece;
}

constexpr int kPieces = 2 * dsv4::cuda::kMaxFanout + 3;  // more pieces than streams
constexpr int kRow = 64;
constexpr long long kSpin = 2'000'000;  // ~1 ms: far longer than the launches take

// src (late) → each piece copies its row (late) → the caller copies everything to out.
void enqueue_fanout(cudaStream_t s, int32_t* src, int32_t* mid, int32_t* out, int32_t value) {
  late_fill<<<1, 128, 0, s>>>(src, kPieces * kRow, value, kSpin);
  dsv4::cuda::run_fanned_out("test", s, kPieces, [&](int i, dsv4::Stream ps) {
    late_copy<<<1, 64, 0, ps>>>(src + i * kRow, mid + i * kRow, kRow, i, kSpin / 4);
  });
  cudaMemcpyAsync(out, mid, sizeof(int32_t) * kPieces * kRow, cudaMemcpyDeviceToDevice, s);
}

// The buffers of one test: src (filled late), mid (the pieces' rows), out (the caller's copy).
struct Buffers {
  DeviceBuffer<int32_t> src{kPieces * kRow}, mid{kPieces * kRow}, out{kPieces * kRow};
  void enqueue(cudaStream_t s, int32_t value) { enqueue_fanout(s, src.data(), mid.data(), out.data(), value); }
  // Poisons mid and out, runs `launch` (which enqueues on `s`), waits, and checks out.
  template <class Launch>
  void run_and_check(cudaStream_t s, int32_t value, Launch&& launch) {
    DSV4_ASSERT_CUDA(cudaMemset(mid.data(), 0xFF, sizeof(int32_t) * mid.size()));
    DSV4_ASSERT_CUDA(cudaMemset(out.data(), 0xFF, sizeof(int32_t) * out.size()));
    launch();
    DSV4_ASSERT_CUDA(cudaStreamSynchronize(s));
    const std::vector<int32_t> got = out.download();
    for (int i = 0; i < kPieces; ++i)
      for (int k = 0; k < kRow; ++k)
        ASSERT_EQ(got[static_cast<size_t>(i * kRow + k)], value + i * kRow + k + 1000 * i)
            << "piece " << i << " elem " << k;
  }
};

// A fresh non-blocking stream per test (what a serving engine hands the layer).
class StreamFanout : public ::testing::Test {
 protected:
  void SetUp() override {
    DSV4_SKIP_WITHOUT_GPU();
    DSV4_ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    b = std::make_unique<Buffers>();
  }
  void TearDown() override {
    if (s) cudaStreamDestroy(s);
  }
  cudaStream_t s = nullptr;
  std::unique_ptr<Buffers> b;  // made after the GPU check
};

TEST_F(StreamFanout, PiecesRunAfterTheCallersWorkAndBeforeItsNext) {
  for (int32_t value : {5, 77}) b->run_and_check(s, value, [&] { b->enqueue(s, value); });
}

TEST_F(StreamFanout, CapturedPiecesReplayAsParallelBranches) {
  // The captured fill writes value 0 at every replay; the poison between replays shows a replay
  // that reads or writes out of order.
  cudaGraph_t graph;
  DSV4_ASSERT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  b->enqueue(s, 0);
  DSV4_ASSERT_CUDA(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  DSV4_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) b->run_and_check(s, 0, [&] { cudaGraphLaunch(exec, s); });
  DSV4_ASSERT_CUDA(cudaGraphExecDestroy(exec));
  DSV4_ASSERT_CUDA(cudaGraphDestroy(graph));
}

TEST_F(StreamFanout, AThrowingPieceStillJoinsAndTheErrorPropagates) {
  // Inside a capture too: a side stream left unjoined would make EndCapture fail.
  DSV4_ASSERT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  EXPECT_THROW(dsv4::cuda::run_fanned_out("test", s, kPieces,
                                          [&](int i, dsv4::Stream ps) {
                                            late_copy<<<1, 64, 0, ps>>>(b->src.data(), b->mid.data(), kRow, i, 10);
                                            if (i == 5) dsv4::fail("piece 5 failed");
                                          }),
               dsv4::Error);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  if (graph) cudaGraphDestroy(graph);
  // The pool still works afterwards.
  b->run_and_check(s, 9, [&] { b->enqueue(s, 9); });
  EXPECT_THROW(dsv4::cuda::run_fanned_out("test", s, 0, [](int, dsv4::Stream) {}), dsv4::Error);
}

}  // namespace
