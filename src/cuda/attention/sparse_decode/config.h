// Compile-time shape of the sparse FP8 decode kernel and the per-layout facts it needs.
//
// One CTA computes one query token (b, s) × one block of 64 heads × one split of the concatenated
// index list [main scope | extra scope]. All heads of a token share its indices, so the 64 heads
// are the M dimension of the tensor-core products and each gathered KV row is reused 64 times.
// Any H is padded up to a multiple of 64 with zero query rows that are never stored. When the
// head blocks come in pairs (H 128), the two CTAs of a pair form a cluster: each gathers and
// dequantizes half of every tile's keys and writes them into both CTAs' shared memory, so a pair
// reads each KV row from L2 once and each producer does half the conversion work.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <cutlass/fast_math.h>

#include "cuda/attention/sparse_decode/launch_order.h"
#include "dsv4/kv_layout.h"

namespace dsv4::cuda::decode {

inline constexpr int kHeadsPerCta = 64;   // M of the products (4 warps × 16 rows)
inline constexpr int kTileKeys = 64;      // index slots gathered per pipeline step
// Warpgroup 0 computes S = Q·Kᵀ for the whole tile, the online softmax and O[:, 0:256] += P·V
// (P from registers); warpgroup 1 computes O[:, 256:512] += P·V with P from shared memory, so
// its product overlaps warpgroup 0's S of the next tile; the rest produce (gather and dequantize
// the KV tiles into two shared-memory stages): two warpgroups in a CTA of its own, one in a
// cluster CTA (which gathers half the keys). Either way a producer thread converts a quarter of a
// key per tile: the producer is bound by its instruction stream (docs/notes/decode.md), and two
// producer warps per scheduler hide each other's latencies where one could not.
inline constexpr int kConsumerThreads = 256;
template <int kCluster>
inline constexpr int kProducerThreads = kCluster == 1 ? 256 : 128;
template <int kCluster>
inline constexpr int kThreads = kConsumerThreads + kProducerThreads<kCluster>;
// setmaxnreg split of the registers the CTA holds at launch: 128·(192 + 160 + 2·80) = 128·512
// without a cluster, 128·(192 + 160 + 152) = 168·384 in one; each fits exactly (a larger total
// makes setmaxnreg.inc wait forever). Warpgroup 0 holds O (128), S (32) and P (16); warpgroup 1
// only O; a producer thread one or two tiles of its gathered bytes (kProducerBuffers).
inline constexpr int kSoftmaxRegs = 192, kPvRegs = 160;
template <int kCluster>
inline constexpr int kProducerRegs = kCluster == 1 ? 80 : 152;
inline constexpr int kDv = 512;           // value dims (V = the first 512 dims of K)
inline constexpr int kPRowBytes = kTileKeys * 2;  // bf16 probabilities, one row per head

// How a producer splits a tile: with a cluster of kCluster CTAs each producer gathers kTileKeys /
// kCluster keys, kThreadsPerKey threads per key (4 either way); thread `sub` of a key loads fp8
// chunks (16 values) sub, sub + kThreadsPerKey, ... and bf16 chunks (8 values) likewise, so a
// thread's chunks of one quantization block sit at consecutive i (kThreadsPerKey divides the chunks
// per block).
template <int kCluster>
inline constexpr int kThreadsPerKey = kProducerThreads<kCluster> * kCluster / kTileKeys;

// What the kernel needs of a cache layout (docs/spec.md §7): a token's leading kNope dims are fp8
// codes, in scale blocks of kQuantBlock, and the rest (kBf16Dims) bf16 at byte kBf16Offset of its
// data row (kDataBytes, prefetched whole). kDirectCopy layouts need no conversion: without a
// cluster their rows are copied into the stages by cp.async (a whole row is too many registers
// for a producer thread); in a cluster they take the register path like the others, since a
// halved share fits and the peer's half must go through the cluster anyway.
template <KvLayout L>
struct LayoutTraits;

template <>
struct LayoutTraits<KvLayout::model1_fp8> {
  static constexpr int kDqk = model1::kDim;                // 512
  static constexpr int kNope = model1::kNope;              // 448 fp8 values
  static constexpr int kQuantBlock = model1::kQuantBlock;  // one UE8M0 byte per 64
  static constexpr int kBf16Offset = model1::kNope;        // bf16 rope right after the nope bytes
  static constexpr int kBf16Dims = model1::kRope;
  static constexpr int kDataBytes = model1::kDataBytes;    // 576 (scales in a row of their own)
  static constexpr bool kDirectCopy = false;
};

template <>
struct LayoutTraits<KvLayout::v32_fp8> {
  static constexpr int kDqk = v32::kDim;                   // 576
  static constexpr int kNope = v32::kNope;                 // 512 fp8 values
  static constexpr int kQuantBlock = v32::kQuantBlock;     // one fp32 scale per 128
  static constexpr int kBf16Offset = v32::kRopeOffset;     // 528
  static constexpr int kBf16Dims = v32::kRope;
  static constexpr int kDataBytes = v32::kTokenBytes;      // 656, scales inside
  static constexpr bool kDirectCopy = false;
};

template <>
struct LayoutTraits<KvLayout::fp8_per_tensor> {
  static constexpr int kDqk = 512;
  static constexpr int kNope = 512;                        // every dim fp8
  static constexpr int kQuantBlock = 512;                  // one scale: the cache's tensor_scale
  static constexpr int kBf16Offset = 512;
  static constexpr int kBf16Dims = 0;
  static constexpr int kDataBytes = 512;
  static constexpr bool kDirectCopy = false;
};

template <>
struct LayoutTraits<KvLayout::bf16> {
  static constexpr int kDqk = 512;
  static constexpr int kNope = 0;
  static constexpr int kQuantBlock = 512;                  // unused
  static constexpr int kBf16Offset = 0;
  static constexpr int kBf16Dims = 512;                    // every dim bf16, copied as is
  static constexpr int kDataBytes = 1024;
  static constexpr bool kDirectCopy = true;
};
// Whether a CTA's producer copies its rows by cp.async (produce_by_copy) instead of staging them
// in registers (produce).
template <KvLayout L, int kCluster>
inline constexpr bool kCopiedRows = LayoutTraits<L>::kDirectCopy && kCluster == 1;

template <KvLayout L, int kCluster>
inline constexpr int kFp8ChunksPerThread = LayoutTraits<L>::kNope / 16 / kThreadsPerKey<kCluster>;
template <KvLayout L, int kCluster>
inline constexpr int kBf16ChunksPerThread = LayoutTraits<L>::kBf16Dims * 2 / 16 / kThreadsPerKey<kCluster>;

// Named barriers of the kernel (0 is __syncthreads). kBarConsumers: both consumer warpgroups (256
// threads), Q loaded, and the output factors written. The per-tile hand-off between them goes
// through two mbarriers instead (SharedPlan::p_ready: P and the tile's O factor published by
// warpgroup 0; p_free: warpgroup 1 has read them), whose release/acquire racecheck models (a
// named-barrier arrive it does not). kBarOutRows + h: warpgroup h's O rows are in shared memory
// (its 128 threads; detail::store_o_half).
inline constexpr int kBarConsumers = 1;
inline constexpr int kBarOutRows = 2;

// Shared-memory plan of one CTA. Q and the two KV stages are bf16 K-major SW128 tiles
// (smem_layout.cuh) at multiples of 1024 bytes (the swizzle atom): the tensor cores multiply one
// stage while the producer fills the other. The dynamic shared-memory size is sizeof(SharedPlan).
template <KvLayout L>
struct SharedPlan {
  static constexpr int kRowBytes = LayoutTraits<L>::kDqk * 2;
  static constexpr int kStageBytes = kTileKeys * kRowBytes;

