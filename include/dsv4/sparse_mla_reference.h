// The unbatched float64 reference of one DeepSeek-V3.2 sparse-MLA layer (sparse_mla_layer.h): a
// second, deliberately plain implementation for `dsv4 run --check` and the layer tests.
//
// ONE request's tokens at positions 0..L-1, in double precision straight from the formulas: the
// un-absorbed reading where it costs nothing (per head, logits q_nope·W_UK·latent + q_pe·k_pe over
// the selected tokens; the output latent·W_UVᵀ), no caches, no padding, no split-KV. Like the V4
// reference (reference.h) it rounds only where the production path stores a narrower format:
// bf16 projection outputs (q_lora, the latent + k_pe row, q, the absorbed q, the latent and W_UV
// outputs), the V32_FP8 cache (latent FP8 e4m3 in blocks of 128 with UE8M0 scales, k_pe bf16),
// the indexer's FP8 q / key rows (one power-of-two scale per 128 values), and with the options
// the FP8 (UE8M0, 1x128) inputs of FP8-weight projections. The indexer scores in double, so
// its top-k can differ from the batched layer's only between near-tied tokens.
#pragma once

#include <vector>

#include "dsv4/config.h"
#include "dsv4/reference.h"
#include "dsv4/sparse_mla_weights.h"

namespace dsv4 {

// x: [L, dim] row-major; returns y [L, dim].
std::vector<double> reference_sparse_mla_layer(const ModelConfig& cfg, const SparseMlaWeights& w,
                                               const std::vector<double>& x,
                                               const ReferenceOptions& opts = {});

}  // namespace dsv4
