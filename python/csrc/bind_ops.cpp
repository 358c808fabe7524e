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

// Arguments are taken as Python gave them (TensorArg, IntArg: see tensor_args.h) and converted
// here, so a None, a non-tensor or an out-of-range integer is a dsv4::Error naming op and argument.
void linear_op(const TensorArg& x, const TensorArg& x_scale, const TensorArg& w,
               const TensorArg& w_scale, const TensorArg& y, uintptr_t stream) {
  constexpr const char* k = "linear";
  linear(tensor_arg(k, "x", x), optional_tensor_arg(k, "x_scale", x_scale), tensor_arg(k, "w", w),
         optional_tensor_arg(k, "w_scale", w_scale), tensor_arg(k, "y", y), stream_of(stream));
}

void quantize_act_fp8_op(const TensorArg& x, const IntArg& block, const TensorArg& xq,
                         const TensorArg& scale, uintptr_t stream) {
  constexpr const char* k = "quantize_act_fp8";
  quantize_act_fp8(tensor_arg(k, "x", x), int_arg(k, "block", block), tensor_arg(k, "xq", xq),
                   tensor_arg(k, "scale", scale), stream_of(stream));
}

void dequantize_fp8_blocks_op(const TensorArg& x, const TensorArg& scale, const IntArg& block_rows,
                              const IntArg& block_cols, const TensorArg& y, uintptr_t stream) {
  constexpr const char* k = "dequantize_fp8_blocks";
  dequantize_fp8_blocks(tensor_arg(k, "x", x), tensor_arg(k, "scale", scale),
                        int_arg(k, "block_rows", block_rows), int_arg(k, "block_cols", block_cols),
                        tensor_arg(k, "y", y), stream_of(stream));
}

void rms_norm_op(const TensorArg& x, const TensorArg& weight, float eps, const TensorArg& y,
                 uintptr_t stream) {
  constexpr const char* k = "rms_norm";
  rms_norm(tensor_arg(k, "x", x), optional_tensor_arg(k, "weight", weight), eps,
           tensor_arg(k, "y", y), stream_of(stream));
}

void fused_qkv_rms_norm_op(const TensorArg& q_in, const TensorArg& wq, const TensorArg& kv_in,
                           const TensorArg& wkv, float eps, const TensorArg& q_out,
                           const TensorArg& kv_out, uintptr_t stream) {
  constexpr const char* k = "fused_qkv_rms_norm";
  fused_qkv_rms_norm(tensor_arg(k, "q_in", q_in), tensor_arg(k, "wq", wq),
                     tensor_arg(k, "kv_in", kv_in), tensor_arg(k, "wkv", wkv), eps,
                     tensor_arg(k, "q_out", q_out), tensor_arg(k, "kv_out", kv_out),
                     stream_of(stream));
}

void apply_rope_op(const TensorArg& x, const TensorArg& positions, const TensorArg& cos_sin,
                   bool inverse, const TensorArg& y, uintptr_t stream) {
  constexpr const char* k = "apply_rope";
  apply_rope(tensor_arg(k, "x", x), tensor_arg(k, "positions", positions),
             tensor_arg(k, "cos_sin", cos_sin), inverse, tensor_arg(k, "y", y), stream_of(stream));
}

void inv_rope_fp8_quant_op(const TensorArg& o, const TensorArg& positions,
                           const TensorArg& cos_sin, const IntArg& block, const TensorArg& o_fp8,
                           const TensorArg& o_scale, uintptr_t stream) {
  constexpr const char* k = "inv_rope_fp8_quant";
  inv_rope_fp8_quant(tensor_arg(k, "o", o), tensor_arg(k, "positions", positions),
                     tensor_arg(k, "cos_sin", cos_sin), int_arg(k, "block", block),
                     tensor_arg(k, "o_fp8", o_fp8), tensor_arg(k, "o_scale", o_scale),
                     stream_of(stream));
}

