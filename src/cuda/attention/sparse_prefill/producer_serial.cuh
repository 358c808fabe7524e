// The producer warpgroup (WG2) of the sparse prefill kernel (kernel.cuh) in the serial schedule
// (config.h): Q of every item by TMA, the item's top-k rows gathered tile by tile into the
// two-buffer ring (producer_common.cuh), and the items' O stored from shared memory by TMA.
//
// O of an item leaves through its last tile's buffer: the math WGs stage it there (the out map's
// box layout) and free the buffer as for any tile; before the next gather into that buffer — or
// at the end — this WG TMA-stores it, so no math thread waits on global stores.
#pragma once

#include <cstdint>

#include "cuda/attention/sparse_prefill/config.h"
#include "cuda/attention/sparse_prefill/producer_common.cuh"
#include "cuda/attention/sparse_prefill/trace.cuh"
#include "cuda/attention/sparse_prefill/work_item.cuh"
#include "cuda/common/ptx.cuh"

namespace dsv4::cuda::sparse_prefill_detail {

template <int D_QK>
struct SerialProducer : ProducerBase<D_QK, SerialConfig<D_QK>> {
  using Base = ProducerBase<D_QK, SerialConfig<D_QK>>;
  using typename Base::Cfg;
  using Base::kRowsPerThread;
  using Base::kTile;
  using Base::p;
  using Base::plan;
  using Base::tid;
  using Base::work;

  // This thread's row indices of the next tile to gather, read one tile before the gather that
  // needs them — across items too (the next item's tile 0 during this item's last tile), so no
  // gather waits on an index read.
  int32_t next_indices[kRowsPerThread];
  int prefetched_item = -1;  // the item whose tile-0 indices next_indices holds
  // The item whose O buffer 0/1 holds, -1 if none (two scalars, not an array indexed by the
  // run-time buffer: no local memory).
  int staged0 = -1, staged1 = -1;

  __device__ __forceinline__ SerialProducer(const Params& params, typename Base::Plan& shared)
      : Base(params, shared) {}

  // O of `staged_item`, staged in buffer b, out by TMA (one thread); no thread gathers into b
  // before the store has read it.
  __device__ __forceinline__ void store_staged_o(int b, int staged_item) {
    if (tid == 0) {
      const int token = work.token_of(staged_item), head0 = work.head0_of(staged_item);
      const uint64_t evict_first = ptx::l2_evict_first_policy();  // O is written once (load_q)
#pragma unroll
      for (int blk = 0; blk < Cfg::kDv / 64; ++blk)
        ptx::tma_store_3d(&p.out_map, plan.k[b] + blk * kTile * 128, blk * 64, head0, token, evict_first);
      ptx::bulk_commit();
      ptx::bulk_wait_read<0>();
    }
    ptx::named_barrier_sync(Cfg::kBarProducer, 128);
  }

  // Tile t of `it` (the CTA's item number k; CTA tile g) into buffer g % 2: its rows' sources
  // from the indices read one tile ago, the next indices (after the last tile: the next item's),
  // the buffer's release by the math WGs (and the store of an O staged in it), then the gather in
  // two halves, each announced on its own k_full barrier (the math WGs wait for both before S).
  __device__ __forceinline__ void gather_tile(const WorkItem& it, int item, int k, int t, uint32_t g) {
    const int buf = g & 1;
    const uint8_t* src[kRowsPerThread];
    bool valid[kRowsPerThread];
    Base::row_sources(next_indices, src, valid);
    if (t + 1 < it.num_tiles) {
      Base::read_tile_indices(it, t + 1, next_indices);
    } else if (Base::next_item(item, k) >= 0) {
      prefetched_item = Base::upcoming;
      Base::read_tile_indices(work.at(p, prefetched_item), 0, next_indices);
    }
    trace_tile_event(tid, g, kTraceEmptyWait);
    if (g >= 2) ptx::mbarrier_wait(&plan.k_empty[buf], ((g >> 1) - 1) & 1);
    const int staged = buf ? staged1 : staged0;
    if (staged >= 0) {
      store_staged_o(buf, staged);
      if (buf) staged1 = -1;
      else staged0 = -1;
    }
    trace_tile_event(tid, g, kTraceEmptyDone);
    Base::publish_key_valid(buf, valid);  // released by this arrival on the first half's barrier
    ptx::mbarrier_arrive(&plan.k_full[buf][0]);
    Base::gather_blocks(plan.k[buf], src, 0, Cfg::kSplitBlocks);
    ptx::cp_async_arrive_noinc(&plan.k_full[buf][0]);
    Base::gather_blocks(plan.k[buf], src, Cfg::kSplitBlocks, Base::kBlocks);
    ptx::cp_async_arrive_noinc(&plan.k_full[buf][1]);
    trace_tile_event(tid, g, kTraceGatherIssued);
  }

  // The last items' O: once the math WGs staged it (the buffer's last use completed), store it.
  // g: the number of tiles this CTA gathered.
  __device__ __forceinline__ void store_last_outputs(uint32_t g) {
    for (int b = 0; b < 2; ++b) {
      const int staged = b ? staged1 : staged0;
      if (staged < 0) continue;
      const uint32_t last = ((g - 1) & 1) == static_cast<uint32_t>(b) ? g - 1 : g - 2;
      ptx::mbarrier_wait(&plan.k_empty[b], (last >> 1) & 1);
      store_staged_o(b, staged);
    }
    if (tid == 0) ptx::bulk_wait<0>();  // the stores' global writes, before the CTA exits
  }

  __device__ __forceinline__ void run() {
    uint32_t g = 0;
    int k = 0;
    for (int item = Base::first_item(); item >= 0; item = Base::upcoming, ++k) {
      const WorkItem it = work.at(p, item);
      if (tid == 0) Base::load_q(it, item, k);
      Base::claim_next(item);
      if (it.num_tiles > 0 && prefetched_item != item) Base::read_tile_indices(it, 0, next_indices);
      for (int t = 0; t < it.num_tiles; ++t, ++g) gather_tile(it, item, k, t, g);
      if (it.num_tiles > 0) {  // the item's O will be staged in its last tile's buffer
        if ((g - 1) & 1) staged1 = item;
        else staged0 = item;
      } else {
        Base::next_item(item, k);
      }
    }
    if (tid == 0) Base::end_items(k);
    store_last_outputs(g);
  }
};

}  // namespace dsv4::cuda::sparse_prefill_detail
