// Host side of the CUDA linear: the CUDA-only dtype and scale-layout rules, then one cuBLASLt
// matmul.
#include "cuda/gemm/linear.h"

#include "cuda/gemm/cublaslt_matmul.h"

namespace dsv4::cuda {

void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y, const TensorView& workspace,
            Stream stream) {
  constexpr const char* kOp = "linear";
  check_matmul_dtypes(kOp, "x", x, "x_scale", x_scale, "w", w, "w_scale", w_scale, "y", y);
  const int64_t workspace_bytes = check_matmul_workspace(kOp, workspace);
  MatmulXwT p;
  p.ab_dtype = x.dtype;
  p.y_dtype = y.dtype;
  p.T = x.shape[0];
  p.K = x.shape[1];
  p.N = w.shape[0];
  p.x = {x.data, x.strides[0], 0};
  p.w = {w.data, w.strides[0], 0};
  if (x.dtype == DType::fp8_e4m3) {
    check_act_scale_layout(kOp, "x_scale", x_scale);
    check_weight_scale_layout(kOp, "w_scale", w_scale.shape[0], w_scale.shape[1], w_scale.strides[0],
                              w_scale.strides[1], p.K);
    p.x_scale = static_cast<const float*>(x_scale.data);
    p.w_scale = static_cast<const float*>(w_scale.data);
  }
  p.y = y.data;
  p.y_ld = y.strides[0];
  p.workspace = workspace.data;
  p.workspace_bytes = workspace_bytes;
  matmul_xwT(kOp, p, stream);
}

}  // namespace dsv4::cuda
