// Warp-per-row building blocks of the index kernels (src/cuda/index/*.cu): each warp owns one
// token row, so a row's packing and counting need no shared memory and no __syncthreads, and the
// order of the packed entries is fixed (lane order within each 32-entry round, rounds in order) —
// the CPU reference's order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.h"

namespace dsv4::cuda::index_rows {

inline constexpr int kWarpsPerBlock = 8;
inline constexpr int kThreadsPerBlock = 32 * kWarpsPerBlock;
inline constexpr unsigned kFullMask = 0xffffffffu;

// The row (token) of the calling warp; rows >= num_rows have nothing to do (a whole warp leaves).
__device__ __forceinline__ int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
}
__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x % 32); }

// One round of a stable warp-wide compaction: every lane of the warp calls it (the same number of
// rounds on all lanes); lanes with `keep` store `value` at out[count + (keeping lanes below)].
// Returns the new count (count + keeping lanes), the same on every lane.
__device__ __forceinline__ int pack_round(bool keep, int32_t value, int32_t* out, int count) {
  const unsigned kept = __ballot_sync(kFullMask, keep);
  const unsigned below = kept & ((1u << lane_id()) - 1u);
  if (keep) out[count + __popc(below)] = value;
  return count + __popc(kept);
}

// Sum of one int over the warp (fixed butterfly order), the same on every lane.
__device__ __forceinline__ int warp_sum(int v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Blocks for `rows` warp-rows; a grid beyond the launch limit (2^31 - 1 blocks) is a dsv4::Error.
inline unsigned blocks_for(const char* where, int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  DSV4_CHECK(blocks <= 2147483647, where, ": ", rows, " rows exceed the grid limit");
  return static_cast<unsigned>(blocks);
}

}  // namespace dsv4::cuda::index_rows
