// CUDA entry point of dsv4::quantize_act_fp8 (src/cpu/quantize_act_fp8.cpp validates every
// argument, then calls this for CUDA tensors): per row and block of 64 / 128 values, the UE8M0
// scale 2^k and fp8 codes xq = fp8(x / 2^k), through the same dtype.h helpers as the CPU
// reference (ue8m0_exponent_for_amax, exp2_int, float_to_fp8_e4m3), so codes and scales are
// bit-identical to it. Row strides of x, xq and scale are honoured.
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void quantize_act_fp8(const TensorView& x, int block, const TensorView& xq, const TensorView& scale,
                      Stream stream);

}  // namespace dsv4::cuda
