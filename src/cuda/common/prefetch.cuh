// L2 prefetches: warm L2 with bytes a later load will need, without holding registers.
#pragma once

#include <cstdint>

namespace dsv4::cuda::ptx {

// The cache line holding `p`.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
// `bytes` bytes from `p` (both multiples of 16) in one bulk request (sm_90).
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

}  // namespace dsv4::cuda::ptx
