// Division of non-negative integers on the host's per-step paths. Planning a decode step divides a
// few times per request and cache (entries into blocks, positions into compressed entries), and a
// 64-bit integer divide costs tens of cycles: at 128 requests those divides were a visible share of
// the host's time before a replayed graph's launch. Block sizes and compression ratios are powers
// of two, so these shift instead (one predictable branch), and divide otherwise.
#pragma once

#include <bit>
#include <cstdint>

namespace dsv4 {

// n / d for n >= 0, d > 0.
inline int64_t div_nonneg(int64_t n, int64_t d) {
  return (d & (d - 1)) == 0 ? n >> std::countr_zero(static_cast<uint64_t>(d)) : n / d;
}
// n % d for n >= 0, d > 0.
inline int64_t mod_nonneg(int64_t n, int64_t d) { return (d & (d - 1)) == 0 ? n & (d - 1) : n % d; }
// ceil(n / d) for n >= 0, d > 0.
inline int64_t ceil_div_nonneg(int64_t n, int64_t d) { return div_nonneg(n + d - 1, d); }

}  // namespace dsv4
