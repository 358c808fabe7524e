// Test helpers shared by the safetensors and weights tests: a scratch directory per test and an
// error expectation that checks the message names what it should.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <fstream>
#include <nlohmann/json.hpp>

#include "dsv4/config.h"
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

// config.json in the official inference style (ModelArgs keys), written from the config's fields.
inline void write_config_json(const std::string& dir, const dsv4::ModelConfig& c) {
  const nlohmann::json j = {{"dim", c.dim},
                            {"n_heads", c.n_heads},
                            {"head_dim", c.head_dim},
                            {"rope_head_dim", c.rope_head_dim},
                            {"q_lora_rank", c.q_lora_rank},
                            {"o_groups", c.o_groups},
                            {"o_lora_rank", c.o_lora_rank},
                            {"window_size", c.window_size},
                            {"n_layers", c.n_layers() - c.n_mtp_layers},
                            {"n_mtp_layers", c.n_mtp_layers},
                            {"compress_ratios", c.compress_ratios},
                            {"index_n_heads", c.index_n_heads},
                            {"index_head_dim", c.index_head_dim},
                            {"index_topk", c.index_topk},
                            {"norm_eps", c.norm_eps},
                            {"rope_theta", c.rope_theta},
                            {"compress_rope_theta", c.compress_rope_theta},
                            {"rope_factor", c.rope_factor},
                            {"original_seq_len", c.original_seq_len},
                            {"beta_fast", c.beta_fast},
                            {"beta_slow", c.beta_slow},
                            {"max_seq_len", c.max_position}};
  std::ofstream(std::filesystem::path(dir) / "config.json") << j.dump(2);
}

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
