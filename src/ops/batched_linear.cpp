// batched_linear: y[b] = x[b] · w[b]ᵀ (include/dsv4/ops.h) — the front door: validation, then
// the backend.
#include <utility>

#include "dsv4/ops.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {
constexpr const char* kOp = "batched_linear";

void validate_batched_linear(const TensorView& x, const TensorView& w, const TensorView& y) {
  for (const auto& [name, t] : {std::pair<const char*, const TensorView&>{"x", x}, {"w", w}, {"y", y}}) {
    check_defined(kOp, name, t);
    ops::check_dtype_in(kOp, name, t, {DType::bf16, DType::fp32});
    check_ndim(kOp, name, t, 3);
  }
  const int64_t B = x.shape[0], T = x.shape[1], K = x.shape[2], N = w.shape[1];
  check_shape(kOp, "w", w, {B, N, K});
  check_shape(kOp, "y", y, {B, T, N});
  ops::check_row_strided(kOp, "x", x);
  ops::check_row_strided(kOp, "w", w);
  ops::check_output_layout(kOp, "y", y);
  ops::check_outputs_disjoint(kOp, {{"y", y}}, {{"x", x}, {"w", w}});
}
}  // namespace

void batched_linear(const TensorView& x, const TensorView& w, const TensorView& y, Stream stream) {
  batched_linear(x, w, y, TensorView{}, stream);
}

void batched_linear(const TensorView& x, const TensorView& w, const TensorView& y,
                    const TensorView& workspace, Stream stream) {
  validate_batched_linear(x, w, y);
  const Device device = ops::common_device(kOp, {{"x", x}, {"w", w}, {"y", y}, {"workspace", workspace}});
  ops::kernel(kOp, ops::kBatchedLinear, device)(x, w, y, workspace, stream);
}

}  // namespace dsv4
