// sparse_decode: split-KV sparse attention of decode queries straight over the paged FP8 (or
// BF16) caches through two index scopes (docs/spec.md §6), and its shape-only split planner.
// CPU reference: each (b, s_q, split) item attends its slice of the concatenated index list
// into the workspace partials, then the shared combine merges the splits and applies the sink.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "cpu/attention_checks.h"
#include "cpu/attention_core.h"
#include "cpu/backend.h"
#include "cpu/sparse_combine.h"
#include "cpu/validate.h"
#include "dsv4/checked_math.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#ifdef DSV4_WITH_CUDA
#include "cuda/attention/sparse_decode.h"
#endif

namespace dsv4 {

namespace {

constexpr const char* kOp = "sparse_decode";

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of the partials for these shapes: partial_o [b, s_q, H, splits, d_v] then partial_lse
// [b, s_q, H, splits], both fp32. The checked version throws (naming `where`) when the size does
// not fit int64; the plain one is for shapes it has already accepted.
int64_t partial_o_bytes(int64_t rows, int64_t h, int64_t splits, int64_t d_v) {
  return rows * h * splits * d_v * static_cast<int64_t>(sizeof(float));
}
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
  cpu::check_tensor(kOp, "q", a.q, DType::bf16, {-1, -1, -1, -1}, dims.device,
                    cpu::Dense::last_dim);
  if (h < 1) fail_expected(kOp, "q.shape[2] (heads)", ">= 1", h);

  const int cache_dim = cpu::check_cache(kOp, "k_cache", a.k_cache, dims.device);
  if (d_qk != cache_dim)
    fail_expected(kOp, "q.shape[3] (d_qk)",
                  detail::concat(cache_dim, " (the dim of k_cache's layout ",
                                 kv_layout_name(a.k_cache.layout), ")"),
                  d_qk);
  if (a.d_v < 1 || a.d_v > d_qk)
    fail_expected(kOp, "d_v", detail::concat("a value in [1, ", d_qk, "]"), a.d_v);

  cpu::check_tensor(kOp, "indices", a.indices, DType::int32, {b, s_q, -1}, dims.device,
                    cpu::Dense::last_dim);
  dims.topk = a.indices.shape[2];
  if (dims.topk < 1) fail_expected(kOp, "indices.shape[2] (topk)", ">= 1", dims.topk);
  cpu::check_optional_tensor(kOp, "topk_length", a.topk_length, DType::int32, {b}, dims.device);

  const bool has_extra = a.extra_k_cache.data.defined();
  if (has_extra) {
    cpu::check_cache(kOp, "extra_k_cache", a.extra_k_cache, dims.device);
    if (a.extra_k_cache.layout != a.k_cache.layout)
      fail_expected(kOp, "extra_k_cache.layout", kv_layout_name(a.k_cache.layout),
                    kv_layout_name(a.extra_k_cache.layout));
    cpu::check_tensor(kOp, "extra_indices", a.extra_indices, DType::int32, {b, s_q, -1},
                      dims.device, cpu::Dense::last_dim);
    dims.extra_topk = a.extra_indices.shape[2];
    if (dims.extra_topk < 1)
      fail_expected(kOp, "extra_indices.shape[2] (extra_topk)", ">= 1", dims.extra_topk);
    cpu::check_optional_tensor(kOp, "extra_topk_length", a.extra_topk_length, DType::int32, {b},
                               dims.device);
  } else {
    if (a.extra_indices.defined() || a.extra_topk_length.defined())
      fail(kOp, ": extra_indices / extra_topk_length: expected none without extra_k_cache, got ",
           "a tensor");
    dims.extra_topk = 0;
  }

