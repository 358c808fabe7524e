// KV layouts (docs/spec.md §7): names, byte geometry, cache validation and the validated bulk CPU
// quantize / dequantize built on the per-token functions of kv_layout.h.
#include "dsv4/kv_layout.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/validate.h"
#include "dsv4/status.h"

namespace dsv4 {

namespace {
constexpr std::array<KvLayout, 4> kAllLayouts = {KvLayout::model1_fp8, KvLayout::v32_fp8,
                                                 KvLayout::bf16, KvLayout::fp8_per_tensor};
// Upper bound that keeps block_bytes and slot numbers comfortably inside int64 / int32 math.
constexpr int kMaxBlockSize = 1 << 16;
}  // namespace

KvLayout parse_kv_layout(std::string_view name) {
  std::string lower(name);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::string known;
  for (KvLayout l : kAllLayouts) {
    std::string cand(kv_layout_name(l));
    for (char& ch : cand) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lower == cand) return l;
    known.append(known.empty() ? "" : ", ").append(cand);
  }
  fail_expected("parse_kv_layout", "name", detail::concat("one of ", known),
                detail::concat("'", name, "'"));
}

KvGeometry kv_geometry(KvLayout layout, int block_size) {
  if (block_size < 1 || block_size > kMaxBlockSize)
    fail_expected("kv_geometry", "block_size", "1.." + std::to_string(kMaxBlockSize), block_size);
  KvGeometry g{layout, block_size, 512, 0, 0};
  switch (layout) {
    case KvLayout::model1_fp8: {
      g.token_bytes = model1::kTokenBytes;
      // FlashMLA pads each block to a multiple of 576 B so the next block's data rows stay
      // aligned like its first row.
      const int64_t raw = int64_t{block_size} * model1::kTokenBytes;
      g.block_bytes = (raw + model1::kBlockAlign - 1) / model1::kBlockAlign * model1::kBlockAlign;
      break;
    }
    case KvLayout::v32_fp8:
      g.dim = v32::kDim;
      g.token_bytes = v32::kTokenBytes;
      g.block_bytes = int64_t{block_size} * v32::kTokenBytes;
      break;
    case KvLayout::bf16:
      g.token_bytes = 512 * 2;
      g.block_bytes = int64_t{block_size} * g.token_bytes;
      break;
    case KvLayout::fp8_per_tensor:
      g.token_bytes = 512;
      g.block_bytes = int64_t{block_size} * g.token_bytes;
      break;
    default:
      fail("kv_geometry: layout: unknown value ", static_cast<int>(layout));
  }
  return g;
}

void check_kv_cache(const char* where, const char* name, const KvCacheView& cache) {
  const std::string n(name);
  const KvGeometry g = kv_geometry(cache.layout, cache.block_size);
  check_defined(where, (n + ".data").c_str(), cache.data);
  check_dtype(where, (n + ".data").c_str(), cache.data, DType::uint8);
  check_ndim(where, (n + ".data").c_str(), cache.data, 2);
  if (cache.data.shape[1] != g.block_bytes)
    fail_expected(where, n + ".data.shape[1]",
                  std::to_string(g.block_bytes) + " (block bytes of " +
                      std::string(kv_layout_name(cache.layout)) + " at block_size " +
                      std::to_string(cache.block_size) + ")",
                  cache.data.shape[1]);
  // Bytes dense within a block; blocks any number of bytes apart (a padded block stride, as
  // FlashMLA's and vLLM's caches have) as long as blocks do not overlap.
  check_inner_contiguous(where, (n + ".data").c_str(), cache.data);
  const int64_t block_stride = cache.data.strides[0];
  if (cache.data.shape[0] > 1) {
    if (block_stride < g.block_bytes)
      fail_expected(where, n + ".data.stride(0) (block stride, bytes)",
                    ">= " + std::to_string(g.block_bytes) + " (the block bytes of " +
                        std::string(kv_layout_name(cache.layout)) + " at block_size " +
                        std::to_string(cache.block_size) + ")",
                    block_stride);
    // Every block starts 16-byte aligned like the first: kernels read a token's 16-byte chunks,
    // fp32 scales and bf16 rope in place.
    if (block_stride % 16 != 0)
      fail_expected(where, n + ".data.stride(0) (block stride, bytes)", "a multiple of 16",
                    block_stride);
  }
  if (reinterpret_cast<uintptr_t>(cache.data.data) % 16 != 0)
    fail_expected(where, n + ".data pointer", "16-byte aligned", cache.data.data);
  if (cache.layout == KvLayout::fp8_per_tensor &&
      !(cache.tensor_scale > 0.0f && cache.tensor_scale < 3.0e38f))
    fail_expected(where, n + ".tensor_scale", "a finite value > 0", cache.tensor_scale);
}

