// sparse_prefill: sparse attention of prefill queries over a bf16 KV workspace (the gathered
// compressed + SWA rows), FlashMLA sparse-prefill semantics (docs/spec.md §6): indices -1 and >= s_kv
// are masked (not errors), slots past topk_length are ignored; returns out, max_logits and lse
// in natural units.
#include <cstdint>
#include <string>

#include "cpu/rows.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#include "ops/attention_checks.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {

constexpr const char* kOp = "sparse_prefill";

struct PrefillDims {
  int64_t s_q, h, d_qk, s_kv, topk;
  float scale;
  Device device;
};

// The one validation of sparse_prefill's arguments, shared by both backends.
PrefillDims validate_prefill(const SparsePrefillArgs& a) {
  check_defined(kOp, "q", a.q);
  check_ndim(kOp, "q", a.q, 3);
  PrefillDims dims{};
  dims.device = a.q.device;
  const int64_t s_q = a.q.shape[0], h = a.q.shape[1], d_qk = a.q.shape[2];
  dims.s_q = s_q;
  dims.h = h;
  dims.d_qk = d_qk;
  ops::check_tensor(kOp, "q", a.q, DType::bf16, {-1, -1, -1}, dims.device, ops::Dense::last_dim);
  if (h < 1) fail_expected(kOp, "q.shape[1] (heads)", ">= 1", h);
  if (d_qk != 512 && d_qk != 576) fail_expected(kOp, "q.shape[2] (d_qk)", "512 or 576", d_qk);
  if (a.d_v < 1 || a.d_v > d_qk)
    fail_expected(kOp, "d_v", detail::concat("a value in [1, ", d_qk, "]"), a.d_v);

  ops::check_tensor(kOp, "kv", a.kv, DType::bf16, {-1, 1, d_qk}, dims.device,
                    ops::Dense::last_dim);
  dims.s_kv = a.kv.shape[0];
  ops::check_tensor(kOp, "indices", a.indices, DType::int32, {s_q, 1, -1}, dims.device,
                    ops::Dense::last_dim);
  dims.topk = a.indices.shape[2];
  if (dims.topk < 1) fail_expected(kOp, "indices.shape[2] (topk)", ">= 1", dims.topk);
  ops::check_optional_tensor(kOp, "topk_length", a.topk_length, DType::int32, {s_q}, dims.device);
  ops::check_optional_tensor(kOp, "attn_sink", a.attn_sink, DType::fp32, {h}, dims.device);
  dims.scale = ops::resolve_softmax_scale(kOp, a.softmax_scale, d_qk);

  ops::check_output_tensor(kOp, "out", a.out, DType::bf16, {s_q, h, a.d_v}, dims.device,
                           ops::Dense::last_dim);
  ops::check_output_tensor(kOp, "max_logits", a.max_logits, DType::fp32, {s_q, h}, dims.device,
                           ops::Dense::last_dim);
  ops::check_output_tensor(kOp, "lse", a.lse, DType::fp32, {s_q, h}, dims.device,
                           ops::Dense::last_dim);
  if (a.work_counter.defined()) {
    ops::check_output_tensor(kOp, "work_counter", a.work_counter, DType::int32, {-1}, dims.device,
                             ops::Dense::last_dim);
    if (a.work_counter.shape[0] < 1) fail_expected(kOp, "work_counter.shape[0]", ">= 1", a.work_counter.shape[0]);
  }
  ops::check_outputs_disjoint(kOp,
                              {{"out", a.out}, {"max_logits", a.max_logits}, {"lse", a.lse},
                               {"work_counter", a.work_counter}},
                              {{"q", a.q}, {"kv", a.kv}, {"indices", a.indices},
                               {"topk_length", a.topk_length}, {"attn_sink", a.attn_sink}});

  // Index values are masked, not checked; only the lengths are data the contract constrains.
  if (dims.device == Device::cpu && a.topk_length.defined())
    cpu::check_values_in_range(kOp, "topk_length", a.topk_length.ptr<const int32_t>(), s_q, 0,
                               dims.topk);
  return dims;
}

}  // namespace

void sparse_prefill(const SparsePrefillArgs& args, Stream stream) {
  const PrefillDims dims = validate_prefill(args);
  ops::kernel(kOp, ops::kSparsePrefill, dims.device)(args, stream);
}

}  // namespace dsv4
