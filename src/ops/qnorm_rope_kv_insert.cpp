// qnorm_rope_kv_insert (docs/spec.md §2 steps 1–2, vLLM fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert):
// per token, q ← RoPE(rms_norm(q) per head), kv ← RoPE(kv), kv quantized into the paged cache at
// its slot, and kv overwritten with the dequantized cache value so the caller attends to exactly
// what later steps will read back; optionally the queries as FP8 too (Fp8QueryOutput), q then
// holding what they mean. Per-token encode/decode is kv_layout.h's, shared with CUDA.
// The front door: validation, then the backend.
#include <cmath>
#include <string>

#include "dsv4/ops.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {
constexpr const char* kOp = "qnorm_rope_kv_insert";

// The optional FP8 query: q's shape, its own strides (last dim contiguous, elements distinct), a
// finite scale > 0 (whose largest query is a finite bf16, as q then holds it); without one, the
// scale stays at its default 1 (a scale given alone would be silently ignored).
void validate_fp8_query(const TensorView& q, const Fp8QueryOutput& fp8_query) {
  const TensorView& q_fp8 = fp8_query.q_fp8;
  if (!q_fp8.defined()) {
    if (fp8_query.q_scale != 1.0f)
      fail_expected(kOp, "q_scale", "1 without q_fp8 (the scale of an FP8 query)", fp8_query.q_scale);
    return;
  }
  check_dtype(kOp, "q_fp8", q_fp8, DType::fp8_e4m3);
  check_shape(kOp, "q_fp8", q_fp8, {q.shape[0], q.shape[1], q.shape[2]});
  ops::check_output_layout(kOp, "q_fp8", q_fp8);
  ops::check_fp8_query_scale(kOp, fp8_query.q_scale);
}

// Shape/dtype/stride checks.
void validate_shapes(const TensorView& q, const TensorView& kv, const TensorView& positions,
                        const TensorView& cos_sin, float eps, const KvCacheView& cache,
                        const TensorView& slot_mapping, const Fp8QueryOutput& fp8_query) {
  check_defined(kOp, "q", q);
  check_defined(kOp, "kv", kv);
  check_dtype(kOp, "q", q, DType::bf16);
  check_dtype(kOp, "kv", kv, DType::bf16);
  check_ndim(kOp, "q", q, 3);
  check_ndim(kOp, "kv", kv, 2);
  const int64_t T = q.shape[0], D = q.shape[2];
  check_shape(kOp, "kv", kv, {T, D});
  ops::check_output_layout(kOp, "q", q);
  ops::check_output_layout(kOp, "kv", kv);
  validate_fp8_query(q, fp8_query);
  ops::check_index_vector(kOp, "positions", positions, T);
  ops::check_index_vector(kOp, "slot_mapping", slot_mapping, T);
  ops::check_rope_table(kOp, cos_sin, D);
  if (!(eps >= 0.0f) || !std::isfinite(eps)) fail_expected(kOp, "eps", "a finite value >= 0", eps);
  check_kv_cache(kOp, "cache", cache);
  const KvGeometry g = kv_geometry(cache.layout, cache.block_size);
  if (D != g.dim)
    fail_expected(kOp, "kv.shape[1]",
                  std::to_string(g.dim) + " (the dim of layout " +
                      std::string(kv_layout_name(cache.layout)) + ")",
                  D);
  if (cache.layout == KvLayout::fp8_per_tensor &&
      (!(cache.tensor_scale > 0.0f) || !std::isfinite(cache.tensor_scale)))
    fail_expected(kOp, "cache.tensor_scale", "a finite value > 0", cache.tensor_scale);
  // q, q_fp8, kv and the cache are written while positions, the table and the slots are read (a
  // slot or position overwritten mid-op would then index out of range).
  ops::check_outputs_disjoint(kOp,
                              {{"q", q}, {"q_fp8", fp8_query.q_fp8}, {"kv", kv},
                               {"cache.data", cache.data}},
                              {{"positions", positions}, {"cos_sin", cos_sin},
                               {"slot_mapping", slot_mapping}});
}

}  // namespace

void qnorm_rope_kv_insert(const TensorView& q, const TensorView& kv, const TensorView& positions,
                          const TensorView& cos_sin, float eps, const KvCacheView& cache,
                          const TensorView& slot_mapping, Stream stream) {
  qnorm_rope_kv_insert(q, kv, positions, cos_sin, eps, cache, slot_mapping, Fp8QueryOutput{},
                       stream);
}

void qnorm_rope_kv_insert(const TensorView& q, const TensorView& kv, const TensorView& positions,
                          const TensorView& cos_sin, float eps, const KvCacheView& cache,
                          const TensorView& slot_mapping, const Fp8QueryOutput& fp8_query,
                          Stream stream) {
  validate_shapes(q, kv, positions, cos_sin, eps, cache, slot_mapping, fp8_query);
  const Device device = ops::common_device(
      kOp, {{"q", q}, {"kv", kv}, {"positions", positions}, {"cos_sin", cos_sin},
            {"cache", cache.data}, {"slot_mapping", slot_mapping}, {"q_fp8", fp8_query.q_fp8}});
  // The CPU kernel checks position and slot values before writing; on CUDA they live on the
  // device and the kernel handles invalid ones (see src/cuda/kv/qnorm_rope_kv_insert.h).
  ops::kernel(kOp, ops::kQnormRopeKvInsert, device)(q, kv, positions, cos_sin, eps, cache,
                                                    slot_mapping, fp8_query, stream);
}

}  // namespace dsv4
