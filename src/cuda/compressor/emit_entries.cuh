// Kernel 1 of compressor_update_and_emit: one block of D threads per batch token; the tokens that
// complete a window (position (j+1)·r − 1) pool it, normalize, rotate and store entry j. The
// per-element math is the CPU op's (math/compressor.h, math/rms_norm.h, math/rope.h,
// fp8_block.h, kv_layout.h, indexer_key_cache.h) in the CPU op's order, so the entries are
// bit-identical. Nothing runs serially over the entry's dims: the window's present rows are
// compacted by warp ballots (window order kept), RMSNorm's sum runs in one warp in the lane order
// norm_math.h defines for the CPU too, and the encoders' FP8 blocks are one thread each (KV cache:
// blocks of 64) or one block maximum over the block's threads (indexer keys: fmax is exact in any
// order) — where one thread used to pool the window, sum 512 squares and encode the whole entry.
#pragma once

#include <cstdint>

#include "cuda/common/float_rows.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/rope_table.cuh"
#include "cuda/common/warp_kv_scale_block.cuh"
#include "cuda/compressor/update_params.cuh"
#include "cuda/norm/warp_rms.cuh"
#include "dsv4/compressor.h"
#include "dsv4/fp8_block.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/kv_layout.h"
#include "math/compressor.h"
#include "math/rms_norm.h"

