// CUDA entry point of dsv4::linear (src/ops/linear.cpp validates every argument, then calls this
// for CUDA tensors). y [T, N] = x [T, K] · w [N, K]ᵀ: x and w both bf16 (y bf16 or fp32), both fp32
// (y fp32), or both fp8_e4m3 with fp32 block scales in cuBLASLt's layouts (x 1 × 128, w 128 × 128;
// y bf16 or fp32) — through the skinny decode GEMM for the fp8 / bf16 problems
// skinny_gemm_preferred() accepts (skinny_gemm.h), else one cuBLASLt matmul (cublaslt_matmul.h).
// `workspace` (optional, uint8 on the device) holds the skinny kernel's split-K partial sums or
// lets cuBLASLt pick split-K algorithms.
#pragma once

#include "dsv4/ops.h"
#include "runtime/gemm_path.h"

namespace dsv4::cuda {

void linear(const TensorView& x, const TensorView& x_scale, const TensorView& w,
            const TensorView& w_scale, const TensorView& y, const TensorView& workspace,
            Stream stream);

// The same on the kernel `choice` names (rt::linear_on_path, for benchmarks and tests); linear()
// is this with GemmPath::automatic.
void linear_on_path(const rt::GemmChoice& choice, const TensorView& x, const TensorView& x_scale,
                    const TensorView& w, const TensorView& w_scale, const TensorView& y,
                    const TensorView& workspace, Stream stream);

}  // namespace dsv4::cuda
