// Sparse prefill kernel (sm_90a): compile-time configuration, shared-memory plan and the
// parameters the host dispatch passes by value.
//
// One work item = one query token × one group of 64 heads (the wgmma M dimension; all heads of a
// token share its indices, MQA); persistent CTAs (one per SM) walk the items round-robin. The
// token's top-k rows are gathered 64 at a time ("tiles") into two shared-memory buffers by a
// producer warpgroup; two math warpgroups alternate OWNERSHIP of tiles:
// the owner of tile i computes S = Q·K_iᵀ (64×64) and the online softmax, publishes P_i (bf16) and
// the row statistics in shared memory, and both warpgroups accumulate O[:, their 256 of d_v] +=
// P_i · V_i. While one owner runs its softmax the other warpgroup's matrix products keep the
// tensor cores busy. H that is not a multiple of 64 is padded inside the kernel: the last group's
// missing heads are out of bounds of the q tensor map (TMA fills zeros) and are never written, so
// any H ≥ 1 runs (H 64 and 128 without waste).
#pragma once

#include <cuda.h>

#include <cstdint>

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
  int s_q, num_heads, s_kv, topk;
  int64_t kv_row_stride, indices_row_stride;
  int64_t out_stride_s, out_stride_h, ml_stride_s, ml_stride_h, lse_stride_s, lse_stride_h;
  float scale_log2;  // softmax_scale · log2(e): logits are kept in base 2 inside the kernel
};

template <int D_QK>
struct Config {
  static_assert(D_QK == 512 || D_QK == 576, "d_qk must be 512 (MODEL1) or 576 (V3.2)");
  static constexpr int kDqk = D_QK;
  static constexpr int kDv = 512;
  static constexpr int kHeads = 64;     // heads per CTA = wgmma M
  static constexpr int kTile = 64;      // gathered rows per tile = S columns = P·V depth
  static constexpr int kDvPerWarpgroup = kDv / 2;
  static constexpr int kThreads = 3 * 128;  // WG0, WG1: math; WG2: producer
  static constexpr int kTileBytes = kTile * kDqk * 2;
  static constexpr int kQBytes = kHeads * kDqk * 2;
  static constexpr int kPBytes = kHeads * kTile * 2;
  // d 576: the rope block (cols 512..575) of a K tile is read only by S = Q·Kᵀ, so P of that tile
  // lives there once S is done; this is what lets Q + two 72 KB tiles fit in 227 KB.
  static constexpr bool kPInRopeBlock = kDqk > kDv;
  static constexpr int kPOffsetInTile = kDv * kTile * 2;  // byte offset of the rope block

  // Register split (setmaxnreg): math warpgroups hold O (128 fp32) + S (32) + P (16); the producer
  // only computes addresses. 2·224·128 + 56·128 = 64512 ≤ 65536. With the math warpgroups'
  // addresses in uniform registers (kernel.cuh) neither role spills at 224 / 56; at 232 / 40 the
  // producer's gather loop does.
  static constexpr uint32_t kMathRegs = 224;
  static constexpr uint32_t kProducerRegs = 56;

  // A tile is gathered in two halves (columns [0, 256) and [256, d_qk)), each on its own k_full
  // barrier. S used to start on the first half early; the math WGs now wait for both and fence
  // once (math.cuh, issue_s), which measured faster. The halves' barriers stay as measured;
  // folding them into one is a change still to be timed.
  static constexpr int kSplitBlocks = 4;           // 64-column blocks in the first half
  static constexpr int kSplitKSteps = kSplitBlocks * 64 / 16;
  // Named barriers (0 is __syncthreads): the end-of-item row-sum exchange between the math WGs;
  // the producer WG's threads waiting for its O store to have read a buffer.
  static constexpr uint32_t kBarLExchange = 1;
  static constexpr uint32_t kBarProducer = 2;

  struct SharedPlan {
    alignas(1024) uint8_t q[kQBytes];
    alignas(1024) uint8_t k[2][kTileBytes];
    alignas(1024) uint8_t p[kPInRopeBlock ? 1 : 2][kPInRopeBlock ? 16 : kPBytes];
    float row_max[2][kHeads];    // reference max (base-2 units) after the tile, per buffer parity
    float row_seen_max[2][kHeads];  // true running max after the tile (for max_logits)
    float row_scale[2][kHeads];  // factor the tile's owner applied to O and l
    float row_sum[2][2][kHeads];  // [item parity][WG] partial l, exchanged at the item's end
    uint8_t key_valid[2][kTile];  // [buffer][row]: 1 if the row's index was valid, by the producer
    uint64_t q_full, q_empty;
    uint64_t k_full[2][2];  // [buffer][half]
    uint64_t p_ready[2];    // [local tile parity]: P and row stats of a tile published by its owner
    uint64_t k_empty[2];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedPlan)) + 1024;  // + alignment
  static_assert(kSmemBytes <= 227 * 1024, "shared-memory plan exceeds the sm_90 limit");
};

// Kernel entry for one d_qk (defined in kernel.cuh, instantiated in instantiations/).
template <int D_QK>
void launch(const Params& params, CUstream_st* stream);

}  // namespace dsv4::cuda::sparse_prefill_detail
