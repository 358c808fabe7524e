// CUDA implementation of src/runtime/posted_copy.h: the page-locked post and staging, and the
// take kernel that a replayed decode step runs first.
#include "runtime/posted_copy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "cuda/common/check.h"
#include "cuda/common/launch.cuh"

namespace dsv4::rt {
namespace {

using cuda::check_cuda;
using cuda::grid_dependency_entry;
constexpr const char* kWhere = "PostedCopy";

// What the host fills in per post (page-locked, mapped: the take kernel reads it over the bus).
struct Post {
  uint64_t seq;    // the post's number (1, 2, ...)
  int64_t lo, hi;  // bytes [lo, hi) of the staging, to the same offsets of the destination
};
// The post and, on a line of its own, what the device writes back.
struct Mailbox {
  Post post;
  alignas(64) uint64_t taken;  // the number of the last post a take copied
};

// One CTA moves up to kThreads · 16 · kUnroll = 64 KB per round trip over the bus: enough bytes in
// flight to keep a PCIe link busy, so a bigger grid (with its cross-CTA hand-off before `taken`)
// would not be faster. A decode step posts a few KB; a step whose batch changed posts its whole plan.
constexpr int kThreads = 1024;
constexpr int kUnroll = 4;
constexpr int64_t kEarlyBytes = int64_t{kThreads} * 16;

// Each thread loads its word of the staging's first `early_bytes` while thread 0 loads the post:
// one round trip over the bus for what most posts hold (a patched decode step's bytes start at 0,
// where the per-step arrays are), a second only for bytes beyond that window.
__global__ void __launch_bounds__(kThreads)
    take_kernel(const Mailbox* box, uint64_t* taken, const uint8_t* staging, int64_t early_bytes, uint8_t* dst) {
  grid_dependency_entry();
  __shared__ Post post;
  const int64_t mine = int64_t{threadIdx.x} * 16;
  uint4 early{};
  // .cv: fetched anew from the host every time, never from a cache line of an older post.
  if (mine < early_bytes) early = __ldcv(reinterpret_cast<const uint4*>(staging + mine));
  if (threadIdx.x == 0) {
    const volatile Post* p = &box->post;
    post.seq = p->seq;
    post.lo = p->lo;
    post.hi = p->hi;
  }
  __syncthreads();
  const int64_t lo = post.lo, hi = post.hi;
  if (mine < early_bytes && mine >= lo && mine < hi) *reinterpret_cast<uint4*>(dst + mine) = early;
  constexpr int64_t kStride = int64_t{kThreads} * 16;
  const int64_t rest = lo > early_bytes ? lo : early_bytes;
  for (int64_t base = rest + mine; base < hi; base += kStride * kUnroll) {
    uint4 word[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t at = base + u * kStride;
      if (at < hi) word[u] = __ldcv(reinterpret_cast<const uint4*>(staging + at));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t at = base + u * kStride;
      if (at < hi) *reinterpret_cast<uint4*>(dst + at) = word[u];
    }
  }
  __syncthreads();  // every read of the staging has returned: the host may reuse it
  if (threadIdx.x == 0) *reinterpret_cast<volatile uint64_t*>(taken) = post.seq;
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

template <class T>
T* device_address(T* host, const char* what) {
  void* dev = nullptr;
  check_cuda(cudaHostGetDevicePointer(&dev, host, 0), kWhere, what);
  return static_cast<T*>(dev);
}

}  // namespace

struct PostedCopy::State {
  Mailbox* box = nullptr;
  Mailbox* box_dev = nullptr;
  uint8_t* staging = nullptr;
  const uint8_t* staging_dev = nullptr;
  int64_t capacity = 0;
  uint64_t posted = 0;    // posts made
  uint64_t confirmed = 0; // posts whose take was confirmed enqueued

