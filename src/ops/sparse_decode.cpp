// sparse_decode: split-KV sparse attention of decode queries straight over the paged FP8 (or
// BF16) caches through two index scopes (docs/spec.md §6), and its shape-only split planner.
// The front door: validation (with the host data checks when the indices live on the host),
// then the backend.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "cpu/rows.h"
#include "dsv4/checked_math.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#include "ops/attention_checks.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {

constexpr const char* kOp = "sparse_decode";

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of the partials for these shapes: partial_o [b, s_q, H, splits, d_v] then partial_lse
// [b, s_q, H, splits], both fp32; throws (naming `where`) when the size does not fit int64.
int64_t checked_workspace_bytes(const char* where, int64_t rows, int64_t h, int64_t splits,
                                int64_t d_v) {
  const char* what = "workspace bytes (b * s_q * h * num_splits * (d_v + 1) * 4)";
  int64_t n = checked_mul(where, what, rows, h);
  n = checked_mul(where, what, n, splits);
  n = checked_mul(where, what, n, checked_add(where, what, d_v, 1));
  return checked_mul(where, what, n, static_cast<int64_t>(sizeof(float)));
}

struct DecodeDims {
  int64_t b, s_q, h, d_qk, topk, extra_topk;
  float scale;
  Device device;
};

// Data-dependent checks (a pass over host memory, CPU only): lengths in [0, topk], and every
// counted index -1 or a slot of its cache.
void check_scope_indices(const char* indices_name, const char* length_name,
                         const TensorView& indices, const TensorView& topk_length,
                         int64_t num_slots) {
  const int64_t b = indices.shape[0], s_q = indices.shape[1], topk = indices.shape[2];
  if (topk_length.defined())
    cpu::check_values_in_range(kOp, length_name, topk_length.ptr<const int32_t>(), b, 0, topk);
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t counted = topk_length.defined() ? topk_length.ptr<const int32_t>()[bi] : topk;
    for (int64_t si = 0; si < s_q; ++si) {
      const int32_t* idx =
          indices.ptr<const int32_t>() + bi * indices.strides[0] + si * indices.strides[1];
      for (int64_t k = 0; k < counted; ++k) {
        const int32_t slot = idx[k];
        if (slot != -1 && (slot < 0 || slot >= num_slots))
          fail_expected(kOp,
                        detail::concat(indices_name, "[", bi, "][", si, "][", k, "]"),
                        detail::concat("-1 or a slot in [0, ", num_slots, ")"), slot);
      }
    }
  }
}

// q_scale: an FP8 q's dequantization scale (ops::check_fp8_query_scale); a bf16 q has none, so
// only 1.
void check_query_scale(const TensorView& q, float q_scale) {
  if (q.dtype == DType::bf16) {
    if (q_scale != 1.0f) fail_expected(kOp, "q_scale", "1 for a bf16 q (the scale of an FP8 q)", q_scale);
    return;
  }
  ops::check_fp8_query_scale(kOp, q_scale);
}

