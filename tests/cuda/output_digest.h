// Bit-identity of a kernel's outputs across two builds (e.g. a kernel restructured on a branch
// against the same kernel on main), which a test inside one build cannot see:
//   DSV4_OUTPUT_DIGESTS_RECORD=DIR  each call writes the 64-bit FNV-1a digest of the outputs
//                                   to DIR/<test name>.<n> (n: the call's number in its test);
//   DSV4_OUTPUT_DIGESTS_EXPECT=DIR  each calling test fails unless its digest equals the one
//                                   recorded in DIR (a missing record fails too).
// Unset (CI), the call does nothing. bench/scripts/device_session.sh (step `kernels`) runs the
// sparse GPU tests of both builds this way.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>

namespace dsv4::test {

// The bytes of one output: pointer and size.
using OutputBytes = std::pair<const void*, size_t>;

inline uint64_t fnv1a_64(std::initializer_list<OutputBytes> parts) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& [data, size] : parts) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  }
  return h;
}

// Records or checks the digest of `parts` under `name` in the directories the environment names.
inline void check_output_digest_as(const std::string& name, std::initializer_list<OutputBytes> parts) {
  const char* record = std::getenv("DSV4_OUTPUT_DIGESTS_RECORD");
  const char* expect = std::getenv("DSV4_OUTPUT_DIGESTS_EXPECT");
  if (record == nullptr && expect == nullptr) return;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a_64(parts)));
  if (record != nullptr) {
    std::ofstream f(std::string(record) + "/" + name);
    ASSERT_TRUE(f << hex << "\n") << "cannot write the digest of " << name << " into " << record;
  }
  if (expect != nullptr) {
    std::ifstream f(std::string(expect) + "/" + name);
    std::string want;
    ASSERT_TRUE(f >> want) << "no recorded digest of " << name << " in " << expect;
    EXPECT_EQ(want, hex) << name << ": outputs differ from the recorded build's";
  }
}

// Records or checks the digest of `parts` as the current test's next output:
// <suite>.<test>.<n>, '/' of parameterized names replaced by '_'.
inline void check_output_digest(std::initializer_list<OutputBytes> parts) {
  if (std::getenv("DSV4_OUTPUT_DIGESTS_RECORD") == nullptr && std::getenv("DSV4_OUTPUT_DIGESTS_EXPECT") == nullptr)
    return;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test = std::string(info->test_suite_name()) + "." + info->name();
  static std::string last_test;
  static int calls = 0;
  calls = test == last_test ? calls + 1 : 0;
  last_test = test;
  std::string name = test + "." + std::to_string(calls);
  for (char& c : name)
    if (c == '/') c = '_';
  check_output_digest_as(name, parts);
}

}  // namespace dsv4::test
