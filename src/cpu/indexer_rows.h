// The per-row part of the CPU indexer_query, after the two projections: exposed so the GPU tests
// can feed the CPU reference and the CUDA kernel (cuda::indexer_query_rows) the very same
// projected rows and compare codes bit for bit (the projections themselves may sum in another
// order on the two backends).
#pragma once

#include "dsv4/ops.h"  // Stream
#include "dsv4/tensor.h"

namespace dsv4::cpu {

// q fp32 contiguous, T·H·128 values ([T, H, 128], or [T, H·128] as the projection writes it),
// overwritten (RoPE on the last R dims at positions[t], Hadamard);
// q_fp8 [T, H, 128] / q_scale [T, H] receive the FP8 codes and power-of-two scales; weights
// [T, H] fp32 holds x·weights_projᵀ and is scaled in place by 128^-0.5 · H^-0.5. Arguments as
// validated by indexer_query (positions in [0, cos_sin.shape[0])). The step of indexer_query
// after its projections on the CPU backend.
void indexer_query_rows(const TensorView& q, const TensorView& positions,
                        const TensorView& cos_sin, const TensorView& q_fp8,
                        const TensorView& q_scale, const TensorView& weights,
                        Stream stream = nullptr);

}  // namespace dsv4::cpu
