// The entries dequantize_and_gather copies for one request, shared by the op's host data checks
// and the CPU kernel.
#pragma once

#include <cstdint>

namespace dsv4::cpu {

// Rows to gather for request r: the last g of its seq_len entries (g = gather_lens[r], or all).
struct GatherRange {
  int64_t first_entry, count;
};
inline GatherRange gather_range(const int32_t* seq_lens, const int32_t* gather_lens, int64_t r) {
  const int64_t g = gather_lens ? gather_lens[r] : seq_lens[r];
  return {seq_lens[r] - g, g};
}

}  // namespace dsv4::cpu
