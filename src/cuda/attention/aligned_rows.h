// The stride rule of the attention kernels' row operands (q, out): any strides whose last dim is
// contiguous, with every row starting 16 bytes aligned, because rows move in 16-byte pieces
// (cp.async copies, vector stores, TMA boxes — a TMA descriptor's strides must be multiples of
// 16 bytes). Host-side checks, shared by the decode and prefill dispatch.
#pragma once

#include <cstdint>

#include "dsv4/status.h"
#include "dsv4/tensor.h"

namespace dsv4::cuda {

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// `t`: last dim contiguous, 16-byte aligned base, and the stride of each of its first
// `row_dims` dims a multiple of 16 bytes. A dim of size 1 is never stepped over, so its stride
// is free (torch gives size-1 dims arbitrary strides, e.g. after unsqueeze). `why` names the
// kernel's 16-byte accesses in the error.
inline void check_aligned_rows(const char* op, const char* name, const TensorView& t, int row_dims,
                               const char* why) {
  check_inner_contiguous(op, name, t);
  if (!aligned16(t.data))
    fail(op, ": ", name, ": expected a 16-byte aligned pointer (", why, "), got ", t.data);
  const int64_t elem = static_cast<int64_t>(dtype_size(t.dtype));
  for (int d = 0; d < row_dims; ++d) {
    if (t.shape[d] > 1 && (t.strides[d] * elem) % 16 != 0)
      fail(op, ": ", name, ".stride(", d, "): expected a multiple of ", 16 / elem, " elements (",
           "16 bytes: ", why, "), got ", t.strides[d]);
  }
}

// The stride to give dim `d` of `t` in a kernel parameter or TMA descriptor: its own, or for a
// dim of size 1 (never stepped over, any stride) the dense stride, so it meets the 16-byte rule.
inline int64_t effective_stride(const TensorView& t, int d) {
  if (t.shape[d] > 1) return t.strides[d];
  int64_t dense = 1;
  for (int i = d + 1; i < t.ndim; ++i) dense *= t.shape[i];
  return dense;
}

}  // namespace dsv4::cuda
