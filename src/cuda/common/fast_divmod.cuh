// Division of a non-negative int32 index by a divisor fixed for a launch, as one multiply-high
// and one shift (the round-up reciprocal of Granlund & Montgomery, "Division by invariant
// integers using multiplication", PLDI 1994). Element-wise kernels split flat indices into
// (row, column) with it: a runtime integer division is ~20 instructions (64-bit: a call of ~80),
// as much as a memory-bound kernel's whole per-element budget.
#pragma once

#include <cstdint>

#include "dsv4/status.h"

namespace dsv4::cuda {

struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 0;  // ⌈2^(31 + l) / divisor⌉ with l = ⌈log2 divisor⌉; 0 for divisor 1
  uint32_t shift = 0;       // l − 1

  // Exact for every dividend n < 2^31: n·m / 2^(31+l) = n / d + n·e / (d·2^(31+l)) with
  // e = m·d − 2^(31+l) < d, so the error term is below 2^-l ≤ 1 / d and cannot carry the
  // quotient past the next integer. m < 2^32 because d > 2^(l-1).
  static FastDivmod of(int64_t divisor) {
    DSV4_CHECK(divisor >= 1 && divisor <= INT32_MAX, "FastDivmod: expected a divisor in [1, 2^31), got ",
               divisor);
    FastDivmod f;
    f.divisor = static_cast<uint32_t>(divisor);
    if (divisor == 1) return f;  // 2^31 / 1 needs a shift of −1: the device divides by copying
    uint32_t l = 0;
    while ((uint64_t{1} << l) < static_cast<uint64_t>(divisor)) ++l;
    f.multiplier = static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + divisor - 1) / divisor);
    f.shift = l - 1;
    return f;
  }

  // n / divisor, for 0 <= n < 2^31.
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return multiplier ? __umulhi(n, multiplier) >> shift : n;
  }
};

}  // namespace dsv4::cuda
