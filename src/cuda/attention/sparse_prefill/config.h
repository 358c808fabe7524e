// Sparse prefill kernel (sm_90a): compile-time configuration, shared-memory plans and the
// parameters the host dispatch passes by value.
//
// One work item = one query token × one group of 64 heads (the wgmma M dimension; all heads of a
// token share its indices, MQA); persistent CTAs (one per SM) take the items round-robin and,
// with a work counter, the launch's last ones from the counter (work_item.cuh). The
// token's top-k rows are gathered 64 at a time ("tiles") into two shared-memory buffers by a
// producer warpgroup, and two math warpgroups share the tiles by one of two schedules:
//   serial (math_serial.cuh): the WGs alternate OWNERSHIP of tiles: the owner of tile i computes
//     S = Q·K_iᵀ (64×64) and the online softmax, publishes P_i (bf16) and the row statistics in
//     shared memory, and both accumulate O[:, their 256 of d_v] += P_i · V_i. One tile at a time
//     holds both WGs, so the next tile's gather overlaps the whole of it.
//   pair (math_pair.cuh): the WGs work on PAIRS of tiles, one each (tile 2j + w in buffer w):
//     both S in flight, the pair agrees on one reference max, and each WG's softmax runs under
//     the other's products. Fewer cycles a tile, but a pair holds both buffers at once.
// The launch picks the pair schedule for tokens of two or more head groups (H > 64), and for a
// single group when the kv fits in the L2 and its items are long (top-k ≥ 1024) or all full (no
// topk_length) with an even tile count of 8 or more; the serial one otherwise
// (sparse_prefill_auto_schedule in sparse_prefill.h, with the measurements behind it).
// H that is not a multiple of 64 is padded inside the kernel: the last group's missing heads are
// out of bounds of the q tensor map (TMA fills zeros) and are never written, so any H ≥ 1 runs
// (H 64 and 128 without waste).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/attention/sparse_prefill.h"
#include "cuda/common/smem_layout.cuh"

namespace dsv4::cuda::sparse_prefill_detail {

struct Params {
  // TMA map of q as (d_qk, H, s_q) with 64×64×1 boxes, 128-byte swizzled (64-byte aligned type).
  CUtensorMap q_map;
  // TMA map of out as (512, H, s_q), same boxes and swizzle: O leaves through shared memory.
  CUtensorMap out_map;
  const void* kv;          // [s_kv, d_qk] bf16 (row stride kv_row_stride elements)
  const int32_t* indices;  // [s_q, topk] (row stride indices_row_stride)
  const int32_t* topk_length;  // [s_q] or nullptr
  const float* attn_sink;      // [H] or nullptr
  void* out;               // [s_q, H, 512] bf16
  float* max_logits;       // [s_q, H] (strides ml_stride_s, ml_stride_h)
  float* lse;              // [s_q, H]
  int* work_counter;       // the items' atomic counter (work_item.cuh), zeroed before the launch; or nullptr
  int round_robin_items;   // the items handed out round-robin, before the counter's (all of them without one)
  int s_q, num_heads, s_kv, topk;
  int64_t kv_row_stride, indices_row_stride;
  int64_t out_stride_s, out_stride_h, ml_stride_s, ml_stride_h, lse_stride_s, lse_stride_h;
  float scale_log2;  // softmax_scale · log2(e): logits are kept in base 2 inside the kernel
};

// An item as the producer announces it to the math warpgroups (SharedPlan::item; work_item.cuh):
// its number (−1: no more items) and its slots in use.
struct ItemSlot {
  int item;
  int valid_len;
};

// How the two math warpgroups share the tiles (above): the entry's enum (sparse_prefill.h), whose
// kAuto the host dispatch resolves (sparse_prefill_auto_schedule) before a launch.
using Schedule = SparsePrefillSchedule;

// Both plans ask for their last member's end plus the alignment slack (smem_layout.cuh,
// aligned_dynamic_smem_bytes), not sizeof + 1024: that is what lets d 576's pair plan keep its
// three k_full barriers a buffer. (Declaring the array 1024-aligned, as the decode kernel does,
// and asking for the plan alone fitted too, but under compute-sanitizer memcheck the CUDA graph
// replay of the d 576 pair launch then never ran: SparsePrefillEdge.WorkCounterLaunch-
// ReplaysFromACudaGraph, 2026-12-01.) A member added after a plan's last one must move its
// kSmemBytes along.

template <int D_QK>
struct Config {
  static_assert(D_QK == 512 || D_QK == 576, "d_qk must be 512 (MODEL1) or 576 (V3.2)");
  static constexpr int kDqk = D_QK;
  static constexpr int kDv = 512;
  static constexpr int kHeads = kSparsePrefillHeadsPerItem;  // heads per CTA = wgmma M
  static constexpr int kTile = kSparsePrefillTileRows;       // gathered rows per tile = S columns = P·V depth
  static constexpr int kDvPerWarpgroup = kDv / 2;
  static constexpr int kThreads = 3 * 128;  // WG0, WG1: math; WG2: producer
  static constexpr int kTileBytes = kTile * kDqk * 2;
  static constexpr int kQBytes = kHeads * kDqk * 2;
  static constexpr int kPBytes = kHeads * kTile * 2;
  // d 576: the rope block (cols 512..575) of a K tile is read only by S = Q·Kᵀ, so P of that tile
  // lives there once S is done; this is what lets Q + two 72 KB tiles fit in 227 KB.
  static constexpr bool kPInRopeBlock = kDqk > kDv;
  static constexpr int kPOffsetInTile = kDv * kTile * 2;  // byte offset of the rope block

