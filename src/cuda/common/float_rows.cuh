// Row-wise access to bf16 / fp32 tensors in device code: the CUDA counterpart of the CPU
// reference's RowWalker + load_row / store_row (src/cpu/rows.h), with the same conversions
// (dtype.h), so a kernel reads and rounds exactly what the reference does.
#pragma once

#include <cstdint>

#include "cuda/common/fp8_convert.cuh"
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
// Kernels that stream rows at bandwidth access them in chunks of kChunk = 8 consecutive elements
// (the RMSNorm order of src/math/rms_norm.h is built on the same chunks).
struct FloatRows {
  static constexpr int kChunk = 8;

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

  // Whether every row starts 16-byte aligned (data and every leading stride), so that a chunk of
  // kChunk elements starting at a multiple of kChunk is one 16-byte access (two for fp32).
  bool rows_aligned16() const {
    const int64_t elem = is_bf16 ? 2 : 4;
    if (reinterpret_cast<uintptr_t>(data) % 16 != 0) return false;
    for (int d = 0; d < lead_dims; ++d)
      if ((strides[d] * elem) % 16 != 0) return false;
    return true;
  }

  // Elements [i, i + kChunk) of a row (i a multiple of kChunk) as floats; those at or past n read
  // as 0. kVector (rows_aligned16()): a whole chunk is loaded with 16-byte accesses.
  template <bool kVector>
  __device__ __forceinline__ void load_chunk(int64_t row_off, int64_t i, int64_t n, float v[kChunk]) const {
    if (kVector && i + kChunk <= n) {
      if (is_bf16) {
        const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(data) + row_off + i);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          v[2 * k] = bf16_bits_to_float(static_cast<uint16_t>(w[k] & 0xffffu));
          v[2 * k + 1] = bf16_bits_to_float(static_cast<uint16_t>(w[k] >> 16));
        }
      } else {
        const float4* f = reinterpret_cast<const float4*>(static_cast<const float*>(data) + row_off + i);
        const float4 a = f[0], b = f[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      }
      return;
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) v[k] = i + k < n ? load(row_off, i + k) : 0.0f;
  }

  // Stores elements [i, min(i + kChunk, n)) of a row, each rounded once to the row's type.
  template <bool kVector>
  __device__ __forceinline__ void store_chunk(int64_t row_off, int64_t i, int64_t n, const float v[kChunk]) const {
    if (kVector && i + kChunk <= n) {
      if (is_bf16) {
        // Hardware conversions, float_to_bf16_bits's bytes (fp8_convert.cuh, pack_bf16x8).
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(data) + row_off + i) = pack_bf16x8(v);
      } else {
        float4* f = reinterpret_cast<float4*>(static_cast<float*>(data) + row_off + i);
        f[0] = make_float4(v[0], v[1], v[2], v[3]);
        f[1] = make_float4(v[4], v[5], v[6], v[7]);
      }
      return;
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k)
      if (i + k < n) store(row_off, i + k, v[k]);
  }
};

}  // namespace dsv4::cuda
