// Kernel 1 of compressor_update_and_emit: one block of D threads per batch token; the tokens that
// complete a window (position (j+1)·r − 1) pool it, normalize, rotate and store entry j. The
// per-element math is the CPU op's (math/compressor.h, math/rms_norm.h, math/rope.h,
// fp8_block.h, kv_layout.h, indexer_key_cache.h) in the CPU op's order, so the entries are
// bit-identical; every reduction whose order matters (softmax over rows, RMSNorm's sum, the
// encoders' block maxima) runs sequentially in one thread, exactly like the CPU loop.
#pragma once

#include <cstdint>

#include "math/compressor.h"
#include "math/rms_norm.h"
#include "cuda/common/float_rows.cuh"
#include "cuda/common/rope_table.cuh"
#include "cuda/compressor/update_params.cuh"
#include "dsv4/compressor.h"
#include "dsv4/fp8_block.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/kv_layout.h"

namespace dsv4::cuda::compressor {

constexpr int kMaxDim = 512;        // D: 512 (kv_cache) or 128 (indexer_keys); blockDim.x == D
constexpr int kMaxRingRows = 128;   // K = coff·r: 8 (r = 4) or 128 (r = 128); K <= D

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
  namespace cm = compressor_math;
  __shared__ float e[kMaxDim];
  __shared__ const float* window_kv[kMaxRingRows];
  __shared__ const float* window_s[kMaxRingRows];
  __shared__ int window_state[kMaxRingRows];
  __shared__ const float* pooled_kv[kMaxRingRows];  // the present rows, in window order
  __shared__ const float* pooled_s[kMaxRingRows];
  __shared__ int num_pooled;  // -1: skip the entry
  __shared__ float inv_rms;

  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x;

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
  if (tid < p.K) {
    const int64_t row_pos = pos - p.K + 1 + tid;
    int state = kRowAbsent;
    const float* kv = nullptr;
    const float* s = nullptr;
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
    window_state[tid] = state;
    window_kv[tid] = kv;
    window_s[tid] = s;
  }
  __syncthreads();
  if (tid == 0) {
    int n = 0;
    for (int i = 0; i < p.K && n >= 0; ++i) {
      if (window_state[i] == kRowInvalid) n = -1;
      else if (window_state[i] == kRowPresent) {
        pooled_kv[n] = window_kv[i];
        pooled_s[n] = window_s[i];
        ++n;
      }
    }
    num_pooled = n;
  }
  __syncthreads();
  const int n = num_pooled;
  if (n <= 0) return;  // uniform: read after the barrier

  // Pool (one thread per dim), RMSNorm (the sum in one thread, index order), RoPE (one thread
  // per pair): compute_entry of the CPU op.
  if (tid < p.D) e[tid] = cm::pool_dim(pooled_kv, pooled_s, n, tid);
  __syncthreads();
  if (tid == 0) inv_rms = math::rms_inverse(e, p.D, p.eps);
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
    if (tid == 0) kv_encode_token(p.geometry, block, offset, e, p.tensor_scale);
  } else if (tid == 0) {
    indexer_key_encode(block, p.out_table.block_size, offset, e);
  }
}

}  // namespace dsv4::cuda::compressor