// The one validation of sparse_decode's arguments, shared by both backends.
DecodeDims validate_decode(const SparseDecodeArgs& a, const DecodeSchedule& schedule,
                           const TensorView& workspace) {
  check_defined(kOp, "q", a.q);
  check_ndim(kOp, "q", a.q, 4);
  DecodeDims dims{};
  dims.device = a.q.device;
  dims.b = a.q.shape[0];
  dims.s_q = a.q.shape[1];
  dims.h = a.q.shape[2];
  dims.d_qk = a.q.shape[3];
  const int64_t b = dims.b, s_q = dims.s_q, h = dims.h, d_qk = dims.d_qk;
  ops::check_dtype_in(kOp, "q", a.q, {DType::bf16, DType::fp8_e4m3});
  ops::check_tensor(kOp, "q", a.q, a.q.dtype, {-1, -1, -1, -1}, dims.device,
                    ops::Dense::last_dim);
  if (h < 1) fail_expected(kOp, "q.shape[2] (heads)", ">= 1", h);

  const int cache_dim = ops::check_cache(kOp, "k_cache", a.k_cache, dims.device);
  if (d_qk != cache_dim)
    fail_expected(kOp, "q.shape[3] (d_qk)",
                  detail::concat(cache_dim, " (the dim of k_cache's layout ",
                                 kv_layout_name(a.k_cache.layout), ")"),
                  d_qk);
  if (a.d_v < 1 || a.d_v > d_qk)
    fail_expected(kOp, "d_v", detail::concat("a value in [1, ", d_qk, "]"), a.d_v);

  ops::check_tensor(kOp, "indices", a.indices, DType::int32, {b, s_q, -1}, dims.device,
                    ops::Dense::last_dim);
  dims.topk = a.indices.shape[2];
  if (dims.topk < 1) fail_expected(kOp, "indices.shape[2] (topk)", ">= 1", dims.topk);
  ops::check_optional_tensor(kOp, "topk_length", a.topk_length, DType::int32, {b}, dims.device);

  const bool has_extra = a.extra_k_cache.data.defined();
  if (has_extra) {
    ops::check_cache(kOp, "extra_k_cache", a.extra_k_cache, dims.device);
    if (a.extra_k_cache.layout != a.k_cache.layout)
      fail_expected(kOp, "extra_k_cache.layout", kv_layout_name(a.k_cache.layout),
                    kv_layout_name(a.extra_k_cache.layout));
    ops::check_tensor(kOp, "extra_indices", a.extra_indices, DType::int32, {b, s_q, -1},
                      dims.device, ops::Dense::last_dim);
    dims.extra_topk = a.extra_indices.shape[2];
    if (dims.extra_topk < 1)
      fail_expected(kOp, "extra_indices.shape[2] (extra_topk)", ">= 1", dims.extra_topk);
    ops::check_optional_tensor(kOp, "extra_topk_length", a.extra_topk_length, DType::int32, {b},
                               dims.device);
  } else {
    if (a.extra_indices.defined() || a.extra_topk_length.defined())
      fail(kOp, ": extra_indices / extra_topk_length: expected none without extra_k_cache, got ",
           "a tensor");
    dims.extra_topk = 0;
  }

  ops::check_optional_tensor(kOp, "attn_sink", a.attn_sink, DType::fp32, {h}, dims.device);
  dims.scale = ops::resolve_softmax_scale(kOp, a.softmax_scale, d_qk);
  check_query_scale(a.q, a.q_scale);
  ops::check_output_tensor(kOp, "out", a.out, DType::bf16, {b, s_q, h, a.d_v}, dims.device,
                           ops::Dense::last_dim);
  ops::check_output_tensor(kOp, "lse", a.lse, DType::fp32, {b, s_q, h}, dims.device,
                           ops::Dense::last_dim);

  const int64_t topk_total = dims.topk + dims.extra_topk;
  if (schedule.num_splits < 1)
    fail_expected(kOp, "schedule.num_splits", ">= 1", schedule.num_splits);
  if (schedule.split_len < kDecodeTile || schedule.split_len % kDecodeTile != 0)
    fail_expected(kOp, "schedule.split_len", detail::concat("a positive multiple of ", kDecodeTile),
                  schedule.split_len);
  if (int64_t{schedule.num_splits} * schedule.split_len < topk_total)
    fail_expected(kOp, "schedule (num_splits * split_len)",
                  detail::concat(">= ", topk_total, " (topk + extra_topk)"),
                  int64_t{schedule.num_splits} * schedule.split_len);
  const int64_t need = checked_workspace_bytes(kOp, checked_mul(kOp, "b * s_q", b, s_q), h,
                                              schedule.num_splits, a.d_v);
  ops::check_tensor(kOp, "workspace", workspace, DType::uint8, {-1}, dims.device);
  if (workspace.numel() < need)
    fail_expected(kOp, "workspace bytes", detail::concat(">= ", need), workspace.numel());
  if (reinterpret_cast<uintptr_t>(workspace.data) % 16 != 0)
    fail(kOp, ": workspace: expected a 16-byte aligned pointer, got ", workspace.data);
  // The split partials in workspace are written and read back while out / lse are written.
  ops::check_outputs_disjoint(
      kOp, {{"out", a.out}, {"lse", a.lse}, {"workspace", workspace}},
      {{"q", a.q}, {"k_cache.data", a.k_cache.data}, {"indices", a.indices},
       {"topk_length", a.topk_length}, {"extra_k_cache.data", a.extra_k_cache.data},
       {"extra_indices", a.extra_indices}, {"extra_topk_length", a.extra_topk_length},
       {"attn_sink", a.attn_sink}});

  if (dims.device == Device::cpu) {
    check_scope_indices("indices", "topk_length", a.indices, a.topk_length,
                        a.k_cache.num_slots());
    if (has_extra)
      check_scope_indices("extra_indices", "extra_topk_length", a.extra_indices,
                          a.extra_topk_length, a.extra_k_cache.num_slots());
  }
  return dims;
}

}  // namespace

