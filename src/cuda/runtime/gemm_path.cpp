// CUDA implementation of src/runtime/gemm_path.h: the op's own argument checks, then the CUDA
// entry of the op with the kernel chosen.
#include "runtime/gemm_path.h"

#include "cuda/gemm/grouped_wo_a.h"
#include "cuda/gemm/linear.h"
#include "dsv4/status.h"
#include "ops/backend.h"
#include "ops/gemm_checks.h"

namespace dsv4::rt {

namespace {
void check_on_cuda(const char* where, Device device) {
  if (device != Device::cuda) fail(where, ": expected tensors on the CUDA device (a GEMM path is a CUDA kernel)");
}
}  // namespace

void linear_on_path(const GemmChoice& choice, const TensorView& x, const TensorView& x_scale,
                    const TensorView& w, const TensorView& w_scale, const TensorView& y,
                    const TensorView& workspace, Stream stream) {
  constexpr const char* kOp = "linear";
  ops::validate_linear(x, x_scale, w, w_scale, y);
  check_on_cuda(kOp, ops::common_device(kOp, {{"x", x}, {"x_scale", x_scale}, {"w", w}, {"w_scale", w_scale},
                                              {"y", y}, {"workspace", workspace}}));
  cuda::linear_on_path(choice, x, x_scale, w, w_scale, y, workspace, stream);
}

void grouped_wo_a_on_path(const GemmChoice& choice, const TensorView& o, const TensorView& o_scale,
                          const TensorView& wo_a, const TensorView& wo_a_scale, const TensorView& z,
                          const TensorView& workspace, Stream stream) {
  constexpr const char* kOp = "grouped_wo_a";
  ops::validate_grouped_wo_a(o, o_scale, wo_a, wo_a_scale, z);
  check_on_cuda(kOp, ops::common_device(kOp, {{"o", o}, {"o_scale", o_scale}, {"wo_a", wo_a},
                                              {"wo_a_scale", wo_a_scale}, {"z", z}, {"workspace", workspace}}));
  cuda::grouped_wo_a_on_path(choice, o, o_scale, wo_a, wo_a_scale, z, workspace, stream);
}

}  // namespace dsv4::rt
