// linear: y = x · Wᵀ (docs/spec.md §2 projections) — validation, backend dispatch, CPU GEMM call.
#include "cpu/backend.h"
#include "cpu/gemm.h"
#include "cpu/validate.h"
#include "dsv4/ops.h"
#ifdef DSV4_WITH_CUDA
#include "cuda/gemm/linear.h"
#endif

namespace dsv4 {

namespace {
constexpr const char* kOp = "linear";
constexpr int64_t kWeightBlock = 128;  // weight scales cover 128 × 128 blocks

// Returns the activation scale block (0 when x is not fp8).
int64_t validate_linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
                        const TensorView& w_scale, const TensorView& y) {
  check_defined(kOp, "x", x);
  check_defined(kOp, "w", w);
  check_defined(kOp, "y", y);
  cpu::check_dtype_in(kOp, "x", x, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  cpu::check_dtype_in(kOp, "w", w, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  cpu::check_dtype_in(kOp, "y", y, {DType::bf16, DType::fp32});
  check_ndim(kOp, "x", x, 2);
  check_ndim(kOp, "w", w, 2);
  const int64_t T = x.shape[0], K = x.shape[1], N = w.shape[0];
  check_dim(kOp, "w", w, 1, K);
  check_shape(kOp, "y", y, {T, N});
  cpu::check_row_strided(kOp, "x", x);
  cpu::check_row_strided(kOp, "w", w);
  cpu::check_output_layout(kOp, "y", y);
  const int64_t x_block = cpu::check_activation_scale(kOp, "x", x, "x_scale", x_scale);
  cpu::check_weight_scale(kOp, "w", w, "w_scale", w_scale,
                          {(N + kWeightBlock - 1) / kWeightBlock, (K + kWeightBlock - 1) / kWeightBlock});
  cpu::check_outputs_disjoint(kOp, {{"y", y}},
                              {{"x", x}, {"w", w}, {"x_scale", x_scale}, {"w_scale", w_scale}});
  return x_block;
}
}  // namespace

void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y, Stream stream) {
  linear(x, x_scale, w, w_scale, y, TensorView{}, stream);
}

void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y,
            [[maybe_unused]] const TensorView& workspace, [[maybe_unused]] Stream stream) {
  const int64_t x_block = validate_linear(x, x_scale, w, w_scale, y);
  if (cpu::common_device(kOp, {{"x", x}, {"x_scale", x_scale}, {"w", w}, {"w_scale", w_scale},
                               {"y", y}, {"workspace", workspace}}) == Device::cuda) {
    DSV4_CUDA_DISPATCH(kOp, cuda::linear(x, x_scale, w, w_scale, y, workspace, stream));
  }
  const cpu::GemmProblem problem{cpu::ScaledMatrix::from_views(x, x_scale, 1, x_block),
                                 cpu::ScaledMatrix::from_views(w, w_scale, kWeightBlock, kWeightBlock),
                                 cpu::OutputMatrix::from_view(y)};
  cpu::gemm_xwT(&problem, 1);
}

}  // namespace dsv4
