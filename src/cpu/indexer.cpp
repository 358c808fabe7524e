// CPU reference of entry selection (SPEC §5): the C4A indexer's queries, scores and top-k, and
// the C128A "every emitted entry" plan.
#include "dsv4/indexer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu/backend.h"
#include "math/hadamard.h"
#include "cpu/indexer_rows.h"
#include "cpu/rows.h"
#include "cpu/validate.h"
#include "dsv4/fp8_block.h"
#include "dsv4/indexer_math.h"
#if defined(DSV4_WITH_CUDA)
#include "cuda/gemm/cublaslt_matmul.h"
#include "cuda/indexer/indexer.h"
#endif

namespace dsv4 {

namespace {

constexpr int kKeyDim = indexer_keys::kDim;

using indexer_math::visible_entries;

void check_ratio(const char* where, int ratio) {
  if (ratio < 1) fail_expected(where, "ratio", ">= 1", ratio);
}

// Positions must be >= 0 and every token's visible count must fit in `cols` columns.
void check_visible_fit(const char* where, const char* cols_name, const TensorView& positions,
                       int ratio, int64_t cols) {
  for (int64_t t = 0; t < positions.size(0); ++t) {
    const int64_t p = cpu::load_index(positions, t);
    if (p < 0) fail_expected(where, detail::concat("positions[", t, "]"), ">= 0", p);
    if (visible_entries(p, ratio) > cols)
      fail_expected(where, cols_name,
                    detail::concat(">= ", visible_entries(p, ratio),
                                   " (entries visible at positions[", t, "] = ", p, ")"),
                    cols);
  }
}

// An int32 [T, K] index output and its optional int32 [T] lengths.
void check_index_output(const char* where, const TensorView& indices, const TensorView& lens,
                        int64_t T) {
  check_defined(where, "indices", indices);
  check_dtype(where, "indices", indices, DType::int32);
  check_ndim(where, "indices", indices, 2);
  check_dim(where, "indices", indices, 0, T);
  cpu::check_output_layout(where, "indices", indices);
  if (lens.defined()) {
    check_dtype(where, "lens", lens, DType::int32);
    check_shape(where, "lens", lens, {T});
    cpu::check_distinct_elements(where, "lens", lens);  // any stride: both backends honour it
  }
}

void store_len(const TensorView& lens, int64_t t, int64_t n) {
  if (lens.defined()) lens.ptr<int32_t>()[t * lens.stride(0)] = static_cast<int32_t>(n);
}

// A caller-provided workspace on CUDA: uint8, 1-d, contiguous, 16-byte aligned, >= `bytes`.
[[maybe_unused]] void check_cuda_workspace(const char* where, const TensorView& workspace, int64_t bytes) {
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

namespace cpu {

void indexer_query_rows(const TensorView& q, const TensorView& positions,
                        const TensorView& cos_sin, const TensorView& q_fp8,
                        const TensorView& q_scale, const TensorView& weights) {
  const int64_t T = q.size(0), H = q.size(1);
  if (T == 0) return;
  apply_rope(q, positions, cos_sin, /*inverse=*/false, q);
  const float w_scale = indexer_math::indexer_weight_scale(H);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float* v = q.ptr<float>() + (t * H + h) * kKeyDim;
      math::hadamard_rotate(v, kKeyDim);
      uint8_t* codes = q_fp8.ptr<uint8_t>() + t * q_fp8.stride(0) + h * q_fp8.stride(1);
      q_scale.ptr<float>()[t * q_scale.stride(0) + h] =
          exp2_int(fp8_quantize_block(v, kKeyDim, codes));
      float& w = weights.ptr<float>()[t * weights.stride(0) + h];
      w = w * w_scale;
    }
  }
}

}  // namespace cpu


void indexer_query(const TensorView& qr, const TensorView& qr_scale, const TensorView& wq_b,
                   const TensorView& wq_b_scale, const TensorView& x,
                   const TensorView& weights_proj, const TensorView& positions,
                   const TensorView& cos_sin, const TensorView& q_fp8, const TensorView& q_scale,
                   const TensorView& weights, const TensorView& workspace, Stream stream) {
  constexpr const char* kOp = "indexer_query";
  (void)stream;
  check_defined(kOp, "qr", qr);
  check_ndim(kOp, "qr", qr, 2);
  cpu::check_dtype_in(kOp, "qr", qr, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  cpu::check_row_strided(kOp, "qr", qr);
  cpu::check_activation_scale(kOp, "qr", qr, "qr_scale", qr_scale);
  const int64_t T = qr.size(0), q_lora = qr.size(1);
  check_defined(kOp, "wq_b", wq_b);
  check_ndim(kOp, "wq_b", wq_b, 2);
  cpu::check_dtype_in(kOp, "wq_b", wq_b, {DType::bf16, DType::fp32, DType::fp8_e4m3});
  if (wq_b.size(0) % kKeyDim != 0 || wq_b.size(0) == 0)
    fail_expected(kOp, "wq_b.shape[0]", "a positive multiple of 128 (H_I x 128)", wq_b.size(0));
  const int64_t H = wq_b.size(0) / kKeyDim;
  check_dim(kOp, "wq_b", wq_b, 1, q_lora);
  cpu::check_row_strided(kOp, "wq_b", wq_b);
  cpu::check_weight_scale(kOp, "wq_b", wq_b, "wq_b_scale", wq_b_scale,
                          {(H * kKeyDim + 127) / 128, (q_lora + 127) / 128});
  check_defined(kOp, "x", x);
  check_ndim(kOp, "x", x, 2);
  check_dim(kOp, "x", x, 0, T);
  cpu::check_dtype_in(kOp, "x", x, {DType::bf16, DType::fp32});
  cpu::check_row_strided(kOp, "x", x);
  check_defined(kOp, "weights_proj", weights_proj);
  cpu::check_dtype_in(kOp, "weights_proj", weights_proj, {DType::bf16, DType::fp32});
  check_shape(kOp, "weights_proj", weights_proj, {H, x.size(1)});
  cpu::check_row_strided(kOp, "weights_proj", weights_proj);
  cpu::check_index_vector(kOp, "positions", positions, T);
  check_defined(kOp, "cos_sin", cos_sin);
  check_dtype(kOp, "cos_sin", cos_sin, DType::fp32);
  check_ndim(kOp, "cos_sin", cos_sin, 2);
  const int64_t R = cos_sin.size(1);
  if (R <= 0 || R > kKeyDim || R % 2 != 0)
    fail_expected(kOp, "cos_sin.shape[1]", "even, in (0, 128] (rope dims)", R);
  cpu::check_row_strided(kOp, "cos_sin", cos_sin);
  check_defined(kOp, "q_fp8", q_fp8);
  check_dtype(kOp, "q_fp8", q_fp8, DType::fp8_e4m3);
  check_shape(kOp, "q_fp8", q_fp8, {T, H, kKeyDim});
  cpu::check_output_layout(kOp, "q_fp8", q_fp8);
  for (const auto& [name, out] : {std::pair<const char*, const TensorView&>{"q_scale", q_scale},
                                  std::pair<const char*, const TensorView&>{"weights", weights}}) {
    check_defined(kOp, name, out);
    check_dtype(kOp, name, out, DType::fp32);
    check_shape(kOp, name, out, {T, H});
    cpu::check_output_layout(kOp, name, out);
  }
  cpu::check_outputs_disjoint(
      kOp, {{"q_fp8", q_fp8}, {"q_scale", q_scale}, {"weights", weights}},
      {{"qr", qr}, {"qr_scale", qr_scale}, {"wq_b", wq_b}, {"wq_b_scale", wq_b_scale}, {"x", x},
       {"weights_proj", weights_proj}, {"positions", positions}, {"cos_sin", cos_sin},
       {"workspace", workspace}});
  const Device dev = cpu::common_device(kOp, {{"qr", qr},
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
  if (dev == Device::cuda) {
#if defined(DSV4_WITH_CUDA)
    // The CUDA dsv4::linear's rules (like operands; FP8 with fp32 scales in cuBLASLt's layouts),
    // checked here so the errors name this op's arguments.
    cuda::check_matmul_dtypes(kOp, "qr", qr, "qr_scale", qr_scale, "wq_b", wq_b, "wq_b_scale",
                              wq_b_scale, "q (fp32)", TensorView(nullptr, DType::fp32, {0}, Device::cuda));
    if (qr.dtype == DType::fp8_e4m3) {
      cuda::check_act_scale_layout(kOp, "qr_scale", qr_scale);
      cuda::check_weight_scale_layout(kOp, "wq_b_scale", wq_b_scale.size(0), wq_b_scale.size(1),
                                      wq_b_scale.stride(0), wq_b_scale.stride(1), q_lora);
    }
    if (weights_proj.dtype != x.dtype)
      fail(kOp, ": weights_proj.dtype: expected the dtype of x (", dtype_name(x.dtype),
           ") on CUDA, got ", dtype_name(weights_proj.dtype));
    check_cuda_workspace(kOp, workspace,
                         indexer_query_workspace_bytes(T, static_cast<int>(H), kKeyDim));
    if (T == 0) return;
    cuda::indexer_query(qr, qr_scale, wq_b, wq_b_scale, x, weights_proj, positions, cos_sin, q_fp8,
                        q_scale, weights, workspace, stream);
    return;
#else
    cpu::throw_cuda_unavailable(kOp);
#endif
  }
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = cpu::load_index(positions, t);
    if (p < 0 || p >= cos_sin.size(0))
      fail_expected(kOp, detail::concat("positions[", t, "]"),
                    detail::concat("in [0, ", cos_sin.size(0), ") (rows of cos_sin)"), p);
  }
  if (T == 0) return;

  // Validation is complete (nothing below fails), so `weights` can take the raw projection.
  HostTensor q(DType::fp32, {T, H, int64_t{kKeyDim}});
  linear(qr, qr_scale, wq_b, wq_b_scale, TensorView(q.data<float>(), DType::fp32, {T, H * kKeyDim}));
  linear(x, {}, weights_proj, {}, weights);
  cpu::indexer_query_rows(q, positions, cos_sin, q_fp8, q_scale, weights);
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
                    const TensorView& scores, [[maybe_unused]] Stream stream) {
  constexpr const char* kOp = "indexer_scores";
  check_ratio(kOp, ratio);
  check_defined(kOp, "q_fp8", q_fp8);
  check_dtype(kOp, "q_fp8", q_fp8, DType::fp8_e4m3);
  check_ndim(kOp, "q_fp8", q_fp8, 3);
  check_dim(kOp, "q_fp8", q_fp8, 2, kKeyDim);
  cpu::check_row_strided(kOp, "q_fp8", q_fp8);
  const int64_t T = q_fp8.size(0), H = q_fp8.size(1);
  for (const auto& [name, in] : {std::pair<const char*, const TensorView&>{"q_scale", q_scale},
                                 std::pair<const char*, const TensorView&>{"weights", weights}}) {
    check_defined(kOp, name, in);
    check_dtype(kOp, name, in, DType::fp32);
    check_shape(kOp, name, in, {T, H});
    cpu::check_row_strided(kOp, name, in);
  }
  cpu::check_index_vector(kOp, "positions", positions, T);
  cpu::check_index_vector(kOp, "token_to_req", token_to_req, T);
  check_indexer_key_cache(kOp, "keys", keys);
  check_defined(kOp, "key_block_table", key_block_table);
  check_dtype(kOp, "key_block_table", key_block_table, DType::int32);
  check_ndim(kOp, "key_block_table", key_block_table, 2);
  check_defined(kOp, "scores", scores);
  check_dtype(kOp, "scores", scores, DType::fp32);
  check_ndim(kOp, "scores", scores, 2);
  check_dim(kOp, "scores", scores, 0, T);
  cpu::check_output_layout(kOp, "scores", scores);
  cpu::check_outputs_disjoint(kOp, {{"scores", scores}},
                              {{"q_fp8", q_fp8}, {"q_scale", q_scale}, {"weights", weights},
                               {"positions", positions}, {"token_to_req", token_to_req},
                               {"keys.data", keys.data}, {"key_block_table", key_block_table}});
  const Device dev = cpu::common_device(kOp, {{"q_fp8", q_fp8},
                                              {"q_scale", q_scale},
                                              {"weights", weights},
                                              {"positions", positions},
                                              {"token_to_req", token_to_req},
                                              {"keys.data", keys.data},
                                              {"key_block_table", key_block_table},
                                              {"scores", scores}});
  if (dev == Device::cuda) {
    DSV4_CUDA_DISPATCH(kOp, cuda::indexer_scores(q_fp8, q_scale, weights, positions, token_to_req,
                                                 keys, key_block_table, ratio, scores, stream));
  }

  // Data: request rows in range, the visible entries fit in `scores`, and every visible entry's
  // key is mapped. Also collects how many keys of each request the batch reads.
  const int64_t N = scores.size(1), R = key_block_table.size(0), B = keys.block_size;
  check_visible_fit(kOp, "scores.shape[1]", positions, ratio, N);
  std::vector<int64_t> keys_needed(static_cast<size_t>(R), 0);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t q = cpu::load_index(token_to_req, t);
    if (q < 0 || q >= R)
      fail_expected(kOp, detail::concat("token_to_req[", t, "]"),
                    detail::concat("in [0, ", R, ") (rows of key_block_table)"), q);
    keys_needed[q] =
        std::max(keys_needed[q], visible_entries(cpu::load_index(positions, t), ratio));
  }
  auto key_block = [&](int64_t q, int64_t j) -> int64_t {  // block id, or -1 if unmapped
    const int64_t k = j / B;
    if (k >= key_block_table.size(1)) return -1;
    const int32_t b =
        key_block_table
            .ptr<int32_t>()[q * key_block_table.stride(0) + k * key_block_table.stride(1)];
    return (b < 0 || b >= keys.data.size(0)) ? -1 : b;
  };
  for (int64_t q = 0; q < R; ++q)
    for (int64_t j = 0; j < keys_needed[q]; j += B)
      if (key_block(q, j) < 0)
        fail(kOp, ": key_block_table: entry ", j, " of request ", q,
             " is visible but its block is not mapped to the key cache (", keys.data.size(0),
             " blocks)");

  // Decode each request's visible keys once: fp8 codes as floats + the entry scale.
  const float* fp8 = cpu::fp8_e4m3_table();
  std::vector<std::vector<float>> key_codes(static_cast<size_t>(R));
  std::vector<std::vector<float>> key_scales(static_cast<size_t>(R));
  for (int64_t q = 0; q < R; ++q) {
    key_codes[q].resize(static_cast<size_t>(keys_needed[q] * kKeyDim));
    key_scales[q].resize(static_cast<size_t>(keys_needed[q]));
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < keys_needed[q]; ++j) {
      const uint8_t* block = keys.data.ptr<uint8_t>() + key_block(q, j) * keys.data.stride(0);
      const int off = static_cast<int>(j % B);
      const uint8_t* codes = indexer_key_codes(block, off);
      for (int d = 0; d < kKeyDim; ++d) key_codes[q][j * kKeyDim + d] = fp8[codes[d]];
      key_scales[q][j] = indexer_key_scale(block, keys.block_size, off);
    }
  }

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t q = cpu::load_index(token_to_req, t);
    const int64_t visible = visible_entries(cpu::load_index(positions, t), ratio);
    std::vector<float> qf(static_cast<size_t>(H * kKeyDim));
    for (int64_t h = 0; h < H; ++h) {
      const uint8_t* codes = q_fp8.ptr<uint8_t>() + t * q_fp8.stride(0) + h * q_fp8.stride(1);
      for (int d = 0; d < kKeyDim; ++d) qf[h * kKeyDim + d] = fp8[codes[d]];
    }
    const float* qs = q_scale.ptr<float>() + t * q_scale.stride(0);
    const float* w = weights.ptr<float>() + t * weights.stride(0);
    float* out = scores.ptr<float>() + t * scores.stride(0);
    for (int64_t j = 0; j < visible; ++j) {
      const float* k = key_codes[q].data() + j * kKeyDim;
      float score = 0.0f;
      for (int64_t h = 0; h < H; ++h) {
        // The fixed CPU order of indexer_math.h (CUDA sums on tensor cores: indexer.h tolerance).
        const float dot = indexer_math::dot128(qf.data() + h * kKeyDim, k);
        score += indexer_math::head_term(w[h], dot, qs[h], key_scales[q][j]);
      }
      out[j] = score;
    }
    std::fill(out + visible, out + N, -std::numeric_limits<float>::infinity());
  }
}

