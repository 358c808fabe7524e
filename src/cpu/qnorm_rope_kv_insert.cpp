// The CPU kernel of qnorm_rope_kv_insert: per token, q ← RoPE(rms_norm(q) per head) (with an FP8
// query: its codes written, q ← what they mean), kv ← RoPE(kv), kv encoded into its cache slot and
// replaced by the decoded value (kv_layout.h's per-token encode/decode and fp8_block.h's
// per-tensor rule, shared with CUDA).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/rope_common.h"
#include "cpu/rows.h"
#include "dsv4/fp8_block.h"
#include "math/rms_norm.h"

namespace dsv4::cpu {

namespace {
constexpr const char* kOp = "qnorm_rope_kv_insert";

// Every slot is -1 or in [0, num_slots), and no slot is written twice (the result would depend
// on thread order).
void check_slots(const TensorView& slot_mapping, int64_t num_slots) {
  std::vector<std::pair<int64_t, int64_t>> used;  // (slot, token)
  for (int64_t t = 0; t < slot_mapping.shape[0]; ++t) {
    const int64_t slot = load_index(slot_mapping, t);
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
                          const TensorView& slot_mapping, const Fp8QueryOutput& fp8_query,
                          Stream /*stream*/) {
  const int64_t R = cos_sin.shape[1];
  check_positions_in_table(kOp, positions, cos_sin);
  check_slots(slot_mapping, cache.num_slots());

  const int64_t T = q.shape[0], H = q.shape[1], D = q.shape[2];
  const KvGeometry g = kv_geometry(cache.layout, cache.block_size);
  // Tokens without a slot are encoded into a one-token scratch block, so kv holds the value the
  // cache would hold whether or not it is stored.
  const KvGeometry scratch_g = kv_geometry(cache.layout, 1);
  uint8_t* cache_bytes = static_cast<uint8_t*>(cache.data.data);
  const TensorView& q_fp8 = fp8_query.q_fp8;
  const float q_scale = fp8_query.q_scale, inv_q_scale = ieee_div(1.0f, q_scale);
#pragma omp parallel if (T > 1)
  {
    std::vector<float> row(static_cast<size_t>(D));
    std::vector<uint8_t> scratch(static_cast<size_t>(scratch_g.block_bytes));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = load_index(positions, t);
      const float* cos_sin_row = rope_table_row(cos_sin, p);
      for (int64_t h = 0; h < H; ++h) {
        uint16_t* q_row = static_cast<uint16_t*>(q.data) + t * q.strides[0] + h * q.strides[1];
        load_row(q_row, DType::bf16, D, row.data());
        math::rms_normalize(row.data(), D, eps, nullptr);
        math::rope_rotate_pairs(row.data() + (D - R), cos_sin_row, R / 2, false);
        if (q_fp8.defined()) {
          uint8_t* codes = static_cast<uint8_t*>(q_fp8.data) + t * q_fp8.strides[0] + h * q_fp8.strides[1];
          for (int64_t i = 0; i < D; ++i) {
            codes[i] = fp8_encode_scaled(row[i], inv_q_scale);
            row[i] = fp8_decode_scaled(codes[i], q_scale);
          }
        }
        store_row(row.data(), DType::bf16, D, q_row);
      }

      uint16_t* kv_row = static_cast<uint16_t*>(kv.data) + t * kv.strides[0];
      load_row(kv_row, DType::bf16, D, row.data());
      math::rope_rotate_pairs(row.data() + (D - R), cos_sin_row, R / 2, false);
      const int64_t slot = load_index(slot_mapping, t);
      const KvGeometry& tg = slot >= 0 ? g : scratch_g;
      uint8_t* block = slot >= 0 ? cache_bytes + (slot / g.block_size) * cache.data.strides[0]
                                 : scratch.data();
      const int offset = slot >= 0 ? static_cast<int>(slot % g.block_size) : 0;
      kv_encode_token(tg, block, offset, row.data(), cache.tensor_scale);
      kv_decode_token(tg, block, offset, row.data(), cache.tensor_scale);
      store_row(row.data(), DType::bf16, D, kv_row);
    }
  }
}

}  // namespace dsv4::cpu
