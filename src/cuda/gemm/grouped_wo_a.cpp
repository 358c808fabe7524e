// Host side of the CUDA grouped_wo_a: the CUDA-only dtype rules, then one strided-batched
// cuBLASLt matmul over the G groups.
#include "cuda/gemm/grouped_wo_a.h"

#include "cuda/gemm/cublaslt_matmul.h"

namespace dsv4::cuda {

void grouped_wo_a(const TensorView& o, const TensorView& /*o_scale*/, const TensorView& wo_a,
                  const TensorView& /*wo_a_scale*/, const TensorView& z, Stream stream) {
  constexpr const char* kOp = "grouped_wo_a";
  // Scales only come with fp8 operands (validated by the caller), which this rejects.
  check_matmul_dtypes(kOp, "o", o, "wo_a", wo_a, "z", z);
  const int64_t G = wo_a.shape[0], L = wo_a.shape[1], Dg = wo_a.shape[2];
  MatmulXwT p;
  p.ab_dtype = o.dtype;
  p.y_dtype = z.dtype;
  p.batch = G;
  p.T = o.shape[0];
  p.N = L;
  p.K = Dg;
  p.x = {o.data, o.strides[0], Dg};  // group g: columns [g·Dg, (g+1)·Dg) of every row of o
  p.w = {wo_a.data, wo_a.strides[1], wo_a.strides[0]};
  p.y = z.data;
  p.y_ld = z.strides[0];
  p.y_batch_stride = L;  // group g: columns [g·L, (g+1)·L) of z
  p.x_name = "o";
  p.w_name = "wo_a";
  p.y_name = "z";
  matmul_xwT(kOp, p, stream);
}

}  // namespace dsv4::cuda