DecodeSchedule make_decode_schedule(int b, int s_q, int h, int topk_total, int num_sms, int d_v) {
  constexpr const char* kWhere = "make_decode_schedule";
  if (b < 0) fail_expected(kWhere, "b", ">= 0", b);
  if (s_q < 1) fail_expected(kWhere, "s_q", ">= 1", s_q);
  if (h < 1) fail_expected(kWhere, "h", ">= 1", h);
  if (topk_total < 0) fail_expected(kWhere, "topk_total", ">= 0", topk_total);
  if (num_sms < 1) fail_expected(kWhere, "num_sms", ">= 1", num_sms);
  if (d_v < 1) fail_expected(kWhere, "d_v", ">= 1", d_v);

  // A kernel CTA handles one (b, s_q) row, one 64-head group and one split of the index list.
  // Cost model (measured on H100 by the decode kernel's author, docs/notes/decode.md): a CTA
  // takes one fixed tile-time plus one per KV tile, CTAs run in waves of num_sms, and splitting
  // adds a combine pass. Pick the split count with the lowest cost (ties: fewer splits), never
  // more splits than tiles.
  const int64_t tiles = std::max<int64_t>(1, ceil_div(topk_total, kDecodeTile));
  // (In double: b * s_q * heads groups may exceed int64; the cost only ranks split counts.)
  const double ctas_per_split =
      std::max(1.0, static_cast<double>(b) * s_q * static_cast<double>(ceil_div(h, 64)));
  // split_len is an int: with topk_total near INT_MAX, one split's whole tiles would not fit it.
  const int64_t min_splits = ceil_div(tiles, INT_MAX / kDecodeTile);
  int64_t wanted = min_splits;
  double best_cost = 1e300;
  for (int64_t splits = min_splits; splits <= std::max<int64_t>(min_splits, std::min<int64_t>(tiles, 64));
       ++splits) {
    const int64_t per_split = ceil_div(tiles, splits);
    const double waves = std::ceil(ctas_per_split * static_cast<double>(splits) / num_sms);
    const double cost = waves * (per_split + 1.0) + (splits > 1 ? 0.5 : 0.0);
    if (cost < best_cost - 1e-9) {
      best_cost = cost;
      wanted = splits;
    }
  }
  const int64_t tiles_per_split = ceil_div(tiles, wanted);

  DecodeSchedule s;
  s.split_len = static_cast<int>(tiles_per_split * kDecodeTile);  // <= INT_MAX: see min_splits
  s.num_splits = static_cast<int>(ceil_div(tiles, tiles_per_split));  // no empty split
  s.workspace_bytes = checked_workspace_bytes(kWhere, int64_t{b} * s_q, h, s.num_splits, d_v);
  return s;
}

void sparse_decode(const SparseDecodeArgs& args, const DecodeSchedule& schedule,
                   const TensorView& workspace, Stream stream) {
  const DecodeDims dims = validate_decode(args, schedule, workspace);
  ops::kernel(kOp, ops::kSparseDecode, dims.device)(args, schedule, workspace, stream);
}

}  // namespace dsv4
