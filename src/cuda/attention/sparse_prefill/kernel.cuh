// Sparse prefill attention kernel for Hopper (sm_90a). See config.h for the work split and the two
// schedules of the math warpgroups.
//
// Per work item (token t, head group g) of a persistent CTA (work_item.cuh), n = ceil(topk_length
// / 64) tiles. The producer WG2 loads Q by TMA and gathers the tiles' rows with cp.async into two
// buffers (producer_common.cuh; by tile, producer_serial.cuh, or by pair, producer_pair.cuh); the
// math WGs 0 and 1 compute S = Q·Kᵀ, the online softmax (base 2) and O += P·V for their half of
// O's value dims, sharing the tiles serially (math_serial.cuh: one tile at a time, ownership
// alternating) or in pairs (math_pair.cuh: one tile each, both S in flight). Both add their row
// sums across the WGs at the end in a fixed order (deterministic), then apply the sink and
// normalise. O leaves through the item's last tile buffer and a TMA store (serial) or straight
// from registers (pair).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include <cutlass/cutlass.h>

#include "cuda/attention/sparse_prefill/config.h"
#include "cuda/attention/sparse_prefill/math_pair.cuh"
#include "cuda/attention/sparse_prefill/math_serial.cuh"
#include "cuda/attention/sparse_prefill/producer_pair.cuh"
#include "cuda/attention/sparse_prefill/producer_serial.cuh"
#include "cuda/attention/sparse_prefill/trace.cuh"
#include "cuda/common/check.h"
#include "cuda/common/device_props.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/per_device_once.h"
#include "cuda/common/ptx.cuh"

namespace dsv4::cuda::sparse_prefill_detail {

// The barriers of the shared-memory plan, with the number of arrivals that completes a phase.
template <Schedule S, class Plan>
__device__ __forceinline__ void init_barriers(Plan& plan) {
  ptx::mbarrier_init(&plan.q_full, 1);     // the producer's expect-tx arrival (+ TMA bytes)
  ptx::mbarrier_init(&plan.q_empty, 256);  // every math thread, after its last S of the item
  for (int b = 0; b < 2; ++b) {
    if constexpr (S == Schedule::kSerial) {
      // Per producer thread: one cp.async arrival per half, and on the first half's barrier also
      // one (release) for its rows' key_valid flags.
      ptx::mbarrier_init(&plan.k_full[b][0], 256);
      ptx::mbarrier_init(&plan.k_full[b][1], 128);
      ptx::mbarrier_init(&plan.p_ready[b], 128);  // the owner WG's threads
      ptx::mbarrier_init(&plan.k_empty[b], 256);  // every math thread, after its P·V on the tile
    } else {
      // Per producer thread: one cp.async arrival per piece, and on the half of buffer b filled
      // first (piece 0) also one (release) for its rows' key_valid flags.
      ptx::mbarrier_init(&plan.k_full[b][0], 256);
      ptx::mbarrier_init(&plan.k_full[b][1], 128);
      ptx::mbarrier_init(&plan.k_full[b][2], 128);
      for (int h = 0; h < 2; ++h) ptx::mbarrier_init(&plan.k_empty[b][h], 128);  // WG h's threads, its last reader
      ptx::mbarrier_init(&plan.max_ready[b], 128);  // WG b's threads
      ptx::mbarrier_init(&plan.p_ready[b], 128);
    }
  }
  ptx::fence_barrier_init();
}

template <int D_QK, Schedule S>
__global__ void __launch_bounds__(Config<D_QK>::kThreads, 1)
    sparse_prefill_kernel(const __grid_constant__ Params p) {
  grid_dependency_entry();
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Cfg = ScheduleConfig<D_QK, S>;
  using Plan = typename Cfg::SharedPlan;
  extern __shared__ uint8_t smem_raw[];
  Plan& plan = aligned_dynamic_smem<Plan>(smem_raw);
  if (threadIdx.x == 0) init_barriers<S>(plan);
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 2) {
    ptx::warpgroup_regs_decrease<Cfg::kProducerRegs>();
    if constexpr (S == Schedule::kSerial) SerialProducer<D_QK>(p, plan).run();
    else PairProducer<D_QK>(p, plan).run();
  } else {
    ptx::warpgroup_regs_increase<Cfg::kMathRegs>();
    // The index as a broadcast from lane 0, which the compiler knows to be warp-uniform: it
    // reaches every shared-memory address a math warpgroup forms, and those, and the wgmma
    // descriptors made from them, stay in uniform registers only if they are provably uniform.
    if constexpr (S == Schedule::kSerial) {
      SerialMath<D_QK>(p, plan, cutlass::canonical_warp_group_idx()).run();
    } else if (cutlass::canonical_warp_group_idx() == 0) {
      // Each WG's whole program is its own instantiation (its order of the pair's steps differs):
      // with both orders behind run-time branches in one loop ptxas serializes the wgmmas.
      PairMath<D_QK, 0>(p, plan).run();
    } else {
      PairMath<D_QK, 1>(p, plan).run();
    }
  }
#endif
}

template <int D_QK, Schedule S>
void launch_schedule(const Params& params, CUstream_st* stream) {
  using Cfg = ScheduleConfig<D_QK, S>;
  static PerDeviceOnce smem_opt_in;
  opt_in_dynamic_smem(smem_opt_in, sparse_prefill_kernel<D_QK, S>, Cfg::kSmemBytes, "sparse_prefill");
  const int head_groups = (params.num_heads + Cfg::kHeads - 1) / Cfg::kHeads;
  const int64_t items = int64_t{params.s_q} * head_groups;
  const int sms = current_device_sm_count("sparse_prefill");
  const int64_t ctas = items < sms ? items : sms;  // persistent: one CTA per SM
  Params walk = params;
  walk.round_robin_items =
      static_cast<int>(params.work_counter != nullptr ? sparse_prefill_round_robin_items(items, ctas) : items);
  // The counter the CTAs take the last items from, zeroed in stream order: nothing waits on the
  // host, and a captured graph replays the zeroing with the launch. A launch of fewer than eight
  // rounds hands every item out round-robin, so it neither zeroes nor claims it.
  if (walk.round_robin_items >= items) walk.work_counter = nullptr;
  else DSV4_CUDA_CHECK("sparse_prefill", cudaMemsetAsync(walk.work_counter, 0, sizeof(int), stream));
  launch_kernel("sparse_prefill", sparse_prefill_kernel<D_QK, S>,
                {dim3(static_cast<unsigned>(ctas)), Cfg::kThreads, Cfg::kSmemBytes}, stream, walk);
  DSV4_TRACE_DUMP(stream);  // a -DDSV4_KERNEL_TRACE build only (trace.cuh)
}

template <int D_QK>
void launch(const Params& params, Schedule schedule, CUstream_st* stream) {
  if (schedule == Schedule::kPair) launch_schedule<D_QK, Schedule::kPair>(params, stream);
  else launch_schedule<D_QK, Schedule::kSerial>(params, stream);
}

}  // namespace dsv4::cuda::sparse_prefill_detail