  ~State() {
    if (staging) cudaFreeHost(staging);
    if (box) cudaFreeHost(box);
  }
};

PostedCopy::PostedCopy() : s_(std::make_unique<State>()) {
  void* p = nullptr;
  check_cuda(cudaHostAlloc(&p, sizeof(Mailbox), cudaHostAllocMapped | cudaHostAllocPortable), kWhere,
             "cudaHostAlloc (post)");
  s_->box = new (p) Mailbox{};
  s_->box_dev = device_address(s_->box, "cudaHostGetDevicePointer (post)");
}

PostedCopy::~PostedCopy() = default;

uint64_t PostedCopy::taken() const { return __atomic_load_n(&s_->box->taken, __ATOMIC_ACQUIRE); }

void PostedCopy::wait_taken(uint64_t seq, Stream stream) {
  for (uint32_t spins = 0; taken() < seq; ++spins) {
    if ((spins & 1023) == 1023) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess && taken() < seq)
        fail(kWhere, ": the stream finished without taking post ", seq, " (taken: ", taken(), ")");
      if (e != cudaSuccess && e != cudaErrorNotReady) check_cuda(e, kWhere, "cudaStreamQuery");
    }
    cpu_relax();
  }
}

void PostedCopy::settle(Stream stream) {
  State& s = *s_;
  if (s.posted == s.confirmed) return;
  // The last post's take was never confirmed (its forward threw): once the stream drained, the
  // device has taken it or never will; either way its number is settled.
  check_cuda(cudaStreamSynchronize(stream), kWhere, "cudaStreamSynchronize");
  s.posted = s.confirmed = taken();
}

bool PostedCopy::reserve(int64_t bytes, Stream stream) {
  State& s = *s_;
  if (bytes <= s.capacity) return false;
  settle(stream);
  wait_taken(s.posted, stream);  // no take reads the staging while it moves
  const int64_t capacity = (bytes + 4095) / 4096 * 4096;
  void* p = nullptr;
  check_cuda(cudaHostAlloc(&p, static_cast<size_t>(capacity), cudaHostAllocMapped | cudaHostAllocPortable),
             kWhere, "cudaHostAlloc (staging)");
  if (s.staging) cudaFreeHost(s.staging);
  s.staging = static_cast<uint8_t*>(p);
  s.staging_dev = device_address(s.staging, "cudaHostGetDevicePointer (staging)");
  s.capacity = capacity;
  return true;
}

int64_t PostedCopy::capacity() const { return s_->capacity; }

void PostedCopy::post(const uint8_t* src, int64_t lo, int64_t hi, Stream stream) {
  State& s = *s_;
  DSV4_CHECK(lo >= 0 && lo <= hi && lo % kAlign == 0 && hi % kAlign == 0, kWhere, ": post of bytes [", lo,
             ", ", hi, "): expected a range aligned to ", kAlign);
  settle(stream);
  DSV4_CHECK(hi <= s.capacity, kWhere, ": post of bytes [", lo, ", ", hi, ") beyond the staging's ",
             s.capacity, " (reserve first)");
  wait_taken(s.posted, stream);
  std::memcpy(s.staging + lo, src + lo, static_cast<size_t>(hi - lo));
  Post& p = s.box->post;
  p.lo = lo;
  p.hi = hi;
  // The launch that follows reaches the device after these stores (the driver's doorbell write is
  // ordered after them); the fence keeps the compiler from sinking them past it.
  __atomic_store_n(&p.seq, ++s.posted, __ATOMIC_RELEASE);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

void PostedCopy::take(uint8_t* dst, Stream stream) {
  const State& s = *s_;
  DSV4_CHECK(s.capacity > 0, kWhere, "::take: no staging (reserve first)");
  cuda::launch_kernel("PostedCopy::take", take_kernel, {1, kThreads, 0}, stream, s.box_dev, &s.box_dev->taken,
                      s.staging_dev, std::min(s.capacity, kEarlyBytes), dst);
}

void PostedCopy::taken_enqueued() { s_->confirmed = s_->posted; }

}  // namespace dsv4::rt
