// Overflow-checked 64-bit arithmetic for size, count and position checks.
//
// A bound check like `prompt + steps > max_position` or `rows * stride > kMaxSlot` is only a check
// when its own arithmetic cannot wrap: a huge argument would otherwise overflow the left-hand
// side into a small (or negative) number and pass. Every such check in the library is written
// with these helpers; an overflowing value is reported as the argument error it is.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "dsv4/status.h"

namespace dsv4 {

// a + b and a * b, or nullopt when the exact result does not fit int64.
constexpr std::optional<int64_t> add_i64(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
constexpr std::optional<int64_t> mul_i64(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The same, throwing dsv4::Error "<where>: <what>: <a> + <b> overflows int64" on overflow.
inline int64_t checked_add(std::string_view where, std::string_view what, int64_t a, int64_t b) {
  if (const auto r = add_i64(a, b)) return *r;
  fail(where, ": ", what, ": ", a, " + ", b, " overflows int64");
}
inline int64_t checked_mul(std::string_view where, std::string_view what, int64_t a, int64_t b) {
  if (const auto r = mul_i64(a, b)) return *r;
  fail(where, ": ", what, ": ", a, " * ", b, " overflows int64");
}

}  // namespace dsv4
