// quantize_act_fp8: per-row, per-block FP8 e4m3 activation quantization with UE8M0 (power of
// two) scales — the production input of the FP8 projections (DeepSeek act_quant, vLLM QuantFP8
// with use_ue8m0). The scale rule is dtype.h's ue8m0_exponent_for_amax, shared with the kernels.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

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
  check_defined(kOp, "xq", xq);
  check_defined(kOp, "scale", scale);
  if (block != 64 && block != 128) fail_expected(kOp, "block", "64 or 128", block);
  cpu::check_dtype_in(kOp, "x", x, {DType::bf16, DType::fp32});
  check_dtype(kOp, "xq", xq, DType::fp8_e4m3);
  cpu::check_dtype_in(kOp, "scale", scale, {DType::ue8m0, DType::fp32});
  check_ndim(kOp, "x", x, 2);
  const int64_t T = x.shape[0], K = x.shape[1];
  if (K % block != 0)
    fail_expected(kOp, "x.shape[1]", "a multiple of block = " + std::to_string(block), K);
  check_shape(kOp, "xq", xq, {T, K});
  check_shape(kOp, "scale", scale, {T, K / block});
  cpu::check_row_strided(kOp, "x", x);
  cpu::check_output_layout(kOp, "xq", xq);
  cpu::check_output_layout(kOp, "scale", scale);
  cpu::check_disjoint(kOp, "xq", xq, "x", x);
  cpu::check_disjoint(kOp, "scale", scale, "x", x);
  cpu::check_disjoint(kOp, "scale", scale, "xq", xq);
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
      for (int64_t b = 0; b < num_blocks; ++b) {
        const float* v = row.data() + b * block;
        float amax = 0.0f;
        for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(v[i]));
        const int32_t k = ue8m0_exponent_for_amax(amax);
        const float inv_scale = exp2_int(-k);  // exact: dividing by a power of two
        for (int i = 0; i < block; ++i) q[b * block + i] = float_to_fp8_e4m3(v[i] * inv_scale);
        const int64_t s = t * scale.strides[0] + b;
        if (scale.dtype == DType::ue8m0)
          static_cast<uint8_t*>(scale.data)[s] = static_cast<uint8_t>(k + 127);
        else
          static_cast<float*>(scale.data)[s] = exp2_int(k);
      }
    }
  }
}

}  // namespace dsv4
