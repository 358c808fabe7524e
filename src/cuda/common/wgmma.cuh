// Warpgroup matrix products (wgmma, sm_90a) over CuTe MMA atoms, as two calls a kernel can read:
//   wgmma_ss(mma, sA, sB, rC, zero_init)  rC (+)= sA · sBᵀ, both operands in shared memory
//   wgmma_rs(mma, rA, sB, rC, zero_init)  rC (+)= rA · sBᵀ, A from registers
// Both only ISSUE the instructions; the caller groups them with wgmma_commit() and waits with
// wgmma_wait<N>() (N = groups still allowed in flight), so products overlap with other work.
// Must be called by all 128 threads of one warpgroup.
#pragma once

#if defined(DSV4_HAVE_CUTLASS)
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>

namespace dsv4::cuda {

// kBegin/kEnd restrict the product to K steps [kBegin, kEnd) of the instruction's K (16 for bf16),
// so a product can start on the part of an operand that has already arrived (kEnd -1: all).
template <int kBegin = 0, int kEnd = -1, class TiledMma, class SmemA, class SmemB, class RegC>
__device__ __forceinline__ void wgmma_ss(TiledMma mma, const SmemA& sA, const SmemB& sB, RegC& rC,
                                         bool zero_init) {
  using namespace cute;
  auto thr = mma.get_slice(threadIdx.x % 128);
  Tensor tA = thr.partition_fragment_A(sA);  // smem descriptors, (MMA, MMA_M, MMA_K)
  Tensor tB = thr.partition_fragment_B(sB);
  constexpr int kSteps = decltype(size<2>(tA))::value;
  constexpr int kLast = kEnd < 0 ? kSteps : kEnd;
  static_assert(0 <= kBegin && kBegin < kLast && kLast <= kSteps, "K-step range out of bounds");
  warpgroup_fence_operand(rC);
  warpgroup_arrive();
  mma.accumulate_ = zero_init ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = kBegin; k < kLast; ++k) {
    cute::gemm(mma, tA(_, _, k), tB(_, _, k), rC);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_fence_operand(rC);
}

template <class TiledMma, class RegA, class SmemB, class RegC>
__device__ __forceinline__ void wgmma_rs(TiledMma mma, RegA& rA, const SmemB& sB, RegC& rC,
                                         bool zero_init) {
  using namespace cute;
  auto thr = mma.get_slice(threadIdx.x % 128);
  Tensor tB = thr.partition_fragment_B(sB);
  warpgroup_fence_operand(rA);
  warpgroup_fence_operand(rC);
  warpgroup_arrive();
  mma.accumulate_ = zero_init ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    cute::gemm(mma, rA(_, _, k), tB(_, _, k), rC);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_fence_operand(rC);
  warpgroup_fence_operand(rA);
}

__device__ __forceinline__ void wgmma_commit() { cute::warpgroup_commit_batch(); }
template <int kInFlight>
__device__ __forceinline__ void wgmma_wait() { cute::warpgroup_wait<kInFlight>(); }

// Accumulator fragment of an m64nN wgmma, per thread of the warpgroup: element i sits at
//   row = 16·warp + lane/4 + 8·((i/2)%2),  col = 8·(i/4) + 2·(lane%4) + i%2.
__device__ __forceinline__ int acc_row(int i, int thread_in_wg) {
  return 16 * (thread_in_wg / 32) + (thread_in_wg % 32) / 4 + 8 * ((i / 2) % 2);
}
__device__ __forceinline__ int acc_col(int i, int thread_in_wg) {
  return 8 * (i / 4) + 2 * (thread_in_wg % 4) + (i % 2);
}

}  // namespace dsv4::cuda
#endif
