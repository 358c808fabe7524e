// The producer warpgroup (WG2) of the sparse prefill kernel (kernel.cuh): Q of every item by TMA,
// the item's top-k rows gathered tile by tile into the two-buffer ring, and the items' O stored
// from shared memory by TMA.
//
// Q: 64×64 TMA boxes issued by one thread (heads past H are out of bounds: zero-filled).
// KV: gathered with cp.async by all 128 threads — thread (group = tid/8, lane8 = tid%8) copies
// chunk lane8 of every 64-column block of rows group, group+16, ...; a warp moves 4 rows × 128
// contiguous bytes per instruction; invalid rows are copied from rows of zeros (zero_rows).
// (One-row TMA boxes gather correctly but ran 6.5x slower: docs/notes/prefill.md, v5.)
// O of an item leaves through its last tile's buffer: the math WGs stage it there (the out map's
// box layout) and free the buffer as for any tile; before the next gather into that buffer — or
// at the end — this WG TMA-stores it, so no math thread waits on global stores.
#pragma once

#include <cstdint>

#include "cuda/attention/sparse_prefill/config.h"
#include "cuda/attention/sparse_prefill/trace.cuh"
#include "cuda/attention/sparse_prefill/work_item.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/smem_layout.cuh"

namespace dsv4::cuda::sparse_prefill_detail {

// Rows of zeros in global memory (zero-initialised when the module loads) that invalid rows are
// copied from: an ordinary 16-byte copy of an L2-resident line instead of cp.async's zero-fill,
// with which tiles holding invalid slots ran 5-21 % slower than tiles without, while reading
// fewer bytes (docs/notes/prefill.md, "Invalid rows copied from rows of zeros"). One row per
// producer thread group (16), so that the invalid rows of every SM spread over 144 lines and the
// L2 slices that hold them: one row shared by all made such tiles 2-3x slower at 132 CTAs (a row
// per tile row spilled the producer). One per translation unit (static): each d_qk's
// instantiation has its own.
constexpr int kZeroRowBytes = 576 * 2;
constexpr int kZeroRows = 16;
static __device__ __align__(256) uint8_t zero_rows[kZeroRows * kZeroRowBytes];

template <int D_QK>
struct Producer {
  using Cfg = Config<D_QK>;
  using Plan = typename Cfg::SharedPlan;
  static constexpr int kTile = Cfg::kTile;
  static constexpr int kBlocks = D_QK / 64;          // 64-column blocks of a row
  static constexpr int kRowsPerThread = kTile / 16;  // rows group, group + 16, ...
  static_assert(kTile / kRowsPerThread == kZeroRows && D_QK * 2 <= kZeroRowBytes,
                "a zero row per thread group");

  const Params& p;
  Plan& plan;
  const WorkList<D_QK> work;
  const int tid, group, lane8;
  const uint8_t* const kv_base;  // this thread's 16-byte chunk of row 0
  const int64_t kv_row_bytes;
  const uint8_t* const zero_base;  // this thread's 16-byte chunk of its group's zero row
  // This thread's row indices of the next tile to gather, read one tile before the gather that
  // needs them — across items too (the next item's tile 0 during this item's last tile), so no
  // gather waits on an index read.
  int32_t next_indices[kRowsPerThread];
  int prefetched_item = -1;  // the item whose tile-0 indices next_indices holds
  // The item whose O buffer 0/1 holds, -1 if none (two scalars, not an array indexed by the
  // run-time buffer: no local memory).
  int staged0 = -1, staged1 = -1;

  __device__ __forceinline__ Producer(const Params& params, Plan& shared)
      : p(params),
        plan(shared),
        work(params),
        tid(threadIdx.x % 128),
        group(tid / 8),
        lane8(tid % 8),
        kv_base(static_cast<const uint8_t*>(params.kv) + lane8 * 16),
        kv_row_bytes(params.kv_row_stride * 2),
        zero_base(zero_rows + group * kZeroRowBytes + lane8 * 16) {}

  // Q of item number k of this CTA (one thread), once the previous item's S products are done
  // with the buffer.
  __device__ __forceinline__ void load_q(const WorkItem& it, int k) {
    if (k >= 1) ptx::mbarrier_wait(&plan.q_empty, (k - 1) & 1);
    ptx::mbarrier_arrive_expect_tx(&plan.q_full, Cfg::kQBytes);
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk)
      ptx::tma_load_3d(plan.q + blk * Cfg::kHeads * 128, &p.q_map, blk * 64, it.head0, it.token, &plan.q_full);
  }