// Fills `out` (fp32 host [max_pos, R], contiguous) with build_rope_cache's table.
void rope_cache_op(double theta, const IntArg& rope_dims_arg, bool yarn, double factor,
                   const IntArg& original_seq_len, double beta_fast, double beta_slow,
                   const TensorArg& out) {
  const char* where = "rope_cache";
  const int rope_dims = int_arg(where, "rope_dims", rope_dims_arg);
  const TensorView o = tensor_arg(where, "out", out);
  check_dtype(where, "out", o, DType::fp32);
  check_device(where, "out", o, Device::cpu);
  check_ndim(where, "out", o, 2);
  check_dim(where, "out", o, 1, rope_dims);
  check_contiguous(where, "out", o);
  const RopeConfig cfg{theta, rope_dims, yarn, factor,
                       int64_arg(where, "original_seq_len", original_seq_len), beta_fast,
                       beta_slow};
  const HostTensor table = build_rope_cache(cfg, o.shape[0]);
  std::memcpy(o.data, table.view().data, table.nbytes());
}

void qnorm_rope_kv_insert_op(const TensorArg& q, const TensorArg& kv, const TensorArg& positions,
                             const TensorArg& cos_sin, float eps, const TensorArg& cache,
                             const std::string& layout, const IntArg& block_size,
                             float tensor_scale, const TensorArg& slot_mapping,
                             uintptr_t stream) {
  constexpr const char* k = "qnorm_rope_kv_insert";
  qnorm_rope_kv_insert(tensor_arg(k, "q", q), tensor_arg(k, "kv", kv),
                       tensor_arg(k, "positions", positions), tensor_arg(k, "cos_sin", cos_sin),
                       eps, cache_arg(k, "cache", cache, layout, block_size, tensor_scale),
                       tensor_arg(k, "slot_mapping", slot_mapping), stream_of(stream));
}

std::tuple<int, int, int64_t> decode_schedule_op(const IntArg& b, const IntArg& s_q,
                                                 const IntArg& h, const IntArg& topk_total,
                                                 const IntArg& num_sms, const IntArg& d_v) {
  constexpr const char* k = "make_decode_schedule";
  const DecodeSchedule s = make_decode_schedule(
      int_arg(k, "b", b), int_arg(k, "s_q", s_q), int_arg(k, "h", h),
      int_arg(k, "topk_total", topk_total), int_arg(k, "num_sms", num_sms), int_arg(k, "d_v", d_v));
  return {s.num_splits, s.split_len, s.workspace_bytes};
}

void sparse_decode_op(const TensorArg& q, const TensorArg& k_cache, const std::string& k_layout,
                      const IntArg& k_block_size, const TensorArg& indices,
                      const TensorArg& topk_length, const TensorArg& extra_k_cache,
                      const std::string& extra_layout, const IntArg& extra_block_size,
                      const TensorArg& extra_indices, const TensorArg& extra_topk_length,
                      const TensorArg& attn_sink, float softmax_scale, const IntArg& d_v,
                      const IntArg& num_splits, const IntArg& split_len,
                      const IntArg& workspace_bytes, const TensorArg& workspace,
                      const TensorArg& out, const TensorArg& lse, uintptr_t stream) {
  constexpr const char* k = "sparse_decode";
  SparseDecodeArgs a;
  a.q = tensor_arg(k, "q", q);
  a.k_cache = cache_arg(k, "k_cache", k_cache, k_layout, k_block_size, 1.0f);
  a.indices = tensor_arg(k, "indices", indices);
  a.topk_length = optional_tensor_arg(k, "topk_length", topk_length);
  if (!extra_k_cache.none)
    a.extra_k_cache = cache_arg(k, "extra_k_cache", extra_k_cache, extra_layout, extra_block_size,
                                1.0f);
  a.extra_indices = optional_tensor_arg(k, "extra_indices", extra_indices);
  a.extra_topk_length = optional_tensor_arg(k, "extra_topk_length", extra_topk_length);
  a.attn_sink = optional_tensor_arg(k, "attn_sink", attn_sink);
  a.softmax_scale = softmax_scale;
  a.d_v = int_arg(k, "d_v", d_v);
  a.out = tensor_arg(k, "out", out);
  a.lse = tensor_arg(k, "lse", lse);
  const DecodeSchedule schedule{int_arg(k, "num_splits", num_splits),
                                int_arg(k, "split_len", split_len),
                                int64_arg(k, "workspace_bytes", workspace_bytes)};
  sparse_decode(a, schedule, tensor_arg(k, "workspace", workspace), stream_of(stream));
}

