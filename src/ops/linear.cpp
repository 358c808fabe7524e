// linear: y = x · Wᵀ (docs/spec.md §2 projections) — the front door: validation, then the backend.
#include "dsv4/ops.h"
#include "ops/backend.h"
#include "ops/gemm_checks.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {
constexpr const char* kOp = "linear";
constexpr int64_t kWeightBlock = 128;  // weight scales cover 128 × 128 blocks
}  // namespace

void ops::validate_linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
                          const TensorView& w_scale, const TensorView& y) {
  check_defined(kOp, "x", x);
  check_defined(kOp, "w", w);
  check_defined(kOp, "y", y);
  ops::check_dtype_in(kOp, "x", x, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  ops::check_dtype_in(kOp, "w", w, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  ops::check_dtype_in(kOp, "y", y, {DType::bf16, DType::fp32});
  check_ndim(kOp, "x", x, 2);
  check_ndim(kOp, "w", w, 2);
  const int64_t T = x.shape[0], K = x.shape[1], N = w.shape[0];
  check_dim(kOp, "w", w, 1, K);
  check_shape(kOp, "y", y, {T, N});
  ops::check_row_strided(kOp, "x", x);
  ops::check_row_strided(kOp, "w", w);
  ops::check_output_layout(kOp, "y", y);
  ops::check_activation_scale(kOp, "x", x, "x_scale", x_scale);
  ops::check_weight_scale(kOp, "w", w, "w_scale", w_scale,
                          {(N + kWeightBlock - 1) / kWeightBlock, (K + kWeightBlock - 1) / kWeightBlock});
  ops::check_outputs_disjoint(kOp, {{"y", y}},
                              {{"x", x}, {"w", w}, {"x_scale", x_scale}, {"w_scale", w_scale}});
}

void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y, Stream stream) {
  linear(x, x_scale, w, w_scale, y, TensorView{}, stream);
}

void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y,
            const TensorView& workspace, Stream stream) {
  ops::validate_linear(x, x_scale, w, w_scale, y);
  const Device device = ops::common_device(kOp, {{"x", x}, {"x_scale", x_scale}, {"w", w},
                                                 {"w_scale", w_scale}, {"y", y},
                                                 {"workspace", workspace}});
  ops::kernel(kOp, ops::kLinear, device)(x, x_scale, w, w_scale, y, workspace, stream);
}

}  // namespace dsv4
