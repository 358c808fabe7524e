// CUDA entry point of dsv4::linear (src/cpu/linear.cpp validates every argument, then calls this
// for CUDA tensors). y [T, N] = x [T, K] · w [N, K]ᵀ through one cuBLASLt matmul
// (cublaslt_matmul.h): x and w both bf16 (y bf16 or fp32) or both fp32 (y fp32). FP8 x or w, and
// any scale, throw dsv4::Error pointing to dequantize_fp8_blocks (FP8 GEMMs are a later step).
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y, Stream stream);

}  // namespace dsv4::cuda