  __device__ __forceinline__ void read_indices(const WorkItem& of, int t) {
#pragma unroll
    for (int rk = 0; rk < kRowsPerThread; ++rk) {
      const int slot = t * kTile + group + 16 * rk;
      next_indices[rk] = slot < of.valid_len ? __ldg(of.indices + slot) : -1;
    }
  }

  // O of `staged_item`, staged in buffer b, out by TMA (one thread); no thread gathers into b
  // before the store has read it.
  __device__ __forceinline__ void store_staged_o(int b, int staged_item) {
    if (tid == 0) {
      const int token = work.token_of(staged_item), head0 = work.head0_of(staged_item);
#pragma unroll
      for (int blk = 0; blk < Cfg::kDv / 64; ++blk)
        ptx::tma_store_3d(&p.out_map, plan.k[b] + blk * kTile * 128, blk * 64, head0, token);
      ptx::bulk_commit();
      ptx::bulk_wait_read<0>();
    }
    ptx::named_barrier_sync(Cfg::kBarProducer, 128);
  }

  // Copies 64-column blocks [blk_begin, blk_end) of this thread's rows into tile buffer `dst`.
  __device__ __forceinline__ void gather_blocks(uint8_t* dst, const uint8_t* const (&src)[kRowsPerThread],
                                                int blk_begin, int blk_end) {
#pragma unroll
    for (int rk = 0; rk < kRowsPerThread; ++rk) {
      const int row = group + 16 * rk;
#pragma unroll
      for (int blk = blk_begin; blk < blk_end; ++blk)
        ptx::cp_async_16(dst + sw128_chunk_offset<kTile>(row, blk * 8 + lane8), src[rk] + blk * 128);
    }
  }

  // Tile t of `it` (CTA tile g) into buffer g % 2: its rows' sources from the indices read one
  // tile ago, the next indices, the buffer's release by the math WGs (and the store of an O
  // staged in it), then the gather in two halves, each announced on its own k_full barrier (the
  // math WGs wait for both before S).
  __device__ __forceinline__ void gather_tile(const WorkItem& it, int item, int t, uint32_t g) {
    const int buf = g & 1;
    const uint8_t* src[kRowsPerThread];
    bool valid[kRowsPerThread];
#pragma unroll
    for (int rk = 0; rk < kRowsPerThread; ++rk) {
      const int idx = next_indices[rk];
      valid[rk] = idx >= 0 && idx < p.s_kv;
      src[rk] = valid[rk] ? kv_base + idx * kv_row_bytes : zero_base;
    }
    if (t + 1 < it.num_tiles) {
      read_indices(it, t + 1);
    } else if (item + static_cast<int>(gridDim.x) < work.num_items) {
      prefetched_item = item + gridDim.x;
      read_indices(work.at(p, prefetched_item), 0);
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
    // The rows' validity for the math warpgroups' masks (their column_mask), published with a
    // release arrival on the first half's barrier they wait on.
    if (lane8 == 0) {
#pragma unroll
      for (int rk = 0; rk < kRowsPerThread; ++rk) plan.key_valid[buf][group + 16 * rk] = valid[rk];
    }
    ptx::mbarrier_arrive(&plan.k_full[buf][0]);
    gather_blocks(plan.k[buf], src, 0, Cfg::kSplitBlocks);
    ptx::cp_async_arrive_noinc(&plan.k_full[buf][0]);
    gather_blocks(plan.k[buf], src, Cfg::kSplitBlocks, kBlocks);
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
    for (int item = blockIdx.x; item < work.num_items; item += gridDim.x, ++k) {
      const WorkItem it = work.at(p, item);
      if (tid == 0) load_q(it, k);
      if (it.num_tiles > 0 && prefetched_item != item) read_indices(it, 0);
      for (int t = 0; t < it.num_tiles; ++t, ++g) gather_tile(it, item, t, g);
      if (it.num_tiles > 0) {  // the item's O will be staged in its last tile's buffer
        if ((g - 1) & 1) staged1 = item;
        else staged0 = item;
      }
    }
    store_last_outputs(g);
  }
};

}  // namespace dsv4::cuda::sparse_prefill_detail