  // A tile is gathered in two column halves, each announced on its own k_full barrier: half 0 =
  // columns [0, 256) (V's first 256 dims, WG0's for P·V), half 1 = columns [256, d_qk) (V's last
  // 256, WG1's, and the d 576 rope block). The serial schedule waits for both and fences once
  // before S (one fence per tile measured faster than starting S on the first half early); the
  // pair schedule starts S on the half the producer fills first for that WG and releases the
  // halves separately, each by its last reader; it also announces the half filled second in two
  // pieces (PairConfig::kPieceSplitBlock), so that S runs on the first while the second lands.
  static constexpr int kSplitBlocks = 4;  // 64-column blocks in half 0
  static constexpr int kSplitKSteps = kSplitBlocks * 64 / 16;
  // Named barriers (0 is __syncthreads): the end-of-item row-sum exchange between the math WGs;
  // the producer WG's threads waiting for its O store to have read a buffer (serial) or for the
  // next item thread 0 took from the counter (producer_common.cuh).
  static constexpr uint32_t kBarLExchange = 1;
  static constexpr uint32_t kBarProducer = 2;
};

// The serial schedule: register split (setmaxnreg) and shared-memory plan. Math warpgroups hold
// O (128 fp32) + S (32) + P (16); the producer only computes addresses. 2·224·128 + 56·128 =
// 64512 ≤ 65536. With the math warpgroups' addresses in uniform registers (kernel.cuh) neither
// role spills at 224 / 56; at 232 / 40 the producer's gather loop does.
template <int D_QK>
struct SerialConfig : Config<D_QK> {
  using Base = Config<D_QK>;
  static constexpr uint32_t kMathRegs = 224;
  static constexpr uint32_t kProducerRegs = 56;
  struct SharedPlan {
    alignas(1024) uint8_t q[Base::kQBytes];
    alignas(1024) uint8_t k[2][Base::kTileBytes];
    alignas(1024) uint8_t p[Base::kPInRopeBlock ? 1 : 2][Base::kPInRopeBlock ? 16 : Base::kPBytes];
    float row_max[2][Base::kHeads];       // reference max (base-2 units) after the tile, per buffer parity
    float row_seen_max[2][Base::kHeads];  // true running max after the tile (for max_logits)
    float row_scale[2][Base::kHeads];     // factor the tile's owner applied to O and l
    float row_sum[2][2][Base::kHeads];    // [item parity][WG] partial l, exchanged at the item's end
    uint8_t key_valid[2][Base::kTile];    // [buffer][row]: 1 if the row's index was valid, by the producer
    ItemSlot item;   // the item whose Q q_full announces (work_item.cuh)
    int claimed[2];  // [CTA item count parity]: the producer's next item from the counter
    uint64_t q_full, q_empty;
    uint64_t k_full[2][2];  // [buffer][half]
    uint64_t p_ready[2];    // [local tile parity]: P and row stats of a tile published by its owner
    uint64_t k_empty[2];  // (the last member: kSmemBytes)
  };
  static constexpr int kSmemBytes =
      aligned_dynamic_smem_bytes(offsetof(SharedPlan, k_empty) + sizeof(SharedPlan::k_empty));  // its last member
  static_assert(kSmemBytes <= 227 * 1024, "shared-memory plan exceeds the sm_90 limit");
};

// The pair schedule: each math WG also keeps the fp32 P of its tile until the pair's max is
// final, so the math WGs take 216 registers and the producer, which holds two tiles' row indices,
// 72 (2·216·128 + 72·128 = 64512); neither spills in its loop.
template <int D_QK>
struct PairConfig : Config<D_QK> {
  using Base = Config<D_QK>;
  static constexpr uint32_t kMathRegs = 216;
  static constexpr uint32_t kProducerRegs = 72;
  // Where the half of a buffer filled second splits into its two pieces, in 64-column blocks:
  // half 0 (blocks [0, kSplitBlocks), buffer 1's) and half 1 (blocks [kSplitBlocks, d_qk / 64),
  // buffer 0's) each at its first kSplitBlocks / 2 blocks. At s_kv 64k, where rows come from
  // DRAM, WG0 waited ~1400 cycles a pair for its second half to land and then ran S on all of it;
  // with the pieces, S on the first runs during that wait: V4-Pro and V3.2 at s_kv 64k and 128k
  // 0.7-2 % faster, s_kv 8k level (docs/notes/prefill.md, "S on the second half's first piece").
  static constexpr int kPieceSplitBlock[2] = {Base::kSplitBlocks / 2, Base::kSplitBlocks + Base::kSplitBlocks / 2};
  struct SharedPlan {
    alignas(1024) uint8_t q[Base::kQBytes];
    alignas(1024) uint8_t k[2][Base::kTileBytes];
    // P of the tile of WG1 (d 576: WG0's lives in buffer 0's rope block, read only by S) or of
    // WG0 and WG1 (d 512).
    alignas(1024) uint8_t p[Base::kPInRopeBlock ? 1 : 2][Base::kPBytes];
    float pair_max[Base::kHeads];  // the pair's reference max (base 2): WG0's, then WG1's final one
    float row_seen_max[2][Base::kHeads];  // [item parity] WG1's true running max (max_logits)
    float row_sum[2][2][Base::kHeads];    // [item parity][WG] partial l, exchanged at the item's end
    uint8_t key_valid[2][Base::kTile];    // [buffer][row]: 1 if the row's index was valid, by the producer
    ItemSlot item;   // the item whose Q q_full announces (work_item.cuh)
    int claimed[2];  // [CTA item count parity]: the producer's next item from the counter
    uint64_t q_full, q_empty;
    // [buffer][piece]: gathered. Piece 0 is half `buffer`, filled first, with the rows' key_valid
    // flags; pieces 1 and 2 are the other half's two parts (kPieceSplitBlock).
    uint64_t k_full[2][3];
    uint64_t k_empty[2][2];  // [buffer][half]: released by WG `half`, its last reader
    // The pair's hand-offs between the math WGs, each completed by the publishing WG's 128
    // threads once a pair (p_ready[1]: once a whole pair) and awaited by the other WG. The
    // schedule keeps a WG from publishing twice before the other has waited (math_pair.cuh).
    // mbarriers rather than named barriers: the same order, in a form compute-sanitizer's
    // racecheck follows (it reported a bar.arrive / bar.sync hand-off as races).
    uint64_t max_ready[2];  // [WG]: its reference max of the pair in pair_max
    uint64_t p_ready[2];    // [WG]: P of its tile in shared memory (the last member: kSmemBytes)
  };
  // (d 576 fills the 227 KB to the byte.)
  static constexpr int kSmemBytes =
      aligned_dynamic_smem_bytes(offsetof(SharedPlan, p_ready) + sizeof(SharedPlan::p_ready));  // its last member
  static_assert(kSmemBytes <= 227 * 1024, "shared-memory plan exceeds the sm_90 limit");
};

template <int D_QK, Schedule S>
using ScheduleConfig = std::conditional_t<S == Schedule::kSerial, SerialConfig<D_QK>, PairConfig<D_QK>>;

// Kernel entry for one d_qk (defined in kernel.cuh, instantiated in instantiations/).
template <int D_QK>
void launch(const Params& params, Schedule schedule, CUstream_st* stream);

}  // namespace dsv4::cuda::sparse_prefill_detail
