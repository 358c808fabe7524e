// Bindings of the layer ops (include/dsv4/ops.h). Each takes its tensors (outputs included, the
// caller allocates them), its scalars, and `stream` (a cudaStream_t as an int; 0 = default
// stream, ignored on CPU). The GIL is released while an op runs.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstring>
#include <tuple>

#include "dsv4/ops.h"
#include "tensor_args.h"

namespace dsv4::python {

namespace {

using nb::arg;
using Release = nb::call_guard<nb::gil_scoped_release>;

void linear_op(const AnyArray& x, const OptArray& x_scale, const AnyArray& w,
               const OptArray& w_scale, const AnyArray& y, uintptr_t stream) {
  linear(view_of(x, "x"), view_of(x_scale, "x_scale"), view_of(w, "w"),
         view_of(w_scale, "w_scale"), view_of(y, "y"), stream_of(stream));
}

void quantize_act_fp8_op(const AnyArray& x, int block, const AnyArray& xq, const AnyArray& scale,
                         uintptr_t stream) {
  quantize_act_fp8(view_of(x, "x"), block, view_of(xq, "xq"), view_of(scale, "scale"),
                   stream_of(stream));
}

void dequantize_fp8_blocks_op(const AnyArray& x, const AnyArray& scale, int block_rows,
                              int block_cols, const AnyArray& y, uintptr_t stream) {
  dequantize_fp8_blocks(view_of(x, "x"), view_of(scale, "scale"), block_rows, block_cols,
                        view_of(y, "y"), stream_of(stream));
}

void rms_norm_op(const AnyArray& x, const OptArray& weight, float eps, const AnyArray& y,
                 uintptr_t stream) {
  rms_norm(view_of(x, "x"), view_of(weight, "weight"), eps, view_of(y, "y"), stream_of(stream));
}

void fused_qkv_rms_norm_op(const AnyArray& q_in, const AnyArray& wq, const AnyArray& kv_in,
                           const AnyArray& wkv, float eps, const AnyArray& q_out,
                           const AnyArray& kv_out, uintptr_t stream) {
  fused_qkv_rms_norm(view_of(q_in, "q_in"), view_of(wq, "wq"), view_of(kv_in, "kv_in"),
                     view_of(wkv, "wkv"), eps, view_of(q_out, "q_out"),
                     view_of(kv_out, "kv_out"), stream_of(stream));
}

void apply_rope_op(const AnyArray& x, const AnyArray& positions, const AnyArray& cos_sin,
                   bool inverse, const AnyArray& y, uintptr_t stream) {
  apply_rope(view_of(x, "x"), view_of(positions, "positions"), view_of(cos_sin, "cos_sin"),
             inverse, view_of(y, "y"), stream_of(stream));
}

void inv_rope_fp8_quant_op(const AnyArray& o, const AnyArray& positions, const AnyArray& cos_sin,
                           int block, const AnyArray& o_fp8, const AnyArray& o_scale,
                           uintptr_t stream) {
  inv_rope_fp8_quant(view_of(o, "o"), view_of(positions, "positions"), view_of(cos_sin, "cos_sin"),
                     block, view_of(o_fp8, "o_fp8"), view_of(o_scale, "o_scale"), stream_of(stream));
}

// Fills `out` (fp32 host [max_pos, R], contiguous) with build_rope_cache's table.
void rope_cache_op(double theta, int rope_dims, bool yarn, double factor,
                   long long original_seq_len, double beta_fast, double beta_slow,
                   const AnyArray& out) {
  const TensorView o = view_of(out, "out");
  const char* where = "rope_cache";
  check_dtype(where, "out", o, DType::fp32);
  check_device(where, "out", o, Device::cpu);
  check_ndim(where, "out", o, 2);
  check_dim(where, "out", o, 1, rope_dims);
  check_contiguous(where, "out", o);
  const RopeConfig cfg{theta, rope_dims, yarn, factor, original_seq_len, beta_fast, beta_slow};
  const HostTensor table = build_rope_cache(cfg, o.shape[0]);
  std::memcpy(o.data, table.view().data, table.nbytes());
}

void qnorm_rope_kv_insert_op(const AnyArray& q, const AnyArray& kv, const AnyArray& positions,
                             const AnyArray& cos_sin, float eps, const AnyArray& cache,
                             const std::string& layout, int block_size, float tensor_scale,
                             const AnyArray& slot_mapping, uintptr_t stream) {
  qnorm_rope_kv_insert(view_of(q, "q"), view_of(kv, "kv"), view_of(positions, "positions"),
                       view_of(cos_sin, "cos_sin"), eps,
                       cache_of(cache, layout, block_size, tensor_scale, "cache"),
                       view_of(slot_mapping, "slot_mapping"), stream_of(stream));
}

std::tuple<int, int, int64_t> decode_schedule_op(int b, int s_q, int h, int topk_total,
                                                 int num_sms, int d_v) {
  const DecodeSchedule s = make_decode_schedule(b, s_q, h, topk_total, num_sms, d_v);
  return {s.num_splits, s.split_len, s.workspace_bytes};
}

void sparse_decode_op(const AnyArray& q, const AnyArray& k_cache, const std::string& k_layout,
                      int k_block_size, const AnyArray& indices, const OptArray& topk_length,
                      const OptArray& extra_k_cache, const std::string& extra_layout,
                      int extra_block_size, const OptArray& extra_indices,
                      const OptArray& extra_topk_length, const OptArray& attn_sink,
                      float softmax_scale, int d_v, int num_splits, int split_len,
                      int64_t workspace_bytes, const AnyArray& workspace, const AnyArray& out,
                      const AnyArray& lse, uintptr_t stream) {
  SparseDecodeArgs a;
  a.q = view_of(q, "q");
  a.k_cache = cache_of(k_cache, k_layout, k_block_size, 1.0f, "k_cache");
  a.indices = view_of(indices, "indices");
  a.topk_length = view_of(topk_length, "topk_length");
  if (extra_k_cache.has_value())
    a.extra_k_cache = cache_of(*extra_k_cache, extra_layout, extra_block_size, 1.0f,
                               "extra_k_cache");
  a.extra_indices = view_of(extra_indices, "extra_indices");
  a.extra_topk_length = view_of(extra_topk_length, "extra_topk_length");
  a.attn_sink = view_of(attn_sink, "attn_sink");
  a.softmax_scale = softmax_scale;
  a.d_v = d_v;
  a.out = view_of(out, "out");
  a.lse = view_of(lse, "lse");
  const DecodeSchedule schedule{num_splits, split_len, workspace_bytes};
  sparse_decode(a, schedule, view_of(workspace, "workspace"), stream_of(stream));
}

void sparse_attention_combine_op(const AnyArray& partial_o, const AnyArray& partial_lse,
                                 const OptArray& attn_sink, const AnyArray& out,
                                 const AnyArray& lse, uintptr_t stream) {
  sparse_attention_combine(view_of(partial_o, "partial_o"), view_of(partial_lse, "partial_lse"),
                           view_of(attn_sink, "attn_sink"), view_of(out, "out"),
                           view_of(lse, "lse"), stream_of(stream));
}

void sparse_prefill_op(const AnyArray& q, const AnyArray& kv, const AnyArray& indices,
                       const OptArray& topk_length, const OptArray& attn_sink,
                       float softmax_scale, int d_v, const AnyArray& out,
                       const AnyArray& max_logits, const AnyArray& lse, uintptr_t stream) {
  SparsePrefillArgs a;
  a.q = view_of(q, "q");
  a.kv = view_of(kv, "kv");
  a.indices = view_of(indices, "indices");
  a.topk_length = view_of(topk_length, "topk_length");
  a.attn_sink = view_of(attn_sink, "attn_sink");
  a.softmax_scale = softmax_scale;
  a.d_v = d_v;
  a.out = view_of(out, "out");
  a.max_logits = view_of(max_logits, "max_logits");
  a.lse = view_of(lse, "lse");
  sparse_prefill(a, stream_of(stream));
}

void dequantize_and_gather_op(const AnyArray& cache, const std::string& layout, int block_size,
                              float tensor_scale, const AnyArray& block_table,
                              const AnyArray& seq_lens, const OptArray& gather_lens,
                              int64_t offset, const AnyArray& workspace, uintptr_t stream) {
  dequantize_and_gather(cache_of(cache, layout, block_size, tensor_scale, "cache"),
                        view_of(block_table, "block_table"), view_of(seq_lens, "seq_lens"),
                        view_of(gather_lens, "gather_lens"), offset,
                        view_of(workspace, "workspace"), stream_of(stream));
}

void grouped_wo_a_op(const AnyArray& o, const OptArray& o_scale, const AnyArray& wo_a,
                     const OptArray& wo_a_scale, const AnyArray& z, uintptr_t stream) {
  grouped_wo_a(view_of(o, "o"), view_of(o_scale, "o_scale"), view_of(wo_a, "wo_a"),
               view_of(wo_a_scale, "wo_a_scale"), view_of(z, "z"), stream_of(stream));
}

}  // namespace

void bind_ops(nb::module_& m) {
  const auto none = [](const char* name) { return arg(name).none(); };
  m.def("linear", &linear_op, arg("x"), none("x_scale"), arg("w"), none("w_scale"), arg("y"),
        arg("stream") = 0, Release());
  m.def("quantize_act_fp8", &quantize_act_fp8_op, arg("x"), arg("block"), arg("xq"),
        arg("scale"), arg("stream") = 0, Release());
  m.def("dequantize_fp8_blocks", &dequantize_fp8_blocks_op, arg("x"), arg("scale"),
        arg("block_rows"), arg("block_cols"), arg("y"), arg("stream") = 0, Release());
  m.def("rms_norm", &rms_norm_op, arg("x"), none("weight"), arg("eps"), arg("y"),
        arg("stream") = 0, Release());
  m.def("fused_qkv_rms_norm", &fused_qkv_rms_norm_op, arg("q_in"), arg("wq"), arg("kv_in"),
        arg("wkv"), arg("eps"), arg("q_out"), arg("kv_out"), arg("stream") = 0, Release());
  m.def("apply_rope", &apply_rope_op, arg("x"), arg("positions"), arg("cos_sin"),
        arg("inverse"), arg("y"), arg("stream") = 0, Release());
  m.def("inv_rope_fp8_quant", &inv_rope_fp8_quant_op, arg("o"), arg("positions"), arg("cos_sin"),
        arg("block"), arg("o_fp8"), arg("o_scale"), arg("stream") = 0, Release());
  m.def("rope_cache", &rope_cache_op, arg("theta"), arg("rope_dims"), arg("yarn"),
        arg("factor"), arg("original_seq_len"), arg("beta_fast"), arg("beta_slow"), arg("out"),
        Release());
  m.def("qnorm_rope_kv_insert", &qnorm_rope_kv_insert_op, arg("q"), arg("kv"),
        arg("positions"), arg("cos_sin"), arg("eps"), arg("cache"), arg("layout"),
        arg("block_size"), arg("tensor_scale"), arg("slot_mapping"), arg("stream") = 0,
        Release());
  m.def("decode_schedule", &decode_schedule_op, arg("b"), arg("s_q"), arg("h"),
        arg("topk_total"), arg("num_sms"), arg("d_v"),
        "(num_splits, split_len, workspace_bytes) of make_decode_schedule");
  m.def("sparse_decode", &sparse_decode_op, arg("q"), arg("k_cache"), arg("k_layout"),
        arg("k_block_size"), arg("indices"), none("topk_length"), none("extra_k_cache"),
        arg("extra_layout"), arg("extra_block_size"), none("extra_indices"),
        none("extra_topk_length"), none("attn_sink"), arg("softmax_scale"), arg("d_v"),
        arg("num_splits"), arg("split_len"), arg("workspace_bytes"), arg("workspace"),
        arg("out"), arg("lse"), arg("stream") = 0, Release());
  m.def("sparse_attention_combine", &sparse_attention_combine_op, arg("partial_o"),
        arg("partial_lse"), none("attn_sink"), arg("out"), arg("lse"), arg("stream") = 0,
        Release());
  m.def("sparse_prefill", &sparse_prefill_op, arg("q"), arg("kv"), arg("indices"),
        none("topk_length"), none("attn_sink"), arg("softmax_scale"), arg("d_v"), arg("out"),
        arg("max_logits"), arg("lse"), arg("stream") = 0, Release());
  m.def("dequantize_and_gather", &dequantize_and_gather_op, arg("cache"), arg("layout"),
        arg("block_size"), arg("tensor_scale"), arg("block_table"), arg("seq_lens"),
        none("gather_lens"), arg("offset"), arg("workspace"), arg("stream") = 0, Release());
  m.def("grouped_wo_a", &grouped_wo_a_op, arg("o"), none("o_scale"), arg("wo_a"),
        none("wo_a_scale"), arg("z"), arg("stream") = 0, Release());
}

}  // namespace dsv4::python
