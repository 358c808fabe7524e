// The FP8 tensor-core scores kernel of the C4A indexer (sm_90a): compile-time shape, the
// parameters the host passes by value and the shared-memory plan of one CTA.
//
// The product per key tile is C[key, (token, head)] = K̂[key, :] · Q̂[(token, head), :]ᵀ over the 128
// dims, both operands fp8 e4m3 K-major in shared memory (the only operand form FP8 wgmma takes):
//   M = 64 keys (the wgmma M of one warpgroup), N = kCols = kTokens · kHeadsPadded, K = 128.
// Keys are M (not heads) so that the sum over heads runs along N, where a thread holds whole rows
// of its accumulator: the head reduction is in-thread FMAs plus two shuffles inside a quad, never
// a trip through shared memory. kTokens tokens of one request share every key tile (prefill: keys
// are loaded once per kTokens tokens); tokens of a CTA that belong to different requests are
// handled one request ("segment") after the other with the same Q operand.
//
// One CTA = one group of kTokens consecutive tokens × one chunk of key tiles (blockIdx.y), with
//   warpgroup 0 (128 threads): math — wgmma, then ReLU · (w·q_scale) summed over heads, · key
//                              scale, masks, stores;
//   warp 4 (32 threads):       producer — Q once, then each key tile (64 rows of 128 fp8 + their
//                              scales) gathered through the block table with cp.async into a ring
//                              of kStages stages (mbarriers full/empty).
// Several CTAs share an SM (2 at kCols 256, more below), so one CTA's epilogue overlaps another's
// products on the tensor cores.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/fast_divmod.cuh"
#include "cuda/common/index_vector.cuh"

namespace dsv4::cuda::indexer_scores_detail {

inline constexpr int kDim = 128;          // index head dim = K of the product = bytes per row
inline constexpr int kTileKeys = 64;      // keys per tile = wgmma M
inline constexpr int kStages = 4;         // key tiles in flight per CTA
inline constexpr int kMathThreads = 128;  // one warpgroup
inline constexpr int kProducerThreads = 32;
inline constexpr int kThreads = kMathThreads + kProducerThreads;
inline constexpr int kMaxCols = 256;      // wgmma N limit: kTokens · kHeadsPadded <= 256

struct Params {
  const uint8_t* q_fp8;  // [T, H, 128] fp8 codes, strides in bytes; rows 4-byte aligned
  int64_t q_stride0, q_stride1;
  const float* q_scale;  // [T, H], row stride
  int64_t q_scale_stride0;
  const float* weights;  // [T, H], row stride
  int64_t weights_stride0;
  int64_t num_tokens;
  int num_heads;
  IndexVector positions, token_to_req;
  const uint8_t* keys;  // [num_blocks, block_size · 132] bytes, block stride key_stride0
  int64_t key_stride0, num_key_blocks;
  int block_size;
  const int32_t* table;  // [R, max_blocks]
  int64_t table_stride0, table_stride1, num_requests, max_blocks;
  int ratio;
  float* scores;  // [T, N], row stride
  int64_t scores_stride0, N;
  int chunk_tiles;  // key tiles per CTA; blockIdx.y = chunk
  // Copy width of the gathers: 16-byte cp.async when every Q and key row is 16-byte aligned,
  // 4-byte otherwise (rows are always 4-byte aligned: the host checks).
  bool q_rows_16, key_rows_16;
  // Every key tile lies in one cache block (block_size a multiple of kTileKeys, key rows 16-byte
  // aligned): one table read per tile. tiles_in_block divides a row's tile index into (block,
  // tile within it).
  bool block_tiles;
  FastDivmod tiles_in_block;
};

// Who a CTA's tokens are: the rows it writes, what they see, which segment (request) they are in.
template <int kTokens>
struct TokenPlan {
  int64_t token[kTokens];    // token index, -1 past T
  int64_t visible[kTokens];  // min((p+1) div r, N)
  int segment[kTokens];      // index into segments, -1 past T
  int64_t request[kTokens];  // per segment: the request row (-1: out of range, every key NaN)
  int64_t limit[kTokens];    // per segment: keys [chunk_begin, limit) are gathered
  int tiles[kTokens];        // per segment: key tiles of this chunk it needs
  int num_segments;
  int total_tiles;           // Σ tiles over segments = pipeline steps
  int64_t chunk_begin, chunk_end;  // columns [begin, end) this CTA writes
};

template <int kCols, int kTokens>
struct SharedPlan {
  alignas(1024) uint8_t q[kCols * kDim];                   // B operand: K-major SW128 fp8
  alignas(1024) uint8_t keys[kStages][kTileKeys * kDim];   // A operand per stage, same layout
  float key_scale[kStages][kTileKeys];  // per key; NaN for an unmapped key (its score is NaN)
  float head_factor[kCols];             // w · q_scale per (token, head) column; 0 when padded
  TokenPlan<kTokens> plan;
  uint64_t q_full;
  uint64_t full[kStages], empty[kStages];
};

template <int kCols, int kTokens>
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SharedPlan<kCols, kTokens>)) + 1024;  // + alignment

// Kernel entry for one (kCols, kHeadsPadded) pair, defined in kernel.cuh and instantiated in
// instantiations/: grid (ceil(T / kTokens), chunks).
template <int kCols, int kHeadsPadded>
void launch_scores(const Params& params, int chunks, cudaStream_t stream);

}  // namespace dsv4::cuda::indexer_scores_detail
