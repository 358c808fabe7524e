// sparse_attention_combine: merges split-KV partials (o_s, lse_s) into the final output with the
// attention sink (docs/spec.md §6). The front door: validation, then the backend.
#include <cstdint>

#include "dsv4/ops.h"
#include "dsv4/status.h"
#include "ops/attention_checks.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

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
  ops::check_tensor(kOp, "partial_o", partial_o, DType::fp32, {-1, -1, -1, -1, -1}, device);
  if (splits < 1) fail_expected(kOp, "partial_o.shape[3] (splits)", ">= 1", splits);
  if (h < 1) fail_expected(kOp, "partial_o.shape[2] (heads)", ">= 1", h);
  if (d_v < 1) fail_expected(kOp, "partial_o.shape[4] (d_v)", ">= 1", d_v);
  ops::check_tensor(kOp, "partial_lse", partial_lse, DType::fp32, {b, s_q, h, splits}, device);
  ops::check_optional_tensor(kOp, "attn_sink", attn_sink, DType::fp32, {h}, device);
  ops::check_output_tensor(kOp, "out", out, DType::bf16, {b, s_q, h, d_v}, device,
                           ops::Dense::last_dim);
  ops::check_output_tensor(kOp, "lse", lse, DType::fp32, {b, s_q, h}, device,
                           ops::Dense::last_dim);
  ops::check_outputs_disjoint(kOp, {{"out", out}, {"lse", lse}},
                              {{"partial_o", partial_o}, {"partial_lse", partial_lse},
                               {"attn_sink", attn_sink}});
}

}  // namespace

void sparse_attention_combine(const TensorView& partial_o, const TensorView& partial_lse,
                              const TensorView& attn_sink, const TensorView& out,
                              const TensorView& lse, Stream stream) {
  validate_combine(partial_o, partial_lse, attn_sink, out, lse);
  ops::kernel(kOp, ops::kSparseAttentionCombine, partial_o.device)(partial_o, partial_lse,
                                                                   attn_sink, out, lse, stream);
}

}  // namespace dsv4
