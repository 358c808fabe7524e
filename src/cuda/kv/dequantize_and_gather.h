// CUDA entry point of dequantize_and_gather (src/cuda/kv/dequantize_and_gather.cu). Called by the
// public op (src/ops/gather.cpp) after it has validated dtypes, shapes, strides, devices, the
// cache geometry and offset — not the values of seq_lens / gather_lens / block_table, which live
// on the device. The kernel skips (leaves untouched) every workspace row it cannot gather
// validly: a request with seq_lens[r] < 0 or gather_lens[r] outside [0, seq_lens[r]], a row
// j >= M − offset, an entry whose table column is beyond max_blocks or whose block is −1 or
// outside the cache. Values written are bit-identical to the CPU reference (kv_decode_value).
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void dequantize_and_gather(const KvCacheView& cache, const TensorView& block_table,
                           const TensorView& seq_lens, const TensorView& gather_lens,
                           int64_t offset, const TensorView& workspace, Stream stream);

}  // namespace dsv4::cuda
