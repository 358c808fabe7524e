// KV layouts (docs/spec.md §7): names, byte geometry and cache validation. The bulk quantize /
// dequantize ops built on the per-token functions of kv_layout.h: src/ops/kv_quantize.cpp.
#include "dsv4/kv_layout.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

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
  const std::string n(name), data_name = n + ".data";  // (formatted once: every op call checks)
  const KvGeometry g = kv_geometry(cache.layout, cache.block_size);
  check_defined(where, data_name.c_str(), cache.data);
  check_dtype(where, data_name.c_str(), cache.data, DType::uint8);
  check_ndim(where, data_name.c_str(), cache.data, 2);
  if (cache.data.shape[1] != g.block_bytes)
    fail_expected(where, n + ".data.shape[1]",
                  std::to_string(g.block_bytes) + " (block bytes of " +
                      std::string(kv_layout_name(cache.layout)) + " at block_size " +
                      std::to_string(cache.block_size) + ")",
                  cache.data.shape[1]);
  // Bytes dense within a block; blocks any number of bytes apart (a padded block stride, as
  // FlashMLA's and vLLM's caches have) as long as blocks do not overlap.
  check_inner_contiguous(where, data_name.c_str(), cache.data);
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

}  // namespace dsv4
