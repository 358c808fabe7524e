#include "cpu/rows.h"

namespace dsv4::cpu {

namespace {
struct Fp8Table {
  float v[256];
  Fp8Table() {
    for (int b = 0; b < 256; ++b) v[b] = fp8_e4m3_to_float(static_cast<uint8_t>(b));
  }
};
}  // namespace

const float* fp8_e4m3_table() {
  static const Fp8Table table;
  return table.v;
}

namespace {
// out[i · stride] = decode(i) · scale; the contiguous case is its own loop so it vectorizes.
template <typename Decode>
void emit_scaled(int64_t n, float scale, float* out, int64_t stride, Decode decode) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = decode(i) * scale;
  } else {
    for (int64_t i = 0; i < n; ++i) out[i * stride] = decode(i) * scale;
  }
}
}  // namespace

void load_row_scaled(const void* row, DType t, int64_t n, float scale, float* out,
                     int64_t out_stride) {
  switch (t) {
    case DType::fp32: {
      const float* p = static_cast<const float*>(row);
      emit_scaled(n, scale, out, out_stride, [p](int64_t i) { return p[i]; });
      return;
    }
    case DType::bf16: {
      const uint16_t* p = static_cast<const uint16_t*>(row);
      emit_scaled(n, scale, out, out_stride, [p](int64_t i) { return bf16_bits_to_float(p[i]); });
      return;
    }
    case DType::fp8_e4m3: {
      const uint8_t* p = static_cast<const uint8_t*>(row);
      const float* table = fp8_e4m3_table();
      emit_scaled(n, scale, out, out_stride, [p, table](int64_t i) { return table[p[i]]; });
      return;
    }
    default:
      emit_scaled(n, scale, out, out_stride, [row, t](int64_t i) { return load_as_float(row, t, i); });
      return;
  }
}

void store_row(const float* in, DType t, int64_t n, void* row) {
  switch (t) {
    case DType::fp32: {
      float* p = static_cast<float*>(row);
      for (int64_t i = 0; i < n; ++i) p[i] = in[i];
      return;
    }
    case DType::bf16: {
      uint16_t* p = static_cast<uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_bf16_bits(in[i]);
      return;
    }
    default:
      for (int64_t i = 0; i < n; ++i) store_from_float(row, t, i, in[i]);
      return;
  }
}

TensorView select0(const TensorView& t, int64_t i) {
  TensorView v;
  v.data = static_cast<char*>(t.data) + i * t.strides[0] * static_cast<int64_t>(dtype_size(t.dtype));
  v.dtype = t.dtype;
  v.device = t.device;
  v.ndim = t.ndim - 1;
  for (int d = 1; d < t.ndim; ++d) {
    v.shape[d - 1] = t.shape[d];
    v.strides[d - 1] = t.strides[d];
  }
  return v;
}

TensorView column_range(const TensorView& t, int64_t c0, int64_t c1) {
  TensorView v = t;
  v.data = static_cast<char*>(t.data) +
           c0 * t.strides[t.ndim - 1] * static_cast<int64_t>(dtype_size(t.dtype));
  v.shape[t.ndim - 1] = c1 - c0;
  return v;
}

RowWalker::RowWalker(const TensorView& t)
    : data_(t.data), elem_bytes_(dtype_size(t.dtype)), lead_dims_(t.ndim > 0 ? t.ndim - 1 : 0) {
  for (int d = 0; d < lead_dims_; ++d) {
    shape_[d] = t.shape[d];
    strides_[d] = t.strides[d];
    num_rows_ *= t.shape[d];
  }
  row_len_ = t.ndim > 0 ? t.shape[t.ndim - 1] : 1;
}

int64_t RowWalker::row_offset(int64_t r) const {
  int64_t off = 0;
  for (int d = lead_dims_ - 1; d >= 0; --d) {
    off += (r % shape_[d]) * strides_[d];
    r /= shape_[d];
  }
  return off;
}

void check_values_in_range(const char* where, const char* name, const int32_t* v, int64_t n,
                           int64_t lo, int64_t hi) {
  for (int64_t i = 0; i < n; ++i)
    if (v[i] < lo || v[i] > hi)
      fail_expected(where, detail::concat(name, "[", i, "]"),
                    detail::concat("a value in [", lo, ", ", hi, "]"), v[i]);
}

}  // namespace dsv4::cpu
