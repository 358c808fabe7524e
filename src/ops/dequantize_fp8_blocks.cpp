// dequantize_fp8_blocks: block-scaled FP8 e4m3 → bf16 / fp32, y = fp8(x) · scale of its block.
// The front door: validation, then the backend.
#include "dsv4/ops.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {
constexpr const char* kOp = "dequantize_fp8_blocks";

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void validate_dequantize(const TensorView& x, const TensorView& scale, int block_rows,
                         int block_cols, const TensorView& y) {
  check_defined(kOp, "x", x);
  check_defined(kOp, "scale", scale);
  check_defined(kOp, "y", y);
  check_dtype(kOp, "x", x, DType::fp8_e4m3);
  ops::check_dtype_in(kOp, "scale", scale, {DType::ue8m0, DType::fp32});
  ops::check_dtype_in(kOp, "y", y, {DType::bf16, DType::fp32});
  if (x.ndim != 2 && x.ndim != 3) fail_expected(kOp, "x.ndim", "2 ([R, C]) or 3 ([G, R, C])", x.ndim);
  if (block_rows < 1) fail_expected(kOp, "block_rows", ">= 1", block_rows);
  if (block_cols < 1) fail_expected(kOp, "block_cols", ">= 1", block_cols);
  const int64_t R = x.shape[x.ndim - 2], C = x.shape[x.ndim - 1];
  const int64_t SR = ceil_div(R, block_rows), SC = ceil_div(C, block_cols);
  if (x.ndim == 2) {
    check_shape(kOp, "scale", scale, {SR, SC});
    check_shape(kOp, "y", y, {R, C});
  } else {
    check_shape(kOp, "scale", scale, {x.shape[0], SR, SC});
    check_shape(kOp, "y", y, {x.shape[0], R, C});
  }
  ops::check_row_strided(kOp, "x", x);
  ops::check_row_strided(kOp, "scale", scale);
  ops::check_output_layout(kOp, "y", y);
  ops::check_disjoint(kOp, "y", y, "x", x);
  ops::check_disjoint(kOp, "y", y, "scale", scale);
}

}  // namespace

void dequantize_fp8_blocks(const TensorView& x, const TensorView& scale, int block_rows,
                           int block_cols, const TensorView& y, Stream stream) {
  validate_dequantize(x, scale, block_rows, block_cols, y);
  const Device device = ops::common_device(kOp, {{"x", x}, {"scale", scale}, {"y", y}});
  ops::kernel(kOp, ops::kDequantizeFp8Blocks, device)(x, scale, block_rows, block_cols, y, stream);
}

}  // namespace dsv4
