// `dsv4 bench layer` end to end on the CPU backend with the tiny model: every layer kind and
// phase runs, the JSON report has the documented fields, and its floors are consistent with its
// own FLOPs, bytes and ceilings; plus --list, the filters and argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cli_test_support.h"
#include "dsv4/batch.h"
#include "weights_test_support.h"

namespace {

using Result = dsv4_test::CliResult;

Result bench_layer(const std::string& args) {
  return dsv4_test::run_cli("bench layer --backend cpu " + args, "OMP_NUM_THREADS=1");
}

// Small enough for a second or two: prefill 8 x 4 and 4 x 8 @ 16, decodes at context 136 (past
// the tiny window of 16 and one ratio-128 entry), MTP 2 x 2.
const char* kSmall = "--model tiny --prefill-tokens 32 --context 136 --decode-requests 1,2 --mtp-requests 2 --reps 2 "
                     "--prefill-reps 1 --warmup 1 --cooldown-ms 0";

TEST(CliBenchLayer, CpuTinyReportHasEveryKindPhaseAndConsistentFloors) {
  dsv4_test::TempDir dir;
  const Result r = bench_layer(std::string(kSmall) + " --commit abc1234 --json " + dir.file("layer.json"));
  ASSERT_EQ(r.status, 0) << r.output;
  nlohmann::json j;
  std::ifstream(dir.file("layer.json")) >> j;
  EXPECT_EQ(j["commit"], "abc1234");
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_TRUE(j["device"].is_string());
  const auto& ceil = j["ceilings"];
  for (const char* k : {"fp8_tflops", "bf16_tflops", "copy_gbps"}) EXPECT_GT(ceil[k].get<double>(), 0) << k;

  std::set<std::string> kinds, names;
  ASSERT_EQ(j["cases"].size(), 3u * 5u);  // 3 kinds x (2 prefill + 2 decode + 1 MTP)
  for (const auto& c : j["cases"]) {
    kinds.insert(c["kind"].get<std::string>());
    names.insert(c["case"].get<std::string>());
    EXPECT_EQ(c["model"], "tiny");
    EXPECT_EQ(c["tokens"].get<int64_t>(),
              c["requests"].get<int64_t>() * (c["phase"] == "prefill" ? (c["requests"] == 8 ? 4 : 8)
                                                                       : c["phase"] == "mtp" ? 2 : 1));
    EXPECT_GT(c["wall_us"].get<double>(), 0);
    EXPECT_GT(c["forward_us"].get<double>(), 0);
    EXPECT_LE(c["forward_us"].get<double>(), c["wall_us"].get<double>());
    EXPECT_GT(c["gpu_us"].get<double>(), 0);
    EXPECT_TRUE(c["floor_complete"].get<bool>()) << c["unmodeled_ops"];
    EXPECT_EQ(c["wall_mode"], "eager");
    EXPECT_EQ(c["graph_gpu_us"].get<double>(), 0.0);  // no graphs on the CPU
    EXPECT_EQ(c["graph_replays"].get<int>(), 0);
    // Floors: each op's is max(FLOPs / its rate, bytes / copy); the case's is their sum.
    double sum = 0;
    ASSERT_FALSE(c["ops"].empty());
    for (const auto& op : c["ops"]) {
      ASSERT_TRUE(op["modeled"].get<bool>()) << op["name"];
      const double compute = 1e-6 * (op["flop_fp8"].get<double>() / ceil["fp8_tflops"].get<double>() +
                                     op["flop_bf16"].get<double>() / ceil["bf16_tflops"].get<double>());
      const double memory = 1e-3 * op["bytes"].get<double>() / ceil["copy_gbps"].get<double>();
      EXPECT_NEAR(op["floor_us"].get<double>(), std::max(compute, memory), 1e-9 * std::max(compute, memory))
          << op["name"];
      EXPECT_DOUBLE_EQ(op["flop"].get<double>(), op["flop_fp8"].get<double>() + op["flop_bf16"].get<double>());
      EXPECT_GT(op["bytes"].get<double>(), 0) << op["name"];
      EXPECT_GE(op["gpu_us"].get<double>(), 0);
      sum += op["floor_us"].get<double>();
    }
    EXPECT_NEAR(c["floor_us"].get<double>(), sum, 1e-9 * sum);
    EXPECT_GT(sum, 0);
    // Decode-path ops where every request is decode-like (context > 0, at most
    // BatchPlan::kMaxDecodeLikeTokens new tokens: the decode and MTP cases, and tiny's 4 x 8
    // continuing prefill), prefill-path ops on the others.
    bool has_decode_op = false, has_prefill_op = false;
    for (const auto& op : c["ops"]) {
      has_decode_op = has_decode_op || op["name"] == "sparse_decode";
      has_prefill_op = has_prefill_op || op["name"] == "sparse_prefill";
    }
    const int64_t per_request = c["tokens"].get<int64_t>() / c["requests"].get<int64_t>();
    const bool decode_like = c["context"].get<int64_t>() > 0 && per_request <= dsv4::BatchPlan::kMaxDecodeLikeTokens;
    EXPECT_EQ(has_decode_op, decode_like) << c["case"];
    EXPECT_EQ(has_prefill_op, !decode_like) << c["case"];
    if (c["phase"] != "prefill") {
      EXPECT_TRUE(decode_like) << c["case"];
    }
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"SWA", "C4A", "C128A"}));
  EXPECT_EQ(names, (std::set<std::string>{"prefill-8x4", "prefill-4x8@16", "decode-1", "decode-2", "mtp-2x2"}));
  EXPECT_NE(r.output.find("floor"), std::string::npos);
}

