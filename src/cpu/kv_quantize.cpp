// The CPU kernels of kv_quantize / kv_dequantize: every slot value checked (-1 or inside the
// cache; distinct when writing) before anything is written, then kv_layout.h's per-token encode /
// decode per row.
#include <algorithm>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/rows.h"

namespace dsv4::cpu {

namespace {

constexpr int kMaxDim = 576;  // largest layout dim (V32_FP8)

// Every slot value: -1 (skip) or inside the cache; with `unique`, no slot may appear twice (two
// tokens writing one slot would race).
void check_slots(const char* where, const TensorView& slots, int64_t num_slots, bool unique) {
  std::vector<int64_t> seen;
  for (int64_t i = 0; i < slots.shape[0]; ++i) {
    const int64_t s = load_index(slots, i);
    if (s < -1 || s >= num_slots)
      fail(where, ": slots[", i, "]: expected -1 or 0..", num_slots - 1, ", got ", s);
    if (unique && s >= 0) seen.push_back(s);
  }
  if (unique) {
    std::sort(seen.begin(), seen.end());
    const auto dup = std::adjacent_find(seen.begin(), seen.end());
    if (dup != seen.end()) fail(where, ": slots: slot ", *dup, " appears more than once");
  }
}

// Row i of a [n, dim] fp32 / bf16 tensor.
void* row_ptr(const TensorView& t, int64_t i) {
  return static_cast<char*>(t.data) + i * t.strides[0] * static_cast<int64_t>(dtype_size(t.dtype));
}

}  // namespace

void kv_quantize(const KvCacheView& cache, const TensorView& values, const TensorView& slots,
                 Stream /*stream*/) {
  check_slots("kv_quantize", slots, cache.num_slots(), /*unique=*/true);
  const KvGeometry g = kv_geometry(cache.layout, cache.block_size);
  uint8_t* base = cache.data.ptr<uint8_t>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < values.shape[0]; ++i) {
    const int64_t s = load_index(slots, i);
    if (s < 0) continue;
    float row[kMaxDim];
    load_row(row_ptr(values, i), values.dtype, g.dim, row);
    kv_encode_token(g, base + (s / g.block_size) * cache.data.strides[0],
                    static_cast<int>(s % g.block_size), row, cache.tensor_scale);
  }
}

void kv_dequantize(const KvCacheView& cache, const TensorView& slots, const TensorView& out,
                   Stream /*stream*/) {
  check_slots("kv_dequantize", slots, cache.num_slots(), /*unique=*/false);
  const KvGeometry g = kv_geometry(cache.layout, cache.block_size);
  const uint8_t* base = cache.data.ptr<const uint8_t>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < out.shape[0]; ++i) {
    const int64_t s = load_index(slots, i);
    float row[kMaxDim] = {};
    if (s >= 0)
      kv_decode_token(g, base + (s / g.block_size) * cache.data.strides[0],
                      static_cast<int>(s % g.block_size), row, cache.tensor_scale);
    store_row(row, out.dtype, g.dim, row_ptr(out, i));
  }
}

}  // namespace dsv4::cpu
