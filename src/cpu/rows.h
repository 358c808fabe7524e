// Row-wise access to float-like tensors for the CPU reference: decode a contiguous row of
// bf16 / fp16 / fp32 / fp8 values (optionally times its block scales) into fp32, encode an fp32
// row back, and walk the rows of an n-d view whose last dim is contiguous.
#pragma once

#include <array>
#include <cstdint>

#include "dsv4/dtype.h"
#include "dsv4/tensor.h"

namespace dsv4::cpu {

// fp8 e4m3 byte → float through a 256-entry table (decoding dominates dequantization loops).
const float* fp8_e4m3_table();

// out[i · out_stride] = scale · (value i of a contiguous row of n elements of type t: bf16 /
// fp16 / fp32 / fp8_e4m3). A strided destination lets the GEMM write a transposed weight tile
// while decoding, in one pass.
void load_row_scaled(const void* row, DType t, int64_t n, float scale, float* out,
                     int64_t out_stride = 1);
// out[i] = value i of the row (× 1.0f is exact, so this is a plain decode).
inline void load_row(const void* row, DType t, int64_t n, float* out) {
  load_row_scaled(row, t, n, 1.0f, out, 1);
}
// Rounds in[0..n) once to type t (bf16/fp16/fp32/fp8_e4m3) into a contiguous row.
void store_row(const float* in, DType t, int64_t n, void* row);

// A scale value: ue8m0 byte → 2^(b-127), fp32 → itself.
inline float load_scale(const void* base, DType t, int64_t i) {
  return t == DType::ue8m0 ? ue8m0_to_float(static_cast<const uint8_t*>(base)[i])
                           : static_cast<const float*>(base)[i];
}

// Index value i of an int32/int64 vector with stride `stride`.
inline int64_t load_index(const TensorView& t, int64_t i) {
  const int64_t off = i * t.strides[0];
  return t.dtype == DType::int64 ? static_cast<const int64_t*>(t.data)[off]
                                 : static_cast<int64_t>(static_cast<const int32_t*>(t.data)[off]);
}

// Sub-views without copies: t[i] (drops dim 0), and columns [c0, c1) of the last dim.
TensorView select0(const TensorView& t, int64_t i);
TensorView column_range(const TensorView& t, int64_t c0, int64_t c1);

// The rows of a view: all dims but the last, flattened in row-major order. row_offset(r) is the
// element offset of row r from t.data (any strides on the leading dims).
class RowWalker {
 public:
  explicit RowWalker(const TensorView& t);
  int64_t num_rows() const { return num_rows_; }
  int64_t row_len() const { return row_len_; }
  int64_t row_offset(int64_t r) const;
  // Byte pointer to the start of row r.
  char* row_ptr(int64_t r) const {
    return static_cast<char*>(data_) + row_offset(r) * static_cast<int64_t>(elem_bytes_);
  }

 private:
  void* data_;
  size_t elem_bytes_;
  int lead_dims_;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
  int64_t num_rows_ = 1;
  int64_t row_len_ = 1;
};

// Host data check: every v[i] (i < n) lies in [lo, hi] ("where: name[i]: expected ...").
void check_values_in_range(const char* where, const char* name, const int32_t* v, int64_t n,
                           int64_t lo, int64_t hi);

}  // namespace dsv4::cpu
