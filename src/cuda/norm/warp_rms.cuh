// One warp's RMSNorm factor of a row, 1 / sqrt(mean(x²) + eps), bit-identical to the CPU
// reference (cpu::rms_inverse, src/cpu/norm_math.h): the sum of squares is accumulated in index
// order, one element after the other, with the same IEEE-rounded steps. Every lane computes the
// whole sum itself — all lanes load the same element at each step (one broadcast transaction) —
// so they all hold the same value without a reduction. A strictly sequential sum is latency-bound
// (about 4 cycles per element), which is acceptable for these off-hot-path norms and keeps the
// reference's exact results.
#pragma once

#include <cstdint>

#include "cpu/norm_math.h"

namespace dsv4::cuda {

// load(i) returns element i (0 <= i < n) of the row as float. All 32 lanes must call it.
template <typename Load>
__device__ __forceinline__ float warp_rms_inverse(const Load& load, int64_t n, float eps) {
  float sum_sq = 0.0f;
#pragma unroll 8
  for (int64_t i = 0; i < n; ++i) sum_sq = cpu::rms_accumulate(sum_sq, load(i));
  // Every lane has read the whole row: from here on any lane may overwrite it in place (the
  // barrier also orders the two phases' memory accesses across the warp).
  __syncwarp();
  return cpu::rms_inverse_of_sum(sum_sq, n, eps);
}

}  // namespace dsv4::cuda
