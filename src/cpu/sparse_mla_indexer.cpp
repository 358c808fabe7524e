// V3.2 indexer rows (see include/dsv4/sparse_mla_indexer.h): validation, then the CPU reference.
#include "dsv4/sparse_mla_indexer.h"

#include <cmath>
#include <set>
#include <vector>

#include "cpu/backend.h"
#include "cpu/hadamard.h"
#include "cpu/rope_common.h"
#include "cpu/rows.h"
#include "cpu/validate.h"
#include "dsv4/fp8_block.h"

namespace dsv4 {

namespace {

constexpr int kDim = indexer_keys::kDim;  // 128: the Hadamard width and the key cache's entry

// NeoX-style RoPE on v[0 .. R): pairs (v_i, v_{i + R/2}) rotate by the angles of one table row.
void rope_rotate_halves(float* v, const float* cos_sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) cpu::rope_rotate_pair(v[i], v[i + half], cos_sin[i], cos_sin[half + i]);
}

// RoPE, rotation and FP8 of one row in place; writes the codes and returns the scale.
float prepare_row(float* v, const TensorView& cos_sin, int64_t p, int64_t half, uint8_t* codes) {
  rope_rotate_halves(v, cpu::rope_table_row(cos_sin, p), half);
  cpu::hadamard_rotate(v, kDim);
  return exp2_int(fp8_quantize_block(v, kDim, codes));
}

// The checks shared by both entry points: x rows [T, ..., d], positions and the table.
int64_t check_rows_and_rope(const char* op, const char* name, const TensorView& x,
                            const TensorView& positions, const TensorView& cos_sin) {
  check_defined(op, name, x);
  cpu::check_dtype_in(op, name, x, {DType::bf16, DType::fp32});
  check_dim(op, name, x, x.ndim - 1, kDim);
  cpu::check_row_strided(op, name, x);
  cpu::check_index_vector(op, "positions", positions, x.shape[0]);
  const int64_t R = cpu::check_rope_table(op, cos_sin, kDim);
  cpu::check_positions_in_table(op, positions, cos_sin);
  return R;
}

}  // namespace

void sparse_mla_indexer_quantize(const TensorView& x, const TensorView& positions,
                                 const TensorView& cos_sin, const TensorView& codes,
                                 const TensorView& scales, [[maybe_unused]] Stream stream) {
  constexpr const char* kOp = "sparse_mla_indexer_quantize";
  if (cpu::common_device(kOp, {{"x", x}, {"positions", positions}, {"cos_sin", cos_sin},
                               {"codes", codes}, {"scales", scales}}) == Device::cuda)
    cpu::throw_cuda_unavailable(kOp);
  check_ndim(kOp, "x", x, 3);
  const int64_t T = x.shape[0], n = x.shape[1];
  const int64_t R = check_rows_and_rope(kOp, "x", x, positions, cos_sin);
  check_defined(kOp, "codes", codes);
  check_dtype(kOp, "codes", codes, DType::fp8_e4m3);
  check_shape(kOp, "codes", codes, {T, n, kDim});
  cpu::check_output_layout(kOp, "codes", codes);
  check_defined(kOp, "scales", scales);
  check_dtype(kOp, "scales", scales, DType::fp32);
  check_shape(kOp, "scales", scales, {T, n});
  cpu::check_distinct_elements(kOp, "scales", scales);
  cpu::check_outputs_disjoint(kOp, {{"codes", codes}, {"scales", scales}},
                              {{"x", x}, {"positions", positions}, {"cos_sin", cos_sin}});

  const cpu::RowWalker x_rows(x), code_rows(codes);
#pragma omp parallel for schedule(static) if (T * n >= 256)
  for (int64_t r = 0; r < T * n; ++r) {
    const int64_t t = r / n, h = r % n;
    float v[kDim];
    cpu::load_row(x_rows.row_ptr(r), x.dtype, kDim, v);
    const float scale = prepare_row(v, cos_sin, cpu::load_index(positions, t), R / 2,
                                    reinterpret_cast<uint8_t*>(code_rows.row_ptr(r)));
    scales.ptr<float>()[t * scales.strides[0] + h * scales.strides[1]] = scale;
  }
}

