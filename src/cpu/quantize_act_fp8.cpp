// quantize_act_fp8: per-row, per-block FP8 e4m3 activation quantization with UE8M0 (power of
// two) scales — the production input of the FP8 projections (DeepSeek act_quant, vLLM QuantFP8
// with use_ue8m0). The scale rule is dtype.h's ue8m0_exponent_for_amax, shared with the kernels.
#include <string>
#include <vector>

#include "cpu/act_quant.h"
#include "cpu/backend.h"
#include "cpu/rows.h"
#include "cpu/validate.h"
#include "dsv4/ops.h"
#ifdef DSV4_WITH_CUDA
#include "cuda/oproj/quantize_act_fp8.h"
#endif

namespace dsv4 {

namespace {
constexpr const char* kOp = "quantize_act_fp8";

void validate_quantize_act(const TensorView& x, int block, const TensorView& xq,
                           const TensorView& scale) {
  check_defined(kOp, "x", x);
  cpu::check_dtype_in(kOp, "x", x, {DType::bf16, DType::fp32});
  check_ndim(kOp, "x", x, 2);
  cpu::check_row_strided(kOp, "x", x);
  if ((block == 64 || block == 128) && x.shape[1] % block != 0)
    fail_expected(kOp, "x.shape[1]", "a multiple of block = " + std::to_string(block), x.shape[1]);
  cpu::check_act_quant_outputs(kOp, "xq", xq, "scale", scale, x.shape[0], x.shape[1], block);
  cpu::check_disjoint(kOp, "xq", xq, "x", x);
  cpu::check_disjoint(kOp, "scale", scale, "x", x);
}
}  // namespace

void quantize_act_fp8(const TensorView& x, int block, const TensorView& xq,
                      const TensorView& scale, [[maybe_unused]] Stream stream) {
  validate_quantize_act(x, block, xq, scale);
  if (cpu::common_device(kOp, {{"x", x}, {"xq", xq}, {"scale", scale}}) == Device::cuda) {
    DSV4_CUDA_DISPATCH(kOp, cuda::quantize_act_fp8(x, block, xq, scale, stream));
  }

  const int64_t T = x.shape[0], K = x.shape[1], num_blocks = K / block;
  const size_t x_elem = dtype_size(x.dtype);
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      cpu::load_row(static_cast<const char*>(x.data) + t * x.strides[0] * x_elem, x.dtype, K,
                    row.data());
      uint8_t* q = static_cast<uint8_t*>(xq.data) + t * xq.strides[0];
      for (int64_t b = 0; b < num_blocks; ++b)
        cpu::quantize_act_block(row.data() + b * block, block, q + b * block, scale, t, b);
    }
  }
}

}  // namespace dsv4
