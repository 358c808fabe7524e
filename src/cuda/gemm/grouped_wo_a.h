// CUDA entry point of dsv4::grouped_wo_a (src/cpu/grouped_wo_a.cpp validates every argument,
// then calls this for CUDA tensors). The G group GEMMs z_g [T, L] = o_g [T, Dg] · wo_a[g] [L, Dg]ᵀ
// run as ONE strided-batched cuBLASLt matmul (batch g: o at column g·Dg, wo_a[g], z at column
// g·L). o and wo_a both bf16 (z bf16 or fp32) or both fp32 (z fp32); FP8 o or wo_a throw
// dsv4::Error pointing to dequantize_fp8_blocks (FP8 GEMMs are a later step).
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z, Stream stream);

}  // namespace dsv4::cuda
