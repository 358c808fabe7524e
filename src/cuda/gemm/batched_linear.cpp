// Host side of the CUDA batched_linear: linear's CUDA dtype rules, then one strided-batched
// cuBLASLt matmul whose batch strides are the views' leading strides. The batches may interleave
// in memory (the heads of one [T, H, d] activation: batch stride d, row stride H·d): cuBLASLt
// addresses matrix b at data + b · batch_stride whatever the other strides, and the front door has
// checked that y's elements are distinct, so no two batches write one element.
#include "cuda/gemm/batched_linear.h"

#include "cuda/gemm/cublaslt_matmul.h"

namespace dsv4::cuda {

void batched_linear(const TensorView& x, const TensorView& w, const TensorView& y,
                    const TensorView& workspace, Stream stream) {
  constexpr const char* kOp = "batched_linear";
  check_matmul_dtypes(kOp, "x", x, "x_scale", {}, "w", w, "w_scale", {}, "y", y);
  MatmulXwT p;
  p.ab_dtype = x.dtype;
  p.y_dtype = y.dtype;
  p.batch = x.shape[0];
  p.T = x.shape[1];
  p.K = x.shape[2];
  p.N = w.shape[1];
  p.x = {x.data, x.strides[1], x.strides[0]};
  p.w = {w.data, w.strides[1], w.strides[0]};
  p.y = y.data;
  p.y_ld = y.strides[1];
  p.y_batch_stride = y.strides[0];
  p.workspace = workspace.data;
  p.workspace_bytes = check_matmul_workspace(kOp, workspace);
  matmul_xwT(kOp, p, stream);
}

}  // namespace dsv4::cuda
