// CUDA entry point of dsv4::quantize_act_fp8 (src/ops/quantize_act_fp8.cpp validates every
// argument, then calls this for CUDA tensors): per row and block of 64 / 128 values, the UE8M0
// scale 2^k and fp8 codes xq = fp8(x / 2^k), with the same dtype.h rules as the CPU reference
// (ue8m0_exponent_for_amax, exp2_int; the codes through the bit-identical hardware conversion of
// fp8_convert.cuh), so codes and scales are bit-identical to it. Row strides of x and xq and any
// strides of scale are honoured.
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void quantize_act_fp8(const TensorView& x, int block, const TensorView& xq, const TensorView& scale,
                      Stream stream);

}  // namespace dsv4::cuda
