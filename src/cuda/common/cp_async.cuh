// cp.async pieces beyond ptx.cuh's 16-byte zero-filling gather: the 8-byte variant (MODEL1 scale
// rows are 8 bytes) and commit/wait groups, for kernels that pipeline gathers with
// cp.async.wait_group rather than mbarriers.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace dsv4::cuda::ptx {

// 8-byte global→shared copy; `valid` false: nothing is read, the 8 bytes are zero-filled.
__device__ __forceinline__ void cp_async_8_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(smem_addr(smem_dst)),
               "l"(gmem_src), "r"(valid ? 8 : 0)
               : "memory");
}
// Closes the group of cp.async issued by this thread since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace dsv4::cuda::ptx
