// The sparse decode kernel's trace points: without -DDSV4_KERNEL_TRACE every point is an empty
// statement and the kernel's code does not change. bench/trace/decode_trace_summary.py reads
// the traces.
#pragma once

#include "cuda/common/kernel_trace.cuh"

namespace dsv4::cuda::decode::detail {

#if defined(DSV4_KERNEL_TRACE)
// kernel_trace.cuh's events (a -DDSV4_KERNEL_TRACE build only). Traced: the grid's first row's
// first two CTAs (a cluster's pair). Per tile row t: the producer's thread 0 records 0 before
// its `empty` wait, 1 after it, 2 with the tile stored, 3 after the `full` arrive, 4 with the
// refill issued; warpgroup 0's thread 0: 5 before its stage wait, 6 after it, 7 with S done,
// 8 after the p_free wait, 9 after the p_ready arrive, 10 with P·V done and the stage released;
// warpgroup 1's thread 0: 11 before its stage wait, 12 after it, 13 after the p_ready wait, 14
// with P·V done and the stage released. Once row: 0 kernel entry, 1 past the block-wide barrier,
// 2 Q loaded, 3 warpgroup 0's last tile done, 4 its O stored, 5 / 6 the producer's start / end,
// 7 warpgroup 1's O stored.
__device__ __forceinline__ int trace_cta() {
  const int x = static_cast<int>(blockIdx.x);
  return blockIdx.y == 0 && x < trace::kCtas ? x : -1;
}
__device__ __forceinline__ int trace_tile(int t) { return t < trace::kOnceRow ? t : -1; }
#endif

}  // namespace dsv4::cuda::decode::detail
