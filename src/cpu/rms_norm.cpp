// rms_norm and fused_qkv_rms_norm (SPEC §2 steps 1–2): y = x · rsqrt(mean(x²) + eps) [· weight]
// over the last dim, fp32 math, one rounding to the output type.
#include <cmath>
#include <string>
#include <vector>

#include "cpu/act_quant.h"
#include "cpu/backend.h"
#include "math/rms_norm.h"
#include "cpu/rows.h"
#include "cpu/validate.h"
#include "dsv4/ops.h"
#if defined(DSV4_WITH_CUDA)
#include "cuda/norm/rms_norm.h"
#endif

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
  cpu::check_dtype_in(where, x_name, x, {DType::bf16, DType::fp32});
  cpu::check_dtype_in(where, y_name, y, {DType::bf16, DType::fp32});
  if (x.ndim < 1) fail_expected(where, std::string(x_name) + ".ndim", ">= 1", x.ndim);
  check_ndim(where, y_name, y, x.ndim);
  for (int d = 0; d < x.ndim; ++d) check_dim(where, y_name, y, d, x.shape[d]);
  cpu::check_row_strided(where, x_name, x);
  cpu::check_output_layout(where, y_name, y);
  if (weight_required) check_defined(where, w_name, weight);
  if (weight.defined()) {
    cpu::check_dtype_in(where, w_name, weight, {DType::bf16, DType::fp32});
    check_shape(where, w_name, weight, {x.shape[x.ndim - 1]});
    cpu::check_row_strided(where, w_name, weight);
    cpu::check_disjoint(where, y_name, y, w_name, weight);
  }
  cpu::check_alias_exact_or_disjoint(where, y_name, y, x_name, x);
}

// The CPU kernel: each row is read whole into fp32 before its output is written, so y == x works.
// y may be undefined when q8 (an FP8 copy of the output, 1 × 128 blocks, of the values y holds —
// bf16 without a y) is given.
void normalize_rows(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
                    const TensorView& q8, const TensorView& q8_scale) {
  const cpu::RowWalker x_rows(x), y_rows(y.defined() ? y : x);  // y_rows only used with a y
  const int64_t D = x_rows.row_len();
  const DType out_dtype = y.defined() ? y.dtype : DType::bf16;
  std::vector<float> w;
  if (weight.defined()) {
    w.resize(static_cast<size_t>(D));
    cpu::load_row(weight.data, weight.dtype, D, w.data());
  }
  const float* w_ptr = weight.defined() ? w.data() : nullptr;
  const int64_t rows = x_rows.num_rows();
#pragma omp parallel if (rows > 1)
  {
    std::vector<float> row(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      cpu::load_row(x_rows.row_ptr(r), x.dtype, D, row.data());
      math::rms_normalize(row.data(), D, eps, w_ptr);
      if (y.defined()) cpu::store_row(row.data(), y.dtype, D, y_rows.row_ptr(r));
      if (!q8.defined()) continue;
      if (out_dtype == DType::bf16)
        for (float& v : row) v = round_bf16(v);
      uint8_t* q = static_cast<uint8_t*>(q8.data) + r * q8.strides[0];
      for (int64_t b = 0; b < D / 128; ++b)
        cpu::quantize_act_block(row.data() + b * 128, 128, q + b * 128, q8_scale, r, b);
    }
  }
}

}  // namespace

void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              [[maybe_unused]] Stream stream) {
  constexpr const char* kOp = "rms_norm";
  validate_norm_operand(kOp, "x", x, "weight", weight, false, "y", y);
  check_eps(kOp, eps);
  if (cpu::common_device(kOp, {{"x", x}, {"weight", weight}, {"y", y}}) == Device::cuda) {
    DSV4_CUDA_DISPATCH(kOp, cuda::rms_norm(x, weight, eps, y, stream));
  }
  normalize_rows(x, weight, eps, y, {}, {});
}

void fused_qkv_rms_norm(const TensorView& q_in, const TensorView& wq, const TensorView& kv_in,
                        const TensorView& wkv, float eps, const TensorView& q_out,
                        const TensorView& kv_out, Stream stream) {
  fused_qkv_rms_norm(q_in, wq, kv_in, wkv, eps, q_out, kv_out, TensorView{}, TensorView{}, stream);
}

