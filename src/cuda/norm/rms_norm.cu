// RMSNorm kernel: one warp per row, fp32 math in the CPU reference's order and rounding
// (warp_rms.cuh / src/math/rms_norm.h), y = x · inv · weight rounded once to y's type. Lane l
// owns the row's chunks l, l + 32, … (8 consecutive values: one 16-byte load of bf16 when the rows
// are 16-byte aligned): it reads them for its partial sum of squares, and after the butterfly
// reads them again and writes the same chunks, so y may alias x. With an FP8 output (the q of
// fused_qkv_rms_norm for an FP8 wq_b) the normed values, rounded to y's type, are quantized per
// 1 × 128 block in the same pass: a block is 16 chunks, which the lanes of one half-warp hold in
// the same round of the loop.
#include "cuda/norm/rms_norm.h"

#include <cuda_runtime.h>

#include <climits>

#include "cuda/common/act_quant.cuh"
#include "cuda/common/check.h"
#include "cuda/common/float_rows.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/norm/warp_rms.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kChunk = FloatRows::kChunk;
constexpr int kQuantBlock = 128;

struct NormParams {
  FloatRows x;
  FloatRows y;       // y.data == nullptr: no float output (FP8 only)
  FloatRows weight;  // one row of row_len values; weight.data == nullptr: no weight
  float eps;
  bool round_bf16;   // the value quantized is rounded to bf16 (y bf16, or no y)
  uint8_t* q8;       // optional FP8 output [rows, row_len], row stride q8_ld
  int64_t q8_ld;
  ActScales q8_scale;  // [rows, row_len / 128]
};

template <bool kVector, bool kQuant>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) rms_norm_kernel(const NormParams p) {
  grid_dependency_entry();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.x.num_rows) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t x_off = p.x.row_offset(row), n = p.x.row_len;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  float v[kChunk];
  float partial = 0.0f;
  for (int64_t c = lane; c < chunks; c += 32) {
    p.x.load_chunk<kVector>(x_off, c * kChunk, n, v);
    partial = rms_accumulate_chunk(partial, v, n - c * kChunk < kChunk ? static_cast<int>(n - c * kChunk) : kChunk);
  }
  const float inv = math::rms_inverse_of_sum(warp_rms_total(partial), n, p.eps);

  const int64_t y_off = p.y.data != nullptr ? p.y.row_offset(row) : 0;
  for (int64_t round = 0; round < chunks; round += 32) {  // warp-uniform: the FP8 shuffles need it
    const int64_t c = round + lane, i = c * kChunk;
    const bool mine = c < chunks;
    if (mine) {
      float w[kChunk];
      p.x.load_chunk<kVector>(x_off, i, n, v);
      if (p.weight.data != nullptr) p.weight.load_chunk<kVector>(0, i, n, w);
#pragma unroll
      for (int k = 0; k < kChunk; ++k) v[k] = math::rms_apply(v[k], inv, p.weight.data != nullptr ? w[k] : 1.0f);
      if (p.y.data != nullptr) p.y.store_chunk<kVector>(y_off, i, n, v);
    } else {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) v[k] = 0.0f;
    }
    if constexpr (kQuant) {
      if (p.round_bf16)
#pragma unroll
        for (int k = 0; k < kChunk; ++k) v[k] = round_bf16(v[k]);
      uint2 codes;
      const int32_t e = quantize_block_chunk<kQuantBlock / kChunk>(v, codes);
      if (mine) {
        store_codes<kVector>(p.q8 + row * p.q8_ld + i, codes, kChunk);
        if (lane % (kQuantBlock / kChunk) == 0) p.q8_scale.store(row, i / kQuantBlock, e);
      }
    }
  }
}

FloatRows optional_rows(const TensorView& t) { return t.defined() ? FloatRows::of(t) : FloatRows{}; }

