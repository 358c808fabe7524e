// One warp's RMSNorm factor of a row, 1 / sqrt(mean(x²) + eps), summed in exactly the order of
// the CPU reference (cpu::rms_sum_of_squares, src/cpu/norm_math.h): lane j accumulates elements
// j, j + 32, … in index order, then the xor butterfly adds the 32 partials pairwise (offsets
// 16 … 1). Every lane returns the same, bit-identical value. All 32 lanes must call it.
#pragma once

#include <cstdint>

#include "cpu/norm_math.h"

namespace dsv4::cuda {

// load(i) returns element i (0 <= i < n) of the row as float.
template <typename Load>
__device__ __forceinline__ float warp_rms_inverse(const Load& load, int64_t n, float eps, int lane) {
  static_assert(cpu::kRmsLanes == 32, "the reduction order is one warp's");
  float partial = 0.0f;
  for (int64_t i = lane; i < n; i += 32) partial = cpu::rms_accumulate(partial, load(i));
  for (int w = 16; w >= 1; w /= 2) partial = ieee_add(partial, __shfl_xor_sync(0xffffffffu, partial, w));
  // Every lane's loads have been consumed by the reduction: the row may now be overwritten in
  // place by any lane (the sync also orders the memory accesses of the two phases).
  __syncwarp();
  return cpu::rms_inverse_of_sum(partial, n, eps);
}

}  // namespace dsv4::cuda
