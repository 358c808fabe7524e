// The CPU kernels of the V3.2 indexer's row steps (include/dsv4/sparse_mla_indexer.h; the front
// doors in src/ops validate everything but the index values, which these check as they read them,
// before anything is written).
#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/rope_common.h"
#include "cpu/rows.h"
#include "dsv4/fp8_block.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/indexer_math.h"
#include "math/hadamard.h"
#include "math/rope.h"

namespace dsv4::cpu {

namespace {

constexpr int kDim = indexer_keys::kDim;  // 128: the Hadamard width and the key cache's entry

// NeoX-style RoPE on v[0 .. R): pairs (v_i, v_{i + R/2}) rotate by the angles of one table row.
void rope_rotate_halves(float* v, const float* cos_sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) math::rope_rotate_pair(v[i], v[i + half], cos_sin[i], cos_sin[half + i]);
}

// RoPE, rotation and FP8 of one row in place; writes the codes and returns the scale.
float prepare_row(float* v, const TensorView& cos_sin, int64_t p, int64_t half, uint8_t* codes) {
  rope_rotate_halves(v, rope_table_row(cos_sin, p), half);
  math::hadamard_rotate(v, kDim);
  return exp2_int(fp8_quantize_block(v, kDim, codes));
}

}  // namespace

void sparse_mla_indexer_quantize(const TensorView& x, const TensorView& positions,
                                 const TensorView& cos_sin, const TensorView& codes,
                                 const TensorView& scales, const TensorView& weights,
                                 Stream /*stream*/) {
  constexpr const char* kOp = "sparse_mla_indexer_quantize";
  check_positions_in_table(kOp, positions, cos_sin);
  const int64_t T = x.shape[0], n = x.shape[1], R = cos_sin.shape[1];
  const RowWalker x_rows(x), code_rows(codes);
  const float w_scale = indexer_math::indexer_weight_scale(n);
#pragma omp parallel for schedule(static) if (T * n >= 256)
  for (int64_t r = 0; r < T * n; ++r) {
    const int64_t t = r / n, h = r % n;
    float v[kDim];
    load_row(x_rows.row_ptr(r), x.dtype, kDim, v);
    const float scale = prepare_row(v, cos_sin, load_index(positions, t), R / 2,
                                    reinterpret_cast<uint8_t*>(code_rows.row_ptr(r)));
    scales.ptr<float>()[t * scales.strides[0] + h * scales.strides[1]] = scale;
    if (weights.defined()) weights.ptr<float>()[t * weights.strides[0] + h * weights.strides[1]] *= w_scale;
  }
}

void sparse_mla_indexer_key_insert(const TensorView& k, const TensorView& norm_weight,
                                   const TensorView& norm_bias, float eps,
                                   const TensorView& positions, const TensorView& cos_sin,
                                   const IndexerKeyCacheView& keys, const TensorView& slot_mapping,
                                   Stream /*stream*/) {
  constexpr const char* kOp = "sparse_mla_indexer_key_insert";
  check_positions_in_table(kOp, positions, cos_sin);
  const int64_t T = k.shape[0], R = cos_sin.shape[1];
  std::set<int64_t> seen;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = load_index(slot_mapping, t);
    if (s == -1) continue;
    if (s < 0 || s >= keys.num_slots())
      fail_expected(kOp, detail::concat("slot_mapping[", t, "]"),
                    detail::concat("-1 or in [0, ", keys.num_slots(), ")"), s);
    if (!seen.insert(s).second)
      fail(kOp, ": slot_mapping[", t, "] = ", s, " is given twice");
  }

  float w[kDim], b[kDim];
  load_row(norm_weight.data, norm_weight.dtype, kDim, w);
  load_row(norm_bias.data, norm_bias.dtype, kDim, b);
  const RowWalker k_rows(k);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = load_index(slot_mapping, t);
    if (s == -1) continue;
    float v[kDim];
    load_row(k_rows.row_ptr(t), k.dtype, kDim, v);
    float mean = 0.0f, var = 0.0f;
    for (float e : v) mean += e;
    mean /= kDim;
    for (float e : v) var += (e - mean) * (e - mean);
    const float inv = 1.0f / std::sqrt(var / kDim + eps);
    for (int i = 0; i < kDim; ++i) v[i] = (v[i] - mean) * inv * w[i] + b[i];
    uint8_t* block = keys.data.ptr<uint8_t>() + (s / keys.block_size) * keys.data.strides[0];
    const int offset = static_cast<int>(s % keys.block_size);
    uint8_t codes[kDim];
    const float scale = prepare_row(v, cos_sin, load_index(positions, t), R / 2, codes);
    std::copy(codes, codes + kDim, block + indexer_key_data_offset(offset));
    *reinterpret_cast<float*>(block + indexer_key_scale_offset(keys.block_size, offset)) = scale;
  }
}

}  // namespace dsv4::cpu
