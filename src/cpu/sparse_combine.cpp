// sparse_attention_combine: merges split-KV partials (o_s, lse_s) into the final output with the
// attention sink (docs/spec.md §6). CPU reference + dispatch to the CUDA twin.
#include "cpu/sparse_combine.h"

#include <cstdint>

#include "cpu/attention_checks.h"
#include "cpu/attention_core.h"
#include "cpu/backend.h"
#include "cpu/validate.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#ifdef DSV4_WITH_CUDA
#include "cuda/attention/sparse_decode.h"
#endif

namespace dsv4 {

namespace cpu {

void combine_partials(const TensorView& partial_o, const TensorView& partial_lse,
                      const float* attn_sink, const TensorView& out, const TensorView& lse) {
  const int64_t b = partial_o.shape[0], s_q = partial_o.shape[1], h = partial_o.shape[2];
  const int num_splits = static_cast<int>(partial_o.shape[3]);
  const int d_v = static_cast<int>(partial_o.shape[4]);
  const float* po = partial_o.ptr<const float>();
  const float* plse = partial_lse.ptr<const float>();
  uint16_t* out_bits = out.ptr<uint16_t>();
  float* lse_out = lse.ptr<float>();

  // One head per item: the splits of head h are the "rows" of a one-head softmax whose logits
  // are the splits' lse (see attention_core.h).
#pragma omp parallel
  {
    HeadGroupSoftmax merge(1, d_v);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < b * s_q * h; ++row) {
      const int64_t bi = row / (s_q * h), si = row / h % s_q, hi = row % h;
      merge.reset();
      merge.add(plse + row * num_splits, num_splits, po + row * num_splits * d_v, d_v, num_splits);
      uint16_t* o = out_bits + bi * out.strides[0] + si * out.strides[1] + hi * out.strides[2];
      float* l = lse_out + bi * lse.strides[0] + si * lse.strides[1] + hi * lse.strides[2];
      merge.write_output(0, sink_of(attn_sink, static_cast<int>(hi)), o, l);
    }
  }
}

}  // namespace cpu

namespace {

constexpr const char* kOp = "sparse_attention_combine";

// The one validation of the combine's arguments, shared by both backends.
void validate_combine(const TensorView& partial_o, const TensorView& partial_lse,
                      const TensorView& attn_sink, const TensorView& out, const TensorView& lse) {
  check_defined(kOp, "partial_o", partial_o);
  check_ndim(kOp, "partial_o", partial_o, 5);
  const Device device = partial_o.device;
  const int64_t b = partial_o.shape[0], s_q = partial_o.shape[1], h = partial_o.shape[2],
                splits = partial_o.shape[3], d_v = partial_o.shape[4];
  cpu::check_tensor(kOp, "partial_o", partial_o, DType::fp32, {-1, -1, -1, -1, -1}, device);
  if (splits < 1) fail_expected(kOp, "partial_o.shape[3] (splits)", ">= 1", splits);
  if (h < 1) fail_expected(kOp, "partial_o.shape[2] (heads)", ">= 1", h);
  if (d_v < 1) fail_expected(kOp, "partial_o.shape[4] (d_v)", ">= 1", d_v);
  cpu::check_tensor(kOp, "partial_lse", partial_lse, DType::fp32, {b, s_q, h, splits}, device);
  cpu::check_optional_tensor(kOp, "attn_sink", attn_sink, DType::fp32, {h}, device);
  cpu::check_output_tensor(kOp, "out", out, DType::bf16, {b, s_q, h, d_v}, device,
                           cpu::Dense::last_dim);
  cpu::check_output_tensor(kOp, "lse", lse, DType::fp32, {b, s_q, h}, device,
                           cpu::Dense::last_dim);
  cpu::check_outputs_disjoint(kOp, {{"out", out}, {"lse", lse}},
                              {{"partial_o", partial_o}, {"partial_lse", partial_lse},
                               {"attn_sink", attn_sink}});
}

}  // namespace

void sparse_attention_combine(const TensorView& partial_o, const TensorView& partial_lse,
                              const TensorView& attn_sink, const TensorView& out,
                              const TensorView& lse, [[maybe_unused]] Stream stream) {
  validate_combine(partial_o, partial_lse, attn_sink, out, lse);
  if (partial_o.device == Device::cpu) {
    cpu::combine_partials(partial_o, partial_lse, attn_sink.ptr<const float>(), out, lse);
    return;
  }
  DSV4_CUDA_DISPATCH(kOp, cuda::sparse_attention_combine(partial_o, partial_lse, attn_sink, out,
                                                         lse, stream));
}

}  // namespace dsv4
