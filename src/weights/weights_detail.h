// Private helpers shared by the src/weights files.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace dsv4::weights_detail {

// Element loops over weights go multi-threaded only above this size: a parallel region costs
// tens of microseconds (more on an oversubscribed machine, where idle OpenMP threads spin), which
// tiny test weights never win back.
inline constexpr int64_t kParallelMinElements = int64_t{1} << 20;

// "[2, 3]" for error messages.
inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

}  // namespace dsv4::weights_detail
