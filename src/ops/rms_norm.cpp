// rms_norm, fused_qkv_rms_norm and residual_add_rms_norm (docs/spec.md §2 steps 1–2): the front doors,
// validation then the backend.
#include <cmath>
#include <string>

#include "dsv4/ops.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {

void check_eps(const char* where, float eps) {
  if (!(eps >= 0.0f) || !std::isfinite(eps)) fail_expected(where, "eps", "a finite value >= 0", eps);
}

// x [..., D] and y (same shape, in place or disjoint), weight [D] or undefined.
void validate_norm_operand(const char* where, const char* x_name, const TensorView& x,
                           const char* w_name, const TensorView& weight, bool weight_required,
                           const char* y_name, const TensorView& y) {
  check_defined(where, x_name, x);
  check_defined(where, y_name, y);
  ops::check_dtype_in(where, x_name, x, {DType::bf16, DType::fp32});
  ops::check_dtype_in(where, y_name, y, {DType::bf16, DType::fp32});
  if (x.ndim < 1) fail_expected(where, std::string(x_name) + ".ndim", ">= 1", x.ndim);
  check_ndim(where, y_name, y, x.ndim);
  for (int d = 0; d < x.ndim; ++d) check_dim(where, y_name, y, d, x.shape[d]);
  ops::check_row_strided(where, x_name, x);
  ops::check_output_layout(where, y_name, y);
  if (weight_required) check_defined(where, w_name, weight);
  if (weight.defined()) {
    ops::check_dtype_in(where, w_name, weight, {DType::bf16, DType::fp32});
    check_shape(where, w_name, weight, {x.shape[x.ndim - 1]});
    ops::check_row_strided(where, w_name, weight);
    ops::check_disjoint(where, y_name, y, w_name, weight);
  }
  ops::check_alias_exact_or_disjoint(where, y_name, y, x_name, x);
}

}  // namespace

void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              Stream stream) {
  constexpr const char* kOp = "rms_norm";
  validate_norm_operand(kOp, "x", x, "weight", weight, false, "y", y);
  check_eps(kOp, eps);
  const Device device = ops::common_device(kOp, {{"x", x}, {"weight", weight}, {"y", y}});
  ops::kernel(kOp, ops::kRmsNorm, device)(x, weight, eps, y, stream);
}

void fused_qkv_rms_norm(const TensorView& q_in, const TensorView& wq, const TensorView& kv_in,
                        const TensorView& wkv, float eps, const TensorView& q_out,
                        const TensorView& kv_out, Stream stream) {
  fused_qkv_rms_norm(q_in, wq, kv_in, wkv, eps, q_out, kv_out, TensorView{}, TensorView{}, stream);
}

void fused_qkv_rms_norm(const TensorView& q_in, const TensorView& wq, const TensorView& kv_in,
                        const TensorView& wkv, float eps, const TensorView& q_out,
                        const TensorView& kv_out, const TensorView& q_fp8,
                        const TensorView& q_scale, Stream stream) {
  constexpr const char* kOp = "fused_qkv_rms_norm";
  const bool fp8 = q_fp8.defined() || q_scale.defined();
  if (!fp8 || q_out.defined()) validate_norm_operand(kOp, "q_in", q_in, "wq", wq, true, "q_out", q_out);
  validate_norm_operand(kOp, "kv_in", kv_in, "wkv", wkv, true, "kv_out", kv_out);
  check_ndim(kOp, "q_in", q_in, 2);
  check_ndim(kOp, "kv_in", kv_in, 2);
  check_dim(kOp, "kv_in", kv_in, 0, q_in.shape[0]);
  check_eps(kOp, eps);
  if (fp8) {
    if (!q_out.defined()) {  // q_in and wq as validate_norm_operand checks them
      ops::check_dtype_in(kOp, "q_in", q_in, {DType::bf16, DType::fp32});
      ops::check_row_strided(kOp, "q_in", q_in);
      check_defined(kOp, "wq", wq);
      ops::check_dtype_in(kOp, "wq", wq, {DType::bf16, DType::fp32});
      check_shape(kOp, "wq", wq, {q_in.shape[1]});
      ops::check_row_strided(kOp, "wq", wq);
    }
    ops::check_act_quant_outputs(kOp, "q_fp8", q_fp8, "q_scale", q_scale, q_in.shape[0], q_in.shape[1], 128);
    ops::check_outputs_disjoint(kOp, {{"q_fp8", q_fp8}, {"q_scale", q_scale}},
                                {{"q_in", q_in}, {"wq", wq}, {"kv_in", kv_in}, {"wkv", wkv},
                                 {"q_out", q_out}, {"kv_out", kv_out}});
  }
  // The two outputs must not clobber each other or the other branch's inputs.
  ops::check_outputs_disjoint(kOp, {{"q_out", q_out}, {"kv_out", kv_out}}, {});
  ops::check_disjoint(kOp, "q_out", q_out, "kv_in", kv_in);
  ops::check_disjoint(kOp, "q_out", q_out, "wkv", wkv);
  ops::check_disjoint(kOp, "kv_out", kv_out, "q_in", q_in);
  ops::check_disjoint(kOp, "kv_out", kv_out, "wq", wq);
  const Device device =
      ops::common_device(kOp, {{"q_in", q_in}, {"wq", wq}, {"kv_in", kv_in}, {"wkv", wkv},
                               {"q_out", q_out}, {"kv_out", kv_out}, {"q_fp8", q_fp8},
                               {"q_scale", q_scale}});
  ops::kernel(kOp, ops::kFusedQkvRmsNorm, device)(q_in, wq, kv_in, wkv, eps, q_out, kv_out, q_fp8,
                                                  q_scale, stream);
}

void residual_add_rms_norm(const TensorView& residual, const TensorView& delta,
                           const TensorView& weight, float eps, const TensorView& y,
                           Stream stream) {
  constexpr const char* kOp = "residual_add_rms_norm";
  check_defined(kOp, "residual", residual);
  check_dtype(kOp, "residual", residual, DType::fp32);
  check_ndim(kOp, "residual", residual, 2);
  ops::check_row_strided(kOp, "residual", residual);
  ops::check_output_layout(kOp, "residual", residual);
  const int64_t T = residual.shape[0], D = residual.shape[1];
  if (delta.defined()) {
    ops::check_dtype_in(kOp, "delta", delta, {DType::bf16, DType::fp32});
    check_shape(kOp, "delta", delta, {T, D});
    ops::check_row_strided(kOp, "delta", delta);
    ops::check_disjoint(kOp, "residual", residual, "delta", delta);
  }
  if (!y.defined() && weight.defined())
    fail(kOp, ": weight: given without y (the weight only applies to the norm)");
  if (y.defined()) {
    validate_norm_operand(kOp, "residual", residual, "weight", weight, false, "y", y);
    ops::check_disjoint(kOp, "y", y, "residual", residual);
    if (delta.defined()) ops::check_disjoint(kOp, "y", y, "delta", delta);
    check_eps(kOp, eps);
  }
  const Device device = ops::common_device(
      kOp, {{"residual", residual}, {"delta", delta}, {"weight", weight}, {"y", y}});
  ops::kernel(kOp, ops::kResidualAddRmsNorm, device)(residual, delta, weight, eps, y, stream);
}

}  // namespace dsv4
