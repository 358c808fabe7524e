// The CPU kernel of sparse_prefill: per query token, the shared attention core over the rows its
// indices select (-1 and >= s_kv masked, as in FlashMLA), sink folded into the output.
#include <cstdint>

#include "cpu/attention_core.h"
#include "cpu/kernels.h"
#include "math/softmax_scale.h"

namespace dsv4::cpu {

void sparse_prefill(const SparsePrefillArgs& a, Stream /*stream*/) {
  const int64_t s_q = a.q.shape[0], s_kv = a.kv.shape[0], topk = a.indices.shape[2];
  const int h = static_cast<int>(a.q.shape[1]), d_qk = static_cast<int>(a.q.shape[2]), d_v = a.d_v;
  const float scale = math::effective_softmax_scale(a.softmax_scale, d_qk);
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
    QueryAttention attention(h, d_qk, d_v, scale);
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < s_q; ++t) {
      attention.set_query(q + t * a.q.strides[0], a.q.strides[1]);
      const int32_t* idx = indices + t * a.indices.strides[0];
      const int64_t counted = lengths ? lengths[t] : topk;
      attention.attend(0, counted, [&](int64_t k, float* dst) {
        const int32_t row = idx[k];
        if (row < 0 || row >= s_kv) return false;  // masked, as in FlashMLA
        const uint16_t* src = kv + row * kv_row_stride;
        for (int d = 0; d < d_qk; ++d) dst[d] = bf16_bits_to_float(src[d]);
        return true;
      });
      const HeadGroupSoftmax& softmax = attention.softmax();
      for (int hi = 0; hi < h; ++hi) {
        softmax.write_output(hi, sink_of(sink, hi),
                             out + t * a.out.strides[0] + hi * a.out.strides[1],
                             lse + t * a.lse.strides[0] + hi * a.lse.strides[1]);
        max_logits[t * a.max_logits.strides[0] + hi * a.max_logits.strides[1]] =
            softmax.max_logit(hi);
      }
    }
  }
}

}  // namespace dsv4::cpu
