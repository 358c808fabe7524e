// The CPU kernels of rms_norm, fused_qkv_rms_norm and residual_add_rms_norm: fp32 math in
// math/rms_norm.h's summation order (the CUDA kernels' too), one rounding to the output type.
#include <vector>

#include "cpu/act_quant.h"
#include "cpu/kernels.h"
#include "cpu/rows.h"
#include "math/rms_norm.h"

namespace dsv4::cpu {

namespace {

// The CPU kernel: each row is read whole into fp32 before its output is written, so y == x works.
// y may be undefined when q8 (an FP8 copy of the output, 1 × 128 blocks, of the values y holds —
// bf16 without a y) is given.
void normalize_rows(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
                    const TensorView& q8, const TensorView& q8_scale) {
  const RowWalker x_rows(x), y_rows(y.defined() ? y : x);  // y_rows only used with a y
  const int64_t D = x_rows.row_len();
  const DType out_dtype = y.defined() ? y.dtype : DType::bf16;
  std::vector<float> w;
  if (weight.defined()) {
    w.resize(static_cast<size_t>(D));
    load_row(weight.data, weight.dtype, D, w.data());
  }
  const float* w_ptr = weight.defined() ? w.data() : nullptr;
  const int64_t rows = x_rows.num_rows();
#pragma omp parallel if (rows > 1)
  {
    std::vector<float> row(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      load_row(x_rows.row_ptr(r), x.dtype, D, row.data());
      math::rms_normalize(row.data(), D, eps, w_ptr);
      if (y.defined()) store_row(row.data(), y.dtype, D, y_rows.row_ptr(r));
      if (!q8.defined()) continue;
      if (out_dtype == DType::bf16)
        for (float& v : row) v = round_bf16(v);
      uint8_t* q = static_cast<uint8_t*>(q8.data) + r * q8.strides[0];
      for (int64_t b = 0; b < D / 128; ++b)
        quantize_act_block(row.data() + b * 128, 128, q + b * 128, q8_scale, r, b);
    }
  }
}

}  // namespace

void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              Stream /*stream*/) {
  normalize_rows(x, weight, eps, y, {}, {});
}

void fused_qkv_rms_norm(const TensorView& q_in, const TensorView& wq, const TensorView& kv_in,
                        const TensorView& wkv, float eps, const TensorView& q_out,
                        const TensorView& kv_out, const TensorView& q_fp8,
                        const TensorView& q_scale, Stream /*stream*/) {
  normalize_rows(q_in, wq, eps, q_out, q_fp8, q_scale);
  normalize_rows(kv_in, wkv, eps, kv_out, {}, {});
}

void residual_add_rms_norm(const TensorView& residual, const TensorView& delta,
                           const TensorView& weight, float eps, const TensorView& y,
                           Stream /*stream*/) {
  const int64_t T = residual.shape[0], D = residual.shape[1];
  if (delta.defined()) {
    const RowWalker r_rows(residual), d_rows(delta);
#pragma omp parallel if (T > 1)
    {
      std::vector<float> row(static_cast<size_t>(D)), add(static_cast<size_t>(D));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        float* r = reinterpret_cast<float*>(r_rows.row_ptr(t));
        load_row(d_rows.row_ptr(t), delta.dtype, D, add.data());
        for (int64_t i = 0; i < D; ++i) r[i] += add[static_cast<size_t>(i)];
      }
    }
  }
  if (y.defined()) normalize_rows(residual, weight, eps, y, {}, {});
}

}  // namespace dsv4::cpu
