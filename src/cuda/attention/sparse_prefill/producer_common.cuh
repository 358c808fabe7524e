// What both schedules' producer warpgroups (producer_serial.cuh, producer_pair.cuh) do alike: Q
// of every item by TMA, and rows of an item's top-k gathered into a tile buffer with cp.async.
//
// Q: 64×64 TMA boxes issued by one thread (heads past H are out of bounds: zero-filled).
// KV: gathered with cp.async by all 128 threads — thread (group = tid/8, lane8 = tid%8) copies
// chunk lane8 of every 64-column block of rows group, group+16, ...; a warp moves 4 rows × 128
// contiguous bytes per instruction; invalid rows are copied from rows of zeros (zero_rows).
// (One-row TMA boxes gather correctly but ran 6.5x slower: docs/notes/prefill.md, v5.)
#pragma once

#include <cstdint>

#include "cuda/attention/sparse_prefill/config.h"
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

template <int D_QK, class ScheduleCfg>
struct ProducerBase {
  using Cfg = ScheduleCfg;
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

  __device__ __forceinline__ ProducerBase(const Params& params, Plan& shared)
      : p(params),
        plan(shared),
        work(params),
        tid(threadIdx.x % 128),
        group(tid / 8),
        lane8(tid % 8),
        kv_base(static_cast<const uint8_t*>(params.kv) + lane8 * 16),
        kv_row_bytes(params.kv_row_stride * 2),
        zero_base(zero_rows + group * kZeroRowBytes + lane8 * 16) {}

  // ---- the CTA's walk over the items (work_item.cuh) ---------------------------------------
  // The item after the current one, once next_item() has decided it (-1: none).
  int upcoming = -1;
  int claim = 0;  // thread 0, with a counter: the claim taken at the current item's start

  __device__ __forceinline__ int first_item() const {
    return static_cast<int>(blockIdx.x) < work.num_items ? static_cast<int>(blockIdx.x) : -1;
  }
  // At the start of the CTA's item `item` (every producer thread): when the item after it is the
  // counter's, thread 0 claims it now, an item ahead of next_item(), so the atomic's round trip
  // never holds a gather up.
  __device__ __forceinline__ void claim_next(int item) {
    if (p.work_counter != nullptr && tid == 0 && item + static_cast<int>(gridDim.x) >= p.round_robin_items)
      claim = atomicAdd(p.work_counter, 1);
  }
  // The item after `item`, the CTA's number k, into `upcoming` (every producer thread, at the
  // same point of the walk): round-robin within the first round_robin_items, then the claim's
  // item, shared through shared memory (by k's parity, so the next item's write never meets a late
  // reader of this one: a barrier lies between).
  __device__ __forceinline__ int next_item(int item, int k) {
    int next = item + static_cast<int>(gridDim.x);  // (< 2^31: items and grid are ints, grid ≤ items)
    if (p.work_counter != nullptr && next >= p.round_robin_items) {
      if (tid == 0) plan.claimed[k & 1] = p.round_robin_items + claim;
      ptx::named_barrier_sync(Cfg::kBarProducer, 128);
      next = plan.claimed[k & 1];
    }
    upcoming = next < work.num_items ? next : -1;
    return upcoming;
  }

  // Q of item `item`, the CTA's number k (one thread), once the previous item's S products are
  // done with the buffer. The item is announced to the math warpgroups with it: in plan.item,
  // which they read after their wait on q_full (released by this arrival) and before their
  // arrival on q_empty (the wait above, for the next item's write).
  __device__ __forceinline__ void load_q(const WorkItem& it, int item, int k) {
    if (k >= 1) ptx::mbarrier_wait(&plan.q_empty, (k - 1) & 1);
    plan.item = ItemSlot{item, it.valid_len};
    ptx::mbarrier_arrive_expect_tx(&plan.q_full, Cfg::kQBytes);
    // Q is read once (604 MB at V3.2 H 128 s_q 4096): evicted first, it leaves the L2 to the kv
    // rows, which every item gathers again from a cache larger than the L2 at s_kv 64k.
    const uint64_t evict_first = ptx::l2_evict_first_policy();
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk)
      ptx::tma_load_3d(plan.q + blk * Cfg::kHeads * 128, &p.q_map, blk * 64, it.head0, it.token, &plan.q_full,
                       evict_first);
  }
  // After the CTA's k items (one thread): the slot that ends the math warpgroups' walk, on q_full
  // as an item would come.
  __device__ __forceinline__ void end_items(int k) {
    if (k >= 1) ptx::mbarrier_wait(&plan.q_empty, (k - 1) & 1);
    plan.item = ItemSlot{-1, 0};
    ptx::mbarrier_arrive(&plan.q_full);
  }

  // This thread's row indices of tile t of `of` (−1 past the item's slots).
  __device__ __forceinline__ void read_tile_indices(const WorkItem& of, int t, int32_t (&idx)[kRowsPerThread]) const {
#pragma unroll
    for (int rk = 0; rk < kRowsPerThread; ++rk) {
      const int slot = t * kTile + group + 16 * rk;
      idx[rk] = slot < of.valid_len ? __ldg(of.indices + slot) : -1;
    }
  }

  // Where this thread's rows are copied from (a row of zeros for an invalid index), and whether
  // each is valid.
  __device__ __forceinline__ void row_sources(const int32_t (&idx)[kRowsPerThread],
                                              const uint8_t* (&src)[kRowsPerThread],
                                              bool (&valid)[kRowsPerThread]) const {
#pragma unroll
    for (int rk = 0; rk < kRowsPerThread; ++rk) {
      valid[rk] = idx[rk] >= 0 && idx[rk] < p.s_kv;
      src[rk] = valid[rk] ? kv_base + idx[rk] * kv_row_bytes : zero_base;
    }
  }

  // The rows' validity for the math warpgroups' masks (their column_valid_bits), written before
  // the release arrival on the k_full barrier they wait on first.
  __device__ __forceinline__ void publish_key_valid(int buf, const bool (&valid)[kRowsPerThread]) {
    if (lane8 == 0) {
#pragma unroll
      for (int rk = 0; rk < kRowsPerThread; ++rk) plan.key_valid[buf][group + 16 * rk] = valid[rk];
    }
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
};

}  // namespace dsv4::cuda::sparse_prefill_detail
