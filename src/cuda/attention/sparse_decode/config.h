// Compile-time shape of the sparse FP8 decode kernel and the per-layout facts it needs.
//
// One CTA computes one query token (b, s) × one block of 64 heads × one split of the concatenated
// index list [main scope | extra scope]. All heads of a token share its indices, so the 64 heads
// are the M dimension of the tensor-core products and each gathered KV row is reused 64 times.
// H = 128 runs two head blocks (adjacent CTAs, so the second gather hits L2); any other H is
// padded up to a multiple of 64 with zero query rows that are never stored.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dsv4/kv_layout.h"

namespace dsv4::cuda::decode {

inline constexpr int kHeadsPerCta = 64;   // M of the products (4 warps × 16 rows)
inline constexpr int kTileKeys = 64;      // index slots gathered per pipeline step
// Warpgroups 0 and 1 consume (S, softmax, P·V; warp w of warpgroup `half` owns heads
// 16w..16w+15; `half` picks the keys of S and the value dims of O); warpgroup 2 produces (gathers
// and dequantizes the KV tiles into two shared-memory stages).
inline constexpr int kConsumerThreads = 256;
inline constexpr int kProducerThreads = 128;
inline constexpr int kThreads = kConsumerThreads + kProducerThreads;
// setmaxnreg split of the 168·384 registers the CTA holds at launch: 128·(152 + 2·176) fits it
// exactly (a larger total makes setmaxnreg.inc wait forever). ptxas: the consumers (128
// accumulators + S) spill at 168, the producer (a tile of gathered bytes) at 112.
inline constexpr int kProducerRegs = 152, kConsumerRegs = 176;
inline constexpr int kDv = 512;           // value dims (V = the first 512 dims of K)
inline constexpr int kPRowBytes = kTileKeys * 2;  // bf16 probabilities, one row per head

// What the gather and dequantization need to know about a cache layout. Two producer threads
// share a slot: thread `sub` loads fp8 chunks (16 values) sub, sub+2, ... and rope chunks (8 bf16)
// sub, sub+2, ..., so both need the same scale entries in the same order.
inline constexpr int kThreadsPerKey = kProducerThreads / kTileKeys;  // 2
inline constexpr int kRopeChunksPerThread = 64 * 2 / 16 / kThreadsPerKey;  // 4

template <KvLayout L>
struct LayoutTraits;

template <>
struct LayoutTraits<KvLayout::model1_fp8> {
  static constexpr int kDqk = model1::kDim;                // 512
  static constexpr int kNope = model1::kNope;              // 448 fp8 values
  static constexpr int kQuantBlock = model1::kQuantBlock;  // one UE8M0 byte per 64
  static constexpr int kRopeOffset = model1::kNope;        // bf16 rope right after the nope bytes
};

template <>
struct LayoutTraits<KvLayout::v32_fp8> {
  static constexpr int kDqk = v32::kDim;                   // 576
  static constexpr int kNope = v32::kNope;                 // 512 fp8 values
  static constexpr int kQuantBlock = v32::kQuantBlock;     // one fp32 scale per 128
  static constexpr int kRopeOffset = v32::kRopeOffset;     // 528
};

template <KvLayout L>
inline constexpr int kFp8ChunksPerThread = LayoutTraits<L>::kNope / 16 / kThreadsPerKey;  // 14 / 16

// Shared-memory plan of one CTA (bytes). Q and two KV stages are bf16 K-major SW128 tiles
// (smem_layout.cuh): the tensor cores multiply one stage while the threads fill the other.
template <KvLayout L>
struct SmemPlan {
  static constexpr int kRowBytes = LayoutTraits<L>::kDqk * 2;
  static constexpr int kQ = 0;
  static constexpr int kKv = kQ + kHeadsPerCta * kRowBytes;         // [2] stages
  static constexpr int kKvStage = kTileKeys * kRowBytes;
  static constexpr int kP = kKv + 2 * kKvStage;
  static constexpr int kRowMax = kP + kHeadsPerCta * kPRowBytes;    // float [2][64]
  static constexpr int kRowSum = kRowMax + 2 * kHeadsPerCta * 4;    // float [2][64]
  static constexpr int kKeyValid = kRowSum + 2 * kHeadsPerCta * 4;  // uint8 [2][64]
  static constexpr int kBars = kKeyValid + 2 * kTileKeys;            // uint64 full[2], empty[2]
  static constexpr int kBytes = kBars + 4 * 8;
};

// One index scope as the kernel reads it (validated by the host).
struct DecodeScope {
  const uint8_t* cache = nullptr;   // block 0 of the paged cache
  int64_t block_stride = 0;         // bytes between blocks
  int64_t num_slots = 0;            // indices >= this are invalid
  const int32_t* indices = nullptr; // [rows, topk] contiguous
  const int32_t* topk_length = nullptr;  // optional [b]
  int block_size = 1;
  int topk = 0;
};

struct DecodeParams {
  const uint16_t* q = nullptr;  // bf16 bits, [rows, H, d_qk] with the strides below
  int64_t q_row_stride = 0, q_head_stride = 0;  // elements
  int num_rows = 0, s_q = 1, num_heads = 0;
  DecodeScope main, extra;      // extra.topk == 0: no extra scope
  int topk_total = 0, num_splits = 1, split_len = 0;
  float scale_log2 = 0.0f;      // softmax_scale · log2(e): logits in base 2
  // num_splits > 1: partial_o [rows, H, splits, 512] fp32, partial_lse [rows, H, splits].
  float* partial_o = nullptr;
  float* partial_lse = nullptr;
  // num_splits == 1: the kernel finishes the row itself (out bf16 [rows, H, 512], lse [rows, H],
  // optional sink [H]) and the combine is skipped.
  uint16_t* out = nullptr;
  float* lse = nullptr;
  const float* sink = nullptr;
};

template <KvLayout L>
void launch_sparse_decode(const DecodeParams& params, cudaStream_t stream);

}  // namespace dsv4::cuda::decode
