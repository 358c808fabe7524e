// Host side of the CUDA sparse decode: checks what the kernels rely on for memory safety
// (dtypes, shapes, strides, alignment, the workspace), maps the views to kernel parameters and
// launches split-KV attention, then — when the schedule has more than one split — the combine.
// Argument checks of the public API (index ranges etc.) live in the dispatching src/cpu op.
//
// Strides: q, indices, out and lse may have any strides whose last dim is contiguous; q and out
// rows must start 16-byte aligned (strides of their [b, s_q, H] dims multiples of 16 bytes: 8
// elements of a bf16 q or out, 16 of an FP8 q; q rows are read and out rows stored in aligned
// pieces). Caches: any block stride >= the layout's block bytes that is a multiple of 16, bytes
// dense within a block. An FP8 q is converted to bf16(fp8 · q_scale) as the kernels load it.
#include "cuda/attention/sparse_decode.h"

#include <cmath>

#include "cuda/attention/aligned_rows.h"
#include "cuda/attention/combine/combine.h"
#include "cuda/attention/sparse_decode/config.h"
#include "dsv4/status.h"
#include "math/softmax_scale.h"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "sparse_decode";
namespace sd = decode;

// Defined, on the GPU, of `dtype` and `shape`, last dim contiguous (leading dims any strides).
void check_cuda_tensor(const char* where, const char* name, const TensorView& t, DType dtype,
                       std::initializer_list<int64_t> shape) {
  check_defined(where, name, t);
  check_device(where, name, t, Device::cuda);
  check_dtype(where, name, t, dtype);
  check_shape(where, name, t, shape);
  check_inner_contiguous(where, name, t);
}

// A 1-d vector the kernels index directly (topk_length, attn_sink): contiguous.
void check_cuda_vector(const char* where, const char* name, const TensorView& t, DType dtype,
                       int64_t n) {
  check_cuda_tensor(where, name, t, dtype, {n});
  check_contiguous(where, name, t);
}

sd::RowStrides row_strides(const TensorView& t) { return {t.strides[0], t.strides[1], t.strides[2]}; }

// The combine's outputs: out [b, s_q, H, 512] and lse [b, s_q, H], both strided.
void set_combine_outputs(combine::CombineParams& c, const TensorView& out, const TensorView& lse,
                         int64_t s_q) {
  c.out = out.ptr<uint16_t>();
  c.out_b_stride = out.strides[0];
  c.out_s_stride = out.strides[1];
  c.out_h_stride = out.strides[2];
  c.lse = lse.ptr<float>();
  c.lse_b_stride = lse.strides[0];
  c.lse_s_stride = lse.strides[1];
  c.lse_h_stride = lse.strides[2];
  c.s_q = static_cast<int>(s_q);
}

sd::DecodeScope make_scope(const char* name, const KvCacheView& cache, KvLayout layout,
                           const TensorView& indices, const TensorView& topk_length, int64_t b,
                           int64_t s_q) {
  DSV4_CHECK(cache.layout == layout, kOp, ": ", name, ".layout: expected ",
             kv_layout_name(layout), ", got ", kv_layout_name(cache.layout));
  check_defined(kOp, name, cache.data);
  check_device(kOp, name, cache.data, Device::cuda);
  check_dtype(kOp, name, cache.data, DType::uint8);
  check_ndim(kOp, name, cache.data, 2);
  DSV4_CHECK(cache.block_size >= 1, kOp, ": ", name, ".block_size: expected >= 1, got ",
             cache.block_size);
  const int64_t need = kv_geometry(layout, cache.block_size).block_bytes;
  if (cache.data.shape[1] < need) fail_expected(kOp, std::string(name) + ".data.shape[1]", need, cache.data.shape[1]);
  const int64_t block_stride = cache.data.shape[0] > 1 ? cache.data.strides[0] : need;
  DSV4_CHECK(cache.data.strides[1] == 1 && block_stride >= need && block_stride % 16 == 0 &&
                 aligned16(cache.data.data),
             kOp, ": ", name, ": expected 16-byte aligned blocks of dense bytes at least ", need,
             " bytes apart, got base ", cache.data.data, " and strides (", cache.data.strides[0],
             ", ", cache.data.strides[1], ")");
  check_defined(kOp, "indices", indices);
  check_ndim(kOp, "indices", indices, 3);
  check_cuda_tensor(kOp, "indices", indices, DType::int32, {b, s_q, indices.shape[2]});
  sd::DecodeScope scope;
  scope.cache = static_cast<const uint8_t*>(cache.data.data);
  scope.block_stride = block_stride;
  scope.num_slots = cache.data.shape[0] * cache.block_size;
  scope.indices = indices.ptr<const int32_t>();
  scope.indices_b_stride = indices.strides[0];
  scope.indices_s_stride = indices.strides[1];
  scope.block_size = cutlass::FastDivmod(cache.block_size);
  scope.topk = static_cast<int>(indices.shape[2]);
  scope.tensor_scale = cache.tensor_scale;  // FP8_PER_TENSOR's (finite, > 0: check_kv_cache)
  if (topk_length.defined()) {
    check_cuda_vector(kOp, "topk_length", topk_length, DType::int32, b);
    scope.topk_length = topk_length.ptr<const int32_t>();
  }
  return scope;
}

}  // namespace

