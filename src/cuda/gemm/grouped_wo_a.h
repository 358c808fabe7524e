// CUDA entry point of dsv4::grouped_wo_a (src/ops/grouped_wo_a.cpp validates every argument,
// then calls this for CUDA tensors). The G group GEMMs z_g [T, L] = o_g [T, Dg] · wo_a[g] [L, Dg]ᵀ
// (o_g: columns g·Dg of o, z_g: columns g·L of z):
//   o, wo_a bf16 (z bf16 or fp32) or fp32 (z fp32): ONE strided-batched cuBLASLt matmul;
//   o, wo_a fp8_e4m3 with fp32 block scales in cuBLASLt's layouts (o 1 × 128, wo_a 128 × 128 per
//     group; z bf16 or fp32): one block-scaled matmul per group, in group order on `stream`
//     (cuBLASLt's block-scaled modes take no batch).
// `workspace` (optional, uint8 on the device) lets cuBLASLt pick split-K algorithms.
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void grouped_wo_a(const TensorView& o, const TensorView& o_scale, const TensorView& wo_a,
                  const TensorView& wo_a_scale, const TensorView& z, const TensorView& workspace,
                  Stream stream);

}  // namespace dsv4::cuda
