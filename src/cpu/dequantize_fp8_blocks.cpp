// dequantize_fp8_blocks: block-scaled FP8 e4m3 → bf16 / fp32, y = fp8(x) · scale of its block.
// Validation and backend dispatch, and the CPU reference: each row of each batch is decoded with
// the GEMM's scaled-row loader (one fp32 product per element, the scale looked up per block) and
// rounded once to y's dtype — the same two roundings the CUDA kernel does.
#include <string>
#include <vector>

#include "cpu/backend.h"
#include "cpu/gemm.h"
#include "cpu/rows.h"
#include "cpu/validate.h"
#include "dsv4/ops.h"
#ifdef DSV4_WITH_CUDA
#include "cuda/gemm/dequantize_fp8_blocks.h"
#endif

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
  cpu::check_dtype_in(kOp, "scale", scale, {DType::ue8m0, DType::fp32});
  cpu::check_dtype_in(kOp, "y", y, {DType::bf16, DType::fp32});
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
  cpu::check_row_strided(kOp, "x", x);
  cpu::check_row_strided(kOp, "scale", scale);
  cpu::check_output_layout(kOp, "y", y);
  cpu::check_disjoint(kOp, "y", y, "x", x);
  cpu::check_disjoint(kOp, "y", y, "scale", scale);
}

// A 3-d view of a 2-d or 3-d one (a batch of one).
TensorView as_batched(const TensorView& t) {
  if (t.ndim == 3) return t;
  TensorView v = t;
  v.ndim = 3;
  v.shape = {1, t.shape[0], t.shape[1]};
  v.strides = {0, t.strides[0], t.strides[1]};
  return v;
}

void dequantize_cpu(const TensorView& x, const TensorView& scale, int block_rows, int block_cols,
                    const TensorView& y) {
  const TensorView xb = as_batched(x), sb = as_batched(scale), yb = as_batched(y);
  const int64_t G = xb.shape[0], R = xb.shape[1], C = xb.shape[2];
  const int64_t y_elem = static_cast<int64_t>(dtype_size(y.dtype));
#pragma omp parallel if (G * R * C > (int64_t{1} << 16))
  {
    std::vector<float> row(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t gr = 0; gr < G * R; ++gr) {
      const int64_t g = gr / R, r = gr % R;
      const cpu::ScaledMatrix m =
          cpu::ScaledMatrix::from_views(cpu::select0(xb, g), cpu::select0(sb, g), block_rows, block_cols);
      m.load_row_segment(r, 0, C, row.data());
      cpu::store_row(row.data(), y.dtype, C,
                     static_cast<char*>(y.data) + (g * yb.strides[0] + r * yb.strides[1]) * y_elem);
    }
  }
}
}  // namespace

void dequantize_fp8_blocks(const TensorView& x, const TensorView& scale, int block_rows,
                           int block_cols, const TensorView& y, [[maybe_unused]] Stream stream) {
  validate_dequantize(x, scale, block_rows, block_cols, y);
  if (cpu::common_device(kOp, {{"x", x}, {"scale", scale}, {"y", y}}) == Device::cuda) {
    DSV4_CUDA_DISPATCH(kOp,
                       cuda::dequantize_fp8_blocks(x, scale, block_rows, block_cols, y, stream));
  }
  dequantize_cpu(x, scale, block_rows, block_cols, y);
}

}  // namespace dsv4