void sparse_attention_combine_op(const TensorArg& partial_o, const TensorArg& partial_lse,
                                 const TensorArg& attn_sink, const TensorArg& out,
                                 const TensorArg& lse, uintptr_t stream) {
  constexpr const char* k = "sparse_attention_combine";
  sparse_attention_combine(tensor_arg(k, "partial_o", partial_o),
                           tensor_arg(k, "partial_lse", partial_lse),
                           optional_tensor_arg(k, "attn_sink", attn_sink), tensor_arg(k, "out", out),
                           tensor_arg(k, "lse", lse), stream_of(stream));
}

void sparse_prefill_op(const TensorArg& q, const TensorArg& kv, const TensorArg& indices,
                       const TensorArg& topk_length, const TensorArg& attn_sink,
                       float softmax_scale, const IntArg& d_v, const TensorArg& out,
                       const TensorArg& max_logits, const TensorArg& lse,
                       const TensorArg& work_counter, uintptr_t stream) {
  constexpr const char* k = "sparse_prefill";
  SparsePrefillArgs a;
  a.q = tensor_arg(k, "q", q);
  a.kv = tensor_arg(k, "kv", kv);
  a.indices = tensor_arg(k, "indices", indices);
  a.topk_length = optional_tensor_arg(k, "topk_length", topk_length);
  a.attn_sink = optional_tensor_arg(k, "attn_sink", attn_sink);
  a.softmax_scale = softmax_scale;
  a.d_v = int_arg(k, "d_v", d_v);
  a.out = tensor_arg(k, "out", out);
  a.max_logits = tensor_arg(k, "max_logits", max_logits);
  a.lse = tensor_arg(k, "lse", lse);
  a.work_counter = optional_tensor_arg(k, "work_counter", work_counter);
  sparse_prefill(a, stream_of(stream));
}

void dequantize_and_gather_op(const TensorArg& cache, const std::string& layout,
                              const IntArg& block_size, float tensor_scale,
                              const TensorArg& block_table, const TensorArg& seq_lens,
                              const TensorArg& gather_lens, const IntArg& offset,
                              const TensorArg& workspace, uintptr_t stream) {
  constexpr const char* k = "dequantize_and_gather";
  dequantize_and_gather(cache_arg(k, "cache", cache, layout, block_size, tensor_scale),
                        tensor_arg(k, "block_table", block_table),
                        tensor_arg(k, "seq_lens", seq_lens),
                        optional_tensor_arg(k, "gather_lens", gather_lens),
                        int64_arg(k, "offset", offset), tensor_arg(k, "workspace", workspace),
                        stream_of(stream));
}

void grouped_wo_a_op(const TensorArg& o, const TensorArg& o_scale, const TensorArg& wo_a,
                     const TensorArg& wo_a_scale, const TensorArg& z, uintptr_t stream) {
  constexpr const char* k = "grouped_wo_a";
  grouped_wo_a(tensor_arg(k, "o", o), optional_tensor_arg(k, "o_scale", o_scale),
               tensor_arg(k, "wo_a", wo_a), optional_tensor_arg(k, "wo_a_scale", wo_a_scale),
               tensor_arg(k, "z", z), stream_of(stream));
}

}  // namespace

