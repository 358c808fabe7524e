// CUDA entry points of the C4A indexer and the C128A plan (include/dsv4/indexer.h), implemented
// in src/cuda/indexer/*.cu. Called by the front doors (src/ops/indexer.cpp) only after it has
// validated shapes, dtypes, strides, devices and the workspace, so these check only what the
// kernels add (alignment, size limits). Index values are not range-checked: the kernels treat
// out-of-range values as the header of each public op says, never reading out of bounds.
#pragma once

#include "dsv4/indexer.h"

namespace dsv4::cuda {

// indexer_query's step after its projections: q_proj fp32 [T, H·128] contiguous (the workspace).
void indexer_query_rows(const TensorView& q_proj, const TensorView& positions,
                        const TensorView& cos_sin, const TensorView& q_fp8,
                        const TensorView& q_scale, const TensorView& weights, Stream stream);

// Launch shape of indexer_scores (scores.cu explains the automatic choice, 0 = automatic): tokens
// per CTA (1, 2 or 4, at most 256 / padded heads) and key tiles (64 keys) per CTA. Tests force
// every kernel instance with it; results do not depend on it.
struct ScoresTiling {
  int tokens_per_cta = 0;
  int chunk_tiles = 0;
};
void indexer_scores(const TensorView& q_fp8, const TensorView& q_scale, const TensorView& weights,
                    const TensorView& positions, const TensorView& token_to_req,
                    const IndexerKeyCacheView& keys, const TensorView& key_block_table, int ratio,
                    const TensorView& scores, Stream stream, ScoresTiling tiling = {});

void indexer_topk(const TensorView& scores, const TensorView& positions, int ratio,
                  const TensorView& indices, const TensorView& lens, Stream stream,
                  TopkOrder order);

void compressed_prefix_indices(const TensorView& positions, int ratio, const TensorView& indices,
                               const TensorView& lens, Stream stream);

}  // namespace dsv4::cuda