void fused_qkv_rms_norm(const TensorView& q_in, const TensorView& wq, const TensorView& kv_in,
                        const TensorView& wkv, float eps, const TensorView& q_out,
                        const TensorView& kv_out, const TensorView& q_fp8,
                        const TensorView& q_scale, [[maybe_unused]] Stream stream) {
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
      cpu::check_dtype_in(kOp, "q_in", q_in, {DType::bf16, DType::fp32});
      cpu::check_row_strided(kOp, "q_in", q_in);
      check_defined(kOp, "wq", wq);
      cpu::check_dtype_in(kOp, "wq", wq, {DType::bf16, DType::fp32});
      check_shape(kOp, "wq", wq, {q_in.shape[1]});
      cpu::check_row_strided(kOp, "wq", wq);
    }
    cpu::check_act_quant_outputs(kOp, "q_fp8", q_fp8, "q_scale", q_scale, q_in.shape[0], q_in.shape[1], 128);
    cpu::check_outputs_disjoint(kOp, {{"q_fp8", q_fp8}, {"q_scale", q_scale}},
                                {{"q_in", q_in}, {"wq", wq}, {"kv_in", kv_in}, {"wkv", wkv},
                                 {"q_out", q_out}, {"kv_out", kv_out}});
  }
  // The two outputs must not clobber each other or the other branch's inputs.
  cpu::check_outputs_disjoint(kOp, {{"q_out", q_out}, {"kv_out", kv_out}}, {});
  cpu::check_disjoint(kOp, "q_out", q_out, "kv_in", kv_in);
  cpu::check_disjoint(kOp, "q_out", q_out, "wkv", wkv);
  cpu::check_disjoint(kOp, "kv_out", kv_out, "q_in", q_in);
  cpu::check_disjoint(kOp, "kv_out", kv_out, "wq", wq);
  if (cpu::common_device(kOp, {{"q_in", q_in}, {"wq", wq}, {"kv_in", kv_in}, {"wkv", wkv},
                               {"q_out", q_out}, {"kv_out", kv_out}, {"q_fp8", q_fp8},
                               {"q_scale", q_scale}}) == Device::cuda) {
    DSV4_CUDA_DISPATCH(kOp, cuda::fused_qkv_rms_norm(q_in, wq, kv_in, wkv, eps, q_out, kv_out, q_fp8,
                                                     q_scale, stream));
  }
  normalize_rows(q_in, wq, eps, q_out, q_fp8, q_scale);
  normalize_rows(kv_in, wkv, eps, kv_out, {}, {});
}

void residual_add_rms_norm(const TensorView& residual, const TensorView& delta,
                           const TensorView& weight, float eps, const TensorView& y,
                           [[maybe_unused]] Stream stream) {
  constexpr const char* kOp = "residual_add_rms_norm";
  check_defined(kOp, "residual", residual);
  check_dtype(kOp, "residual", residual, DType::fp32);
  check_ndim(kOp, "residual", residual, 2);
  cpu::check_row_strided(kOp, "residual", residual);
  cpu::check_output_layout(kOp, "residual", residual);
  const int64_t T = residual.shape[0], D = residual.shape[1];
  if (delta.defined()) {
    cpu::check_dtype_in(kOp, "delta", delta, {DType::bf16, DType::fp32});
    check_shape(kOp, "delta", delta, {T, D});
    cpu::check_row_strided(kOp, "delta", delta);
    cpu::check_disjoint(kOp, "residual", residual, "delta", delta);
  }
  if (!y.defined() && weight.defined())
    fail(kOp, ": weight: given without y (the weight only applies to the norm)");
  if (y.defined()) {
    validate_norm_operand(kOp, "residual", residual, "weight", weight, false, "y", y);
    cpu::check_disjoint(kOp, "y", y, "residual", residual);
    if (delta.defined()) cpu::check_disjoint(kOp, "y", y, "delta", delta);
    check_eps(kOp, eps);
  }
  if (cpu::common_device(kOp, {{"residual", residual}, {"delta", delta}, {"weight", weight},
                               {"y", y}}) == Device::cuda) {
    DSV4_CUDA_DISPATCH(kOp, cuda::residual_add_rms_norm(residual, delta, weight, eps, y, stream));
  }
  if (delta.defined()) {
    const cpu::RowWalker r_rows(residual), d_rows(delta);
#pragma omp parallel if (T > 1)
    {
      std::vector<float> row(static_cast<size_t>(D)), add(static_cast<size_t>(D));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        float* r = reinterpret_cast<float*>(r_rows.row_ptr(t));
        cpu::load_row(d_rows.row_ptr(t), delta.dtype, D, add.data());
        for (int64_t i = 0; i < D; ++i) r[i] += add[static_cast<size_t>(i)];
      }
    }
  }
  if (y.defined()) normalize_rows(residual, weight, eps, y, {}, {});
}

}  // namespace dsv4