  cpu::check_optional_tensor(kOp, "attn_sink", a.attn_sink, DType::fp32, {h}, dims.device);
  dims.scale = cpu::resolve_softmax_scale(kOp, a.softmax_scale, d_qk);
  cpu::check_output_tensor(kOp, "out", a.out, DType::bf16, {b, s_q, h, a.d_v}, dims.device,
                           cpu::Dense::last_dim);
  cpu::check_output_tensor(kOp, "lse", a.lse, DType::fp32, {b, s_q, h}, dims.device,
                           cpu::Dense::last_dim);

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
  cpu::check_tensor(kOp, "workspace", workspace, DType::uint8, {-1}, dims.device);
  if (workspace.numel() < need)
    fail_expected(kOp, "workspace bytes", detail::concat(">= ", need), workspace.numel());
  if (reinterpret_cast<uintptr_t>(workspace.data) % 16 != 0)
    fail(kOp, ": workspace: expected a 16-byte aligned pointer, got ", workspace.data);
  // The split partials in workspace are written and read back while out / lse are written.
  cpu::check_outputs_disjoint(
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

// One index scope as the CPU fetcher sees it.
struct Scope {
  KvGeometry geometry;
  const uint8_t* blocks;
  int64_t block_stride;  // bytes between blocks
  float tensor_scale;
  const int32_t* indices;  // [b, s_q, topk], strides below (last dim dense)
  int64_t indices_b_stride, indices_s_stride;
  const int32_t* lengths;  // [b] or nullptr
  int64_t topk;

  static Scope of(const KvCacheView& cache, const TensorView& indices, const TensorView& lengths) {
    return Scope{kv_geometry(cache.layout, cache.block_size), cache.data.ptr<const uint8_t>(),
                 cache.data.strides[0], cache.tensor_scale, indices.ptr<const int32_t>(),
                 indices.strides[0], indices.strides[1], lengths.ptr<const int32_t>(),
                 indices.shape[2]};
  }
  int64_t counted(int64_t bi) const { return lengths ? lengths[bi] : topk; }
  // Dequantizes slot k of query row (bi, si) into `dst`; false when invalid.
  bool fetch(int64_t bi, int64_t si, int64_t k, float* dst) const {
    if (k >= counted(bi)) return false;
    const int32_t slot = indices[bi * indices_b_stride + si * indices_s_stride + k];
    if (slot < 0) return false;
    const int bs = geometry.block_size;
    kv_decode_token(geometry, blocks + (slot / bs) * block_stride, slot % bs, dst, tensor_scale);
    return true;
  }
};

void sparse_decode_cpu(const SparseDecodeArgs& a, const DecodeDims& dims,
                       const DecodeSchedule& schedule, const TensorView& partial_o,
                       const TensorView& partial_lse) {
  const Scope main = Scope::of(a.k_cache, a.indices, a.topk_length);
  const bool has_extra = dims.extra_topk > 0;
  const Scope extra = has_extra ? Scope::of(a.extra_k_cache, a.extra_indices, a.extra_topk_length)
                                : Scope{};
  const int64_t topk_total = dims.topk + dims.extra_topk;
  const int64_t rows = dims.b * dims.s_q, splits = schedule.num_splits;
  const int h = static_cast<int>(dims.h), d_qk = static_cast<int>(dims.d_qk), d_v = a.d_v;
  const uint16_t* q = a.q.ptr<const uint16_t>();
  float* po = partial_o.ptr<float>();
  float* plse = partial_lse.ptr<float>();

#pragma omp parallel
  {
    cpu::QueryAttention attention(h, d_qk, d_v, dims.scale);
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < rows * splits; ++item) {
      const int64_t row = item / splits, split = item % splits;
      const int64_t bi = row / dims.s_q, si = row % dims.s_q;
      attention.set_query(q + bi * a.q.strides[0] + si * a.q.strides[1], a.q.strides[2]);
      const int64_t begin = std::min(split * schedule.split_len, topk_total);
      const int64_t end = std::min(begin + schedule.split_len, topk_total);
      // Slot k of the concatenated list: main scope for k < topk, then the extra scope.
      attention.attend(begin, end, [&](int64_t k, float* dst) {
        return k < dims.topk ? main.fetch(bi, si, k, dst)
                             : extra.fetch(bi, si, k - dims.topk, dst);
      });
      for (int hi = 0; hi < h; ++hi) {
        const int64_t head_row = row * h + hi;
        attention.softmax().write_partial(hi, po + (head_row * splits + split) * d_v,
                                          plse + head_row * splits + split);
      }
    }
  }
  cpu::combine_partials(partial_o, partial_lse, a.attn_sink.ptr<const float>(), a.out, a.lse);
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
                   const TensorView& workspace, [[maybe_unused]] Stream stream) {
  const DecodeDims dims = validate_decode(args, schedule, workspace);
  if (dims.device == Device::cpu) {
    // Carve the partials out of the workspace (layout documented in ops.h).
    uint8_t* base = workspace.ptr<uint8_t>();
    const int64_t splits = schedule.num_splits;
    const TensorView partial_o(base, DType::fp32,
                               {dims.b, dims.s_q, dims.h, splits, int64_t{args.d_v}});
    const TensorView partial_lse(
        base + partial_o_bytes(dims.b * dims.s_q, dims.h, splits, args.d_v), DType::fp32,
        {dims.b, dims.s_q, dims.h, splits});
    sparse_decode_cpu(args, dims, schedule, partial_o, partial_lse);
    return;
  }
  DSV4_CUDA_DISPATCH(kOp, cuda::sparse_decode(args, schedule, workspace, stream));
}

}  // namespace dsv4
