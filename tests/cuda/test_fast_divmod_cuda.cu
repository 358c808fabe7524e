// FastDivmod (src/cuda/common/fast_divmod.cuh), on the GPU: its multiply-high division equals n / d
// for divisors from 1 (the copy path) to 2^31 − 1 and dividends where an off-by-one would show —
// either side of every multiple tried, the largest dividend 2^31 − 1 — and random ones. The
// element-wise kernels (inv_rope_fp8_quant, indexer query rows) split flat indices with it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/fast_divmod.cuh"
#include "gpu_test_util.h"

namespace {

using dsv4::cuda::FastDivmod;
using dsv4::test::DeviceBuffer;

__global__ void divide_all(FastDivmod f, const uint32_t* n, uint32_t* q, int count) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < count) q[i] = f.div(n[i]);
}

TEST(FastDivmodCuda, EqualsIntegerDivision) {
  DSV4_SKIP_WITHOUT_GPU();
  constexpr uint32_t kMax = 0x7fffffffu;  // the largest dividend it takes
  std::mt19937 rng(5);
  std::vector<uint32_t> divisors = {1,     2,     3,     5,     7,     8,     60,    64,
                                    100,   128,   448,   512,   576,   1000,  4096,  65535,
                                    65536, (1u << 20) + 1, (1u << 30) - 1, 1u << 30, (1u << 30) + 1,
                                    kMax - 1, kMax};
  for (int i = 0; i < 40; ++i) divisors.push_back(std::uniform_int_distribution<uint32_t>(1, kMax)(rng));
  for (const uint32_t d : divisors) {
    SCOPED_TRACE(d);
    std::vector<uint32_t> n = {0, 1, d - 1, d, kMax, kMax - 1};
    const uint32_t top = kMax / d;  // the last multiple's quotient
    for (const uint32_t k : {1u, 2u, 3u, top / 2, top - 1, top})
      if (k >= 1 && k <= top)
        for (const int64_t m : {int64_t{k} * d - 1, int64_t{k} * d, int64_t{k} * d + d - 1})
          if (m <= kMax) n.push_back(static_cast<uint32_t>(m));
    for (int i = 0; i < 256; ++i) n.push_back(std::uniform_int_distribution<uint32_t>(0, kMax)(rng));
    const DeviceBuffer<uint32_t> n_d(n);
    DeviceBuffer<uint32_t> q_d(n.size());
    const int count = static_cast<int>(n.size());
    divide_all<<<(count + 127) / 128, 128>>>(FastDivmod::of(d), n_d.data(), q_d.data(), count);
    DSV4_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<uint32_t> q = q_d.download();
    for (size_t i = 0; i < n.size(); ++i) ASSERT_EQ(q[i], n[i] / d) << "n = " << n[i];
  }
}

TEST(FastDivmodCuda, RejectsDivisorsOutsideItsRange) {
  EXPECT_THROW(FastDivmod::of(0), dsv4::Error);
  EXPECT_THROW(FastDivmod::of(int64_t{1} << 31), dsv4::Error);
}

}  // namespace
