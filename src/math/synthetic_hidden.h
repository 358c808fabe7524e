// The formula of dsv4::synthetic_hidden (include/dsv4/synthetic.h), shared by the CPU op and the
// CUDA kernel so both write the same bits.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSV4_SYN_HD __host__ __device__ __forceinline__
#else
#define DSV4_SYN_HD inline
#endif

namespace dsv4::synthetic_math {

DSV4_SYN_HD uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Element i of the row of (seed, req, pos): four 16-bit uniforms of one 64-bit hash, summed.
DSV4_SYN_HD float value(uint64_t seed, int64_t req, int64_t pos, int64_t i) {
  const uint64_t key = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(req) * 0x100000001B3ull ^
                                                    splitmix64(static_cast<uint64_t>(pos))));
  const uint64_t h = splitmix64(key + static_cast<uint64_t>(i));
  float sum = 0.0f;
  for (int k = 0; k < 4; ++k) sum += static_cast<float>((h >> (16 * k)) & 0xFFFF) * (1.0f / 65536.0f);
  // Mean 2, variance 4/12: centre and scale to variance 1 (1.7320508 = sqrt(3)).
  return (sum - 2.0f) * 1.7320508f;
}

}  // namespace dsv4::synthetic_math
