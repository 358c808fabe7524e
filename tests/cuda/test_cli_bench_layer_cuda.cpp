// `dsv4 bench layer --backend cuda` end to end on the tiny model: the CUDA event op timer, the
// cuBLASLt / copy ceilings and the report, and that every op the CUDA layer marks (act_dequant
// included, which the CPU layer does not run) has a cost model entry.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cpu/cli_test_support.h"
#include "gpu_test_util.h"

namespace {

TEST(CliBenchLayerCuda, TinyReportIsCompleteAndTimed) {
  DSV4_SKIP_WITHOUT_GPU();
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("dsv4_bench_layer_" + std::to_string(::getpid()) + ".json")).string();
  const dsv4_test::CliResult r = dsv4_test::run_cli(
      "bench layer --backend cuda --model tiny --prefill-tokens 256 --context 300 --decode-requests 1,8 "
      "--mtp-requests 4 --reps 3 --prefill-reps 2 --cooldown-ms 0 --json " + json);
  ASSERT_EQ(r.status, 0) << r.output;
  nlohmann::json j;
  std::ifstream(json) >> j;
  std::filesystem::remove(json);
  EXPECT_EQ(j["backend"], "cuda");
  // H100 / H200: FP8 tensor cores outrun bf16 ones, and HBM copies run at TB/s.
  const auto& ceil = j["ceilings"];
  EXPECT_GT(ceil["fp8_tflops"].get<double>(), ceil["bf16_tflops"].get<double>());
  EXPECT_GT(ceil["bf16_tflops"].get<double>(), 100.0);
  EXPECT_GT(ceil["copy_gbps"].get<double>(), 1000.0);
  ASSERT_EQ(j["cases"].size(), 3u * 5u);
  bool saw_fused_quant = false;
  for (const auto& c : j["cases"]) {
    EXPECT_TRUE(c["floor_complete"].get<bool>()) << c["case"] << ": " << c["unmodeled_ops"];
    EXPECT_GT(c["gpu_us"].get<double>(), 0);
    EXPECT_GT(c["wall_us"].get<double>(), 0);
    EXPECT_GT(c["floor_us"].get<double>(), 0);
    // Decode and MTP steps replay their graph: its GPU time is bracketed by events and lies
    // inside the step's wall clock; prefill steps run eagerly and report none.
    if (c["phase"] == "prefill") {
      EXPECT_EQ(c["graph_gpu_us"].get<double>(), 0.0) << c["case"];
      EXPECT_EQ(c["graph_replays"].get<int>(), 0) << c["case"];
    } else {
      EXPECT_EQ(c["wall_mode"], "graph");
      EXPECT_GT(c["graph_gpu_us"].get<double>(), 0.0) << c["case"];
      EXPECT_GE(2 * c["graph_replays"].get<int>(), c["reps"].get<int>()) << c["case"];
      EXPECT_LT(c["graph_gpu_us"].get<double>(), c["wall_us"].get<double>()) << c["case"];
    }
    // The step cannot beat its floor by much (the floor is the least work at measured peaks;
    // tiny steps are launch-bound, far above it).
    EXPECT_GT(c["gpu_us"].get<double>(), 0.5 * c["floor_us"].get<double>()) << c["case"];
    double op_sum = 0;
    for (const auto& op : c["ops"]) {
      op_sum += op["gpu_us"].get<double>();
      saw_fused_quant = saw_fused_quant || op["name"] == "inv_rope_fp8_quant";
    }
    // Op spans tile the forward: their medians add up to about the forward's median.
    EXPECT_NEAR(op_sum, c["gpu_us"].get<double>(), 0.25 * c["gpu_us"].get<double>()) << c["case"];
  }
  EXPECT_TRUE(saw_fused_quant);  // the FP8 output path (inverse RoPE + quant in one op)
}

}  // namespace