TEST(CliBenchLayer, HostOnlyTimesThePlanningOfDecodeAndMtpStepsWithoutWeights) {
  // V4-Flash's geometry without its weights or compute: a line per kind and pool case.
  const Result r = dsv4_test::run_cli(
      "bench layer --host-only --model v4-flash --context 512 --decode-requests 1,8 --mtp-requests 4 "
      "--reps 3 --warmup 1");
  ASSERT_EQ(r.status, 0) << r.output;
  size_t lines = 0;
  for (size_t at = r.output.find("host planning"); at != std::string::npos; at = r.output.find("host planning", at + 1))
    ++lines;
  EXPECT_EQ(lines, 3u * 3u) << r.output;  // SWA, C4A, C128A x decode-1, decode-8, mtp-4x2
  for (const char* name : {"decode-1", "decode-8", "mtp-4x2", "C4A", "C128A", "SWA"})
    EXPECT_NE(r.output.find(name), std::string::npos) << name << "\n" << r.output;
  EXPECT_EQ(r.output.find("prefill-"), std::string::npos) << r.output;
}

TEST(CliBenchLayer, ListAndFiltersSelectCases) {
  const Result r = bench_layer("--model tiny --list --kind c4a --phase decode,mtp --decode-requests 1,32");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("layer 1   C4A"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("decode-32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mtp-4x2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("prefill"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("SWA"), std::string::npos) << r.output;

  const Result big = bench_layer("--list --model v4-pro --case 4x4096 --prefill-tokens 16384");
  ASSERT_EQ(big.status, 0) << big.output;
  // V4-Pro's first layers are C128A (0) and C4A (2); its only SWA layer is the MTP block's (61).
  EXPECT_NE(big.output.find("layer 61  SWA    prefill-4x4096@8192"), std::string::npos) << big.output;
  EXPECT_NE(big.output.find("layer 0   C128A"), std::string::npos) << big.output;
}

TEST(CliBenchLayer, BadArgumentsAreErrors) {
  const Result kind = bench_layer("--model tiny --kind mla --list");
  EXPECT_EQ(kind.status, 1);
  EXPECT_NE(kind.output.find("--kind"), std::string::npos) << kind.output;
  const Result none = bench_layer("--model tiny --case nothing-matches --list");
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.output.find("no case matches"), std::string::npos) << none.output;
  const Result prefill = bench_layer("--model tiny --prefill-tokens 12 --list");
  EXPECT_EQ(prefill.status, 1);
  EXPECT_NE(prefill.output.find("--prefill-tokens"), std::string::npos) << prefill.output;
  const Result wall = bench_layer(std::string(kSmall) + " --wall replayed");
  EXPECT_EQ(wall.status, 1);
  EXPECT_NE(wall.output.find("--wall"), std::string::npos) << wall.output;
  const Result v32 = bench_layer("--model v3.2 --list");
  EXPECT_EQ(v32.status, 1);
  EXPECT_NE(v32.output.find("DeepSeek-V4"), std::string::npos) << v32.output;
}

}  // namespace

namespace {

// --tp 2 on the CPU times rank 0's shard of the tiny layer: the report records tp and tp_mode
// "shard", its ops are priced on the shard (wo_a counts half the whole layer's FLOPs), and a tp
// that does not divide the heads is refused before anything runs.
TEST(CliBenchLayer, TensorParallelTimesOneRanksShard) {
  dsv4_test::TempDir dir;
  const auto wo_a_flop = [&](const std::string& extra, const std::string& file) {
    const dsv4_test::CliResult r = dsv4_test::run_cli(
        "bench layer --backend cpu --model tiny --kind swa --phase decode --decode-requests 1 --reps 1 --json " +
            dir.file(file) + extra,
        "OMP_NUM_THREADS=1");
    EXPECT_EQ(r.status, 0) << r.output;
    nlohmann::json j;
    std::ifstream(dir.file(file)) >> j;
    for (const auto& op : j["cases"][0]["ops"])
      if (op["name"] == "wo_a") return std::make_pair(j["settings"]["tp"].get<int>(), op["flop"].get<double>());
    return std::make_pair(0, 0.0);
  };
  const auto [tp1, flop1] = wo_a_flop("", "tp1.json");
  const auto [tp2, flop2] = wo_a_flop(" --tp 2", "tp2.json");
  EXPECT_EQ(tp1, 1);
  EXPECT_EQ(tp2, 2);
  // The CPU times the shard (tp_mode "shard"); ranks on GPUs: tests/nccl/test_cli_tensor_parallel.cpp.
  for (const auto& [file, mode] : {std::pair{"tp1.json", "none"}, std::pair{"tp2.json", "shard"}}) {
    nlohmann::json j;
    std::ifstream(dir.file(file)) >> j;
    EXPECT_EQ(j["settings"]["tp_mode"], mode) << file;
  }
  EXPECT_GT(flop1, 0.0);
  EXPECT_DOUBLE_EQ(2 * flop2, flop1);
  const dsv4_test::CliResult bad = dsv4_test::run_cli("bench layer --backend cpu --model tiny --tp 3");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("--tp: tp.size: expected a divisor of n_heads 16, got 3"), std::string::npos) << bad.output;
}

}  // namespace
