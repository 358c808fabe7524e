// Test helpers shared by the safetensors and weights tests: a scratch directory per test and an
// error expectation that checks the message names what it should.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "dsv4/status.h"

namespace dsv4_test {

// A fresh directory named after the running test (and the process), removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = std::filesystem::temp_directory_path() /
            ("dsv4_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Expects `fn` to throw dsv4::Error whose message contains every fragment.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "no dsv4::Error thrown; expected one mentioning '" << fragments.front() << "'";
  } catch (const dsv4::Error& e) {
    const std::string msg = e.what();
    for (const std::string& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nmissing: " << f;
  }
}

}  // namespace dsv4_test
