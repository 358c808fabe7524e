#include "ops/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsv4/checked_math.h"
#include "dsv4/dtype.h"

namespace dsv4::ops {

void check_fp8_query_scale(const char* where, float q_scale) {
  if (!(q_scale > 0.0f) || !std::isfinite(q_scale))
    fail_expected(where, "q_scale", "a finite value > 0", q_scale);
  if (!std::isfinite(round_bf16(ieee_mul(kFp8Max, q_scale))))
    fail_expected(where, "q_scale", "a value whose largest query, bf16(448 * q_scale), is finite",
                  q_scale);
}

void check_dtype_in(const char* where, const char* name, const TensorView& t,
                    std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype == d) return;
  std::string expected;
  for (DType d : allowed) expected += (expected.empty() ? "" : " or ") + std::string(dtype_name(d));
  fail_expected(where, std::string(name) + ".dtype", expected, dtype_name(t.dtype));
}

void check_nonnegative_strides(const char* where, const char* name, const TensorView& t) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.strides[d] < 0)
      fail_expected(where, std::string(name) + ".stride(" + std::to_string(d) + ")",
                    "a non-negative stride", t.strides[d]);
}

void check_row_strided(const char* where, const char* name, const TensorView& t) {
  check_inner_contiguous(where, name, t);
  check_nonnegative_strides(where, name, t);
}

void check_output_layout(const char* where, const char* name, const TensorView& t) {
  check_inner_contiguous(where, name, t);
  check_distinct_elements(where, name, t);
}

void check_distinct_elements(const char* where, const char* name, const TensorView& t) {
  check_nonnegative_strides(where, name, t);
  if (t.numel() == 0) return;  // no elements: nothing to overlap, whatever the strides say
  // Dims of size > 1 by increasing stride: each stride must step past everything spanned by the
  // dims inside it (the standard sufficient condition for non-overlapping elements).
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] > 1) dims.emplace_back(t.strides[d], t.shape[d]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements covered by the dims processed so far
  for (const auto& [stride, size] : dims) {
    if (stride < span)
      fail(where, ": ", name, ": expected an output whose elements do not overlap, got shape ",
           t.shape_str(), " with a stride of ", stride, " (< ", span, ")");
    const auto next = add_i64(mul_i64(stride, size - 1).value_or(INT64_MAX), span);
    if (!next || *next == INT64_MAX)
      fail(where, ": ", name, ": expected a view whose extent fits int64, got shape ",
           t.shape_str());
    span = *next;
  }
}

namespace {
// [first byte, one past the last byte] spanned by a view with non-negative strides, as
// addresses. A view whose extent overflows (it cannot describe real memory) spans everything
// from its base, so it is never taken for disjoint.
struct ByteRange {
  uintptr_t begin;
  uintptr_t end;
  bool empty;
};
ByteRange byte_range(const TensorView& t) {
  std::optional<int64_t> last = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] == 0) return {0, 0, true};
    if (last) last = add_i64(*last, mul_i64(t.shape[d] - 1, t.strides[d]).value_or(INT64_MAX));
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  const auto bytes = last ? add_i64(*last, 1) : std::nullopt;
  const auto extent = bytes ? mul_i64(*bytes, static_cast<int64_t>(dtype_size(t.dtype)))
                            : std::nullopt;
  if (!extent || *extent < 0 || static_cast<uintptr_t>(*extent) > UINTPTR_MAX - base)
    return {base, UINTPTR_MAX, false};
  return {base, base + static_cast<uintptr_t>(*extent), false};
}
bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.strides[d] != b.strides[d])) return false;
  return true;
}
// A view as equally spaced rows: `rows` rows of `row_bytes` bytes, `stride_bytes` apart. Views
// whose leading dims collapse to one stride qualify (e.g. a column range of a matrix).
struct UniformRows {
  int64_t rows;
  int64_t row_bytes;
  int64_t stride_bytes;
};
bool uniform_rows(const TensorView& t, UniformRows& out) {
  if (t.ndim < 2) return false;
  const int64_t elem = static_cast<int64_t>(dtype_size(t.dtype));
  int64_t rows = 1;
  for (int d = 0; d + 1 < t.ndim; ++d) {
    const auto r = mul_i64(rows, t.shape[d]);
    if (!r) return false;
    rows = *r;
    if (d + 2 < t.ndim && t.shape[d] > 1 &&
        mul_i64(t.shape[d + 1], t.strides[d + 1]) != std::optional<int64_t>(t.strides[d]))
      return false;
  }
  const auto row_bytes = mul_i64(t.shape[t.ndim - 1], elem);
  const auto stride_bytes = mul_i64(t.strides[t.ndim - 2], elem);
  if (!row_bytes || !stride_bytes) return false;
  out = {rows, *row_bytes, *stride_bytes};
  return out.stride_bytes > 0 && out.row_bytes <= out.stride_bytes;
}

// Whether two views may share a byte: their byte ranges intersect and, when both are uniform
// rows with the same stride, their column windows (offsets modulo the stride) intersect too.
bool may_overlap(const TensorView& a, const TensorView& b) {
  if (!a.defined() || !b.defined()) return false;
  const ByteRange ra = byte_range(a), rb = byte_range(b);
  if (ra.empty || rb.empty) return false;
  if (!(ra.begin < rb.end && rb.begin < ra.end)) return false;
  UniformRows ua{}, ub{};
  if (!uniform_rows(a, ua) || !uniform_rows(b, ub) || ua.stride_bytes != ub.stride_bytes)
    return true;
  const int64_t s = ua.stride_bytes;
  // a's window start relative to b's, modulo the common row stride.
  const uintptr_t delta = ra.begin >= rb.begin ? ra.begin - rb.begin : rb.begin - ra.begin;
  const int64_t rem = static_cast<int64_t>(delta % static_cast<uintptr_t>(s));
  const int64_t oa = ra.begin >= rb.begin ? rem : (s - rem) % s;
  // b covers [0, ub.row_bytes), a covers [oa, oa + ua.row_bytes) modulo s.
  return oa < ub.row_bytes || oa + ua.row_bytes > s;
}
}  // namespace

