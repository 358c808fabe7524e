// Row-wise access to bf16 / fp32 tensors in device code: the CUDA counterpart of the CPU
// reference's RowWalker + load_row / store_row (src/cpu/rows.h), with the same conversions
// (dtype.h), so a kernel reads and rounds exactly what the reference does.
#pragma once

#include <cstdint>

#include "dsv4/dtype.h"
#include "dsv4/status.h"
#include "dsv4/tensor.h"

namespace dsv4::cuda {

// Element i of a bf16 / fp32 array as float.
__device__ __forceinline__ float load_float(const void* base, bool is_bf16, int64_t i) {
  return is_bf16 ? bf16_bits_to_float(static_cast<const uint16_t*>(base)[i])
                 : static_cast<const float*>(base)[i];
}
// Stores v into element i, rounded once to the array's type.
__device__ __forceinline__ void store_float(void* base, bool is_bf16, int64_t i, float v) {
  if (is_bf16) {
    static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(v);
  } else {
    static_cast<float*>(base)[i] = v;
  }
}

// The rows of a bf16 / fp32 view: all dims but the last, flattened row-major, each row
// contiguous (stride 1), the leading dims with any non-negative strides (validated by the op).
struct FloatRows {
  void* data = nullptr;
  bool is_bf16 = false;
  int lead_dims = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  int64_t num_rows = 1;
  int64_t row_len = 1;

  static FloatRows of(const TensorView& t) {
    DSV4_CHECK(t.dtype == DType::bf16 || t.dtype == DType::fp32,
               "FloatRows: expected a bf16 or fp32 view, got ", dtype_name(t.dtype));
    DSV4_CHECK(t.ndim >= 1 && t.strides[t.ndim - 1] == 1,
               "FloatRows: expected a view with a contiguous last dim, got ", t.shape_str());
    FloatRows r;
    r.data = t.data;
    r.is_bf16 = t.dtype == DType::bf16;
    r.lead_dims = t.ndim - 1;
    for (int d = 0; d < r.lead_dims; ++d) {
      r.shape[d] = t.shape[d];
      r.strides[d] = t.strides[d];
      r.num_rows *= t.shape[d];
    }
    r.row_len = t.shape[t.ndim - 1];
    return r;
  }

  // Element offset of row r from data (row-major over the leading dims, any strides).
  __device__ __forceinline__ int64_t row_offset(int64_t r) const {
    int64_t off = 0;
    for (int d = lead_dims - 1; d >= 0; --d) {
      off += (r % shape[d]) * strides[d];
      r /= shape[d];
    }
    return off;
  }
  __device__ __forceinline__ float load(int64_t row_off, int64_t i) const {
    return load_float(data, is_bf16, row_off + i);
  }
  __device__ __forceinline__ void store(int64_t row_off, int64_t i, float v) const {
    store_float(data, is_bf16, row_off + i, v);
  }
};

}  // namespace dsv4::cuda
