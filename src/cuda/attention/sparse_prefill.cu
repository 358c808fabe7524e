// Host dispatch of the CUDA sparse prefill (docs/spec.md §6): checks what the kernel relies on (device,
// dtypes, shapes, 16-byte aligned rows), encodes the q and out tensor maps, picks the d_qk
// instantiation and launches on the caller's stream. No allocation, no synchronization.
//
// Strides: every tensor may have any strides whose last dim is contiguous. q and out travel
// through TMA (a descriptor's strides are multiples of 16 bytes) and kv rows are gathered in
// 16-byte chunks, so the strides of q's and out's [s_q, H] dims and kv's row stride must be
// multiples of 8 elements, with 16-byte aligned base pointers. indices, max_logits and lse: any
// strides (last dim contiguous). work_counter (optional): its first element is the items' counter.
#include "cuda/attention/sparse_prefill.h"

#include <cmath>
#include <cstdint>

#include "cuda/attention/aligned_rows.h"
#include "cuda/attention/sparse_prefill/config.h"
#include "cuda/common/device_props.h"
#include "cuda/common/tma.h"
#include "dsv4/status.h"
#include "dsv4/tensor.h"
#include "math/softmax_scale.h"

namespace dsv4::cuda {
namespace {

constexpr const char* kOp = "sparse_prefill";

// The byte strides of dims 1 and 0 of a [s_q, H, d] bf16 tensor for its tensor map (dims
// innermost first), size-1 dims given their dense stride.
void tma_strides(const TensorView& t, uint64_t (&bytes)[2]) {
  bytes[0] = static_cast<uint64_t>(effective_stride(t, 1)) * 2;
  bytes[1] = static_cast<uint64_t>(effective_stride(t, 0)) * 2;
}

}  // namespace

void sparse_prefill_with_schedule(const SparsePrefillArgs& a, Stream stream, SparsePrefillSchedule schedule) {
  const TensorView* required[] = {&a.q, &a.kv, &a.indices, &a.out, &a.max_logits, &a.lse};
  const char* names[] = {"q", "kv", "indices", "out", "max_logits", "lse"};
  for (int i = 0; i < 6; ++i) {
    check_defined(kOp, names[i], *required[i]);
    check_device(kOp, names[i], *required[i], Device::cuda);
  }
  check_dtype(kOp, "q", a.q, DType::bf16);
  check_ndim(kOp, "q", a.q, 3);
  const int64_t s_q = a.q.size(0), heads = a.q.size(1), d_qk = a.q.size(2);
  DSV4_CHECK(d_qk == 512 || d_qk == 576, kOp, ": q.shape[2] (d_qk): expected 512 or 576, got ", d_qk);
  DSV4_CHECK_EQ(kOp, "d_v", 512, a.d_v);
  check_aligned_rows(kOp, "q", a.q, 2, "q is loaded by TMA");

  check_dtype(kOp, "kv", a.kv, DType::bf16);
  check_ndim(kOp, "kv", a.kv, 3);
  check_dim(kOp, "kv", a.kv, 1, 1);
  check_dim(kOp, "kv", a.kv, 2, d_qk);
  check_aligned_rows(kOp, "kv", a.kv, 1, "kv rows are gathered in 16-byte chunks");
  const int64_t s_kv = a.kv.size(0);

  check_dtype(kOp, "indices", a.indices, DType::int32);
  check_ndim(kOp, "indices", a.indices, 3);
  check_dim(kOp, "indices", a.indices, 0, s_q);
  check_dim(kOp, "indices", a.indices, 1, 1);
  check_inner_contiguous(kOp, "indices", a.indices);
  const int64_t topk = a.indices.size(2);

  if (a.topk_length.defined()) {
    check_device(kOp, "topk_length", a.topk_length, Device::cuda);
    check_dtype(kOp, "topk_length", a.topk_length, DType::int32);
    check_shape(kOp, "topk_length", a.topk_length, {s_q});
    check_contiguous(kOp, "topk_length", a.topk_length);
  }
  if (a.attn_sink.defined()) {
    check_device(kOp, "attn_sink", a.attn_sink, Device::cuda);
    check_dtype(kOp, "attn_sink", a.attn_sink, DType::fp32);
    check_shape(kOp, "attn_sink", a.attn_sink, {heads});
    check_contiguous(kOp, "attn_sink", a.attn_sink);
  }
  check_dtype(kOp, "out", a.out, DType::bf16);
  check_shape(kOp, "out", a.out, {s_q, heads, 512});
  check_aligned_rows(kOp, "out", a.out, 2, "out is stored by TMA and 16-byte stores");
  for (const auto* t : {&a.max_logits, &a.lse}) {
    const char* name = t == &a.lse ? "lse" : "max_logits";
    check_dtype(kOp, name, *t, DType::fp32);
    check_shape(kOp, name, *t, {s_q, heads});
    check_inner_contiguous(kOp, name, *t);
  }
  // The front doors' rule (math/softmax_scale.h), checked here too for callers of this entry.
  if (!math::is_valid_softmax_scale(a.softmax_scale))
    fail_expected(kOp, "softmax_scale", math::kSoftmaxScaleRule, a.softmax_scale);
  const float scale = math::effective_softmax_scale(a.softmax_scale, d_qk);
  const int64_t head_groups = (heads + kSparsePrefillHeadsPerItem - 1) / kSparsePrefillHeadsPerItem;
  DSV4_CHECK((head_groups == 0 || s_q <= (int64_t{1} << 30) / head_groups) && s_kv < (int64_t{1} << 31) &&
                 topk < (int64_t{1} << 30),
             kOp, ": sizes exceed the kernel's 32-bit index range");
  if (a.work_counter.defined()) {
    check_device(kOp, "work_counter", a.work_counter, Device::cuda);
    check_dtype(kOp, "work_counter", a.work_counter, DType::int32);
    DSV4_CHECK(a.work_counter.numel() >= 1, kOp, ": work_counter: expected at least one element");
  }
  if (s_q == 0 || heads == 0) return;

  sparse_prefill_detail::Params p{};
  p.kv = a.kv.data;
  p.kv_row_stride = a.kv.stride(0);
  p.indices = a.indices.ptr<const int32_t>();
  p.topk_length = a.topk_length.defined() ? a.topk_length.ptr<const int32_t>() : nullptr;
  p.attn_sink = a.attn_sink.defined() ? a.attn_sink.ptr<const float>() : nullptr;
  p.out = a.out.data;
  p.max_logits = a.max_logits.ptr<float>();
  p.lse = a.lse.ptr<float>();
  p.s_q = static_cast<int>(s_q);
  p.num_heads = static_cast<int>(heads);
  p.s_kv = static_cast<int>(s_kv);
  p.topk = static_cast<int>(topk);
  p.indices_row_stride = a.indices.stride(0);
  p.out_stride_s = a.out.stride(0);
  p.out_stride_h = a.out.stride(1);
  p.ml_stride_s = a.max_logits.stride(0);
  p.ml_stride_h = a.max_logits.stride(1);
  p.lse_stride_s = a.lse.stride(0);
  p.lse_stride_h = a.lse.stride(1);
  p.scale_log2 = scale * math::kLog2e;
  // The counter the CTAs take the launch's last items from (sparse_prefill/work_item.cuh; zeroed
  // by the launch, kernel.cuh).
  p.work_counter = a.work_counter.defined() ? a.work_counter.ptr<int>() : nullptr;
  {
    const uint64_t q_dims[3] = {static_cast<uint64_t>(d_qk), static_cast<uint64_t>(heads), static_cast<uint64_t>(s_q)};
    uint64_t q_strides[2];
    tma_strides(a.q, q_strides);
    // 64 dims (one 128-byte swizzle span) × one item's heads × one token.
    const uint32_t q_box[3] = {64, kSparsePrefillHeadsPerItem, 1};
    p.q_map = make_tensor_map_bf16_sw128(kOp, a.q.data, 3, q_dims, q_strides, q_box);
    const uint64_t out_dims[3] = {512, static_cast<uint64_t>(heads), static_cast<uint64_t>(s_q)};
    uint64_t out_strides[2];
    tma_strides(a.out, out_strides);
    p.out_map = make_tensor_map_bf16_sw128(kOp, a.out.data, 3, out_dims, out_strides, q_box);
  }

  const SparsePrefillSchedule chosen =
      schedule == SparsePrefillSchedule::kAuto
          ? sparse_prefill_auto_schedule(heads, topk, !a.topk_length.defined(), s_kv * d_qk * 2,
                                        current_device_l2_bytes(kOp))
          : schedule;
#if defined(DSV4_HAVE_CUTLASS)
  if (d_qk == 512) sparse_prefill_detail::launch<512>(p, chosen, stream);
  else sparse_prefill_detail::launch<576>(p, chosen, stream);
#else
  (void)stream;
  (void)chosen;
  fail(kOp, ": the CUDA kernel needs the CUTLASS/CuTe headers (third_party/cutlass), not found at build time");
#endif
}

void sparse_prefill(const SparsePrefillArgs& args, Stream stream) {
  sparse_prefill_with_schedule(args, stream, SparsePrefillSchedule::kAuto);
}

}  // namespace dsv4::cuda