namespace dsv4::cuda::compressor {

constexpr int kMaxDim = 512;        // D: 512 (kv_cache) or 128 (indexer_keys); blockDim.x == D
constexpr int kMaxRingRows = 128;   // K = coff·r: 8 (r = 4) or 128 (r = 128); K <= D
constexpr int kMaxWarps = kMaxDim / 32;

// Window rows: absent (position < 0: kv = 0, s = −inf, no term), present, or invalid (the row is
// not where the contract puts it: not in this batch's run, or its ring row unmapped).
enum RowState : int { kRowAbsent = 0, kRowPresent = 1, kRowInvalid = 2 };

// In place v ← H_n v · scale (Sylvester order, the butterflies of math::hadamard_rotate: each
// element sees the same adds in the same order). Needs blockDim.x >= n; call after a barrier,
// ends with one.
__device__ __forceinline__ void hadamard_rotate_block(float* v, int n, float scale) {
  const int k = threadIdx.x;
  for (int h = 1; h < n; h *= 2) {
    if (k < n / 2) {
      const int i = (k / h) * 2 * h + k % h;  // pair (i, i + h) of stage h
      const float a = v[i], b = v[i + h];
      v[i] = ieee_add(a, b);
      v[i + h] = ieee_sub(a, b);
    }
    __syncthreads();
  }
  if (k < n) v[k] = ieee_mul(v[k], scale);
  __syncthreads();
}

__global__ void __launch_bounds__(kMaxDim) emit_entries_kernel(const UpdateParams p) {
  grid_dependency_entry();
  namespace cm = compressor_math;
  __shared__ float e[kMaxDim];
  __shared__ const float* pooled_kv[kMaxRingRows];  // the present rows, in window order
  __shared__ const float* pooled_s[kMaxRingRows];
  __shared__ int present_before[kMaxWarps + 1];  // present window rows of the warps before w
  __shared__ float inv_rms;
  __shared__ float amax_of_warp[kMaxWarps];

  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warps = static_cast<int>(blockDim.x) / 32;  // D is a multiple of 32

  // Does token t emit, and where to? Every thread evaluates the same loads, so the early returns
  // are uniform (before any barrier).
  const int64_t pos = p.positions[t];
  if (pos < 0 || (pos + 1) % p.r != 0) return;
  const int64_t q = p.token_to_req[t];
  if (q < 0 || q >= p.R) return;
  const int64_t ctx = p.context_lens[q];
  const int64_t j = (pos + 1) / p.r - 1;
  const int64_t rope_pos = j * p.r;  // the window's first position
  if (ctx < 0 || pos < ctx || !p.rope.contains(rope_pos)) return;
  const int64_t slot = p.out_table.slot(q, j);
  if (slot < 0) return;

  // Where each of the K rows of the window (positions pos−K+1 .. pos) lives.
  int state = kRowAbsent;
  const float* kv = nullptr;
  const float* s = nullptr;
  if (tid < p.K) {
    const int64_t row_pos = pos - p.K + 1 + tid;
    if (row_pos >= 0) {
      // Overlap (r = 4): the previous window's rows use dims [0, D), the current one's [D, 2D).
      const int64_t col = (p.coff == 2 && tid >= p.r) ? p.D : 0;
      state = kRowInvalid;
      if (row_pos >= ctx) {
        // This call's token of that position: the request's run is contiguous with consecutive
        // positions, so it sits pos − row_pos tokens before t. Verified, not assumed.
        const int64_t u = t - (pos - row_pos);
        if (u >= 0 && p.token_to_req[u] == q && p.positions[u] == row_pos) {
          kv = p.kv_rows + u * p.kv_stride + col;
          s = p.score_rows + u * p.score_stride + col;
          state = kRowPresent;
        }
      } else {
        const int64_t ring_slot = p.state_table.slot(q, row_pos % p.K);
        if (ring_slot >= 0) {
          const float* row = p.state_rows + ring_slot * p.state_stride;
          kv = row + col;
          s = row + p.W + col;
          state = kRowPresent;
        }
      }
    }
  }
  // The present rows in window order (= thread order): an invalid row skips the entry.
  const unsigned present = __ballot_sync(0xffffffffu, state == kRowPresent);
  if (lane == 0) present_before[warp + 1] = __popc(present);
  if (__syncthreads_or(state == kRowInvalid)) return;  // uniform
  if (tid == 0) {
    present_before[0] = 0;
    for (int w = 0; w < warps; ++w) present_before[w + 1] += present_before[w];
  }
  __syncthreads();
  if (state == kRowPresent) {
    const int i = present_before[warp] + __popc(present & ((1u << lane) - 1u));
    pooled_kv[i] = kv;
    pooled_s[i] = s;
  }
  const int n = present_before[warps];
  __syncthreads();
  if (n == 0) return;  // uniform: read after the barrier

  // Pool (one thread per dim), RMSNorm (the sum in warp 0, norm_math.h's lane order), RoPE (one
  // thread per pair): compute_entry of the CPU op.
  if (tid < p.D) e[tid] = cm::pool_dim(pooled_kv, pooled_s, n, tid);
  __syncthreads();
  if (warp == 0) {
    float partial = 0.0f;
    for (int c = lane; c * math::kRmsChunk < p.D; c += math::kRmsLanes)
      partial = rms_accumulate_chunk(partial, e + c * math::kRmsChunk, min(math::kRmsChunk, p.D - c * math::kRmsChunk));
    const float total = warp_rms_total(partial);
    if (lane == 0) inv_rms = math::rms_inverse_of_sum(total, p.D, p.eps);
  }
  __syncthreads();
  if (tid < p.D) e[tid] = math::rms_apply(e[tid], inv_rms, load_float(p.norm_weight, p.norm_bf16, tid));
  __syncthreads();
  if (tid < p.rope.half) {
    const int a = p.D - p.rope_dims + 2 * tid;
    p.rope.rotate(rope_pos, tid, e[a], e[a + 1]);
  }
  __syncthreads();
  if (p.target == CompressorTarget::indexer_keys) hadamard_rotate_block(e, p.D, p.hadamard_scale);

  // The values before the cache's quantization.
  if (p.entries != nullptr && tid < p.D) p.entries[t * p.entries_stride + tid] = e[tid];
  __syncthreads();  // e is read above before the FP8 block rounding below changes it

  uint8_t* block = p.out_data + (slot / p.out_table.block_size) * p.out_stride;
  const int offset = static_cast<int>(slot % p.out_table.block_size);
  if (p.target == CompressorTarget::kv_cache) {
    // MODEL1_FP8 stores the nope dims as FP8 blocks of 64 itself; BF16 / FP8_PER_TENSOR get the
    // model's FP8-rounded values first (store_entry of the CPU op).
    if (p.geometry.layout != KvLayout::model1_fp8 &&
        tid < (p.D - p.rope_dims) / model1::kQuantBlock)
      fp8_round_block(e + tid * model1::kQuantBlock, model1::kQuantBlock);
    __syncthreads();
    // kv_encode_token, its pieces in parallel (scale blocks, padding and plain dims touch
    // disjoint bytes).
    const KvGeometry& g = p.geometry;
    const int num_scale_blocks = kv_num_scale_blocks(g.layout);
    if (warp < num_scale_blocks) warp_encode_kv_scale_block(g, block, offset, warp, e, lane);  // D/32 >= 16 warps
    if (tid == num_scale_blocks) kv_encode_padding(g, block, offset);
    const float inv_tensor_scale = ieee_div(1.0f, p.tensor_scale);
    if (tid >= kv_plain_begin(g.layout) && tid < g.dim)
      kv_encode_plain_value(g, block, offset, tid, e[tid], inv_tensor_scale);
  } else {
    // indexer_key_encode with one thread per dim: the block maximum over the block's warps,
    // then every code and the scale.
    float amax = tid < p.D ? fabsf(e[tid]) : 0.0f;
    for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if (lane == 0) amax_of_warp[warp] = amax;
    __syncthreads();
    for (int w = 0; w < warps; ++w) amax = fmaxf(amax, amax_of_warp[w]);
    const int32_t k = ue8m0_exponent_for_amax(amax);
    if (tid < p.D) indexer_key_encode_value(block, offset, tid, e[tid], k);
    if (tid == 0) indexer_key_encode_scale(block, p.out_table.block_size, offset, k);
  }
}

}  // namespace dsv4::cuda::compressor
