// Smoke test of the built `dsv4` binary: `info`, `info --layouts`, `info --model`, `--help`, and
// an unknown flag. The binary's path comes from the build (DSV4_CLI_PATH).
#include <gtest/gtest.h>

#include <string>

#include "cli_test_support.h"
#include "dsv4/device_tensor.h"

namespace {

using Result = dsv4_test::CliResult;
using dsv4_test::run_cli;

TEST(CliInfo, LayoutsPrintBytesPerTokenAndBlock) {
  const Result r = run_cli("info --layouts --block-size 64");
  ASSERT_EQ(r.status, 0) << r.output;
  // Hand-computed (docs/spec.md §7): MODEL1 584 B/token, 37440 B/block of 64; V32 656 / 41984;
  // BF16 1024 / 65536; FP8_PER_TENSOR 512 / 32768.
  for (const char* want : {"MODEL1_FP8", "584", "37440", "V32_FP8", "656", "41984", "BF16",
                           "65536", "FP8_PER_TENSOR", "32768"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << " missing in:\n" << r.output;
  const Result b256 = run_cli("info --layouts --block-size 256");
  EXPECT_NE(b256.output.find("149760"), std::string::npos) << b256.output;
}

TEST(CliInfo, BuildModelAndHelp) {
  const Result info = run_cli("info");
  ASSERT_EQ(info.status, 0) << info.output;
  EXPECT_NE(info.output.find("dsv4attn"), std::string::npos) << info.output;
  EXPECT_NE(info.output.find("cpu backend"), std::string::npos) << info.output;
  const Result model = run_cli("info --model v4-flash");
  ASSERT_EQ(model.status, 0) << model.output;
  EXPECT_NE(model.output.find("C128A"), std::string::npos) << model.output;
  const Result help = run_cli("info --help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.output.find("--layouts"), std::string::npos) << help.output;
}

TEST(CliInfo, BadArgumentsFail) {
  const Result unknown = run_cli("info --no-such-flag");
  EXPECT_NE(unknown.status, 0);
  EXPECT_NE(unknown.output.find("unknown option '--no-such-flag'"), std::string::npos)
      << unknown.output;
  const Result bad_b = run_cli("info --layouts --block-size zero");
  EXPECT_NE(bad_b.status, 0);
  EXPECT_NE(bad_b.output.find("--block-size"), std::string::npos) << bad_b.output;
  const Result missing = run_cli("info --config /nonexistent/dir");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.output.find("cannot open"), std::string::npos) << missing.output;
}

// `dsv4 bench` checks its options before it looks for a GPU, so this runs everywhere.
TEST(CliBench, ListsCasesAndRejectsBadOptions) {
  const Result list = run_cli("bench --list --filter prefill_flash");
  ASSERT_EQ(list.status, 0) << list.output;
  EXPECT_NE(list.output.find("prefill_flash_h64_d512_topk512_skv8192_sink"), std::string::npos) << list.output;
  EXPECT_EQ(list.output.find("decode_"), std::string::npos) << list.output;
  // A filter ending in '$' must end the name: one case, not its _len sibling.
  const Result one = run_cli("bench --list --filter prefill_flash_h64_d512_topk512_skv8192_sink$");
  ASSERT_EQ(one.status, 0) << one.output;
  EXPECT_NE(one.output.find("prefill_flash_h64_d512_topk512_skv8192_sink "), std::string::npos) << one.output;
  EXPECT_EQ(one.output.find("_sink_len"), std::string::npos) << one.output;
  const Result sub = run_cli("bench --list --filter prefill_flash_h64_d512_topk512_skv8192_sink");
  EXPECT_NE(sub.output.find("_sink_len"), std::string::npos) << sub.output;
  const Result help = run_cli("bench --help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.output.find("--cooldown-ms"), std::string::npos) << help.output;
  const Result cool = run_cli("bench --cooldown-ms -1");
  EXPECT_NE(cool.status, 0);
  EXPECT_NE(cool.output.find("--cooldown-ms: expected >= 0, got -1"), std::string::npos) << cool.output;
  const Result reps = run_cli("bench --reps 5");
  EXPECT_NE(reps.status, 0);
  EXPECT_NE(reps.output.find("--reps: expected >= 20"), std::string::npos) << reps.output;
}

// Without a GPU the harness refuses to run cases, saying why: a build without the CUDA backend,
// or none visible (the harness asks the library at run time, so one binary says either).
TEST(CliBench, WithoutGpuSaysWhyAndRunsNothing) {
  if (dsv4::cuda_available()) GTEST_SKIP() << "a CUDA device is present (the GPU suite runs the cases)";
  const Result r = run_cli("bench --filter prefill_flash --cooldown-ms 0");
  EXPECT_EQ(r.status, 2) << r.output;
  const std::string why = dsv4::cuda_built() ? "dsv4 bench: no CUDA device found; the benchmarks need a GPU"
                                             : "dsv4 bench: this build has no CUDA backend; the benchmarks need a GPU";
  EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("median of"), std::string::npos) << r.output;  // no table header
}

}  // namespace
