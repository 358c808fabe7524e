// CUDA indexer scores (docs/spec.md §5): score_j = Σ_h w_h · ReLU(q̂_h · k̂_j), on FP8 tensor cores (the
// wgmma kernel in scores/, sm_90a). This file picks the launch shape and checks what the kernel
// adds to the op's contract (alignment, head count).
//
// Launch shape:
//   heads padded to kHeadsPadded ∈ {64, 128, 256} (zero query rows, factor 0);
//   tokens per CTA G ∈ {1, 2, 4} with G · kHeadsPadded <= 256: the largest power of two not above
//     T / R (the average tokens per request row of the block table), so a prefill shares each key
//     tile among 4 tokens and a decode (one token per request) wastes no columns;
//   key tiles per CTA: enough CTAs for ~4 per SM over the whole grid (decode splits a long row
//     over several CTAs; a prefill keeps a row in one CTA and loads its Q once).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/check.h"
#include "cuda/common/device_props.h"
#include "cuda/common/index_vector.cuh"
#include "cuda/indexer/indexer.h"
#include "cuda/indexer/scores/config.h"

namespace dsv4::cuda {
namespace {

namespace sd = indexer_scores_detail;
constexpr const char* kOp = "indexer_scores";
constexpr int kMaxHeads = 256;
constexpr int kMaxGridY = 65535;
constexpr int kCtasPerSmTarget = 4;

int heads_padded(int64_t H) { return H <= 64 ? 64 : H <= 128 ? 128 : 256; }

int auto_tokens_per_cta(int64_t T, int64_t requests, int max_tokens) {
  const int64_t per_request = T / std::max<int64_t>(requests, 1);
  int g = 1;
  while (g * 2 <= max_tokens && g * 2 <= per_request) g *= 2;
  return g;
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void indexer_scores(const TensorView& q_fp8, const TensorView& q_scale, const TensorView& weights,
                    const TensorView& positions, const TensorView& token_to_req,
                    const IndexerKeyCacheView& keys, const TensorView& key_block_table, int ratio,
                    const TensorView& scores, Stream stream, ScoresTiling tiling) {
  const int64_t T = q_fp8.size(0), H = q_fp8.size(1), N = scores.size(1);
  if (H > kMaxHeads) fail_expected(kOp, "q_fp8.shape[1] (index heads) on CUDA", "<= 256", H);
  if (!aligned(keys.data.data, 4) || keys.data.stride(0) % 4 != 0)
    fail(kOp, ": keys.data: expected a 4-byte aligned address and row stride on CUDA (the "
              "kernel copies codes and scales in 4-byte words at least), got stride ",
         keys.data.stride(0));
  if (!aligned(q_fp8.data, 4) || q_fp8.stride(0) % 4 != 0 || q_fp8.stride(1) % 4 != 0)
    fail(kOp, ": q_fp8: expected a 4-byte aligned address and strides on CUDA (rows are copied in "
              "4-byte words at least), got strides (",
         q_fp8.stride(0), ", ", q_fp8.stride(1), ")");
  const int hp = heads_padded(H);
  const int max_tokens = 256 / hp;
  int tokens = tiling.tokens_per_cta;
  if (tokens == 0) tokens = auto_tokens_per_cta(T, key_block_table.size(0), max_tokens);
  DSV4_CHECK(tokens == 1 || tokens == 2 || tokens == 4, kOp, ": tokens per CTA must be 1, 2 or 4, got ", tokens);
  DSV4_CHECK(tokens <= max_tokens, kOp, ": ", tokens, " tokens per CTA exceed 256 columns at ", hp,
             " padded heads");
  if (T == 0 || N == 0) return;
  DSV4_CHECK(T <= 0x7fffffff, kOp, ": T = ", T, " tokens exceed one launch");

  sd::Params p;
  p.q_fp8 = q_fp8.ptr<const uint8_t>();
  p.q_stride0 = q_fp8.stride(0);
  p.q_stride1 = q_fp8.stride(1);
  p.q_scale = q_scale.ptr<const float>();
  p.q_scale_stride0 = q_scale.stride(0);
  p.weights = weights.ptr<const float>();
  p.weights_stride0 = weights.stride(0);
  p.num_tokens = T;
  p.num_heads = static_cast<int>(H);
  p.positions = IndexVector::of(positions);
  p.token_to_req = IndexVector::of(token_to_req);
  p.keys = keys.data.ptr<const uint8_t>();
  p.key_stride0 = keys.data.stride(0);
  p.num_key_blocks = keys.data.size(0);
  p.block_size = keys.block_size;
  p.table = key_block_table.ptr<const int32_t>();
  p.table_stride0 = key_block_table.stride(0);
  p.table_stride1 = key_block_table.stride(1);
  p.num_requests = key_block_table.size(0);
  p.max_blocks = key_block_table.size(1);
  p.ratio = ratio;
  p.scores = scores.ptr<float>();
  p.scores_stride0 = scores.stride(0);
  p.N = N;
  // Key rows sit at block + offset·128; Q rows at t·stride0 + h·stride1.
  p.key_rows_16 = aligned(p.keys, 16) && p.key_stride0 % 16 == 0;
  p.q_rows_16 = aligned(p.q_fp8, 16) && p.q_stride0 % 16 == 0 && p.q_stride1 % 16 == 0;

  p.block_tiles = keys.block_size % sd::kTileKeys == 0 && p.key_rows_16;
  p.tiles_in_block = FastDivmod::of(p.block_tiles ? keys.block_size / sd::kTileKeys : 1);

  const int64_t tiles = (N + sd::kTileKeys - 1) / sd::kTileKeys;
  DSV4_CHECK(tiles <= INT32_MAX, kOp, ": N = ", N, " columns exceed 2^31 key tiles");
  const int64_t groups = (T + tokens - 1) / tokens;
  int64_t chunk = tiling.chunk_tiles;
  if (chunk <= 0) {
    const int64_t target = int64_t{kCtasPerSmTarget} * current_device_sm_count(kOp);
    chunk = std::clamp<int64_t>((tiles * groups + target - 1) / target, 1, tiles);
  }
  chunk = std::max(chunk, (tiles + kMaxGridY - 1) / kMaxGridY);
  DSV4_CHECK(chunk <= 0x7fffffff, kOp, ": N = ", N, " columns exceed one launch");
  p.chunk_tiles = static_cast<int>(chunk);
  const int chunks = static_cast<int>((tiles + chunk - 1) / chunk);

  const cudaStream_t s = stream;
  switch (hp * 8 + tokens) {
    case 64 * 8 + 1: sd::launch_scores<64, 64>(p, chunks, s); break;
    case 64 * 8 + 2: sd::launch_scores<128, 64>(p, chunks, s); break;
    case 64 * 8 + 4: sd::launch_scores<256, 64>(p, chunks, s); break;
    case 128 * 8 + 1: sd::launch_scores<128, 128>(p, chunks, s); break;
    case 128 * 8 + 2: sd::launch_scores<256, 128>(p, chunks, s); break;
    default: sd::launch_scores<256, 256>(p, chunks, s); break;
  }
}

}  // namespace dsv4::cuda
