// qnorm_rope_kv_insert (SPEC §2 steps 1–2, vLLM fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert):
// per token, q ← RoPE(rms_norm(q) per head), kv ← RoPE(kv), kv quantized into the paged cache at
// its slot, and kv overwritten with the dequantized cache value so the caller attends to exactly
// what later steps will read back. Per-token encode/decode is kv_layout.h's, shared with CUDA.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cpu/backend.h"
#include "math/rms_norm.h"
#include "cpu/rope_common.h"
#include "cpu/rows.h"
#include "cpu/validate.h"
#include "dsv4/ops.h"
#if defined(DSV4_WITH_CUDA)
#include "cuda/kv/qnorm_rope_kv_insert.h"
#endif

namespace dsv4 {

namespace {
constexpr const char* kOp = "qnorm_rope_kv_insert";

// Shape/dtype/stride checks; returns the rope dims R.
int64_t validate_shapes(const TensorView& q, const TensorView& kv, const TensorView& positions,
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
  cpu::check_output_layout(kOp, "q", q);
  cpu::check_output_layout(kOp, "kv", kv);
  cpu::check_index_vector(kOp, "positions", positions, T);
  cpu::check_index_vector(kOp, "slot_mapping", slot_mapping, T);
  const int64_t R = cpu::check_rope_table(kOp, cos_sin, D);
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
  cpu::check_outputs_disjoint(kOp, {{"q", q}, {"kv", kv}, {"cache.data", cache.data}},
                              {{"positions", positions}, {"cos_sin", cos_sin},
                               {"slot_mapping", slot_mapping}});
  return R;
}

// Every slot is -1 or in [0, num_slots), and no slot is written twice (the result would depend
// on thread order).
void check_slots(const TensorView& slot_mapping, int64_t num_slots) {
  std::vector<std::pair<int64_t, int64_t>> used;  // (slot, token)
  for (int64_t t = 0; t < slot_mapping.shape[0]; ++t) {
    const int64_t slot = cpu::load_index(slot_mapping, t);
    if (slot == -1) continue;
    if (slot < 0 || slot >= num_slots)
      fail_expected(kOp, "slot_mapping[" + std::to_string(t) + "]",
                    "-1 or a slot in [0, " + std::to_string(num_slots) + ") (cache slots)", slot);
    used.emplace_back(slot, t);
  }
  std::sort(used.begin(), used.end());
  for (size_t i = 1; i < used.size(); ++i)
    if (used[i].first == used[i - 1].first)
      fail(kOp, ": slot_mapping: expected distinct slots, got slot ", used[i].first,
           " for tokens ", used[i - 1].second, " and ", used[i].second);
}
}  // namespace

void qnorm_rope_kv_insert(const TensorView& q, const TensorView& kv, const TensorView& positions,
                          const TensorView& cos_sin, float eps, const KvCacheView& cache,
                          const TensorView& slot_mapping, [[maybe_unused]] Stream stream) {
  const int64_t R = validate_shapes(q, kv, positions, cos_sin, eps, cache, slot_mapping);
  if (cpu::common_device(kOp, {{"q", q}, {"kv", kv}, {"positions", positions},
                               {"cos_sin", cos_sin}, {"cache", cache.data},
                               {"slot_mapping", slot_mapping}}) == Device::cuda) {
    // Position and slot values live on the device: the kernel handles invalid ones (see
    // src/cuda/kv/qnorm_rope_kv_insert.h).
    DSV4_CUDA_DISPATCH(kOp, cuda::qnorm_rope_kv_insert(q, kv, positions, cos_sin, eps, cache,
                                                       slot_mapping, stream));
  }
  cpu::check_positions_in_table(kOp, positions, cos_sin);
  check_slots(slot_mapping, cache.num_slots());

  const int64_t T = q.shape[0], H = q.shape[1], D = q.shape[2];
  const KvGeometry g = kv_geometry(cache.layout, cache.block_size);
  // Tokens without a slot are encoded into a one-token scratch block, so kv holds the value the
  // cache would hold whether or not it is stored.
  const KvGeometry scratch_g = kv_geometry(cache.layout, 1);
  uint8_t* cache_bytes = static_cast<uint8_t*>(cache.data.data);
#pragma omp parallel if (T > 1)
  {
    std::vector<float> row(static_cast<size_t>(D));
    std::vector<uint8_t> scratch(static_cast<size_t>(scratch_g.block_bytes));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = cpu::load_index(positions, t);
      const float* cos_sin_row = cpu::rope_table_row(cos_sin, p);
      for (int64_t h = 0; h < H; ++h) {
        uint16_t* q_row = static_cast<uint16_t*>(q.data) + t * q.strides[0] + h * q.strides[1];
        cpu::load_row(q_row, DType::bf16, D, row.data());
        math::rms_normalize(row.data(), D, eps, nullptr);
        math::rope_rotate_pairs(row.data() + (D - R), cos_sin_row, R / 2, false);
        cpu::store_row(row.data(), DType::bf16, D, q_row);
      }

      uint16_t* kv_row = static_cast<uint16_t*>(kv.data) + t * kv.strides[0];
      cpu::load_row(kv_row, DType::bf16, D, row.data());
      math::rope_rotate_pairs(row.data() + (D - R), cos_sin_row, R / 2, false);
      const int64_t slot = cpu::load_index(slot_mapping, t);
      const KvGeometry& tg = slot >= 0 ? g : scratch_g;
      uint8_t* block = slot >= 0 ? cache_bytes + (slot / g.block_size) * cache.data.strides[0]
                                 : scratch.data();
      const int offset = slot >= 0 ? static_cast<int>(slot % g.block_size) : 0;
      kv_encode_token(tg, block, offset, row.data(), cache.tensor_scale);
      kv_decode_token(tg, block, offset, row.data(), cache.tensor_scale);
      cpu::store_row(row.data(), DType::bf16, D, kv_row);
    }
  }
}

}  // namespace dsv4
