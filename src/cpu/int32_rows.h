// Element access to the int32 index tensors of the planning utilities (rows contiguous, as their
// validation requires), for the CPU kernels and the host data checks.
#pragma once

#include <cstdint>

#include "dsv4/tensor.h"

namespace dsv4::cpu {

// Row r of a 2-d int32 tensor; element i of a 1-d one.
inline const int32_t* row_of(const TensorView& t, int64_t r) {
  return t.ptr<const int32_t>() + r * t.strides[0];
}
inline int32_t elem1(const TensorView& t, int64_t i) { return t.ptr<const int32_t>()[i * t.strides[0]]; }
inline int32_t* mut_row(const TensorView& t, int64_t r) { return t.ptr<int32_t>() + r * t.strides[0]; }

}  // namespace dsv4::cpu
