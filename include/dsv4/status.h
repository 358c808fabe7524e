// Error reporting for the public API.
//
// Every validating function throws dsv4::Error with a message that names the argument, what was
// expected and what was found, e.g.
//   "sparse_decode: indices.shape[2]: expected 2048 (topk of q), got 1024".
// Validation happens before any output byte is written, so a throwing call changes nothing.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dsv4 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Throws dsv4::Error("<where>: <what>: expected <expected>, got <actual>").
template <typename E, typename A>
[[noreturn]] void fail_expected(std::string_view where, std::string_view what, const E& expected,
                                const A& actual) {
  throw Error(detail::concat(where, ": ", what, ": expected ", expected, ", got ", actual));
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

}  // namespace dsv4

// DSV4_CHECK(cond, parts...) throws dsv4::Error(concat(parts...)) when cond is false.
#define DSV4_CHECK(cond, ...)          \
  do {                                 \
    if (!(cond)) ::dsv4::fail(__VA_ARGS__); \
  } while (0)

// DSV4_CHECK_EQ(where, what, expected, actual): "where: what: expected E, got A".
#define DSV4_CHECK_EQ(where, what, expected, actual)                      \
  do {                                                                    \
    const auto& dsv4_e_ = (expected);                                     \
    const auto& dsv4_a_ = (actual);                                       \
    if (!(dsv4_e_ == dsv4_a_)) ::dsv4::fail_expected(where, what, dsv4_e_, dsv4_a_); \
  } while (0)