void sparse_mla_indexer_key_insert(const TensorView& k, const TensorView& norm_weight,
                                   const TensorView& norm_bias, float eps,
                                   const TensorView& positions, const TensorView& cos_sin,
                                   const IndexerKeyCacheView& keys, const TensorView& slot_mapping,
                                   [[maybe_unused]] Stream stream) {
  constexpr const char* kOp = "sparse_mla_indexer_key_insert";
  if (cpu::common_device(kOp, {{"k", k}, {"norm_weight", norm_weight}, {"norm_bias", norm_bias},
                               {"positions", positions}, {"cos_sin", cos_sin},
                               {"keys.data", keys.data}, {"slot_mapping", slot_mapping}}) ==
      Device::cuda)
    cpu::throw_cuda_unavailable(kOp);
  check_ndim(kOp, "k", k, 2);
  const int64_t T = k.shape[0];
  const int64_t R = check_rows_and_rope(kOp, "k", k, positions, cos_sin);
  for (const auto& [name, t] : {std::pair<const char*, const TensorView&>{"norm_weight", norm_weight},
                                {"norm_bias", norm_bias}}) {
    check_defined(kOp, name, t);
    cpu::check_dtype_in(kOp, name, t, {DType::bf16, DType::fp32});
    check_shape(kOp, name, t, {kDim});
    check_contiguous(kOp, name, t);
  }
  if (!(eps > 0.0f)) fail_expected(kOp, "eps", "> 0", eps);
  check_indexer_key_cache(kOp, "keys", keys);
  cpu::check_index_vector(kOp, "slot_mapping", slot_mapping, T);
  cpu::check_outputs_disjoint(kOp, {{"keys.data", keys.data}},
                              {{"k", k}, {"norm_weight", norm_weight}, {"norm_bias", norm_bias},
                               {"positions", positions}, {"cos_sin", cos_sin},
                               {"slot_mapping", slot_mapping}});
  std::set<int64_t> seen;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = cpu::load_index(slot_mapping, t);
    if (s == -1) continue;
    if (s < 0 || s >= keys.num_slots())
      fail_expected(kOp, detail::concat("slot_mapping[", t, "]"),
                    detail::concat("-1 or in [0, ", keys.num_slots(), ")"), s);
    if (!seen.insert(s).second)
      fail(kOp, ": slot_mapping[", t, "] = ", s, " is given twice");
  }

  float w[kDim], b[kDim];
  cpu::load_row(norm_weight.data, norm_weight.dtype, kDim, w);
  cpu::load_row(norm_bias.data, norm_bias.dtype, kDim, b);
  const cpu::RowWalker k_rows(k);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = cpu::load_index(slot_mapping, t);
    if (s == -1) continue;
    float v[kDim];
    cpu::load_row(k_rows.row_ptr(t), k.dtype, kDim, v);
    float mean = 0.0f, var = 0.0f;
    for (float e : v) mean += e;
    mean /= kDim;
    for (float e : v) var += (e - mean) * (e - mean);
    const float inv = 1.0f / std::sqrt(var / kDim + eps);
    for (int i = 0; i < kDim; ++i) v[i] = (v[i] - mean) * inv * w[i] + b[i];
    uint8_t* block = keys.data.ptr<uint8_t>() + (s / keys.block_size) * keys.data.strides[0];
    const int offset = static_cast<int>(s % keys.block_size);
    uint8_t codes[kDim];
    const float scale = prepare_row(v, cos_sin, cpu::load_index(positions, t), R / 2, codes);
    std::copy(codes, codes + kDim, block + indexer_key_data_offset(offset));
    *reinterpret_cast<float*>(block + indexer_key_scale_offset(keys.block_size, offset)) = scale;
  }
}

}  // namespace dsv4
