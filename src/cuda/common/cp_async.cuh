// cp.async commit/wait groups, for kernels that wait on their own cp.async (ptx.cuh's gathers)
// with cp.async.wait_group rather than an mbarrier.
#pragma once

namespace dsv4::cuda::ptx {

// Closes the group of cp.async issued by this thread since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace dsv4::cuda::ptx