// ================================ top-k ======================================================

void indexer_topk(const TensorView& scores, const TensorView& positions, int ratio,
                  const TensorView& indices, const TensorView& lens,
                  [[maybe_unused]] Stream stream) {
  constexpr const char* kOp = "indexer_topk";
  check_ratio(kOp, ratio);
  check_defined(kOp, "scores", scores);
  check_dtype(kOp, "scores", scores, DType::fp32);
  check_ndim(kOp, "scores", scores, 2);
  cpu::check_row_strided(kOp, "scores", scores);
  const int64_t T = scores.size(0), N = scores.size(1);
  cpu::check_index_vector(kOp, "positions", positions, T);
  check_index_output(kOp, indices, lens, T);
  cpu::check_outputs_disjoint(kOp, {{"indices", indices}, {"lens", lens}},
                              {{"scores", scores}, {"positions", positions}});
  const Device dev = cpu::common_device(
      kOp, {{"scores", scores}, {"positions", positions}, {"indices", indices}, {"lens", lens}});
  if (dev == Device::cuda) {
    DSV4_CUDA_DISPATCH(kOp, cuda::indexer_topk(scores, positions, ratio, indices, lens, stream));
  }
  check_visible_fit(kOp, "scores.shape[1]", positions, ratio, N);

  const int64_t K = indices.size(1);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < T; ++t) {
    const float* s = scores.ptr<float>() + t * scores.stride(0);
    const int64_t visible = visible_entries(cpu::load_index(positions, t), ratio);
    const int64_t count = std::min(K, visible);
    // Descending score, NaN below everything, ties → lowest index: a strict total order, so
    // the selection is deterministic.
    // The order is indexer_math::topk_key's, the one the CUDA top-k selects by.
    auto before = [s](int32_t a, int32_t b) {
      const uint32_t ka = indexer_math::topk_key(s[a]), kb = indexer_math::topk_key(s[b]);
      return ka != kb ? ka < kb : a < b;
    };
    std::vector<int32_t> order(static_cast<size_t>(visible));
    for (int64_t j = 0; j < visible; ++j) order[j] = static_cast<int32_t>(j);
    std::partial_sort(order.begin(), order.begin() + count, order.end(), before);
    int32_t* out = indices.ptr<int32_t>() + t * indices.stride(0);
    std::copy(order.begin(), order.begin() + count, out);
    std::fill(out + count, out + K, -1);
    store_len(lens, t, count);
  }
}