void launch_rms_norm(const char* where, const TensorView& x, const TensorView& weight, float eps,
                     const TensorView& y, const TensorView& q8, const TensorView& q8_scale,
                     Stream stream) {
  NormParams p;
  p.x = FloatRows::of(x);
  p.y = optional_rows(y);
  p.weight = optional_rows(weight);
  p.eps = eps;
  p.round_bf16 = !y.defined() || y.dtype == DType::bf16;
  p.q8 = static_cast<uint8_t*>(q8.data);
  p.q8_ld = q8.defined() ? q8.strides[0] : 0;
  if (q8.defined()) p.q8_scale = ActScales::of(q8_scale);
  if (p.x.num_rows == 0 || p.x.row_len == 0) return;  // nothing to write
  const int64_t blocks = (p.x.num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  DSV4_CHECK(blocks <= INT_MAX, where, ": x: expected at most ", int64_t{INT_MAX} * kWarpsPerBlock,
             " rows, got ", p.x.num_rows);
  const bool vector = p.x.rows_aligned16() && (!y.defined() || p.y.rows_aligned16()) &&
                      (!weight.defined() || p.weight.rows_aligned16()) &&
                      (!q8.defined() || (reinterpret_cast<uintptr_t>(q8.data) % 8 == 0 && p.q8_ld % 8 == 0));
  const dim3 grid(static_cast<unsigned>(blocks)), threads(32 * kWarpsPerBlock);
  if (q8.defined()) {
    if (vector)
      launch_kernel(where, rms_norm_kernel<true, true>, {grid, threads, 0}, stream, p);
    else
      launch_kernel(where, rms_norm_kernel<false, true>, {grid, threads, 0}, stream, p);
  } else {
    if (vector)
      launch_kernel(where, rms_norm_kernel<true, false>, {grid, threads, 0}, stream, p);
    else
      launch_kernel(where, rms_norm_kernel<false, false>, {grid, threads, 0}, stream, p);
  }
}

// residual ← residual + delta, then (if y) y = RMSNorm(residual). Lane l owns chunks l, l + 32,
// … of the row as in rms_norm_kernel: it forms h = residual + delta for its chunks, adds their
// squares to its partial, and writes h back (no other lane reads them); after the butterfly it
// reads its own h again for y.
struct ResidualParams {
  FloatRows residual, delta, y, weight;  // delta / y / weight.data == nullptr: absent
  float eps;
};

__global__ void __launch_bounds__(32 * kWarpsPerBlock) residual_add_rms_norm_kernel(
    const ResidualParams p) {
  grid_dependency_entry();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.residual.num_rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t r_off = p.residual.row_offset(row), n = p.residual.row_len;
  const int64_t d_off = p.delta.data != nullptr ? p.delta.row_offset(row) : 0;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  float h[kChunk], d[kChunk];
  float partial = 0.0f;
  for (int64_t c = lane; c < chunks; c += 32) {
    const int64_t i = c * kChunk;
    p.residual.load_chunk<false>(r_off, i, n, h);
    if (p.delta.data != nullptr) {
      p.delta.load_chunk<false>(d_off, i, n, d);
#pragma unroll
      for (int k = 0; k < kChunk; ++k) h[k] = ieee_add(h[k], d[k]);
      p.residual.store_chunk<false>(r_off, i, n, h);
    }
    partial = rms_accumulate_chunk(partial, h, n - i < kChunk ? static_cast<int>(n - i) : kChunk);
  }
  if (p.y.data == nullptr) return;
  const float inv = math::rms_inverse_of_sum(warp_rms_total(partial), n, p.eps);
  const int64_t y_off = p.y.row_offset(row);
  for (int64_t c = lane; c < chunks; c += 32) {
    const int64_t i = c * kChunk;
    float w[kChunk];
    p.residual.load_chunk<false>(r_off, i, n, h);  // this lane's own writes above
    if (p.weight.data != nullptr) p.weight.load_chunk<false>(0, i, n, w);
#pragma unroll
    for (int k = 0; k < kChunk; ++k) h[k] = math::rms_apply(h[k], inv, p.weight.data != nullptr ? w[k] : 1.0f);
    p.y.store_chunk<false>(y_off, i, n, h);
  }
}

}  // namespace

void residual_add_rms_norm(const TensorView& residual, const TensorView& delta,
                           const TensorView& weight, float eps, const TensorView& y,
                           Stream stream) {
  constexpr const char* kWhere = "residual_add_rms_norm";
  ResidualParams p;
  p.residual = FloatRows::of(residual);
  p.delta = optional_rows(delta);
  p.y = optional_rows(y);
  p.weight = optional_rows(weight);
  p.eps = eps;
  if (p.residual.num_rows == 0 || p.residual.row_len == 0 || (!delta.defined() && !y.defined())) return;
  const int64_t blocks = (p.residual.num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  DSV4_CHECK(blocks <= INT_MAX, kWhere, ": residual: too many rows (", p.residual.num_rows, ")");
  launch_kernel(kWhere, residual_add_rms_norm_kernel, {static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0},
                stream, p);
}

void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              Stream stream) {
  launch_rms_norm("rms_norm", x, weight, eps, y, {}, {}, stream);
}

void fused_qkv_rms_norm(const TensorView& q_in, const TensorView& wq, const TensorView& kv_in,
                        const TensorView& wkv, float eps, const TensorView& q_out,
                        const TensorView& kv_out, const TensorView& q_fp8, const TensorView& q_scale,
                        Stream stream) {
  // Two launches of the one kernel on the same stream: the two norms are independent (the op
  // has checked that neither output overlaps the other branch).
  launch_rms_norm("fused_qkv_rms_norm", q_in, wq, eps, q_out, q_fp8, q_scale, stream);
  launch_rms_norm("fused_qkv_rms_norm", kv_in, wkv, eps, kv_out, {}, {}, stream);
}

}  // namespace dsv4::cuda
