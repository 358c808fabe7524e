// `dsv4 run` on the GPU warms up before it times (one prefill and one decode step of stand-in
// requests, released after), and the warm-up changes nothing the run computes: with and without
// it, the checked request's every layer output stands at the same distance from the float64
// reference. Skipped without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>

#include "cpu/cli_test_support.h"
#include "gpu_test_util.h"

namespace {

nlohmann::json run_json(const std::string& extra, const char* tag) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            (std::string("dsv4_run_warmup_") + tag + "_" + std::to_string(::getpid()) + ".json"))
                               .string();
  const dsv4_test::CliResult r = dsv4_test::run_cli(
      "run --model v4-flash --layers 0,2,3 --backend cuda --requests 2 --prompt-len 200,120 --decode-steps 4 "
      "--chunk 256 --check --quiet --json " + json + extra);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("check: passed"), std::string::npos) << r.output;
  nlohmann::json j;
  std::ifstream(json) >> j;
  std::filesystem::remove(json);
  return j;
}

TEST(CliRunCuda, WarmsUpAndTheWarmUpChangesNothing) {
  DSV4_SKIP_WITHOUT_GPU();
  const nlohmann::json warm = run_json("", "on");
  const nlohmann::json cold = run_json(" --no-warmup", "off");
  // The reservation: steps of 256 tokens, context 204 → stand-ins of 203 tokens, one per 203.
  EXPECT_EQ(warm["warmup"]["requests"].get<int>(), 1);
  EXPECT_EQ(warm["warmup"]["prompt"].get<int64_t>(), 203);
  EXPECT_GT(warm["warmup"]["seconds"].get<double>(), 0.0);
  EXPECT_EQ(cold["warmup"]["requests"].get<int>(), 0);
  ASSERT_EQ(warm["check"]["layers"].size(), 3u);
  ASSERT_EQ(cold["check"]["layers"].size(), 3u);
  for (size_t l = 0; l < 3; ++l) {
    // The layers are deterministic run to run (graphs and eager steps alike), so the same inputs
    // give the same outputs: the same error to the last bit.
    EXPECT_EQ(warm["check"]["layers"][l]["max_rel_err"].get<double>(),
              cold["check"]["layers"][l]["max_rel_err"].get<double>())
        << "layer " << warm["check"]["layers"][l]["layer"];
  }
}

}  // namespace
