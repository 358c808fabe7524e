// CUDA indexer scores (SPEC §5): score_j = Σ_h w_h · ReLU(q̂_h · k̂_j). A block of 128 threads
// per (token, tile of 128 entries): the token's decoded queries, scales and weights sit in shared
// memory; each thread decodes its entry's key (paged indexer key cache) into registers once and
// sums the heads in order h = 0..H−1 with the CPU's dot-product order (indexer_math.h), so the
// scores equal the CPU reference's bit for bit.
#include <cmath>

#include "cuda/common/check.h"
#include "cuda/common/index_vector.cuh"
#include "cuda/indexer/indexer.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/indexer_math.h"

namespace dsv4::cuda {
namespace {

namespace im = indexer_math;
constexpr int kDim = indexer_keys::kDim;
constexpr int kTile = 128;      // entries per tile = threads per block
constexpr int kMaxHeads = 256;  // shared memory: H · (128 + 2) floats <= 130 KiB
constexpr int kMaxGridY = 65535;

struct ScoresParams {
  const uint8_t* q_fp8;  // [T, H, 128], strides q_stride0 / q_stride1
  int64_t q_stride0, q_stride1;
  const float* q_scale;  // [T, H], row stride
  int64_t q_scale_stride0;
  const float* weights;  // [T, H], row stride
  int64_t weights_stride0;
  int H;
  IndexVector positions, token_to_req;
  const uint8_t* keys;  // [num_blocks, block_size · 132], row stride key_stride0 (bytes)
  int64_t key_stride0, num_key_blocks;
  int block_size;
  const int32_t* table;  // [R, max_blocks]
  int64_t table_stride0, table_stride1, num_requests, max_blocks;
  int ratio;
  float* scores;  // [T, N], row stride
  int64_t scores_stride0, N;
};

// The entry's key block, or nullptr when the request row or the block is out of range.
__device__ __forceinline__ const uint8_t* key_block(const ScoresParams& p, int64_t req,
                                                    int64_t j) {
  if (req < 0 || req >= p.num_requests) return nullptr;
  const int64_t k = j / p.block_size;
  if (k >= p.max_blocks) return nullptr;
  const int32_t b = p.table[req * p.table_stride0 + k * p.table_stride1];
  if (b < 0 || b >= p.num_key_blocks) return nullptr;
  return p.keys + b * p.key_stride0;
}

__global__ void __launch_bounds__(kTile) scores_kernel(ScoresParams p) {
  extern __shared__ float smem[];
  float* q_s = smem;                           // [H][128] decoded fp8 codes
  float* q_scale_s = smem + p.H * kDim;        // [H]
  float* w_s = q_scale_s + p.H;                // [H]
  const int64_t t = blockIdx.x;
  const int64_t seen = im::visible_entries(p.positions[t], p.ratio);
  const int64_t visible = seen < p.N ? seen : p.N;
  const int64_t req = p.token_to_req[t];
  float* out = p.scores + t * p.scores_stride0;

  // Only blocks with a visible entry need the queries (block-uniform condition).
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kTile;
  if (first < visible) {
    const uint8_t* q = p.q_fp8 + t * p.q_stride0;
    for (int i = threadIdx.x; i < p.H * kDim; i += kTile)
      q_s[i] = fp8_e4m3_to_float(q[(i / kDim) * p.q_stride1 + i % kDim]);
    for (int h = threadIdx.x; h < p.H; h += kTile) {
      q_scale_s[h] = p.q_scale[t * p.q_scale_stride0 + h];
      w_s[h] = p.weights[t * p.weights_stride0 + h];
    }
  }
  __syncthreads();

  for (int64_t tile = first; tile < p.N; tile += static_cast<int64_t>(gridDim.y) * kTile) {
    const int64_t j = tile + threadIdx.x;
    if (j >= p.N) break;
    if (j >= visible) {
      out[j] = -INFINITY;
      continue;
    }
    const uint8_t* block = key_block(p, req, j);
    if (block == nullptr) {
      out[j] = __int_as_float(0x7fc00000);  // NaN: no key for this entry
      continue;
    }
    const int off = static_cast<int>(j % p.block_size);
    // The 128 codes as 32 aligned words (blocks are 4-byte aligned, entries 128 bytes apart).
    const uint32_t* words = reinterpret_cast<const uint32_t*>(indexer_key_codes(block, off));
    float k[kDim];
#pragma unroll
    for (int w = 0; w < kDim / 4; ++w) {
      const uint32_t word = words[w];
#pragma unroll
      for (int b = 0; b < 4; ++b) k[4 * w + b] = fp8_e4m3_to_float(static_cast<uint8_t>(word >> (8 * b)));
    }
    const float key_scale = indexer_key_scale(block, p.block_size, off);
    float score = 0.0f;
    for (int h = 0; h < p.H; ++h) {
      const float dot = im::dot128(q_s + h * kDim, k);
      score = ieee_add(score, im::head_term(w_s[h], dot, q_scale_s[h], key_scale));
    }
    out[j] = score;
  }
}

}  // namespace

void indexer_scores(const TensorView& q_fp8, const TensorView& q_scale, const TensorView& weights,
                    const TensorView& positions, const TensorView& token_to_req,
                    const IndexerKeyCacheView& keys, const TensorView& key_block_table, int ratio,
                    const TensorView& scores, Stream stream) {
  constexpr const char* kOp = "indexer_scores";
  const int64_t T = q_fp8.size(0), H = q_fp8.size(1), N = scores.size(1);
  if (H > kMaxHeads) fail_expected(kOp, "q_fp8.shape[1] (index heads) on CUDA", "<= 256", H);
  if (reinterpret_cast<uintptr_t>(keys.data.data) % 4 != 0 || keys.data.stride(0) % 4 != 0)
    fail(kOp, ": keys.data: expected a 4-byte aligned address and row stride on CUDA (the "
              "kernel reads codes and scales as 4-byte words), got stride ",
         keys.data.stride(0));
  if (T == 0 || N == 0) return;
  DSV4_CHECK(T <= 0x7fffffff, kOp, ": T = ", T, " tokens exceed one launch");

  ScoresParams p;
  p.q_fp8 = q_fp8.ptr<const uint8_t>();
  p.q_stride0 = q_fp8.stride(0);
  p.q_stride1 = q_fp8.stride(1);
  p.q_scale = q_scale.ptr<const float>();
  p.q_scale_stride0 = q_scale.stride(0);
  p.weights = weights.ptr<const float>();
  p.weights_stride0 = weights.stride(0);
  p.H = static_cast<int>(H);
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

  const size_t smem = static_cast<size_t>(H) * (kDim + 2) * sizeof(float);
  if (smem > 48 * 1024)
    DSV4_CUDA_CHECK(kOp, cudaFuncSetAttribute(scores_kernel,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
  const int64_t tiles = (N + kTile - 1) / kTile;
  const dim3 grid(static_cast<unsigned>(T),
                  static_cast<unsigned>(tiles < kMaxGridY ? tiles : kMaxGridY));
  scores_kernel<<<grid, kTile, smem, stream>>>(p);
  check_launch(kOp);
}

}  // namespace dsv4::cuda
