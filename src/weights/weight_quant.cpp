// fp8 e4m3 weights with 128x128 block scales (per matrix of a stack): quantization (for generated
// weights) and dequantization to fp32 (for references and backends that want dense weights).
#include <algorithm>
#include <cmath>

#include "dsv4/ops.h"
#include "dsv4/weights.h"
#include "weights/weights_detail.h"

namespace dsv4 {

namespace {

bool is_float_like(DType t) {
  return t == DType::bf16 || t == DType::fp16 || t == DType::fp32 || t == DType::fp8_e4m3;
}

// A weight as a stack of 2-d matrices: the last two dims are rows and columns, any leading dims
// (wo_a's groups) index independent matrices with their own block grids.
struct MatrixStack {
  int64_t count = 1;
  int64_t rows = 1;
  int64_t cols = 1;
  int64_t block_rows() const { return (rows + kWeightScaleBlock - 1) / kWeightScaleBlock; }
  int64_t block_cols() const { return (cols + kWeightScaleBlock - 1) / kWeightScaleBlock; }
};

MatrixStack matrix_stack(const std::vector<int64_t>& shape) {
  MatrixStack m;
  m.rows = shape[shape.size() - 2];
  m.cols = shape.back();
  for (size_t d = 0; d + 2 < shape.size(); ++d) m.count *= shape[d];
  return m;
}

}  // namespace

std::vector<int64_t> weight_scale_shape(const std::vector<int64_t>& value_shape) {
  DSV4_CHECK(value_shape.size() >= 2, "weight_scale_shape: expected a weight of >= 2 dims, got ",
             value_shape.size());
  std::vector<int64_t> s(value_shape.begin(), value_shape.end() - 2);
  const MatrixStack m = matrix_stack(value_shape);
  s.push_back(m.block_rows());
  s.push_back(m.block_cols());
  return s;
}

Weight quantize_weight_fp8(const HostTensor& w, DType scale_dtype) {
  const char* where = "quantize_weight_fp8";
  check_defined(where, "w", w.view());
  if (!is_float_like(w.dtype()))
    fail_expected(where, "w.dtype", "bf16, fp16, fp32 or fp8_e4m3", dtype_name(w.dtype()));
  if (scale_dtype != DType::ue8m0 && scale_dtype != DType::fp32)
    fail_expected(where, "scale_dtype", "ue8m0 or fp32", dtype_name(scale_dtype));
  if (w.view().ndim < 2) fail_expected(where, "w.ndim", ">= 2", w.view().ndim);

  const MatrixStack m = matrix_stack(w.shape());
  Weight q;
  q.value = HostTensor(DType::fp8_e4m3, w.shape());
  q.scale = HostTensor(scale_dtype, weight_scale_shape(w.shape()));
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
  for (int64_t block_row = 0; block_row < m.count * m.block_rows(); ++block_row) {
    // Row block `block_row` of the stack: matrix block_row / block_rows(), rows [r0, r1) of it.
    const int64_t base = (block_row / m.block_rows()) * m.rows * m.cols;
    const int64_t r0 = (block_row % m.block_rows()) * kWeightScaleBlock;
    const int64_t r1 = std::min(m.rows, r0 + kWeightScaleBlock);
    for (int64_t bc = 0; bc < m.block_cols(); ++bc) {
      const int64_t c0 = bc * kWeightScaleBlock, c1 = std::min(m.cols, c0 + kWeightScaleBlock);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          amax = std::max(amax, std::fabs(src[base + r * m.cols + c]));
      const int32_t e = ue8m0_exponent_for_amax(amax);
      // Scaling by an exact power of two: the only rounding is the fp8 encode.
      const float inv_scale = exp2_int(-e);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          dst[base + r * m.cols + c] = float_to_fp8_e4m3(src[base + r * m.cols + c] * inv_scale);
      const int64_t s = block_row * m.block_cols() + bc;
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
    fail_expected(where, "value.dtype", "bf16, fp16, fp32 or fp8_e4m3",
                  dtype_name(w.value.dtype()));
  const bool fp8 = w.value.dtype() == DType::fp8_e4m3;
  if (fp8 != w.quantized())
    fail(where, ": a scale is expected exactly for fp8 values, got value ",
         dtype_name(w.value.dtype()), (w.quantized() ? " with" : " without"), " a scale");

  if (w.value.view().ndim < 2) fail_expected(where, "value.ndim", ">= 2", w.value.view().ndim);
  const MatrixStack m = matrix_stack(w.value.shape());
  if (fp8) {
    const std::vector<int64_t> want = weight_scale_shape(w.value.shape());
    if (w.scale.shape() != want)
      fail_expected(where, "scale.shape", weights_detail::shape_text(want),
                    weights_detail::shape_text(w.scale.shape()));
    if (w.scale.dtype() != DType::ue8m0 && w.scale.dtype() != DType::fp32)
      fail_expected(where, "scale.dtype", "ue8m0 or fp32", dtype_name(w.scale.dtype()));
  }

  HostTensor out(DType::fp32, w.value.shape());
  float* dst = out.data<float>();
  const void* src = w.value.view().data;
#pragma omp parallel for schedule(static) if (out.numel() >= weights_detail::kParallelMinElements)
  for (int64_t row = 0; row < m.count * m.rows; ++row) {
    // Row `row` of the stack: matrix row / rows, its row r; scales of that matrix's row block.
    const int64_t r = row % m.rows;
    const int64_t scale_row = (row / m.rows) * m.block_rows() + r / kWeightScaleBlock;
    for (int64_t c = 0; c < m.cols; ++c) {
      const int64_t i = row * m.cols + c;
      float v = load_as_float(src, w.value.dtype(), i);
      if (fp8) v *= w.scale.get(scale_row * m.block_cols() + c / kWeightScaleBlock);
      dst[i] = v;
    }
  }
  return out;
}

HostTensor cuda_weight_scale(const Weight& w) {
  const char* where = "cuda_weight_scale";
  if (!w.quantized() || w.value.dtype() != DType::fp8_e4m3)
    fail(where, ": expected an fp8_e4m3 weight with block scales, got ", dtype_name(w.value.dtype()),
         w.quantized() ? " with a scale" : " without a scale");
  const std::vector<int64_t> grid = weight_scale_shape(w.value.shape());
  if (w.scale.shape() != grid)
    fail_expected(where, "scale.shape", weights_detail::shape_text(grid),
                  weights_detail::shape_text(w.scale.shape()));
  if (w.scale.dtype() != DType::ue8m0 && w.scale.dtype() != DType::fp32)
    fail_expected(where, "scale.dtype", "ue8m0 or fp32", dtype_name(w.scale.dtype()));
  const int64_t cols = grid.back(), padded = fp8_weight_scale_row_stride(w.value.shape().back());
  std::vector<int64_t> dims = grid;
  dims.back() = padded;
  HostTensor out(DType::fp32, dims);
  const int64_t rows = w.scale.numel() / cols;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < padded; ++c)  // padding: 1.0, a harmless scale should anything read it
      out.data<float>()[r * padded + c] = c < cols ? w.scale.get(r * cols + c) : 1.0f;
  return out;
}

}  // namespace dsv4
