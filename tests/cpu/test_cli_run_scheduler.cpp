// `dsv4 run` under cache pressure, end to end (the built binary, tiny config): the run sizes its
// pools from the workload and --kv-memory, queues what does not fit, still passes --check, and
// reports tokens/s, p50/p99 step latency per phase and the scheduler's counters.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_support.h"
#include "dsv4/config.h"
#include "kv_pools.h"
#include "weights_test_support.h"

namespace {

using Result = dsv4_test::CliResult;

Result run_cli(const std::string& args) { return dsv4_test::run_cli("run " + args, "OMP_NUM_THREADS=1"); }

nlohmann::json read_json(const std::string& path) {
  nlohmann::json j;
  std::ifstream(path) >> j;
  return j;
}

// The issue's reproduction (issue 14: "swa cache exhausted" with 64 x 1024 and an 8192-token
// budget) on the tiny config's SWA layer, whose pool ran out (all four layers take minutes of
// CPU; the SWA pool's sizing and recycling are what failed): it now completes.
TEST(CliRunScheduler, IssueReproductionCompletes) {
  dsv4_test::TempDir dir;
  const Result r = run_cli("--model tiny --layers 0 --requests 64 --prompt-len 1024 --chunk 8192 "
                           "--quiet --json " + dir.file("r.json"));
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json j = read_json(dir.file("r.json"));
  int64_t tokens = 0;
  for (const auto& p : j["phases"]) tokens += p["tokens"].get<int64_t>();
  EXPECT_EQ(tokens, 64 * (1024 + 16));  // --decode-steps defaults to 16
  EXPECT_EQ(j["kv_cache"]["resident_requests"].get<int>(), 64);  // the default budget holds them all
}

// --kv-memory of about one request's worth: requests wait, every one finishes, the sampled
// requests still match the float64 reference, and the report carries the new fields.
TEST(CliRunScheduler, TightKvMemoryQueuesAndPassesCheck) {
  const auto cfg = dsv4::ModelConfig::builtin("tiny");
  const dsv4::cli::KvWorkload w{{100, 60, 130}, 8, 64};
  const dsv4::cli::KvPoolSizes all = dsv4::cli::size_kv_pools(cfg, {0, 1, 2, 3}, {}, w, int64_t{1} << 40);
  dsv4_test::TempDir dir;
  const Result r = run_cli("--model tiny --requests 3 --prompt-len 100,60,130 --decode-steps 8 --chunk 64 "
                           "--check --check-requests 2 --quiet --kv-memory " +
                           std::to_string(all.one_request_bytes) + " --json " + dir.file("r.json"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("check: passed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("p99 (ms)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the rest wait"), std::string::npos) << r.output;
  const nlohmann::json j = read_json(dir.file("r.json"));
  EXPECT_TRUE(j["check"]["passed"].get<bool>());
  EXPECT_EQ(j["kv_cache"]["resident_requests"].get<int>(), 1);
  EXPECT_LE(j["kv_cache"]["bytes"].get<int64_t>(), all.one_request_bytes);
  EXPECT_GT(j["scheduler"]["waited_requests"].get<int64_t>(), 0);
  int64_t tokens = 0;
  std::set<std::string> phases;
  for (const auto& p : j["phases"]) {
    tokens += p["tokens"].get<int64_t>();
    phases.insert(p["phase"].get<std::string>());
    if (p["steps"].get<int64_t>() > 0) {
      EXPECT_GT(p["p50_ms"].get<double>(), 0) << p;
      EXPECT_GE(p["p99_ms"].get<double>(), p["p50_ms"].get<double>()) << p;
      EXPECT_GT(p["tokens_per_s"].get<double>(), 0) << p;
    }
  }
  EXPECT_EQ(phases, (std::set<std::string>{"prefill", "decode", "mixed"}));
  EXPECT_EQ(tokens, 100 + 60 + 130 + 3 * 8 + j["scheduler"]["recomputed_tokens"].get<int64_t>());
}

TEST(CliRunScheduler, MaxRunningCapsTheBatch) {
  dsv4_test::TempDir dir;
  const Result r = run_cli("--model tiny --layers 0 --requests 3 --prompt-len 20 --decode-steps 2 --max-running 1 "
                           "--quiet --json " + dir.file("r.json"));
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json j = read_json(dir.file("r.json"));
  EXPECT_EQ(j["scheduler"]["peak_running"].get<int>(), 1);
  EXPECT_EQ(j["scheduler"]["waited_requests"].get<int64_t>(), 0);  // waiting for a slot, not for cache
}

TEST(CliRunScheduler, BadKvArgumentsAreErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"--kv-memory 1K", "cannot hold the largest request alone"},
      {"--kv-memory lots", "--kv-memory"},
      {"--kv-memory 0", "--kv-memory"},
      {"--kv-memory 150%", "--kv-memory"},
      {"--max-running -1", "--max-running"},
      {"--max-running 4294967297", "--max-running"},
  };
  for (const auto& [args, what] : cases) {
    const Result r = run_cli(std::string("--model tiny --layers 0 --requests 2 --prompt-len 64 --quiet ") + args);
    EXPECT_EQ(r.status, 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << args << ": " << r.output;
  }
}

}  // namespace