void sparse_decode(const SparseDecodeArgs& args, const DecodeSchedule& schedule,
                   const TensorView& workspace, Stream stream) {
  const KvLayout layout = args.k_cache.layout;  // every layout; the extra scope's must match
  const int64_t d_qk = kv_geometry(layout, 1).dim;
  check_defined(kOp, "q", args.q);
  check_device(kOp, "q", args.q, Device::cuda);
  const bool q_fp8 = args.q.dtype == DType::fp8_e4m3;
  if (!q_fp8) check_dtype(kOp, "q", args.q, DType::bf16);  // "expected bf16" names the usual dtype
  check_ndim(kOp, "q", args.q, 4);
  const int64_t b = args.q.shape[0], s_q = args.q.shape[1], h = args.q.shape[2];
  check_dim(kOp, "q", args.q, 3, d_qk);
  check_aligned_rows(kOp, "q", args.q, 3, "q rows are read in aligned pieces");
  DSV4_CHECK(std::isfinite(args.q_scale) && args.q_scale > 0.0f && (q_fp8 || args.q_scale == 1.0f),
             kOp, ": q_scale: expected a finite value > 0 (1 for a bf16 q), got ", args.q_scale);
  // (The front door also refuses a scale whose largest query overflows bf16; here it would only
  // give infinite logits, no memory hazard.)
  DSV4_CHECK(h >= 1 && b >= 1 && s_q >= 1, kOp, ": q: expected non-empty, got ", args.q.shape_str());
  DSV4_CHECK(args.d_v == sd::kDv, kOp, ": d_v: expected 512, got ", args.d_v);
  // The front doors' rule (math/softmax_scale.h), checked here too for callers of this entry.
  if (!math::is_valid_softmax_scale(args.softmax_scale))
    fail_expected(kOp, "softmax_scale", math::kSoftmaxScaleRule, args.softmax_scale);

  sd::DecodeParams p;
  p.main = make_scope("k_cache", args.k_cache, layout, args.indices, args.topk_length, b, s_q);
  if (args.extra_k_cache.data.defined()) {
    p.extra = make_scope("extra_k_cache", args.extra_k_cache, layout, args.extra_indices,
                         args.extra_topk_length, b, s_q);
  }
  check_cuda_tensor(kOp, "out", args.out, DType::bf16, {b, s_q, h, sd::kDv});
  check_aligned_rows(kOp, "out", args.out, 3, "out rows are stored in 16-byte pieces");
  check_cuda_tensor(kOp, "lse", args.lse, DType::fp32, {b, s_q, h});
  if (args.attn_sink.defined()) check_cuda_vector(kOp, "attn_sink", args.attn_sink, DType::fp32, h);

  const int64_t topk_total = int64_t{p.main.topk} + p.extra.topk;
  DSV4_CHECK(schedule.num_splits >= 1 && schedule.split_len >= 1 &&
                 int64_t{schedule.num_splits} * schedule.split_len >= topk_total,
             kOp, ": schedule: expected num_splits · split_len >= ", topk_total, ", got ",
             schedule.num_splits, " · ", schedule.split_len);
  const int64_t rows = b * s_q;
  const int64_t partial_o_bytes = rows * h * schedule.num_splits * sd::kDv * 4;
  const int64_t partial_bytes = partial_o_bytes + rows * h * schedule.num_splits * 4;
  if (schedule.num_splits > 1) {
    check_defined(kOp, "workspace", workspace);
    check_device(kOp, "workspace", workspace, Device::cuda);
    const int64_t have = workspace.numel() * static_cast<int64_t>(dtype_size(workspace.dtype));
    if (have < partial_bytes) fail_expected(kOp, "workspace bytes", partial_bytes, have);
    DSV4_CHECK(aligned16(workspace.data), kOp, ": workspace: expected 16-byte alignment");
  }

  p.q = args.q.data;
  p.q_fp8 = q_fp8;
  p.q_scale = args.q_scale;
  p.q_strides = row_strides(args.q);
  p.num_rows = static_cast<int>(rows);
  p.s_q = static_cast<int>(s_q);
  p.num_heads = static_cast<int>(h);
  p.topk_total = static_cast<int>(topk_total);
  p.num_splits = schedule.num_splits;
  p.split_len = schedule.split_len;
  const float scale = math::effective_softmax_scale(args.softmax_scale, d_qk);
  p.scale_log2 = scale * math::kLog2e;
  p.out = args.out.ptr<uint16_t>();
  p.out_strides = row_strides(args.out);
  p.lse = args.lse.ptr<float>();
  p.lse_strides = row_strides(args.lse);
  p.sink = args.attn_sink.defined() ? args.attn_sink.ptr<const float>() : nullptr;
  if (schedule.num_splits > 1) {
    p.partial_o = workspace.ptr<float>();
    p.partial_lse = reinterpret_cast<float*>(workspace.ptr<uint8_t>() + partial_o_bytes);
  }

  switch (layout) {
    case KvLayout::model1_fp8: sd::launch_sparse_decode<KvLayout::model1_fp8>(p, stream); break;
    case KvLayout::v32_fp8: sd::launch_sparse_decode<KvLayout::v32_fp8>(p, stream); break;
    case KvLayout::bf16: sd::launch_sparse_decode<KvLayout::bf16>(p, stream); break;
    case KvLayout::fp8_per_tensor: sd::launch_sparse_decode<KvLayout::fp8_per_tensor>(p, stream); break;
  }
  if (schedule.num_splits > 1) {
    combine::CombineParams c;
    c.partial_o = p.partial_o;
    c.partial_lse = p.partial_lse;
    c.sink = p.sink;
    set_combine_outputs(c, args.out, args.lse, s_q);
    c.num_rows = rows * h;
    c.num_heads = p.num_heads;
    c.num_splits = schedule.num_splits;
    combine::launch_combine(c, stream);
  }
}

