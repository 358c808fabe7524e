// CUDA entry point of dsv4::batched_linear (src/ops/batched_linear.cpp validates every argument,
// then calls this for CUDA tensors): y[b] = x[b] · w[b]ᵀ for every b as one strided-batched
// cuBLASLt matmul (cublaslt_matmul.h). x and w both bf16 (y bf16 or fp32) or both fp32 (y fp32).
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void batched_linear(const TensorView& x, const TensorView& w, const TensorView& y,
                    const TensorView& workspace, Stream stream);

}  // namespace dsv4::cuda
