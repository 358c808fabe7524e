// Host side of the CUDA linear: the CUDA-only dtype and scale-layout rules, then one GEMM: the
// skinny kernel for the decode-sized fp8 / bf16 problems it is preferred for (skinny_gemm.h says
// why) or is forced onto, else one cuBLASLt matmul.
#include "cuda/gemm/linear.h"

#include "cuda/gemm/cublaslt_matmul.h"
#include "cuda/gemm/skinny_gemm.h"

namespace dsv4::cuda {

void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y, const TensorView& workspace,
            Stream stream) {
  // Qualified: rt::linear_on_path takes the same arguments, and argument-dependent lookup finds it.
  cuda::linear_on_path(rt::GemmChoice{}, x, x_scale, w, w_scale, y, workspace, stream);
}

void linear_on_path(const rt::GemmChoice& choice, const TensorView& x, const TensorView& x_scale,
                    const TensorView& w, const TensorView& w_scale, const TensorView& y,
                    const TensorView& workspace, Stream stream) {
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
  if (p.T > 0) {
    check_matmul(kOp, p);  // the rules of both kernels: a problem is refused the same on either
    SkinnyGemm skinny;
    skinny.ab_dtype = x.dtype;
    skinny.T = p.T;
    skinny.N = p.N;
    skinny.K = p.K;
    skinny.x = x.data;
    skinny.x_ld = x.strides[0];
    skinny.x_scale = p.x_scale;
    skinny.w = w.data;
    skinny.w_ld = w.strides[0];
    skinny.w_scale = p.w_scale;
    skinny.w_scale_ld = x.dtype == DType::fp8_e4m3 ? w_scale.strides[0] : 0;
    skinny.y = y.data;
    skinny.y_dtype = y.dtype;
    skinny.y_ld = y.strides[0];
    skinny.workspace = workspace.data;
    skinny.workspace_bytes = workspace_bytes;
    skinny.splits = choice.skinny_splits;
    skinny.token_tile = choice.skinny_token_tile;
    if (runs_on_skinny_gemm(kOp, choice.path, skinny)) {
      skinny_gemm(skinny, stream);
      return;
    }
  }
  matmul_xwT(kOp, p, stream);
}

}  // namespace dsv4::cuda
