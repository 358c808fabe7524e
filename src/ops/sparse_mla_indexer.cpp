// sparse_mla_indexer_quantize and sparse_mla_indexer_key_insert (include/dsv4/sparse_mla_indexer.h):
// the front doors of the V3.2 indexer's row steps, validation then the backend (the CPU reference
// or the CUDA kernels).
#include "dsv4/sparse_mla_indexer.h"

#include <utility>

#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {

constexpr int kDim = indexer_keys::kDim;  // 128: the Hadamard width and the key cache's entry

// The checks shared by both ops: x rows [T, ..., d], positions and the RoPE table (the table's
// row values are checked by the kernel, which reads them).
void check_rows_and_rope(const char* op, const char* name, const TensorView& x,
                         const TensorView& positions, const TensorView& cos_sin) {
  check_defined(op, name, x);
  ops::check_dtype_in(op, name, x, {DType::bf16, DType::fp32});
  check_dim(op, name, x, x.ndim - 1, kDim);
  ops::check_row_strided(op, name, x);
  ops::check_index_vector(op, "positions", positions, x.shape[0]);
  ops::check_rope_table(op, cos_sin, kDim);
}

}  // namespace

void sparse_mla_indexer_quantize(const TensorView& x, const TensorView& positions,
                                 const TensorView& cos_sin, const TensorView& codes,
                                 const TensorView& scales, Stream stream) {
  sparse_mla_indexer_quantize(x, positions, cos_sin, codes, scales, TensorView{}, stream);
}

void sparse_mla_indexer_quantize(const TensorView& x, const TensorView& positions,
                                 const TensorView& cos_sin, const TensorView& codes,
                                 const TensorView& scales, const TensorView& weights,
                                 Stream stream) {
  constexpr const char* kOp = "sparse_mla_indexer_quantize";
  check_ndim(kOp, "x", x, 3);
  const int64_t T = x.shape[0], n = x.shape[1];
  check_rows_and_rope(kOp, "x", x, positions, cos_sin);
  check_defined(kOp, "codes", codes);
  check_dtype(kOp, "codes", codes, DType::fp8_e4m3);
  check_shape(kOp, "codes", codes, {T, n, kDim});
  ops::check_output_layout(kOp, "codes", codes);
  check_defined(kOp, "scales", scales);
  check_dtype(kOp, "scales", scales, DType::fp32);
  check_shape(kOp, "scales", scales, {T, n});
  ops::check_distinct_elements(kOp, "scales", scales);
  if (weights.defined()) {
    check_dtype(kOp, "weights", weights, DType::fp32);
    check_shape(kOp, "weights", weights, {T, n});
    ops::check_output_layout(kOp, "weights", weights);
  }
  // weights is read and written in place: it may overlap no other argument either.
  ops::check_outputs_disjoint(kOp, {{"codes", codes}, {"scales", scales}, {"weights", weights}},
                              {{"x", x}, {"positions", positions}, {"cos_sin", cos_sin}});
  const Device device = ops::common_device(kOp, {{"x", x}, {"positions", positions},
                                                 {"cos_sin", cos_sin}, {"codes", codes},
                                                 {"scales", scales}, {"weights", weights}});
  ops::kernel(kOp, ops::kSparseMlaIndexerQuantize, device)(x, positions, cos_sin, codes, scales,
                                                           weights, stream);
}

void sparse_mla_indexer_key_insert(const TensorView& k, const TensorView& norm_weight,
                                   const TensorView& norm_bias, float eps,
                                   const TensorView& positions, const TensorView& cos_sin,
                                   const IndexerKeyCacheView& keys, const TensorView& slot_mapping,
                                   Stream stream) {
  constexpr const char* kOp = "sparse_mla_indexer_key_insert";
  check_ndim(kOp, "k", k, 2);
  const int64_t T = k.shape[0];
  check_rows_and_rope(kOp, "k", k, positions, cos_sin);
  for (const auto& [name, t] : {std::pair<const char*, const TensorView&>{"norm_weight", norm_weight},
                                {"norm_bias", norm_bias}}) {
    check_defined(kOp, name, t);
    ops::check_dtype_in(kOp, name, t, {DType::bf16, DType::fp32});
    check_shape(kOp, name, t, {kDim});
    check_contiguous(kOp, name, t);
  }
  if (!(eps > 0.0f)) fail_expected(kOp, "eps", "> 0", eps);
  check_indexer_key_cache(kOp, "keys", keys);
  ops::check_index_vector(kOp, "slot_mapping", slot_mapping, T);
  ops::check_outputs_disjoint(kOp, {{"keys.data", keys.data}},
                              {{"k", k}, {"norm_weight", norm_weight}, {"norm_bias", norm_bias},
                               {"positions", positions}, {"cos_sin", cos_sin},
                               {"slot_mapping", slot_mapping}});
  const Device device = ops::common_device(
      kOp, {{"k", k}, {"norm_weight", norm_weight}, {"norm_bias", norm_bias},
            {"positions", positions}, {"cos_sin", cos_sin}, {"keys.data", keys.data},
            {"slot_mapping", slot_mapping}});
  ops::kernel(kOp, ops::kSparseMlaIndexerKeyInsert, device)(k, norm_weight, norm_bias, eps,
                                                            positions, cos_sin, keys,
                                                            slot_mapping, stream);
}

}  // namespace dsv4