void check_alias_exact_or_disjoint(const char* where, const char* out_name, const TensorView& out,
                                   const char* in_name, const TensorView& in) {
  if (same_view(out, in)) return;
  if (may_overlap(out, in))
    fail(where, ": ", out_name, ": expected the same view as ", in_name,
         " (in place) or memory disjoint from it, got overlapping memory ranges");
}

void check_disjoint(const char* where, const char* out_name, const TensorView& out,
                    const char* in_name, const TensorView& in) {
  if (may_overlap(out, in))
    fail(where, ": ", out_name, ": expected memory disjoint from ", in_name,
         ", got overlapping memory ranges");
}

void check_outputs_disjoint(const char* where, std::initializer_list<NamedView> outputs,
                            std::initializer_list<NamedView> inputs) {
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    for (auto other = outputs.begin(); other != out; ++other)
      check_disjoint(where, out->name, out->view, other->name, other->view);
    for (const NamedView& in : inputs) check_disjoint(where, out->name, out->view, in.name, in.view);
  }
}

int64_t check_activation_scale(const char* where, const char* x_name, const TensorView& x,
                               const char* scale_name, const TensorView& scale) {
  if (x.dtype != DType::fp8_e4m3) {
    if (scale.defined())
      fail(where, ": ", scale_name, ": expected an empty view (", x_name, " is ",
           dtype_name(x.dtype), ", not fp8_e4m3), got a tensor");
    return 0;
  }
  check_defined(where, scale_name, scale);
  check_dtype_in(where, scale_name, scale, {DType::ue8m0, DType::fp32});
  check_ndim(where, scale_name, scale, 2);
  check_dim(where, scale_name, scale, 0, x.shape[0]);
  check_nonnegative_strides(where, scale_name, scale);  // any layout: the CUDA GEMMs take [blocks, rows] transposed
  const int64_t cols = x.shape[1], blocks = scale.shape[1];
  for (int64_t block : {int64_t{128}, int64_t{64}})
    if (cols % block == 0 && blocks * block == cols) return block;
  fail_expected(where, std::string(scale_name) + ".shape[1]",
                std::string(x_name) + ".shape[1] / 128 or / 64 = " + std::to_string(cols / 128.0) +
                    " or " + std::to_string(cols / 64.0),
                blocks);
}

void check_weight_scale(const char* where, const char* w_name, const TensorView& w,
                        const char* scale_name, const TensorView& scale,
                        std::initializer_list<int64_t> expected_shape) {
  if (w.dtype != DType::fp8_e4m3) {
    if (scale.defined())
      fail(where, ": ", scale_name, ": expected an empty view (", w_name, " is ",
           dtype_name(w.dtype), ", not fp8_e4m3), got a tensor");
    return;
  }
  check_defined(where, scale_name, scale);
  check_dtype_in(where, scale_name, scale, {DType::ue8m0, DType::fp32});
  check_shape(where, scale_name, scale, expected_shape);
  check_row_strided(where, scale_name, scale);
}

void check_index_vector(const char* where, const char* name, const TensorView& t,
                        int64_t expected_len) {
  check_defined(where, name, t);
  check_dtype_in(where, name, t, {DType::int64, DType::int32});
  check_ndim(where, name, t, 1);
  check_dim(where, name, t, 0, expected_len);
  check_row_strided(where, name, t);
}

int64_t check_rope_table(const char* where, const TensorView& cos_sin, int64_t head_dim) {
  check_defined(where, "cos_sin", cos_sin);
  check_dtype(where, "cos_sin", cos_sin, DType::fp32);
  check_ndim(where, "cos_sin", cos_sin, 2);
  check_row_strided(where, "cos_sin", cos_sin);
  const int64_t R = cos_sin.shape[1];
  if (R < 2 || R % 2 != 0 || R > head_dim)
    fail_expected(where, "cos_sin.shape[1] (rope dims R)",
                  "an even value in [2, head dim = " + std::to_string(head_dim) + "]", R);
  return R;
}


void check_act_quant_outputs(const char* where, const char* xq_name, const TensorView& xq,
                             const char* scale_name, const TensorView& scale, int64_t rows,
                             int64_t cols, int block) {
  check_defined(where, xq_name, xq);
  check_defined(where, scale_name, scale);
  if (block != 64 && block != 128) fail_expected(where, "block", "64 or 128", block);
  if (cols % block != 0)
    fail_expected(where, std::string(xq_name) + ".shape[1]",
                  "a multiple of block = " + std::to_string(block), cols);
  check_dtype(where, xq_name, xq, DType::fp8_e4m3);
  check_dtype_in(where, scale_name, scale, {DType::ue8m0, DType::fp32});
  check_shape(where, xq_name, xq, {rows, cols});
  check_shape(where, scale_name, scale, {rows, cols / block});
  check_output_layout(where, xq_name, xq);
  check_distinct_elements(where, scale_name, scale);
  check_disjoint(where, scale_name, scale, xq_name, xq);
}

}  // namespace dsv4::ops
