// The producer warpgroup (WG2) of the sparse prefill kernel (kernel.cuh) in the pair schedule
// (config.h): Q of every item by TMA and the item's top-k rows gathered pair by pair — tile
// 2j + w of pair j into buffer w — by column halves ("quarters" of the two buffers), each as soon
// as its last reader has released it (producer_common.cuh does the copies). The math WGs store O
// themselves (math_pair.cuh), so no buffer waits on an output.
#pragma once

#include <cstdint>

#include "cuda/attention/sparse_prefill/config.h"
#include "cuda/attention/sparse_prefill/producer_common.cuh"
#include "cuda/attention/sparse_prefill/trace.cuh"
#include "cuda/attention/sparse_prefill/work_item.cuh"
#include "cuda/common/ptx.cuh"

namespace dsv4::cuda::sparse_prefill_detail {

template <int D_QK>
struct PairProducer : ProducerBase<D_QK, PairConfig<D_QK>> {
  using Base = ProducerBase<D_QK, PairConfig<D_QK>>;
  using typename Base::Cfg;
  using Base::kRowsPerThread;
  using Base::p;
  using Base::plan;
  using Base::tid;
  using Base::work;

  // This thread's row indices of the next pair's two tiles (−1 past the item's slots), read one
  // pair before the gather that needs them — across items too (the next item's pair 0 during
  // this item's last pair), so no gather waits on an index read.
  int32_t next0[kRowsPerThread], next1[kRowsPerThread];
  int prefetched_item = -1;       // the item whose pair-0 indices next0/next1 hold
  uint32_t uses0 = 0, uses1 = 0;  // tiles gathered into buffer 0 / 1 before the current item
  uint32_t g = 0;                 // CTA-wide number of the current item's tile 0 (trace rows only)

  __device__ __forceinline__ PairProducer(const Params& params, typename Base::Plan& shared)
      : Base(params, shared) {}

  // This thread's rows of pair j of `of` (tiles 2j, 2j + 1) into next0 / next1.
  __device__ __forceinline__ void read_pair_indices(const WorkItem& of, int j) {
    Base::read_tile_indices(of, 2 * j, next0);
    Base::read_tile_indices(of, 2 * j + 1, next1);
  }

  // Quarter (B, H) of the buffers for its `use`-th tile (0-based, CTA-wide), from the rows `idx`:
  // once WG H has released it, gathered and announced. Half B of buffer B is filled first, on
  // k_full[B][0], so it also carries the rows' key_valid flags (their last reader, the previous
  // occupant's owner, read them before releasing it); the other half in two pieces, on
  // k_full[B][1] and [2] (config.h, kPieceSplitBlock).
  template <int B, int H>
  __device__ __forceinline__ void fill_quarter(const int32_t (&idx)[kRowsPerThread], uint32_t use, uint32_t row) {
    trace_tile_event(tid, row, static_cast<PairTraceEvent>(kPairEmptyWaitHalf0 + 3 * H));
    if (use >= 1) ptx::mbarrier_wait(&plan.k_empty[B][H], (use - 1) & 1);
    trace_tile_event(tid, row, static_cast<PairTraceEvent>(kPairEmptyDoneHalf0 + 3 * H));
    const uint8_t* src[kRowsPerThread];
    bool valid[kRowsPerThread];
    Base::row_sources(idx, src, valid);
    constexpr int kBegin = H == 0 ? 0 : Cfg::kSplitBlocks, kEnd = H == 0 ? Cfg::kSplitBlocks : Base::kBlocks;
    if constexpr (H == B) {
      Base::publish_key_valid(B, valid);
      ptx::mbarrier_arrive(&plan.k_full[B][0]);
      Base::gather_blocks(plan.k[B], src, kBegin, kEnd);
      ptx::cp_async_arrive_noinc(&plan.k_full[B][0]);
    } else {
      constexpr int kMid = Cfg::kPieceSplitBlock[H];
      // As a loop: written out as two calls, the producer spilled 52 bytes at 72 registers.
#pragma unroll
      for (int piece = 0; piece < 2; ++piece) {
        Base::gather_blocks(plan.k[B], src, piece == 0 ? kBegin : kMid, piece == 0 ? kMid : kEnd);
        ptx::cp_async_arrive_noinc(&plan.k_full[B][1 + piece]);
      }
    }
    trace_tile_event(tid, row, static_cast<PairTraceEvent>(kPairIssuedHalf0 + 3 * H));
  }

  // Pair j of `it` (the CTA's item number k): its rows from the indices read one pair ago, the
  // next pair's indices (after the last pair: the next item's), then the quarters in the order
  // the math WGs release them for the previous pair — (0,0), (1,1), (0,1), (1,0) (math_pair.cuh)
  // — buffer 1's only for a whole pair.
  __device__ __forceinline__ void gather_pair(const WorkItem& it, int item, int k, int j) {
    const bool whole = 2 * j + 1 < it.num_tiles;
    int32_t idx0[kRowsPerThread], idx1[kRowsPerThread];
#pragma unroll
    for (int rk = 0; rk < kRowsPerThread; ++rk) {
      idx0[rk] = next0[rk];
      idx1[rk] = next1[rk];
    }
    if (2 * (j + 1) < it.num_tiles) {
      read_pair_indices(it, j + 1);
    } else if (Base::next_item(item, k) >= 0) {
      prefetched_item = Base::upcoming;
      read_pair_indices(work.at(p, prefetched_item), 0);
    }
    const uint32_t row0 = g + 2 * j;  // trace rows of the pair's tiles
    fill_quarter<0, 0>(idx0, uses0 + j, row0);
    if (whole) fill_quarter<1, 1>(idx1, uses1 + j, row0 + 1);
    fill_quarter<0, 1>(idx0, uses0 + j, row0);
    if (whole) fill_quarter<1, 0>(idx1, uses1 + j, row0 + 1);
  }

  __device__ __forceinline__ void run() {
    trace_pair_marker(tid);
    int k = 0;
    for (int item = Base::first_item(); item >= 0; item = Base::upcoming, ++k) {
      const WorkItem it = work.at(p, item);
      if (tid == 0) Base::load_q(it, item, k);
      Base::claim_next(item);
      if (it.num_tiles > 0 && prefetched_item != item) read_pair_indices(it, 0);
      for (int j = 0; 2 * j < it.num_tiles; ++j) gather_pair(it, item, k, j);
      if (it.num_tiles == 0) Base::next_item(item, k);
      uses0 += (it.num_tiles + 1) / 2;
      uses1 += it.num_tiles / 2;
      g += it.num_tiles;
    }
    if (tid == 0) Base::end_items(k);
  }
};

}  // namespace dsv4::cuda::sparse_prefill_detail
