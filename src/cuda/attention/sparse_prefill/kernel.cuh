// Sparse prefill attention kernel for Hopper (sm_90a). See config.h for the work split.
//
// Per work item (token t, head group g) of a persistent CTA (work_item.cuh), n = ceil(topk_length
// / 64) tiles, numbered per item for ownership and per CTA (g) for the two-buffer ring:
//   producer WG2 (producer.cuh): Q → smem by TMA; for tile i: wait until buffer i%2 is free,
//                 gather its 64 rows (cp.async, invalid rows copied from rows of zeros), arrive on
//                 k_full[i%2].
//   math WG w ∈ {0,1} (math.cuh) owns tiles i ≡ w (mod 2). Iteration over its own tile i:
//     A. own P·V of tile i-2 finished → release buffer (i-2)%2 to the producer
//     C. tile i-1 belongs to the other WG: wait for its published P and row stats, rescale O,
//        O += P_{i-1}·V_{i-1}[:, my half] (A from smem), wait for it → release buffer (i-1)%2
//     B. issue S_i = Q·K_iᵀ (async)
//     D. S_i done → mask, online softmax (base 2), publish P_i + stats, rescale O,
//        issue O += P_i·V_i[:, my half] (A from registers)
//   Both WGs see every tile's scale factor, so their O halves and partial row sums stay in step;
//   the row sums are added across WGs at the end (fixed order: deterministic).
//   Epilogue: O is staged in the item's last tile buffer and TMA-stored by the producer before it
//   gathers into that buffer again (scattered global stores cost ~35 cycles per warp store).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include <cutlass/cutlass.h>

#include "cuda/attention/sparse_prefill/config.h"
#include "cuda/attention/sparse_prefill/math.cuh"
#include "cuda/attention/sparse_prefill/producer.cuh"
#include "cuda/attention/sparse_prefill/trace.cuh"
#include "cuda/common/check.h"
#include "cuda/common/device_props.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/per_device_once.h"
#include "cuda/common/ptx.cuh"

namespace dsv4::cuda::sparse_prefill_detail {

// The barriers of the shared-memory plan, with the number of arrivals that completes a phase.
template <class Plan>
__device__ __forceinline__ void init_barriers(Plan& plan) {
  ptx::mbarrier_init(&plan.q_full, 1);     // the producer's expect-tx arrival (+ TMA bytes)
  ptx::mbarrier_init(&plan.q_empty, 256);  // every math thread, after its last S of the item
  for (int b = 0; b < 2; ++b) {
    // Per producer thread: one cp.async arrival per half, and on the first half's barrier also
    // one (release) for its rows' key_valid flags.
    ptx::mbarrier_init(&plan.k_full[b][0], 256);
    ptx::mbarrier_init(&plan.k_full[b][1], 128);
    ptx::mbarrier_init(&plan.p_ready[b], 128);  // the owner WG's threads
    ptx::mbarrier_init(&plan.k_empty[b], 256);  // every math thread, after its P·V on the tile
  }
  ptx::fence_barrier_init();
}

template <int D_QK>
__global__ void __launch_bounds__(Config<D_QK>::kThreads, 1)
    sparse_prefill_kernel(const __grid_constant__ Params p) {
  grid_dependency_entry();
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Cfg = Config<D_QK>;
  using Plan = typename Cfg::SharedPlan;
  extern __shared__ uint8_t smem_raw[];
  Plan& plan = aligned_dynamic_smem<Plan>(smem_raw);
  if (threadIdx.x == 0) init_barriers(plan);
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 2) {
    ptx::warpgroup_regs_decrease<Cfg::kProducerRegs>();
    Producer<D_QK>(p, plan).run();
  } else {
    ptx::warpgroup_regs_increase<Cfg::kMathRegs>();
    // The index as a broadcast from lane 0, which the compiler knows to be warp-uniform: it
    // reaches every shared-memory address a math warpgroup forms, and those, and the wgmma
    // descriptors made from them, stay in uniform registers only if they are provably uniform.
    MathWarpgroup<D_QK>(p, plan, cutlass::canonical_warp_group_idx()).run();
  }
#endif
}

template <int D_QK>
void launch(const Params& params, CUstream_st* stream) {
  using Cfg = Config<D_QK>;
  static PerDeviceOnce smem_opt_in;
  opt_in_dynamic_smem(smem_opt_in, sparse_prefill_kernel<D_QK>, Cfg::kSmemBytes, "sparse_prefill");
  const int head_groups = (params.num_heads + Cfg::kHeads - 1) / Cfg::kHeads;
  const int64_t items = int64_t{params.s_q} * head_groups;
  const int sms = current_device_sm_count("sparse_prefill");
  const dim3 grid(static_cast<unsigned>(items < sms ? items : sms));  // persistent: one CTA per SM
  launch_kernel("sparse_prefill", sparse_prefill_kernel<D_QK>, {grid, Cfg::kThreads, Cfg::kSmemBytes}, stream,
                params);
  DSV4_TRACE_DUMP(stream);  // a -DDSV4_KERNEL_TRACE build only (trace.cuh)
}

}  // namespace dsv4::cuda::sparse_prefill_detail