namespace {

// Slot tensor [n] (int32 or int64) read as int64.
int64_t slot_at(const TensorView& slots, int64_t i) {
  return slots.dtype == DType::int64 ? slots.ptr<const int64_t>()[i * slots.strides[0]]
                                     : slots.ptr<const int32_t>()[i * slots.strides[0]];
}

// Validates the slot tensor and every slot value: -1 (skip) or inside the cache; with
// `unique`, no slot may appear twice (two tokens writing one slot would race).
void check_slots(const char* where, const TensorView& slots, int64_t n, int64_t num_slots,
                 bool unique) {
  std::vector<int64_t> seen;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slot_at(slots, i);
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

void check_rows(const char* where, const char* name, const TensorView& t, int64_t dim) {
  check_defined(where, name, t);
  check_device(where, name, t, Device::cpu);
  cpu::check_dtype_in(where, name, t, {DType::fp32, DType::bf16});
  check_ndim(where, name, t, 2);
  check_dim(where, name, t, 1, dim);
  cpu::check_row_strided(where, name, t);
}

// The slot tensor's layout: a host index vector [n] (its values are checked by check_slots).
void check_slot_tensor(const char* where, const TensorView& slots, int64_t n) {
  cpu::check_index_vector(where, "slots", slots, n);
  check_device(where, "slots", slots, Device::cpu);
}

// Row i of a [n, dim] fp32/bf16 tensor as floats.
void load_row(const TensorView& t, int64_t i, int dim, float* out) {
  const int64_t base = i * t.strides[0];
  if (t.dtype == DType::fp32) {
    const float* p = t.ptr<const float>() + base;
    std::copy(p, p + dim, out);
  } else {
    const uint16_t* p = t.ptr<const uint16_t>() + base;
    for (int k = 0; k < dim; ++k) out[k] = bf16_bits_to_float(p[k]);
  }
}

void store_row(const TensorView& t, int64_t i, int dim, const float* in) {
  const int64_t base = i * t.strides[0];
  if (t.dtype == DType::fp32) {
    std::copy(in, in + dim, t.ptr<float>() + base);
  } else {
    uint16_t* p = t.ptr<uint16_t>() + base;
    for (int k = 0; k < dim; ++k) p[k] = float_to_bf16_bits(in[k]);
  }
}

constexpr int kMaxDim = 576;  // largest layout dim (V32_FP8)

}  // namespace

void kv_quantize(const KvCacheView& cache, const TensorView& values, const TensorView& slots) {
  constexpr const char* where = "kv_quantize";
  check_kv_cache(where, "cache", cache);
  check_device(where, "cache.data", cache.data, Device::cpu);
  const KvGeometry g = kv_geometry(cache.layout, cache.block_size);
  check_rows(where, "values", values, g.dim);
  const int64_t n = values.shape[0];
  check_slot_tensor(where, slots, n);
  // The cache is written while values and slots are read: a slot or value living inside the
  // cache would change under the loop.
  cpu::check_outputs_disjoint(where, {{"cache.data", cache.data}},
                              {{"values", values}, {"slots", slots}});
  check_slots(where, slots, n, cache.num_slots(), /*unique=*/true);

  uint8_t* base = cache.data.ptr<uint8_t>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slot_at(slots, i);
    if (s < 0) continue;
    float row[kMaxDim];
    load_row(values, i, g.dim, row);
    kv_encode_token(g, base + (s / g.block_size) * cache.data.strides[0],
                    static_cast<int>(s % g.block_size), row, cache.tensor_scale);
  }
}

void kv_dequantize(const KvCacheView& cache, const TensorView& slots, const TensorView& out) {
  constexpr const char* where = "kv_dequantize";
  check_kv_cache(where, "cache", cache);
  check_device(where, "cache.data", cache.data, Device::cpu);
  const KvGeometry g = kv_geometry(cache.layout, cache.block_size);
  check_rows(where, "out", out, g.dim);
  cpu::check_output_layout(where, "out", out);  // rows written concurrently: no shared element
  const int64_t n = out.shape[0];
  check_slot_tensor(where, slots, n);
  cpu::check_outputs_disjoint(where, {{"out", out}}, {{"cache.data", cache.data}, {"slots", slots}});
  check_slots(where, slots, n, cache.num_slots(), /*unique=*/false);

  const uint8_t* base = cache.data.ptr<const uint8_t>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slot_at(slots, i);
    float row[kMaxDim] = {};
    if (s >= 0)
      kv_decode_token(g, base + (s / g.block_size) * cache.data.strides[0],
                      static_cast<int>(s % g.block_size), row, cache.tensor_scale);
    store_row(out, i, g.dim, row);
  }
}

}  // namespace dsv4
