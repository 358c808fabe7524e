// qnorm_rope_kv_insert (docs/spec.md §2 steps 1–2, vLLM fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert):
// per token, q ← RoPE(rms_norm(q) per head), kv ← RoPE(kv), kv quantized into the paged cache at
// its slot, and kv overwritten with the dequantized cache value so the caller attends to exactly
// what later steps will read back. Per-token encode/decode is kv_layout.h's, shared with CUDA.
// The front door: validation, then the backend.
#include <cmath>
#include <string>

#include "dsv4/ops.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {
constexpr const char* kOp = "qnorm_rope_kv_insert";

// Shape/dtype/stride checks.
void validate_shapes(const TensorView& q, const TensorView& kv, const TensorView& positions,
                        const TensorView& cos_sin, float eps, const KvCacheView& cache,
                        const TensorView& slot_mapping) {
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
  // q, kv and the cache are written while positions, the table and the slots are read (a slot
  // or position overwritten mid-op would then index out of range).
  ops::check_outputs_disjoint(kOp, {{"q", q}, {"kv", kv}, {"cache.data", cache.data}},
                              {{"positions", positions}, {"cos_sin", cos_sin},
                               {"slot_mapping", slot_mapping}});
}

}  // namespace

void qnorm_rope_kv_insert(const TensorView& q, const TensorView& kv, const TensorView& positions,
                          const TensorView& cos_sin, float eps, const KvCacheView& cache,
                          const TensorView& slot_mapping, Stream stream) {
  validate_shapes(q, kv, positions, cos_sin, eps, cache, slot_mapping);
  const Device device = ops::common_device(
      kOp, {{"q", q}, {"kv", kv}, {"positions", positions}, {"cos_sin", cos_sin},
            {"cache", cache.data}, {"slot_mapping", slot_mapping}});
  // The CPU kernel checks position and slot values before writing; on CUDA they live on the
  // device and the kernel handles invalid ones (see src/cuda/kv/qnorm_rope_kv_insert.h).
  ops::kernel(kOp, ops::kQnormRopeKvInsert, device)(q, kv, positions, cos_sin, eps, cache,
                                                    slot_mapping, stream);
}

}  // namespace dsv4
