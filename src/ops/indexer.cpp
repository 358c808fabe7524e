// Entry selection (docs/spec.md §5): the front doors of the C4A indexer's queries, scores and top-k, and
// of the C128A "every emitted entry" plan. indexer_query is a sequence: two dsv4::linear
// projections, then the backend's per-row step.
#include "dsv4/indexer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu/rows.h"
#include "dsv4/indexer_math.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {

constexpr int kKeyDim = indexer_keys::kDim;

void check_ratio(const char* where, int ratio) {
  if (ratio < 1) fail_expected(where, "ratio", ">= 1", ratio);
}

// An int32 [T, K] index output and its optional int32 [T] lengths.
void check_index_output(const char* where, const TensorView& indices, const TensorView& lens,
                        int64_t T) {
  check_defined(where, "indices", indices);
  check_dtype(where, "indices", indices, DType::int32);
  check_ndim(where, "indices", indices, 2);
  check_dim(where, "indices", indices, 0, T);
  ops::check_output_layout(where, "indices", indices);
  if (lens.defined()) {
    check_dtype(where, "lens", lens, DType::int32);
    check_shape(where, "lens", lens, {T});
    ops::check_distinct_elements(where, "lens", lens);  // any stride: both backends honour it
  }
}

// A caller-provided workspace (device backends: the op allocates nothing there): uint8, 1-d,
// contiguous, 16-byte aligned, >= `bytes`.
void check_workspace(const char* where, const TensorView& workspace, int64_t bytes) {
  check_defined(where, "workspace", workspace);
  check_dtype(where, "workspace", workspace, DType::uint8);
  check_ndim(where, "workspace", workspace, 1);
  check_contiguous(where, "workspace", workspace);
  if (workspace.size(0) < bytes)
    fail_expected(where, "workspace.shape[0]", detail::concat(">= ", bytes, " bytes"),
                  workspace.size(0));
  if (reinterpret_cast<uintptr_t>(workspace.data) % 16 != 0)
    fail(where, ": workspace: expected a 16-byte aligned address");
}

}  // namespace

// ================================ queries ====================================================