  alignas(1024) uint8_t q[kHeadsPerCta * kRowBytes];
  alignas(1024) uint8_t kv[2][kStageBytes];         // the KV stages: K, and V = their first 512 dims
  // bf16 P of the tile [64 heads × 64 keys]; before the first tile, the launch-order scratch
  // (detail::choose_row: P is first written after the first tile's S, past the prologue's barriers).
  alignas(1024) uint8_t p[kHeadsPerCta * kPRowBytes];
  float row_scale[kHeadsPerCta];   // the tile's O factor, from warpgroup 0 to warpgroup 1
  float out_scale[kHeadsPerCta];   // 1 / row sum (and the sink), from warpgroup 0 to warpgroup 1
  uint8_t key_valid[2][kTileKeys]; // per stage: whether key k's slot was valid (else S = −inf)
  // mbarriers (their arrival counts: sparse_decode_kernel, kernel.cuh)
  uint64_t full[2];   // stage filled: every producer thread (+ the peer's copied bytes; kDirectCopy:
                      // + each producer thread's cp.async landing)
  uint64_t empty[2];  // stage consumed: every consumer warp of the cluster
  uint64_t p_ready;   // P and row_scale of the tile published by warpgroup 0
  uint64_t p_free;    // warpgroup 1 is done reading them

  // After the last tile of a CTA without a cluster, Q's bytes and the stages' (contiguous:
  // static_assert below) hold the O rows on their way out (detail::store_o_half, out_rows.cuh).
  __host__ __device__ uint8_t* out_rows() { return q; }
};
template <KvLayout L>
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SharedPlan<L>));

