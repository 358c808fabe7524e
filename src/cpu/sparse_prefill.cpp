// sparse_prefill: sparse attention of prefill queries over a bf16 KV workspace (the gathered
// compressed + SWA rows), FlashMLA sparse-prefill semantics (docs/spec.md §6): indices -1 and >= s_kv
// are masked (not errors), slots past topk_length are ignored; returns out, max_logits and lse
// in natural units.
#include <cstdint>
#include <string>

#include "cpu/attention_checks.h"
#include "cpu/attention_core.h"
#include "cpu/backend.h"
#include "cpu/validate.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#ifdef DSV4_WITH_CUDA
#include "cuda/attention/sparse_prefill.h"
#endif

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
  cpu::check_tensor(kOp, "q", a.q, DType::bf16, {-1, -1, -1}, dims.device, cpu::Dense::last_dim);
  if (h < 1) fail_expected(kOp, "q.shape[1] (heads)", ">= 1", h);
  if (d_qk != 512 && d_qk != 576) fail_expected(kOp, "q.shape[2] (d_qk)", "512 or 576", d_qk);
  if (a.d_v < 1 || a.d_v > d_qk)
    fail_expected(kOp, "d_v", detail::concat("a value in [1, ", d_qk, "]"), a.d_v);

  cpu::check_tensor(kOp, "kv", a.kv, DType::bf16, {-1, 1, d_qk}, dims.device,
                    cpu::Dense::last_dim);
  dims.s_kv = a.kv.shape[0];
  cpu::check_tensor(kOp, "indices", a.indices, DType::int32, {s_q, 1, -1}, dims.device,
                    cpu::Dense::last_dim);
  dims.topk = a.indices.shape[2];
  if (dims.topk < 1) fail_expected(kOp, "indices.shape[2] (topk)", ">= 1", dims.topk);
  cpu::check_optional_tensor(kOp, "topk_length", a.topk_length, DType::int32, {s_q}, dims.device);
  cpu::check_optional_tensor(kOp, "attn_sink", a.attn_sink, DType::fp32, {h}, dims.device);
  dims.scale = cpu::resolve_softmax_scale(kOp, a.softmax_scale, d_qk);

  cpu::check_output_tensor(kOp, "out", a.out, DType::bf16, {s_q, h, a.d_v}, dims.device,
                           cpu::Dense::last_dim);
  cpu::check_output_tensor(kOp, "max_logits", a.max_logits, DType::fp32, {s_q, h}, dims.device,
                           cpu::Dense::last_dim);
  cpu::check_output_tensor(kOp, "lse", a.lse, DType::fp32, {s_q, h}, dims.device,
                           cpu::Dense::last_dim);
  cpu::check_outputs_disjoint(kOp, {{"out", a.out}, {"max_logits", a.max_logits}, {"lse", a.lse}},
                              {{"q", a.q}, {"kv", a.kv}, {"indices", a.indices},
                               {"topk_length", a.topk_length}, {"attn_sink", a.attn_sink}});

  // Index values are masked, not checked; only the lengths are data the contract constrains.
  if (dims.device == Device::cpu && a.topk_length.defined())
    cpu::check_values_in_range(kOp, "topk_length", a.topk_length.ptr<const int32_t>(), s_q, 0,
                               dims.topk);
  return dims;
}

void sparse_prefill_cpu(const SparsePrefillArgs& a, const PrefillDims& dims) {
  const int h = static_cast<int>(dims.h), d_qk = static_cast<int>(dims.d_qk), d_v = a.d_v;
  const uint16_t* q = a.q.ptr<const uint16_t>();
  const uint16_t* kv = a.kv.ptr<const uint16_t>();
  const int64_t kv_row_stride = a.kv.strides[0];
  const int32_t* indices = a.indices.ptr<const int32_t>();
  const int32_t* lengths = a.topk_length.ptr<const int32_t>();
  const float* sink = a.attn_sink.ptr<const float>();
  uint16_t* out = a.out.ptr<uint16_t>();
  float* max_logits = a.max_logits.ptr<float>();
  float* lse = a.lse.ptr<float>();

#pragma omp parallel
  {
    cpu::QueryAttention attention(h, d_qk, d_v, dims.scale);
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < dims.s_q; ++t) {
      attention.set_query(q + t * a.q.strides[0], a.q.strides[1]);
      const int32_t* idx = indices + t * a.indices.strides[0];
      const int64_t counted = lengths ? lengths[t] : dims.topk;
      attention.attend(0, counted, [&](int64_t k, float* dst) {
        const int32_t row = idx[k];
        if (row < 0 || row >= dims.s_kv) return false;  // masked, as in FlashMLA
        const uint16_t* src = kv + row * kv_row_stride;
        for (int d = 0; d < d_qk; ++d) dst[d] = bf16_bits_to_float(src[d]);
        return true;
      });
      const cpu::HeadGroupSoftmax& softmax = attention.softmax();
      for (int hi = 0; hi < h; ++hi) {
        softmax.write_output(hi, cpu::sink_of(sink, hi),
                             out + t * a.out.strides[0] + hi * a.out.strides[1],
                             lse + t * a.lse.strides[0] + hi * a.lse.strides[1]);
        max_logits[t * a.max_logits.strides[0] + hi * a.max_logits.strides[1]] =
            softmax.max_logit(hi);
      }
    }
  }
}

}  // namespace

void sparse_prefill(const SparsePrefillArgs& args, [[maybe_unused]] Stream stream) {
  const PrefillDims dims = validate_prefill(args);
  if (dims.device == Device::cpu) {
    sparse_prefill_cpu(args, dims);
    return;
  }
  DSV4_CUDA_DISPATCH(kOp, cuda::sparse_prefill(args, stream));
}

}  // namespace dsv4
