// fp8 e4m3 weights with 128x128 block scales: quantization (for generated weights) and
// dequantization to fp32 (for references and backends that want dense weights).
#include <algorithm>
#include <cmath>

#include "dsv4/weights.h"
#include "weights/parallel_threshold.h"

namespace dsv4 {

namespace {

bool is_float_like(DType t) {
  return t == DType::bf16 || t == DType::fp16 || t == DType::fp32 || t == DType::fp8_e4m3;
}

// A weight seen as the 2-d matrix the checkpoint stores: the last dim is the column.
struct MatrixShape {
  int64_t rows = 1;
  int64_t cols = 1;
  int64_t block_rows() const { return (rows + kWeightBlock - 1) / kWeightBlock; }
  int64_t block_cols() const { return (cols + kWeightBlock - 1) / kWeightBlock; }
};

MatrixShape matrix_shape(const TensorView& t) {
  MatrixShape m;
  if (t.ndim == 0) return m;
  m.cols = t.shape[t.ndim - 1];
  for (int d = 0; d + 1 < t.ndim; ++d) m.rows *= t.shape[d];
  return m;
}

}  // namespace

Weight quantize_weight_fp8(const HostTensor& w, DType scale_dtype) {
  const char* where = "quantize_weight_fp8";
  check_defined(where, "w", w.view());
  if (!is_float_like(w.dtype()))
    fail_expected(where, "w.dtype", "bf16, fp16, fp32 or fp8_e4m3", dtype_name(w.dtype()));
  if (scale_dtype != DType::ue8m0 && scale_dtype != DType::fp32)
    fail_expected(where, "scale_dtype", "ue8m0 or fp32", dtype_name(scale_dtype));
  if (w.view().ndim < 1) fail_expected(where, "w.ndim", ">= 1", w.view().ndim);

  const MatrixShape m = matrix_shape(w.view());
  Weight q;
  q.value = HostTensor(DType::fp8_e4m3, w.shape());
  q.scale = HostTensor(scale_dtype, {m.block_rows(), m.block_cols()});
  // Reads go through an fp32 copy unless the input is fp32 already (one conversion per element
  // instead of two in the loops below).
  HostTensor converted;
  const float* src = w.data<float>();
  if (w.dtype() != DType::fp32) {
    converted = HostTensor(DType::fp32, w.shape());
    for (int64_t i = 0; i < w.numel(); ++i) converted.data<float>()[i] = w.get(i);
    src = converted.data<float>();
  }
  uint8_t* dst = q.value.data<uint8_t>();

#pragma omp parallel for schedule(static) if (w.numel() >= weights_detail::kParallelMinElements)
  for (int64_t br = 0; br < m.block_rows(); ++br) {
    const int64_t r0 = br * kWeightBlock, r1 = std::min(m.rows, r0 + kWeightBlock);
    for (int64_t bc = 0; bc < m.block_cols(); ++bc) {
      const int64_t c0 = bc * kWeightBlock, c1 = std::min(m.cols, c0 + kWeightBlock);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          amax = std::max(amax, std::fabs(src[r * m.cols + c]));
      const int32_t e = ue8m0_exponent_for_amax(amax);
      // Scaling by an exact power of two: the only rounding is the fp8 encode.
      const float inv_scale = exp2_int(-e);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          dst[r * m.cols + c] = float_to_fp8_e4m3(src[r * m.cols + c] * inv_scale);
      const int64_t s = br * m.block_cols() + bc;
      if (scale_dtype == DType::ue8m0)
        q.scale.data<uint8_t>()[s] = static_cast<uint8_t>(e + 127);
      else
        q.scale.data<float>()[s] = exp2_int(e);
    }
  }
  return q;
}

HostTensor dequantize_weight(const Weight& w) {
  const char* where = "dequantize_weight";
  check_defined(where, "value", w.value.view());
  if (!is_float_like(w.value.dtype()))
    fail_expected(where, "value.dtype", "bf16, fp16, fp32 or fp8_e4m3", dtype_name(w.value.dtype()));
  const bool fp8 = w.value.dtype() == DType::fp8_e4m3;
  if (fp8 != w.quantized())
    fail(where, ": a scale is expected exactly for fp8 values, got value ",
         dtype_name(w.value.dtype()), (w.quantized() ? " with" : " without"), " a scale");

  const MatrixShape m = matrix_shape(w.value.view());
  if (fp8) {
    check_shape(where, "scale", w.scale.view(), {m.block_rows(), m.block_cols()});
    if (w.scale.dtype() != DType::ue8m0 && w.scale.dtype() != DType::fp32)
      fail_expected(where, "scale.dtype", "ue8m0 or fp32", dtype_name(w.scale.dtype()));
  }

  HostTensor out(DType::fp32, w.value.shape());
  float* dst = out.data<float>();
  const void* src = w.value.view().data;
#pragma omp parallel for schedule(static) if (out.numel() >= weights_detail::kParallelMinElements)
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      const int64_t i = r * m.cols + c;
      float v = load_as_float(src, w.value.dtype(), i);
      if (fp8) v *= w.scale.get((r / kWeightBlock) * m.block_cols() + c / kWeightBlock);
      dst[i] = v;
    }
  }
  return out;
}

}  // namespace dsv4
