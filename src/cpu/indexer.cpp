// The CPU kernels of entry selection (docs/spec.md §5): the indexer query's per-row step, the scores
// over the FP8 key cache, the top-k, and the C128A plan. Sums follow indexer_math.h's fixed order.
#include <algorithm>
#include <limits>
#include <vector>

#include "cpu/indexer_rows.h"
#include "cpu/kernels.h"
#include "cpu/rows.h"
#include "dsv4/fp8_block.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/indexer_math.h"
#include "math/hadamard.h"

namespace dsv4::cpu {

namespace {

constexpr int kKeyDim = indexer_keys::kDim;

using indexer_math::visible_entries;

void store_len(const TensorView& lens, int64_t t, int64_t n) {
  if (lens.defined()) lens.ptr<int32_t>()[t * lens.stride(0)] = static_cast<int32_t>(n);
}

// Positions must be >= 0 and every token's visible count must fit in `cols` columns.
void check_visible_fit(const char* where, const char* cols_name, const TensorView& positions,
                       int ratio, int64_t cols) {
  for (int64_t t = 0; t < positions.size(0); ++t) {
    const int64_t p = load_index(positions, t);
    if (p < 0) fail_expected(where, detail::concat("positions[", t, "]"), ">= 0", p);
    if (visible_entries(p, ratio) > cols)
      fail_expected(where, cols_name,
                    detail::concat(">= ", visible_entries(p, ratio),
                                   " (entries visible at positions[", t, "] = ", p, ")"),
                    cols);
  }
}

}  // namespace

void indexer_query_rows(const TensorView& q, const TensorView& positions,
                        const TensorView& cos_sin, const TensorView& q_fp8,
                        const TensorView& q_scale, const TensorView& weights, Stream stream) {
  const int64_t T = q_fp8.size(0), H = q_fp8.size(1);
  if (T == 0) return;
  // The projected rows as heads: RoPE rotates the last dims of each head.
  const TensorView heads(q.data, DType::fp32, {T, H, int64_t{kKeyDim}});
  cpu::apply_rope(heads, positions, cos_sin, /*inverse=*/false, heads, stream);
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

void indexer_scores(const TensorView& q_fp8, const TensorView& q_scale, const TensorView& weights,
                    const TensorView& positions, const TensorView& token_to_req,
                    const IndexerKeyCacheView& keys, const TensorView& key_block_table, int ratio,
                    const TensorView& scores, Stream /*stream*/) {
  constexpr const char* kOp = "indexer_scores";
  const int64_t T = q_fp8.size(0), H = q_fp8.size(1);
  // Data: request rows in range, the visible entries fit in `scores`, and every visible entry's
  // key is mapped. Also collects how many keys of each request the batch reads.
  const int64_t N = scores.size(1), R = key_block_table.size(0), B = keys.block_size;
  check_visible_fit(kOp, "scores.shape[1]", positions, ratio, N);
  // Per-request work is sized by the requests the batch's tokens belong to (each once, sorted),
  // not by the table's rows: a broadcast (stride 0) table may have any number of them.
  std::vector<int64_t> batch_reqs;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t q = load_index(token_to_req, t);
    if (q < 0 || q >= R)
      fail_expected(kOp, detail::concat("token_to_req[", t, "]"),
                    detail::concat("in [0, ", R, ") (rows of key_block_table)"), q);
    batch_reqs.push_back(q);
  }
  std::sort(batch_reqs.begin(), batch_reqs.end());
  batch_reqs.erase(std::unique(batch_reqs.begin(), batch_reqs.end()), batch_reqs.end());
  auto slot_of = [&](int64_t q) {
    return static_cast<size_t>(std::lower_bound(batch_reqs.begin(), batch_reqs.end(), q) -
                               batch_reqs.begin());
  };
  std::vector<int64_t> keys_needed(batch_reqs.size(), 0);
  for (int64_t t = 0; t < T; ++t) {
    int64_t& needed = keys_needed[slot_of(load_index(token_to_req, t))];
    needed = std::max(needed, visible_entries(load_index(positions, t), ratio));
  }
  auto key_block = [&](int64_t q, int64_t j) -> int64_t {  // block id, or -1 if unmapped
    const int64_t k = j / B;
    if (k >= key_block_table.size(1)) return -1;
    const int32_t b =
        key_block_table
            .ptr<int32_t>()[q * key_block_table.stride(0) + k * key_block_table.stride(1)];
    return (b < 0 || b >= keys.data.size(0)) ? -1 : b;
  };
  for (size_t s = 0; s < batch_reqs.size(); ++s)
    for (int64_t j = 0, q = batch_reqs[s]; j < keys_needed[s]; j += B)
      if (key_block(q, j) < 0)
        fail(kOp, ": key_block_table: entry ", j, " of request ", q,
             " is visible but its block is not mapped to the key cache (", keys.data.size(0),
             " blocks)");

  // Decode each request's visible keys once: fp8 codes as floats + the entry scale.
  const float* fp8 = fp8_e4m3_table();
  std::vector<std::vector<float>> key_codes(batch_reqs.size());
  std::vector<std::vector<float>> key_scales(batch_reqs.size());
  for (size_t s = 0; s < batch_reqs.size(); ++s) {
    const int64_t q = batch_reqs[s];
    key_codes[s].resize(static_cast<size_t>(keys_needed[s] * kKeyDim));
    key_scales[s].resize(static_cast<size_t>(keys_needed[s]));
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < keys_needed[s]; ++j) {
      const uint8_t* block = keys.data.ptr<uint8_t>() + key_block(q, j) * keys.data.stride(0);
      const int off = static_cast<int>(j % B);
      const uint8_t* codes = indexer_key_codes(block, off);
      for (int d = 0; d < kKeyDim; ++d) key_codes[s][j * kKeyDim + d] = fp8[codes[d]];
      key_scales[s][j] = indexer_key_scale(block, keys.block_size, off);
    }
  }

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < T; ++t) {
    const size_t q = slot_of(load_index(token_to_req, t));
    const int64_t visible = visible_entries(load_index(positions, t), ratio);
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

void indexer_topk(const TensorView& scores, const TensorView& positions, int ratio,
                  const TensorView& indices, const TensorView& lens, Stream /*stream*/,
                  TopkOrder order) {
  const int64_t T = scores.size(0), N = scores.size(1), K = indices.size(1);
  check_visible_fit("indexer_topk", "scores.shape[1]", positions, ratio, N);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < T; ++t) {
    const float* s = scores.ptr<float>() + t * scores.stride(0);
    const int64_t visible = visible_entries(load_index(positions, t), ratio);
    const int64_t count = std::min(K, visible);
    // Descending score, NaN below everything, ties → lowest index: a strict total order, so
    // the selection is deterministic.
    // The order is indexer_math::topk_key's, the one the CUDA top-k selects by.
    auto before = [s](int32_t a, int32_t b) {
      const uint32_t ka = indexer_math::topk_key(s[a]), kb = indexer_math::topk_key(s[b]);
      return ka != kb ? ka < kb : a < b;
    };
    std::vector<int32_t> ranked(static_cast<size_t>(visible));
    for (int64_t j = 0; j < visible; ++j) ranked[j] = static_cast<int32_t>(j);
    const auto selected_end = ranked.begin() + count;
    if (order == TopkOrder::score) {
      std::partial_sort(ranked.begin(), selected_end, ranked.end(), before);
    } else {
      // The same `count` first entries of that order, as a set, then written by column.
      std::nth_element(ranked.begin(), selected_end, ranked.end(), before);
      std::sort(ranked.begin(), selected_end);
    }
    int32_t* out = indices.ptr<int32_t>() + t * indices.stride(0);
    std::copy(ranked.begin(), selected_end, out);
    std::fill(out + count, out + K, -1);
    store_len(lens, t, count);
  }
}

void compressed_prefix_indices(const TensorView& positions, int ratio, const TensorView& indices,
                               const TensorView& lens, Stream /*stream*/) {
  const int64_t T = positions.size(0), K = indices.size(1);
  check_visible_fit("compressed_prefix_indices", "indices.shape[1]", positions, ratio, K);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t count = visible_entries(load_index(positions, t), ratio);
    int32_t* out = indices.ptr<int32_t>() + t * indices.stride(0);
    for (int64_t j = 0; j < K; ++j) out[j] = j < count ? static_cast<int32_t>(j) : -1;
    store_len(lens, t, count);
  }
}

}  // namespace dsv4::cpu
