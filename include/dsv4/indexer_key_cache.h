// The indexer key cache (docs/spec.md §7 last line, vLLM's FP8 indexer cache): one entry per ratio-4
// compressed entry, 128 fp8 e4m3 values and one fp32 scale (a power of two, UE8M0 rule), so the
// key is fp8 · scale. A block of B entries is [B × 128 B keys][B × 4 B scales] (keys first, like
// MODEL1_FP8; 132 B per entry). slot = block · B + offset, as for every paged cache.
//
// Scales sit at 4-byte aligned offsets (block rows are multiples of 4 bytes). Encode/decode are
// DSV4_HD so the CPU reference and the CUDA kernels share the byte layout.
#pragma once

#include <cstdint>

#include "dsv4/fp8_block.h"
#include "dsv4/tensor.h"

namespace dsv4 {

namespace indexer_keys {
inline constexpr int kDim = 128;                        // index_head_dim
inline constexpr int kScaleBytes = 4;                   // one fp32 per entry
inline constexpr int kEntryBytes = kDim + kScaleBytes;  // 132
}  // namespace indexer_keys

struct IndexerKeyCacheView {
  TensorView data;  // uint8 [num_blocks, block_size * 132]
  int block_size = 64;
  int64_t num_slots() const { return data.ndim == 2 ? data.shape[0] * block_size : 0; }
};
// Validates dtype uint8, 2-d, rows of block_size * 132 bytes, block_size >= 1.
void check_indexer_key_cache(const char* where, const char* name, const IndexerKeyCacheView& cache);

// Byte offsets inside a block of `block_size` entries.
DSV4_HD int64_t indexer_key_data_offset(int offset) { return int64_t{offset} * indexer_keys::kDim; }
DSV4_HD int64_t indexer_key_scale_offset(int block_size, int offset) {
  return int64_t{block_size} * indexer_keys::kDim + int64_t{offset} * indexer_keys::kScaleBytes;
}

// Quantizes one key (values[0..128), float) into the block starting at `block`.
DSV4_HD void indexer_key_encode(uint8_t* block, int block_size, int offset, const float* values) {
  const int32_t k =
      fp8_quantize_block(values, indexer_keys::kDim, block + indexer_key_data_offset(offset));
  *reinterpret_cast<float*>(block + indexer_key_scale_offset(block_size, offset)) = exp2_int(k);
}

// The fp8 codes and the scale of the entry at `offset`.
DSV4_HD const uint8_t* indexer_key_codes(const uint8_t* block, int offset) {
  return block + indexer_key_data_offset(offset);
}
DSV4_HD float indexer_key_scale(const uint8_t* block, int block_size, int offset) {
  return *reinterpret_cast<const float*>(block + indexer_key_scale_offset(block_size, offset));
}

}  // namespace dsv4
