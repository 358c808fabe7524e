// Block tables as the compressor kernels read them (index vectors: cuda/common/index_vector.cuh).
// Values come straight from caller memory and are never trusted: every lookup that could leave a
// view returns -1 instead.
#pragma once

#include <cstdint>

#include "cuda/common/index_vector.cuh"
#include "dsv4/tensor.h"

namespace dsv4::cuda::compressor {

// An int32 block table [rows, cols] (any strides) of a paged buffer of `num_slots` slots in
// blocks of `block_size`.
struct BlockTable {
  const int32_t* data = nullptr;
  int64_t stride0 = 0, stride1 = 0, cols = 0;
  int block_size = 1;
  int64_t num_slots = 0;

  static BlockTable of(const TensorView& table, int block_size, int64_t num_slots) {
    return {table.ptr<const int32_t>(), table.stride(0), table.stride(1), table.size(1),
            block_size, num_slots};
  }
  // Slot of entry i >= 0 of row q (q inside the table: the caller checks), or -1 when the block
  // lies beyond the table, is unmapped (< 0), or the slot falls outside the buffer.
  __device__ __forceinline__ int64_t slot(int64_t q, int64_t i) const {
    const int64_t blk = i / block_size;
    if (blk >= cols) return -1;
    const int32_t b = data[q * stride0 + blk * stride1];
    if (b < 0) return -1;
    const int64_t s = int64_t{b} * block_size + i % block_size;
    return s < num_slots ? s : -1;
  }
};

}  // namespace dsv4::cuda::compressor
