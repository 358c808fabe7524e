// The CPU kernel of linear: y = x · Wᵀ on the shared CPU GEMM (arguments validated by the op).
#include "cpu/gemm.h"
#include "cpu/kernels.h"

namespace dsv4::cpu {

void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y, const TensorView& /*workspace*/,
            Stream /*stream*/) {
  const int64_t x_block = activation_scale_block(x, x_scale);
  const GemmProblem problem{ScaledMatrix::from_views(x, x_scale, 1, x_block),
                            ScaledMatrix::from_views(w, w_scale, kWeightBlock, kWeightBlock),
                            OutputMatrix::from_view(y)};
  gemm_xwT(&problem, 1);
}

}  // namespace dsv4::cpu
