// The block-table row of each token's request, as the index kernels look it up: token_to_req [T]
// (any element stride) into block_table [R, max_blocks] (contiguous rows, any row stride).
#pragma once

#include <cstdint>

#include "dsv4/tensor.h"

namespace dsv4::cuda::index_rows {

struct RequestTable {
  const int32_t* token_to_req;
  int64_t t2r_stride;
  const int32_t* table;
  int64_t table_stride, requests, max_blocks;

  // Token t's table row, or nullptr when token_to_req[t] is outside 0..R-1 (never dereferenced).
  __device__ __forceinline__ const int32_t* row_of(int64_t t) const {
    const int32_t r = token_to_req[t * t2r_stride];
    return r >= 0 && r < requests ? table + r * table_stride : nullptr;
  }
};

inline RequestTable request_table(const TensorView& token_to_req, const TensorView& block_table) {
  return {token_to_req.ptr<const int32_t>(), token_to_req.strides[0],
          block_table.ptr<const int32_t>(), block_table.strides[0], block_table.shape[0],
          block_table.shape[1]};
}

}  // namespace dsv4::cuda::index_rows
