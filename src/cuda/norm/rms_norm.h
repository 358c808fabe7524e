// CUDA entry points of rms_norm and fused_qkv_rms_norm (src/cuda/norm/rms_norm.cu). Called by the
// public ops (src/ops/rms_norm.cpp) after they have validated every argument (dtypes bf16/fp32,
// shapes, last dim contiguous, y == x exactly or disjoint, all tensors on CUDA), so these trust
// them. Results are bit-identical to the CPU reference (shared DSV4_HD math, src/math/rms_norm.h;
// the FP8 q through act_quant.cuh).
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              Stream stream);

// q_out and / or q_fp8 (+ q_scale, block 128) may be undefined, not both.
void fused_qkv_rms_norm(const TensorView& q_in, const TensorView& wq, const TensorView& kv_in,
                        const TensorView& wkv, float eps, const TensorView& q_out,
                        const TensorView& kv_out, const TensorView& q_fp8, const TensorView& q_scale,
                        Stream stream);

// delta / weight / y may be undefined (see ops.h).
void residual_add_rms_norm(const TensorView& residual, const TensorView& delta,
                           const TensorView& weight, float eps, const TensorView& y,
                           Stream stream);

}  // namespace dsv4::cuda
