// The host half of FP8 activation quantization (quantize_act_fp8's rule: per row and block of
// 64 / 128 values, the UE8M0 scale 2^k, k = ue8m0_exponent_for_amax(amax), codes fp8(v / 2^k)),
// shared by the CPU kernels of quantize_act_fp8, inv_rope_fp8_quant and the FP8 output of
// fused_qkv_rms_norm: the per-block quantization (the outputs' validation is
// ops::check_act_quant_outputs). The CUDA kernels follow src/cuda/common/act_quant.cuh, bit for
// bit.
#pragma once

#include <cstdint>

#include "dsv4/fp8_block.h"
#include "dsv4/tensor.h"

namespace dsv4::cpu {

// Quantizes v[0 .. block) into q and stores the block's scale at (row, b) of `scale`.
inline void quantize_act_block(const float* v, int block, uint8_t* q, const TensorView& scale,
                               int64_t row, int64_t b) {
  const int32_t k = fp8_quantize_block(v, block, q);
  const int64_t s = row * scale.strides[0] + b * scale.strides[1];
  if (scale.dtype == DType::ue8m0)
    static_cast<uint8_t*>(scale.data)[s] = static_cast<uint8_t>(k + 127);
  else
    static_cast<float*>(scale.data)[s] = exp2_int(k);
}

}  // namespace dsv4::cpu
