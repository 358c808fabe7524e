// fence_after_loads.cu: does the decode producer's proxy fence, or its release arrive on the
// stage's mbarrier, wait for the thread's global loads still in flight?
//
// Why: the sparse decode's producer refills its registers with the tile after next while it stores
// the current one (kRefillWhileStoring, src/cuda/attention/sparse_decode/producer.cuh), then fences
// the stores to the async proxy (fence.proxy.async.shared::cta, which ptxas emits as MEMBAR.ALL.CTA
// + FENCE.VIEW.ASYNC.S) and arrives on the stage's `full` barrier (a release at CTA scope). If
// either waits until the loads just issued have returned, each tile's period holds a whole gather
// latency after its stores however far ahead the loads were meant to run, and the latency's cost
// in cycles grows with the clock (the peak H128 case's cycles per call rise more than FlashMLA's
// between 1.35 and 1.9 GHz: docs/notes/decode.md).
//
// Each thread issues 8 independent 16-byte read-only loads at random places of a B-megabyte
// buffer (beyond the L2 for the default 1024 MB, so most come from DRAM), reads the clock, does
// one of the operations below, reads the clock, then uses the loads' values and reads it again.
// Printed per operation, median over threads and repeats: cycles from the loads' issue to after
// the operation (op) and to after the values are used (use). An operation that waits for the
// loads shows op ≈ use; one that does not shows op near its own cost.
//   none       nothing
//   proxy      fence.proxy.async.shared::cta (the producer's fence)
//   arrive     mbarrier.arrive.shared::cta (release, CTA scope: the producer's arrive)
//   fence_cta  fence.acq_rel.cta (__threadfence_block)
//   sts_proxy  16 bytes stored to shared memory, then the proxy fence
//
// Build and run (device):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o /tmp/fal bench/experiments/fence_after_loads.cu
//   /tmp/fal 1024; /tmp/fal 16        # buffer MB (16: L2-resident)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));   \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

namespace {

constexpr int kLoads = 8;  // a MODEL1 cluster producer thread's refill: 7 fp8 chunks and its rope
constexpr int kThreads = 128;
constexpr int kRepeats = 16;
enum Op { kNone, kProxy, kArrive, kFenceCta, kStsProxy, kOps };
const char* const kOpNames[kOps] = {"none", "proxy", "arrive", "fence_cta", "sts_proxy"};

__device__ __forceinline__ uint64_t clock_now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ uint4 load_nc(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t mix(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return x;
}

template <int kOp>
__global__ void __launch_bounds__(kThreads) time_op(const uint8_t* buf, uint64_t chunks, uint32_t seed,
                                                    uint32_t* op_cycles, uint32_t* use_cycles, uint32_t* sink) {
  __shared__ alignas(16) uint8_t stage[kThreads * 16];
  __shared__ uint64_t bar;
  // The repeats' timings wait in shared memory: a global store still in flight would be one more
  // thing for the next repeat's fence to wait for.
  __shared__ uint32_t op_at[kRepeats][kThreads], use_at[kRepeats][kThreads];
  const uint32_t bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
  if (threadIdx.x == 0)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar_addr), "r"(kThreads) : "memory");
  __syncthreads();
  const uint32_t tid = blockIdx.x * kThreads + threadIdx.x;
  uint32_t acc = 0;
  for (int rep = 0; rep < kRepeats; ++rep) {
    uint4 v[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const uint64_t at = mix(tid * 977u + rep * 131u + i * 7919u + seed) % chunks;
      v[i] = load_nc(buf + at * 16);
    }
    const uint64_t t0 = clock_now();
    if constexpr (kOp == kProxy) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    } else if constexpr (kOp == kArrive) {
      asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}" ::"r"(bar_addr) : "memory");
    } else if constexpr (kOp == kFenceCta) {
      asm volatile("fence.acq_rel.cta;" ::: "memory");
    } else if constexpr (kOp == kStsProxy) {
      *reinterpret_cast<uint4*>(stage + threadIdx.x * 16) = make_uint4(tid, rep, 0u, 0u);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    const uint64_t t1 = clock_now();
#pragma unroll
    for (int i = 0; i < kLoads; ++i) acc += v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    asm volatile("" : "+r"(acc));
    const uint64_t t2 = clock_now();  // after the values are used (the empty asm above needs acc)
    op_at[rep][threadIdx.x] = static_cast<uint32_t>(t1 - t0);
    use_at[rep][threadIdx.x] = static_cast<uint32_t>(t2 - t0);
    __syncthreads();  // every thread's loads of this repeat are done before the next issue
  }
  for (int rep = 0; rep < kRepeats; ++rep) {
    op_cycles[tid * kRepeats + rep] = op_at[rep][threadIdx.x];
    use_cycles[tid * kRepeats + rep] = use_at[rep][threadIdx.x];
  }
  sink[tid] = acc;
}

uint32_t median(std::vector<uint32_t> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

template <int kOp>
void run(const uint8_t* buf, uint64_t chunks, int ctas, uint32_t* d_op, uint32_t* d_use, uint32_t* d_sink) {
  const size_t n = static_cast<size_t>(ctas) * kThreads * kRepeats;
  time_op<kOp><<<ctas, kThreads>>>(buf, chunks, 1u, d_op, d_use, d_sink);  // warm-up
  time_op<kOp><<<ctas, kThreads>>>(buf, chunks, 2u, d_op, d_use, d_sink);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<uint32_t> op(n), use(n);
  CHECK(cudaMemcpy(op.data(), d_op, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(use.data(), d_use, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  std::printf("%-10s op %6u cycles   use %6u cycles\n", kOpNames[kOp], median(op), median(use));
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t megabytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  if (megabytes < 1) {
    std::fprintf(stderr, "usage: %s [buffer MB]\n", argv[0]);
    return 2;
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const uint64_t bytes = megabytes << 20, chunks = bytes / 16;
  uint8_t* buf = nullptr;
  CHECK(cudaMalloc(&buf, bytes));
  CHECK(cudaMemset(buf, 1, bytes));
  const size_t n = static_cast<size_t>(sms) * kThreads * kRepeats;
  uint32_t *d_op = nullptr, *d_use = nullptr, *d_sink = nullptr;
  CHECK(cudaMalloc(&d_op, n * sizeof(uint32_t)));
  CHECK(cudaMalloc(&d_use, n * sizeof(uint32_t)));
  CHECK(cudaMalloc(&d_sink, static_cast<size_t>(sms) * kThreads * sizeof(uint32_t)));
  std::printf("%d loads of 16 B per thread, %llu MB buffer, %d CTAs of %d threads\n", kLoads,
              static_cast<unsigned long long>(megabytes), sms, kThreads);
  run<kNone>(buf, chunks, sms, d_op, d_use, d_sink);
  run<kProxy>(buf, chunks, sms, d_op, d_use, d_sink);
  run<kArrive>(buf, chunks, sms, d_op, d_use, d_sink);
  run<kFenceCta>(buf, chunks, sms, d_op, d_use, d_sink);
  run<kStsProxy>(buf, chunks, sms, d_op, d_use, d_sink);
  CHECK(cudaFree(buf));
  CHECK(cudaFree(d_op));
  CHECK(cudaFree(d_use));
  CHECK(cudaFree(d_sink));
  return 0;
}