void indexer_query(const TensorView& qr, const TensorView& qr_scale, const TensorView& wq_b,
                   const TensorView& wq_b_scale, const TensorView& x,
                   const TensorView& weights_proj, const TensorView& positions,
                   const TensorView& cos_sin, const TensorView& q_fp8, const TensorView& q_scale,
                   const TensorView& weights, const TensorView& workspace, Stream stream) {
  constexpr const char* kOp = "indexer_query";
  check_defined(kOp, "qr", qr);
  check_ndim(kOp, "qr", qr, 2);
  ops::check_dtype_in(kOp, "qr", qr, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  ops::check_row_strided(kOp, "qr", qr);
  ops::check_activation_scale(kOp, "qr", qr, "qr_scale", qr_scale);
  const int64_t T = qr.size(0), q_lora = qr.size(1);
  check_defined(kOp, "wq_b", wq_b);
  check_ndim(kOp, "wq_b", wq_b, 2);
  ops::check_dtype_in(kOp, "wq_b", wq_b, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  if (wq_b.size(0) % kKeyDim != 0 || wq_b.size(0) == 0)
    fail_expected(kOp, "wq_b.shape[0]", "a positive multiple of 128 (H_I x 128)", wq_b.size(0));
  const int64_t H = wq_b.size(0) / kKeyDim;
  check_dim(kOp, "wq_b", wq_b, 1, q_lora);
  ops::check_row_strided(kOp, "wq_b", wq_b);
  ops::check_weight_scale(kOp, "wq_b", wq_b, "wq_b_scale", wq_b_scale,
                          {(H * kKeyDim + 127) / 128, (q_lora + 127) / 128});
  check_defined(kOp, "x", x);
  check_ndim(kOp, "x", x, 2);
  check_dim(kOp, "x", x, 0, T);
  ops::check_dtype_in(kOp, "x", x, {DType::bf16, DType::fp32});
  ops::check_row_strided(kOp, "x", x);
  check_defined(kOp, "weights_proj", weights_proj);
  ops::check_dtype_in(kOp, "weights_proj", weights_proj, {DType::bf16, DType::fp32});
  check_shape(kOp, "weights_proj", weights_proj, {H, x.size(1)});
  ops::check_row_strided(kOp, "weights_proj", weights_proj);
  ops::check_index_vector(kOp, "positions", positions, T);
  check_defined(kOp, "cos_sin", cos_sin);
  check_dtype(kOp, "cos_sin", cos_sin, DType::fp32);
  check_ndim(kOp, "cos_sin", cos_sin, 2);
  const int64_t R = cos_sin.size(1);
  if (R <= 0 || R > kKeyDim || R % 2 != 0)
    fail_expected(kOp, "cos_sin.shape[1]", "even, in (0, 128] (rope dims)", R);
  ops::check_row_strided(kOp, "cos_sin", cos_sin);
  check_defined(kOp, "q_fp8", q_fp8);
  check_dtype(kOp, "q_fp8", q_fp8, DType::fp8_e4m3);
  check_shape(kOp, "q_fp8", q_fp8, {T, H, kKeyDim});
  ops::check_output_layout(kOp, "q_fp8", q_fp8);
  for (const auto& [name, out] : {std::pair<const char*, const TensorView&>{"q_scale", q_scale},
                                  std::pair<const char*, const TensorView&>{"weights", weights}}) {
    check_defined(kOp, name, out);
    check_dtype(kOp, name, out, DType::fp32);
    check_shape(kOp, name, out, {T, H});
    ops::check_output_layout(kOp, name, out);
  }
  ops::check_outputs_disjoint(
      kOp, {{"q_fp8", q_fp8}, {"q_scale", q_scale}, {"weights", weights}},
      {{"qr", qr}, {"qr_scale", qr_scale}, {"wq_b", wq_b}, {"wq_b_scale", wq_b_scale}, {"x", x},
       {"weights_proj", weights_proj}, {"positions", positions}, {"cos_sin", cos_sin},
       {"workspace", workspace}});
  const Device dev = ops::common_device(kOp, {{"qr", qr},
                                              {"qr_scale", qr_scale},
                                              {"wq_b", wq_b},
                                              {"wq_b_scale", wq_b_scale},
                                              {"x", x},
                                              {"weights_proj", weights_proj},
                                              {"positions", positions},
                                              {"cos_sin", cos_sin},
                                              {"q_fp8", q_fp8},
                                              {"q_scale", q_scale},
                                              {"weights", weights},
                                              {"workspace", workspace}});
  ops::IndexerQueryRowsFn* const query_rows = ops::kernel(kOp, ops::kIndexerQuery, dev);
  if (dev == Device::cpu) {
    // Host data: every position has a table row (checked before the projections write).
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = cpu::load_index(positions, t);
      if (p < 0 || p >= cos_sin.size(0))
        fail_expected(kOp, detail::concat("positions[", t, "]"),
                      detail::concat("in [0, ", cos_sin.size(0), ") (rows of cos_sin)"), p);
    }
  } else {
    // On a device the projected q lives in the caller's workspace; dsv4::linear checks the GEMM
    // operands' device rules, and the rows kernel leaves a token with an invalid position alone.
    // The projection's one rule a caller of this op meets is checked here, so the error names
    // this op's argument rather than linear's.
    if (wq_b.dtype != qr.dtype)
      fail_expected(kOp, "wq_b.dtype",
                    detail::concat(dtype_name(qr.dtype), ", qr's dtype (the CUDA GEMMs multiply like "
                                   "operands: quantize qr with quantize_act_fp8 for an fp8 wq_b)"),
                    dtype_name(wq_b.dtype));
    check_workspace(kOp, workspace, indexer_query_workspace_bytes(T, static_cast<int>(H), kKeyDim));
  }
  if (T == 0) return;

  // The two projections (dsv4::linear on the same backend), then the per-row step: RoPE,
  // Hadamard, FP8 of q, and the weights' scale.
  HostTensor host_q;
  if (dev == Device::cpu) host_q = HostTensor(DType::fp32, {T, H * kKeyDim});
  const TensorView q_proj = dev == Device::cpu
                                ? host_q.view()
                                : TensorView(workspace.data, DType::fp32, {T, H * kKeyDim}, dev);
  linear(qr, qr_scale, wq_b, wq_b_scale, q_proj, stream);
  linear(x, {}, weights_proj, {}, weights, stream);
  query_rows(q_proj, positions, cos_sin, q_fp8, q_scale, weights, stream);
}

int64_t indexer_query_workspace_bytes(int64_t T, int index_heads, int head_dim) {
  DSV4_CHECK(T >= 0 && index_heads >= 0 && head_dim >= 0,
             "indexer_query_workspace_bytes: expected T, index_heads, head_dim >= 0, got ", T, ", ",
             index_heads, ", ", head_dim);
  return T * index_heads * head_dim * static_cast<int64_t>(sizeof(float));
}

// ================================ scores =====================================================

void indexer_scores(const TensorView& q_fp8, const TensorView& q_scale, const TensorView& weights,
                    const TensorView& positions, const TensorView& token_to_req,
                    const IndexerKeyCacheView& keys, const TensorView& key_block_table, int ratio,
                    const TensorView& scores, Stream stream) {
  constexpr const char* kOp = "indexer_scores";
  check_ratio(kOp, ratio);
  check_defined(kOp, "q_fp8", q_fp8);
  check_dtype(kOp, "q_fp8", q_fp8, DType::fp8_e4m3);
  check_ndim(kOp, "q_fp8", q_fp8, 3);
  check_dim(kOp, "q_fp8", q_fp8, 2, kKeyDim);
  ops::check_row_strided(kOp, "q_fp8", q_fp8);
  const int64_t T = q_fp8.size(0), H = q_fp8.size(1);
  for (const auto& [name, in] : {std::pair<const char*, const TensorView&>{"q_scale", q_scale},
                                 std::pair<const char*, const TensorView&>{"weights", weights}}) {
    check_defined(kOp, name, in);
    check_dtype(kOp, name, in, DType::fp32);
    check_shape(kOp, name, in, {T, H});
    ops::check_row_strided(kOp, name, in);
  }
  ops::check_index_vector(kOp, "positions", positions, T);
  ops::check_index_vector(kOp, "token_to_req", token_to_req, T);
  check_indexer_key_cache(kOp, "keys", keys);
  check_defined(kOp, "key_block_table", key_block_table);
  check_dtype(kOp, "key_block_table", key_block_table, DType::int32);
  check_ndim(kOp, "key_block_table", key_block_table, 2);
  check_defined(kOp, "scores", scores);
  check_dtype(kOp, "scores", scores, DType::fp32);
  check_ndim(kOp, "scores", scores, 2);
  check_dim(kOp, "scores", scores, 0, T);
  ops::check_output_layout(kOp, "scores", scores);
  ops::check_outputs_disjoint(kOp, {{"scores", scores}},
                              {{"q_fp8", q_fp8}, {"q_scale", q_scale}, {"weights", weights},
                               {"positions", positions}, {"token_to_req", token_to_req},
                               {"keys.data", keys.data}, {"key_block_table", key_block_table}});
  const Device dev = ops::common_device(kOp, {{"q_fp8", q_fp8},
                                              {"q_scale", q_scale},
                                              {"weights", weights},
                                              {"positions", positions},
                                              {"token_to_req", token_to_req},
                                              {"keys.data", keys.data},
                                              {"key_block_table", key_block_table},
                                              {"scores", scores}});
  // The CPU kernel checks the index data before writing; the CUDA one skips what it rejects.
  ops::kernel(kOp, ops::kIndexerScores, dev)(q_fp8, q_scale, weights, positions, token_to_req,
                                             keys, key_block_table, ratio, scores, stream);
}

// ================================ top-k ======================================================

void indexer_topk(const TensorView& scores, const TensorView& positions, int ratio,
                  const TensorView& indices, const TensorView& lens, Stream stream,
                  TopkOrder order) {
  constexpr const char* kOp = "indexer_topk";
  check_ratio(kOp, ratio);
  if (order != TopkOrder::score && order != TopkOrder::column)
    fail_expected(kOp, "order", "TopkOrder::score or TopkOrder::column", static_cast<int>(order));
  check_defined(kOp, "scores", scores);
  check_dtype(kOp, "scores", scores, DType::fp32);
  check_ndim(kOp, "scores", scores, 2);
  ops::check_row_strided(kOp, "scores", scores);
  const int64_t T = scores.size(0);
  ops::check_index_vector(kOp, "positions", positions, T);
  check_index_output(kOp, indices, lens, T);
  ops::check_outputs_disjoint(kOp, {{"indices", indices}, {"lens", lens}},
                              {{"scores", scores}, {"positions", positions}});
  const Device dev = ops::common_device(
      kOp, {{"scores", scores}, {"positions", positions}, {"indices", indices}, {"lens", lens}});
  // The CPU kernel checks the positions' data before writing; the CUDA one skips bad tokens.
  ops::kernel(kOp, ops::kIndexerTopk, dev)(scores, positions, ratio, indices, lens, stream, order);
}

// ================================ C128A plan =================================================

void compressed_prefix_indices(const TensorView& positions, int ratio, const TensorView& indices,
                               const TensorView& lens, Stream stream) {
  constexpr const char* kOp = "compressed_prefix_indices";
  check_ratio(kOp, ratio);
  check_defined(kOp, "positions", positions);
  check_ndim(kOp, "positions", positions, 1);
  const int64_t T = positions.size(0);
  ops::check_index_vector(kOp, "positions", positions, T);
  check_index_output(kOp, indices, lens, T);
  ops::check_outputs_disjoint(kOp, {{"indices", indices}, {"lens", lens}},
                              {{"positions", positions}});
  const Device dev =
      ops::common_device(kOp, {{"positions", positions}, {"indices", indices}, {"lens", lens}});
  // The CPU kernel checks the positions' data before writing; the CUDA one skips bad tokens.
  ops::kernel(kOp, ops::kCompressedPrefixIndices, dev)(positions, ratio, indices, lens, stream);
}

}  // namespace dsv4