void sparse_attention_combine(const TensorView& partial_o, const TensorView& partial_lse,
                              const TensorView& attn_sink, const TensorView& out,
                              const TensorView& lse, Stream stream) {
  constexpr const char* kCombine = "sparse_attention_combine";
  check_defined(kCombine, "partial_o", partial_o);
  check_ndim(kCombine, "partial_o", partial_o, 5);
  const int64_t b = partial_o.shape[0], s_q = partial_o.shape[1], h = partial_o.shape[2];
  const int64_t splits = partial_o.shape[3];
  check_cuda_tensor(kCombine, "partial_o", partial_o, DType::fp32, {b, s_q, h, splits, sd::kDv});
  check_contiguous(kCombine, "partial_o", partial_o);
  check_cuda_tensor(kCombine, "partial_lse", partial_lse, DType::fp32, {b, s_q, h, splits});
  check_contiguous(kCombine, "partial_lse", partial_lse);
  check_cuda_tensor(kCombine, "out", out, DType::bf16, {b, s_q, h, sd::kDv});
  check_aligned_rows(kCombine, "out", out, 3, "out rows are stored in aligned pieces, as by sparse_decode");
  check_cuda_tensor(kCombine, "lse", lse, DType::fp32, {b, s_q, h});
  if (attn_sink.defined()) check_cuda_vector(kCombine, "attn_sink", attn_sink, DType::fp32, h);
  DSV4_CHECK(aligned16(partial_o.data), kCombine, ": partial_o: expected 16-byte alignment");
  combine::CombineParams c;
  c.partial_o = partial_o.ptr<const float>();
  c.partial_lse = partial_lse.ptr<const float>();
  c.sink = attn_sink.defined() ? attn_sink.ptr<const float>() : nullptr;
  set_combine_outputs(c, out, lse, s_q);
  c.num_rows = b * s_q * h;
  c.num_heads = static_cast<int>(h);
  c.num_splits = static_cast<int>(splits);
  combine::launch_combine(c, stream);
}

}  // namespace dsv4::cuda
