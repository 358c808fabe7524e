// CUDA entry points of the DeepSeek-V3.2 indexer's row steps (include/dsv4/sparse_mla_indexer.h),
// implemented in sparse_mla_rows.cu. Called by the front doors (src/ops/sparse_mla_indexer.cpp)
// after they have validated shapes, dtypes, strides and devices. Index values cannot be read on
// the host there: a row whose position is outside the RoPE table gets zero codes and a NaN scale
// (queries) or is not stored (keys), and a key whose slot is -1 or outside the cache is not
// stored; two keys given the same slot race (the CPU refuses them).
#pragma once

#include "dsv4/sparse_mla_indexer.h"

namespace dsv4::cuda {

void sparse_mla_indexer_quantize(const TensorView& x, const TensorView& positions,
                                 const TensorView& cos_sin, const TensorView& codes,
                                 const TensorView& scales, const TensorView& weights,
                                 Stream stream);

void sparse_mla_indexer_key_insert(const TensorView& k, const TensorView& norm_weight,
                                   const TensorView& norm_bias, float eps,
                                   const TensorView& positions, const TensorView& cos_sin,
                                   const IndexerKeyCacheView& keys, const TensorView& slot_mapping,
                                   Stream stream);

}  // namespace dsv4::cuda
