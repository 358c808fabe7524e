#include "cuda/common/stream_fanout.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <exception>
#include <map>
#include <vector>

#include "cuda/common/capture_mode.h"
#include "cuda/common/check.h"

namespace dsv4::cuda {
namespace {

struct SidePool {
  cudaEvent_t fork = nullptr;
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> done;  // one per side stream
};

// The current device's pool for this thread, with at least `sides` side streams.
SidePool& side_pool(const char* where, int sides) {
  thread_local std::map<int, SidePool> pools;  // by device; never destroyed (see the header)
  int device = 0;
  DSV4_CUDA_CHECK(where, cudaGetDevice(&device));
  SidePool& pool = pools[device];
  if (pool.fork != nullptr && static_cast<int>(pool.streams.size()) >= sides) return pool;
  cudaError_t err = cudaSuccess;
  {
    const RelaxedCaptureMode relaxed(where);  // the creation may fall inside a capture
    if (pool.fork == nullptr) err = cudaEventCreateWithFlags(&pool.fork, cudaEventDisableTiming);
    while (err == cudaSuccess && static_cast<int>(pool.streams.size()) < sides) {
      cudaStream_t s = nullptr;
      cudaEvent_t e = nullptr;
      err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (err == cudaSuccess) err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      if (err != cudaSuccess) break;
      pool.streams.push_back(s);
      pool.done.push_back(e);
    }
  }
  check_cuda(err, where, "creating the side streams of a fanned-out op");
  return pool;
}

}  // namespace

void run_fanned_out(const char* where, Stream stream, int n,
                    const std::function<void(int piece, Stream piece_stream)>& piece) {
  DSV4_CHECK(n >= 1, where, ": run_fanned_out: expected n >= 1 pieces, got ", n);
  const int width = std::min(n, kMaxFanout);
  if (width == 1) {
    for (int i = 0; i < n; ++i) piece(i, stream);
    return;
  }
  SidePool& pool = side_pool(where, width - 1);
  DSV4_CUDA_CHECK(where, cudaEventRecord(pool.fork, stream));
  int forked = 0;
  std::exception_ptr failure;
  try {
    for (; forked < width - 1; ++forked)
      DSV4_CUDA_CHECK(where, cudaStreamWaitEvent(pool.streams[static_cast<size_t>(forked)], pool.fork, 0));
    for (int i = 0; i < n; ++i)
      piece(i, i % width == 0 ? stream : pool.streams[static_cast<size_t>(i % width - 1)]);
  } catch (...) {
    failure = std::current_exception();
  }
  // Join every side stream that was forked, even after a failure (a capture must end joined).
  for (int i = 0; i < forked; ++i) {
    const size_t k = static_cast<size_t>(i);
    cudaError_t err = cudaEventRecord(pool.done[k], pool.streams[k]);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(stream, pool.done[k], 0);
    if (err != cudaSuccess && !failure) failure = std::make_exception_ptr(Error(detail::concat(
        where, ": joining a side stream: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")")));
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace dsv4::cuda
