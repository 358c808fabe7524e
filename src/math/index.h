// Per-element index math of the planning utilities (include/dsv4/indexing.h), shared by the CPU
// reference (src/cpu/indexing.cpp) and the CUDA kernels (src/cuda/index/) so both paths compute
// every slot and workspace row with the same integer operations.
#pragma once

#include <cstdint>

#include "dsv4/dtype.h"  // DSV4_HD

namespace dsv4::index_math {

inline constexpr int64_t kMaxSlot = 2147483647;  // slots are int32

// Global slot of request-local position `pos` through one block-table row of `max_blocks`
// entries: row[pos / B] * B + pos % B; -1 when pos < 0, its block lies beyond the row, the entry
// is -1 (released or never allocated) or the slot exceeds int32.
DSV4_HD int32_t paged_slot(const int32_t* row, int64_t max_blocks, int block_size, int64_t pos) {
  if (pos < 0) return -1;
  const int64_t blk = pos / block_size;
  if (blk >= max_blocks) return -1;
  const int32_t b = row[blk];
  if (b < 0) return -1;
  const int64_t slot = int64_t{b} * block_size + pos % block_size;
  return slot > kMaxSlot ? -1 : static_cast<int32_t>(slot);
}

// First position of the SWA window of a token at position p: the window is [first, p], at most
// `window` positions.
DSV4_HD int64_t window_first(int64_t p, int window) {
  const int64_t first = p - window + 1;
  return first > 0 ? first : 0;
}

// Number of compressed entries a token at position p may attend (causality): entries
// j < (p + 1) / ratio; none when ratio == 0 (a layer without compressed cache).
DSV4_HD int64_t visible_compressed(int64_t p, int ratio) { return ratio > 0 ? (p + 1) / ratio : 0; }

}  // namespace dsv4::index_math
