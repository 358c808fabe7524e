// CUDA entry points of the KV compressor (docs/spec.md §4; implemented in src/cuda/compressor/*.cu).
// Called by the front doors (src/ops/compressor_*.cpp) only after it has validated shapes, dtypes,
// strides and devices, so these trust them. Index values (positions, token_to_req,
// context_lens, block tables) are never checked on the host for CUDA tensors: the kernels treat
// an inconsistent or out-of-range value as invalid and skip what depends on it, never reading or
// writing outside the views (see include/dsv4/compressor.h).
#pragma once

#include "dsv4/compressor.h"

namespace dsv4::cuda {

// score_rows[t] += ape[positions[t] mod r]; a row with a negative position becomes NaN (the
// host cannot reject it without reading positions). After the projections on the same stream.
void compressor_add_ape(const CompressorConfig& cfg, const TensorView& ape,
                        const TensorView& positions, const TensorView& score_rows, Stream stream);

// The CUDA twin of dsv4::compressor_update_and_emit, same arguments: kernel 1 emits the entries
// (reading ring rows of earlier calls), kernel 2 then saves this call's rows into the rings.
// Throws dsv4::Error for what the kernels need beyond the host API's checks (alignment of the
// indexer key cache's fp32 scales).
void compressor_update_and_emit(const CompressorConfig& cfg, const TensorView& kv_rows,
                                const TensorView& score_rows, const CompressorBatch& batch,
                                const TensorView& norm_weight, const TensorView& cos_sin,
                                const CompressorStateView& state, const CompressorOutputView& out,
                                const TensorView& entries, Stream stream);

}  // namespace dsv4::cuda