void bind_ops(nb::module_& m) {
  // Tensor and integer arguments take any Python object, None included: the op names a wrong one
  // (TensorArg, IntArg).
  const auto any = [](const char* name) { return arg(name).none(); };
  m.def("linear", &linear_op, any("x"), any("x_scale"), any("w"), any("w_scale"), any("y"),
        arg("stream") = 0, Release());
  m.def("quantize_act_fp8", &quantize_act_fp8_op, any("x"), any("block"), any("xq"),
        any("scale"), arg("stream") = 0, Release());
  m.def("dequantize_fp8_blocks", &dequantize_fp8_blocks_op, any("x"), any("scale"),
        any("block_rows"), any("block_cols"), any("y"), arg("stream") = 0, Release());
  m.def("rms_norm", &rms_norm_op, any("x"), any("weight"), arg("eps"), any("y"),
        arg("stream") = 0, Release());
  m.def("fused_qkv_rms_norm", &fused_qkv_rms_norm_op, any("q_in"), any("wq"), any("kv_in"),
        any("wkv"), arg("eps"), any("q_out"), any("kv_out"), arg("stream") = 0, Release());
  m.def("apply_rope", &apply_rope_op, any("x"), any("positions"), any("cos_sin"),
        arg("inverse"), any("y"), arg("stream") = 0, Release());
  m.def("inv_rope_fp8_quant", &inv_rope_fp8_quant_op, any("o"), any("positions"), any("cos_sin"),
        any("block"), any("o_fp8"), any("o_scale"), arg("stream") = 0, Release());
  m.def("rope_cache", &rope_cache_op, arg("theta"), any("rope_dims"), arg("yarn"),
        arg("factor"), any("original_seq_len"), arg("beta_fast"), arg("beta_slow"), any("out"),
        Release());
  m.def("qnorm_rope_kv_insert", &qnorm_rope_kv_insert_op, any("q"), any("kv"),
        any("positions"), any("cos_sin"), arg("eps"), any("cache"), arg("layout"),
        any("block_size"), arg("tensor_scale"), any("slot_mapping"), arg("stream") = 0,
        Release());
  m.def("decode_schedule", &decode_schedule_op, any("b"), any("s_q"), any("h"),
        any("topk_total"), any("num_sms"), any("d_v"),
        "(num_splits, split_len, workspace_bytes) of make_decode_schedule");
  m.def("sparse_decode", &sparse_decode_op, any("q"), any("k_cache"), arg("k_layout"),
        any("k_block_size"), any("indices"), any("topk_length"), any("extra_k_cache"),
        arg("extra_layout"), any("extra_block_size"), any("extra_indices"),
        any("extra_topk_length"), any("attn_sink"), arg("softmax_scale"), any("d_v"),
        any("num_splits"), any("split_len"), any("workspace_bytes"), any("workspace"),
        any("out"), any("lse"), arg("stream") = 0, Release());
  m.def("sparse_attention_combine", &sparse_attention_combine_op, any("partial_o"),
        any("partial_lse"), any("attn_sink"), any("out"), any("lse"), arg("stream") = 0,
        Release());
  m.def("sparse_prefill", &sparse_prefill_op, any("q"), any("kv"), any("indices"),
        any("topk_length"), any("attn_sink"), arg("softmax_scale"), any("d_v"), any("out"),
        any("max_logits"), any("lse"), any("work_counter"), arg("stream") = 0, Release());
  m.def("dequantize_and_gather", &dequantize_and_gather_op, any("cache"), arg("layout"),
        any("block_size"), arg("tensor_scale"), any("block_table"), any("seq_lens"),
        any("gather_lens"), any("offset"), any("workspace"), arg("stream") = 0, Release());
  m.def("grouped_wo_a", &grouped_wo_a_op, any("o"), any("o_scale"), any("wo_a"),
        any("wo_a_scale"), any("z"), arg("stream") = 0, Release());
}

}  // namespace dsv4::python
