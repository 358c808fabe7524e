// CUDA entry point of dsv4::grouped_wo_a (src/ops/grouped_wo_a.cpp validates every argument,
// then calls this for CUDA tensors). The G group GEMMs z_g [T, L] = o_g [T, Dg] · wo_a[g] [L, Dg]ᵀ
// (o_g: columns g·Dg of o, z_g: columns g·L of z):
//   o, wo_a bf16 (z bf16 or fp32) or fp32 (z fp32): ONE strided-batched cuBLASLt matmul;
//   o, wo_a fp8_e4m3 with fp32 block scales in cuBLASLt's layouts (o 1 × 128, wo_a 128 × 128 per
//     group; z bf16 or fp32): one launch of the skinny decode GEMM over all G groups where
//     skinny_gemm_preferred() accepts the problem (skinny_gemm.h), else one block-scaled cuBLASLt
//     matmul per group (cuBLASLt's block-scaled modes take no batch), fanned out over streams.
// `workspace` (optional, uint8 on the device) holds the skinny kernel's split-K partial sums or
// lets cuBLASLt pick split-K algorithms.
#pragma once

#include "dsv4/ops.h"
#include "runtime/gemm_path.h"

namespace dsv4::cuda {

void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z, const TensorView& workspace,
                  Stream stream);

// The same on the kernel `choice` names (rt::grouped_wo_a_on_path, for benchmarks and tests);
// grouped_wo_a() is this with GemmPath::automatic. The skinny kernel takes FP8 operands only here
// (bf16 / fp32 groups always run the strided-batched cuBLASLt matmul; forcing skinny on them throws).
void grouped_wo_a_on_path(const rt::GemmChoice& choice, const TensorView& o, const TensorView& o_scale,
                          const TensorView& wo_a, const TensorView& wo_a_scale, const TensorView& z,
                          const TensorView& workspace, Stream stream);

}  // namespace dsv4::cuda
