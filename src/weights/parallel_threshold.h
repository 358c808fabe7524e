// Element loops over weights go multi-threaded only above this size: a parallel region costs
// tens of microseconds (more on an oversubscribed machine, where idle OpenMP threads spin), which
// tiny test weights never win back.
#pragma once

#include <cstdint>

namespace dsv4::weights_detail {
inline constexpr int64_t kParallelMinElements = int64_t{1} << 20;
}  // namespace dsv4::weights_detail
