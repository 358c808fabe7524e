// quantize_act_fp8: per-row, per-block FP8 e4m3 activation quantization with UE8M0 (power of
// two) scales — the production input of the FP8 projections (DeepSeek act_quant, vLLM QuantFP8
// with use_ue8m0). The scale rule is dtype.h's ue8m0_exponent_for_amax, shared with the kernels.
// The front door: validation, then the backend.
#include <string>

#include "dsv4/ops.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {
constexpr const char* kOp = "quantize_act_fp8";

void validate_quantize_act(const TensorView& x, int block, const TensorView& xq,
                           const TensorView& scale) {
  check_defined(kOp, "x", x);
  ops::check_dtype_in(kOp, "x", x, {DType::bf16, DType::fp32});
  check_ndim(kOp, "x", x, 2);
  ops::check_row_strided(kOp, "x", x);
  if ((block == 64 || block == 128) && x.shape[1] % block != 0)
    fail_expected(kOp, "x.shape[1]", "a multiple of block = " + std::to_string(block), x.shape[1]);
  ops::check_act_quant_outputs(kOp, "xq", xq, "scale", scale, x.shape[0], x.shape[1], block);
  ops::check_disjoint(kOp, "xq", xq, "x", x);
  ops::check_disjoint(kOp, "scale", scale, "x", x);
}
}  // namespace

void quantize_act_fp8(const TensorView& x, int block, const TensorView& xq,
                      const TensorView& scale, Stream stream) {
  validate_quantize_act(x, block, xq, scale);
  const Device device = ops::common_device(kOp, {{"x", x}, {"xq", xq}, {"scale", scale}});
  ops::kernel(kOp, ops::kQuantizeActFp8, device)(x, block, xq, scale, stream);
}

}  // namespace dsv4