// The O rows on their way out: each warpgroup's half of the CTA's 64 rows (256 value dims, fp32
// partials or the bf16 output), one row per head at a pitch 16 bytes past the row's bytes, so that
// a warp's stores of 8 rows × 4 lanes spread over all banks (2 wavefronts for 256 fp32 bytes, 1
// for 128 bf16 bytes); the warps then read 512 contiguous bytes of one row at a time
// (detail::copy_out_rows), which no pitch conflicts.
template <class T>
inline constexpr int kOutRowPitch = kDv / 2 * static_cast<int>(sizeof(T)) + 16;
template <class T>
inline constexpr int kOutHalfBytes = kHeadsPerCta * kOutRowPitch<T>;
template <KvLayout L>
inline constexpr bool kOutRowsFit = offsetof(SharedPlan<L>, kv) == sizeof(SharedPlan<L>::q) &&
                                    2 * kOutHalfBytes<float> <= sizeof(SharedPlan<L>::q) + sizeof(SharedPlan<L>::kv);
static_assert(kOutRowsFit<KvLayout::model1_fp8> && kOutRowsFit<KvLayout::v32_fp8> && kOutRowsFit<KvLayout::bf16> &&
                  kOutRowsFit<KvLayout::fp8_per_tensor>,
              "both warpgroups' O rows fit in Q's and the stages' bytes");

static_assert(kHeadsPerCta * kPRowBytes >= (kMaxOrderedBatches + 1) * static_cast<int>(sizeof(int)),
              "the launch-order scratch fits in P's bytes");
static_assert(kSmemBytes<KvLayout::model1_fp8> <= 227 * 1024 && kSmemBytes<KvLayout::v32_fp8> <= 227 * 1024 &&
                  kSmemBytes<KvLayout::bf16> <= 227 * 1024 && kSmemBytes<KvLayout::fp8_per_tensor> <= 227 * 1024,
              "shared-memory plan exceeds the sm_90 limit");

// One index scope as the kernel reads it (validated by the host).
struct DecodeScope {
  const uint8_t* cache = nullptr;   // block 0 of the paged cache
  int64_t block_stride = 0;         // bytes between blocks (>= the layout's block bytes)
  int64_t num_slots = 0;            // indices >= this are invalid
  const int32_t* indices = nullptr; // [b, s_q, topk], the strides below (elements), last dim dense
  int64_t indices_b_stride = 0, indices_s_stride = 0;
  const int32_t* topk_length = nullptr;  // optional [b]
  // Tokens a block, as a divisor prepared on the host: a slot's block is a multiply-high and a
  // shift (slots are int32, below the 2^31 the divider needs), where a division by a run-time
  // int cost ~25 instructions and a reciprocal on the producer's address path every tile.
  cutlass::FastDivmod block_size{1};
  int topk = 0;
  float tensor_scale = 1.0f;        // FP8_PER_TENSOR: value = fp8 · tensor_scale
};

// Strides (elements) of a [b, s_q, H, ...] tensor over its first three dims; query row
// `row` = batch · s_q + seq. Each CTA resolves its row once (row_offset), so the per-element
// addressing stays one head offset plus a column.
struct RowStrides {
  int64_t b = 0, s = 0, h = 0;
  __host__ __device__ int64_t row_offset(int batch, int seq) const {
    return static_cast<int64_t>(batch) * b + static_cast<int64_t>(seq) * s;
  }
};

struct DecodeParams {
  // [b, s_q, H, d_qk] with q_strides (last dim dense): bf16 bits, or e4m3 codes when q_fp8, which
  // load_q converts to the bf16 query they mean, bf16(fp8 · q_scale).
  const void* q = nullptr;
  bool q_fp8 = false;
  float q_scale = 1.0f;
  RowStrides q_strides;         // elements; 16-byte multiples: rows are read in aligned pieces
  int num_rows = 0, s_q = 1, num_heads = 0;
  DecodeScope main, extra;      // extra.topk == 0: no extra scope
  int topk_total = 0, num_splits = 1, split_len = 0;
  float scale_log2 = 0.0f;      // softmax_scale · log2(e): logits in base 2
  // num_splits > 1: partial_o [rows, H, splits, 512] fp32, partial_lse [rows, H, splits].
  float* partial_o = nullptr;
  float* partial_lse = nullptr;
  // num_splits == 1: the kernel finishes the row itself (out bf16 [b, s_q, H, 512] with
  // out_strides, multiples of 8 elements for its 16-byte stores; lse [b, s_q, H] with
  // lse_strides; optional sink [H]) and the combine is skipped.
  uint16_t* out = nullptr;
  RowStrides out_strides;
  float* lse = nullptr;
  RowStrides lse_strides;
  const float* sink = nullptr;
};

template <KvLayout L>
void launch_sparse_decode(const DecodeParams& params, cudaStream_t stream);

}  // namespace dsv4::cuda::decode
