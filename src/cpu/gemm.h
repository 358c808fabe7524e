// The CPU GEMM behind the dense projections (linear, grouped_wo_a): y = x · wᵀ with fp32
// accumulation, for operands stored as bf16 / fp32 / fp8 e4m3 with optional block scales.
//
// Work is split into (problem, 64-row tile of x, 64-row tile of w) items spread over OpenMP
// threads. Each item walks K in chunks of 128: it dequantizes that chunk of its weight tile once
// (transposed, so the inner loop is a contiguous axpy the compiler vectorizes) and of its
// activation rows, and accumulates every output of the tile in fp32 in K order. The order of
// additions does not depend on the thread count, so results are bit-identical run to run.
#pragma once

#include <cstdint>

#include "dsv4/tensor.h"

namespace dsv4::cpu {

// A rows × cols operand. Element (r, c) is value(data[r * row_stride + c]) times, when `scale`
// is set, scale[(r / scale_block_rows) * scale_row_stride + (c / scale_block_cols) *
// scale_col_stride] (ue8m0 or fp32). Activations use 1 × 64 / 1 × 128 blocks (their scales in
// any layout, e.g. the CUDA GEMMs' transposed one), weights 128 × 128.
struct ScaledMatrix {
  const void* data = nullptr;
  DType dtype = DType::fp32;  // bf16, fp16, fp32 or fp8_e4m3
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // elements
  const void* scale = nullptr;
  DType scale_dtype = DType::fp32;  // ue8m0 or fp32
  int64_t scale_row_stride = 0;     // elements
  int64_t scale_col_stride = 1;     // elements
  int64_t scale_block_rows = 1;
  int64_t scale_block_cols = 1;

  // From validated 2-d views (scale may be undefined). Blocks are block_rows × block_cols.
  static ScaledMatrix from_views(const TensorView& values, const TensorView& scale,
                                 int64_t block_rows, int64_t block_cols);
  // Dequantizes columns [c0, c0 + n) of row r into out[0], out[s], out[2s], ... (s =
  // out_stride; the GEMM writes weight rows as columns of a transposed tile).
  void load_row_segment(int64_t r, int64_t c0, int64_t n, float* out, int64_t out_stride = 1) const;
};

// A rows × cols bf16 / fp32 output; every element is rounded once from the fp32 accumulator.
struct OutputMatrix {
  void* data = nullptr;
  DType dtype = DType::fp32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // elements

  static OutputMatrix from_view(const TensorView& t);
};

// y [T, N] = x [T, K] · w [N, K]ᵀ. Shapes must already be consistent (the public ops validate).
struct GemmProblem {
  ScaledMatrix x;
  ScaledMatrix w;
  OutputMatrix y;
};

// Solves independent problems (e.g. the groups of grouped_wo_a) in one parallel region.
void gemm_xwT(const GemmProblem* problems, int64_t count);

inline constexpr int64_t kWeightBlock = 128;  // an FP8 weight's scales cover 128 × 128 blocks

// The block of an activation's scales (what ops::check_activation_scale accepted): 0 without
// scales, else 128 or 64 columns per scale.
inline int64_t activation_scale_block(const TensorView& x, const TensorView& scale) {
  if (!scale.defined()) return 0;
  const int64_t cols = x.shape[1], blocks = scale.shape[1];
  return cols % 128 == 0 && blocks * 128 == cols ? 128 : 64;
}

}  // namespace dsv4::cpu
