// The cross-build digest check (output_digest.h) itself: a recorded digest is found and matched,
// other bytes and a missing record fail, and without the environment nothing happens. Host only
// (no GPU): it runs wherever the GPU test binary runs.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cuda/output_digest.h"

namespace dsv4::test {
namespace {

// Runs with the two variables cleared and puts back whatever the run was given (a cross-build
// check of the other tests must not lose its environment here).
class OutputDigest : public ::testing::Test {
 protected:
  static constexpr const char* kVars[2] = {"DSV4_OUTPUT_DIGESTS_RECORD", "DSV4_OUTPUT_DIGESTS_EXPECT"};
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      const char* v = std::getenv(kVars[i]);
      saved_[i] = v ? std::optional<std::string>(v) : std::nullopt;
      unsetenv(kVars[i]);
    }
    dir_ = std::filesystem::temp_directory_path() / ("dsv4_digest_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    for (int i = 0; i < 2; ++i) {
      if (saved_[i]) setenv(kVars[i], saved_[i]->c_str(), 1);
      else unsetenv(kVars[i]);
    }
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
  std::optional<std::string> saved_[2];
};

TEST_F(OutputDigest, RecordedOutputsMatchAndOthersFail) {
  const std::vector<uint16_t> out = {1, 2, 3, 0xFFFF};
  std::vector<float> lse = {0.5f, -1.f};
  setenv("DSV4_OUTPUT_DIGESTS_RECORD", dir_.c_str(), 1);
  check_output_digest_as("case", {{out.data(), out.size() * 2}, {lse.data(), lse.size() * 4}});
  ASSERT_TRUE(std::filesystem::exists(dir_ / "case"));
  unsetenv("DSV4_OUTPUT_DIGESTS_RECORD");
  setenv("DSV4_OUTPUT_DIGESTS_EXPECT", dir_.c_str(), 1);
  check_output_digest_as("case", {{out.data(), out.size() * 2}, {lse.data(), lse.size() * 4}});
  lse[1] = std::nextafter(lse[1], 0.f);  // one bit of one output
  EXPECT_NONFATAL_FAILURE(
      check_output_digest_as("case", {{out.data(), out.size() * 2}, {lse.data(), lse.size() * 4}}),
      "outputs differ");
  static const uint16_t one = 1;  // EXPECT_FATAL_FAILURE's statement sees statics only
  EXPECT_FATAL_FAILURE(check_output_digest_as("never_recorded", {{&one, 2}}), "no recorded digest");
}

TEST_F(OutputDigest, DoesNothingWithoutTheEnvironment) {
  const uint32_t x = 7;
  check_output_digest_as("case", {{&x, 4}});
  check_output_digest({{&x, 4}});
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(OutputDigest, NamesCallsByTestAndNumber) {
  setenv("DSV4_OUTPUT_DIGESTS_RECORD", dir_.c_str(), 1);
  const uint32_t x = 7;
  check_output_digest({{&x, 4}});
  check_output_digest({{&x, 4}});
  EXPECT_TRUE(std::filesystem::exists(dir_ / "OutputDigest.NamesCallsByTestAndNumber.0"));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "OutputDigest.NamesCallsByTestAndNumber.1"));
}

TEST(OutputDigestHash, DependsOnEveryByteAndItsPlace) {
  const uint8_t a[] = {1, 2}, b[] = {2, 1};
  EXPECT_NE(fnv1a_64({{a, 2}}), fnv1a_64({{b, 2}}));
  EXPECT_EQ(fnv1a_64({{a, 1}, {a + 1, 1}}), fnv1a_64({{a, 2}}));  // parts are one stream
  EXPECT_EQ(fnv1a_64({}), 0xcbf29ce484222325ull);
}

}  // namespace
}  // namespace dsv4::test