// ================================ C128A plan =================================================

void compressed_prefix_indices(const TensorView& positions, int ratio, const TensorView& indices,
                               const TensorView& lens, [[maybe_unused]] Stream stream) {
  constexpr const char* kOp = "compressed_prefix_indices";
  check_ratio(kOp, ratio);
  check_defined(kOp, "positions", positions);
  check_ndim(kOp, "positions", positions, 1);
  const int64_t T = positions.size(0);
  cpu::check_index_vector(kOp, "positions", positions, T);
  check_index_output(kOp, indices, lens, T);
  cpu::check_outputs_disjoint(kOp, {{"indices", indices}, {"lens", lens}},
                              {{"positions", positions}});
  const Device dev =
      cpu::common_device(kOp, {{"positions", positions}, {"indices", indices}, {"lens", lens}});
  if (dev == Device::cuda) {
    DSV4_CUDA_DISPATCH(kOp,
                       cuda::compressed_prefix_indices(positions, ratio, indices, lens, stream));
  }
  const int64_t K = indices.size(1);
  check_visible_fit(kOp, "indices.shape[1]", positions, ratio, K);

#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t count = visible_entries(cpu::load_index(positions, t), ratio);
    int32_t* out = indices.ptr<int32_t>() + t * indices.stride(0);
    for (int64_t j = 0; j < K; ++j) out[j] = j < count ? static_cast<int32_t>(j) : -1;
    store_len(lens, t, count);
  }
}

}  // namespace dsv4
