// The CPU combine of split-KV partials: per head, a one-head softmax over the splits' lse
// (attention_core.h), sink folded in.
#include "cpu/sparse_combine.h"

#include <cstdint>

#include "cpu/attention_core.h"
#include "cpu/kernels.h"

namespace dsv4::cpu {

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

void sparse_attention_combine(const TensorView& partial_o, const TensorView& partial_lse,
                              const TensorView& attn_sink, const TensorView& out,
                              const TensorView& lse, Stream /*stream*/) {
  combine_partials(partial_o, partial_lse, attn_sink.ptr<const float>(), out, lse);
}

}  // namespace dsv4::cpu
