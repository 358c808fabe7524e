// CUDA entry points of the index planning utilities (include/dsv4/indexing.h), implemented in
// src/cuda/index/*.cu. Called by the public functions (src/ops/indexing.cpp) only after they
// validated shapes, dtypes, row contiguity and devices, so these trust all of that. Index values
// are never trusted: what the CPU version rejects, the kernels treat as invalid (-1), as
// documented per function in indexing.h. Asynchronous on `stream`; T = 0 launches nothing.
#pragma once

#include <cstdint>

#include "dsv4/ops.h"  // Stream
#include "dsv4/tensor.h"

namespace dsv4::cuda {

void local_to_global_slots(const TensorView& local, const TensorView& token_to_req,
                           const TensorView& block_table, int block_size,
                           const TensorView& global, const TensorView& lens, Stream stream);

void swa_window_indices(const TensorView& positions, const TensorView& token_to_req,
                        const TensorView& block_table, int block_size, int window,
                        const TensorView& indices, const TensorView& lens, Stream stream);

void combine_topk_swa_indices(const TensorView& topk, const TensorView& query_start_loc,
                              const TensorView& seq_lens, const TensorView& gather_lens,
                              int window, int compressed_region, int64_t rows_per_request,
                              int ratio, const TensorView& out, const TensorView& out_lens,
                              Stream stream);

}  // namespace dsv4::cuda
