// One warp's RMSNorm factor of a row, 1 / sqrt(mean(x²) + eps), bit-identical to the CPU
// reference (src/math/rms_norm.h): lane l adds the squares of its chunks l, l + 32, … (8
// consecutive elements each, in index order — the elements it loads with one 16-byte access),
// then the butterfly of __shfl_xor_sync combines the 32 partials exactly as
// math::rms_combine_lanes does. Every lane ends with the same factor.
#pragma once

#include <cstdint>

#include "math/rms_norm.h"

namespace dsv4::cuda {

// Adds the squares of one chunk's first `count` values to a lane's partial (index order).
__device__ __forceinline__ float rms_accumulate_chunk(float partial, const float* v, int count) {
#pragma unroll
  for (int k = 0; k < math::kRmsChunk; ++k)
    if (k < count) partial = math::rms_accumulate(partial, v[k]);
  return partial;
}

// The warp's total of the lanes' partials (math::rms_combine_lanes), in every lane. All 32 lanes
// must call it.
__device__ __forceinline__ float warp_rms_total(float partial) {
#pragma unroll
  for (int off = math::kRmsLanes / 2; off > 0; off /= 2)
    partial = ieee_add(partial, __shfl_xor_sync(0xffffffffu, partial, off));
  return partial;
}

}  // namespace dsv4::cuda
