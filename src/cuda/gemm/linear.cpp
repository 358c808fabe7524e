// Host side of the CUDA linear: the CUDA-only dtype rules, then one cuBLASLt matmul.
#include "cuda/gemm/linear.h"

#include "cuda/gemm/cublaslt_matmul.h"

namespace dsv4::cuda {

void linear(const TensorView& x, const TensorView& /*x_scale*/, const TensorView& w,
            const TensorView& /*w_scale*/, const TensorView& y, Stream stream) {
  constexpr const char* kOp = "linear";
  // Scales only come with fp8 operands (validated by the caller), which this rejects.
  check_matmul_dtypes(kOp, "x", x, "w", w, "y", y);
  MatmulXwT p;
  p.ab_dtype = x.dtype;
  p.y_dtype = y.dtype;
  p.T = x.shape[0];
  p.K = x.shape[1];
  p.N = w.shape[0];
  p.x = {x.data, x.strides[0], 0};
  p.w = {w.data, w.strides[0], 0};
  p.y = y.data;
  p.y_ld = y.strides[0];
  matmul_xwT(kOp, p, stream);
}

}  // namespace dsv4::cuda
