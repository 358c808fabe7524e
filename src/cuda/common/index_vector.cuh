// A 1-d int32 or int64 index tensor (positions, token_to_req, slot mappings, context lengths) as
// a kernel parameter: the public ops accept either dtype and any non-negative stride.
#pragma once

#include <cstdint>

#include "dsv4/tensor.h"

namespace dsv4::cuda {

struct IndexVector {
  const void* data = nullptr;
  int64_t stride = 1;  // in elements
  bool is_int64 = false;

  static IndexVector of(const TensorView& t) {
    return IndexVector{t.data, t.ndim > 0 ? t.stride(0) : 1, t.dtype == DType::int64};
  }
  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return is_int64 ? static_cast<const int64_t*>(data)[i * stride]
                    : static_cast<int64_t>(static_cast<const int32_t*>(data)[i * stride]);
  }
};

}  // namespace dsv4::cuda
