#include "bench_harness.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "args.h"
#include "dsv4/status.h"
#include "runtime/device_runtime.h"

namespace dsv4::bench {
namespace {

std::vector<RegisteredGroup>& groups() {
  static std::vector<RegisteredGroup> g;
  return g;
}

constexpr const char* kWhere = "dsv4 bench";

// The first device (the one the cases run on); throws without one.
rt::DeviceInfo first_device() {
  std::string why;
  const std::vector<rt::DeviceInfo> gpus = rt::devices(&why);
  if (gpus.empty()) fail(kWhere, ": no CUDA device (", why, ")");
  return gpus.front();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// --filter: a case whose name contains `filter`; with a trailing '$', whose name ends with the rest
// (one case of a family whose names extend each other: "..._sink" and "..._sink_len").
bool name_matches(const std::string& name, const std::string& filter) {
  if (filter.empty()) return true;
  if (filter.back() != '$') return name.find(filter) != std::string::npos;
  const std::string_view tail(filter.data(), filter.size() - 1);
  return name.size() >= tail.size() && std::string_view(name).substr(name.size() - tail.size()) == tail;
}

void usage() {
  std::puts(
      "usage: dsv4 bench [--filter SUBSTR] [--list] [--json FILE] [--warmup N] [--reps N]\n"
      "                  [--cooldown-ms MS]\n"
      "       dsv4 bench layer [options]   whole layer steps against their floors (--help)\n"
      "  Runs the kernel benchmarks of docs/performance.md on the first CUDA device: median of --reps (>= 20)\n"
      "  CUDA-event timed runs after --warmup runs; prints µs, TFLOP/s, GB/s, % of the bound\n"
      "  ceiling (bf16 or, for the FP8 GEMMs, FP8 tensor cores; or HBM copy) and the FlashMLA\n"
      "  anchor. Groups: prefill, decode (sparse attention), gemm (FP8 projections, V4-Flash).\n"
      "  --filter keeps cases whose name contains SUBSTR (e.g. --filter gemm_fp8); a SUBSTR ending\n"
      "  in '$' must end the name (--filter prefill_v32_h128_d576_topk2048_skv8192_sink$).\n"
      "  --cooldown-ms: the GPU idles this long before each case's runs (default 1000), so no case\n"
      "  inherits the power cap the previous ones drove the clocks into; 0 runs them back to back.");
}

}  // namespace

Registrar::Registrar(const char* group, CaseFactory factory) { groups().push_back({group, factory}); }
const std::vector<RegisteredGroup>& registered_groups() { return groups(); }

Timing time_launch(const LaunchFn& launch, int rotations, int warmup, int reps) {
  const rt::OwnedStream stream;
  std::vector<rt::Event> events;
  events.reserve(2 * static_cast<size_t>(reps));
  // An event is created on its first record: record each once here, so no creation falls between
  // a timed launch and the event that ends it.
  for (int i = 0; i < 2 * reps; ++i) events.emplace_back(/*timing=*/true).record(stream.get());
  for (int i = 0; i < warmup; ++i) launch(stream.get(), i % rotations);
  rt::synchronize_stream(stream.get(), "dsv4 bench: warm-up");
  for (int i = 0; i < reps; ++i) {
    events[2 * i].record(stream.get());
    launch(stream.get(), (warmup + i) % rotations);
    events[2 * i + 1].record(stream.get());
  }
  rt::synchronize_stream(stream.get(), "dsv4 bench: timed runs");
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) us[i] = 1000.0 * rt::Event::elapsed_ms(events[2 * i], events[2 * i + 1]);
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), us.back(), reps};
}

std::shared_ptr<void> device_alloc(size_t bytes) {
  return std::shared_ptr<void>(rt::device_malloc(bytes, kWhere), rt::device_free);
}

std::shared_ptr<void> device_tiled(const std::vector<uint8_t>& pattern, size_t bytes) {
  auto d = device_alloc(bytes);
  for (size_t at = 0; at < bytes; at += pattern.size())
    rt::copy_host_to_device(static_cast<uint8_t*>(d.get()) + at, pattern.data(), std::min(pattern.size(), bytes - at),
                            kWhere);
  return d;
}

int device_count() {
  std::string why;
  return static_cast<int>(rt::devices(&why).size());
}

std::string device_name() {
  const rt::DeviceInfo d = first_device();
  return d.name + " (" + std::to_string(d.sms) + " SMs, sm_" + std::to_string(d.sm_major) +
         std::to_string(d.sm_minor) + ")";
}

int device_sm_count() { return first_device().sms; }

int rotations_beyond_l2(double bytes_per_set) {
  const double l2 = static_cast<double>(first_device().l2_bytes);
  return std::max(1, static_cast<int>(std::ceil(2.0 * l2 / std::max(bytes_per_set, 1.0))));
}

int run_bench_cli(const std::vector<std::string>& args) {
  std::string filter, json_path;
  bool list = false;
  int warmup = 5, reps = 30;
  // Back to back, the tensor-heavy prefill cases hold the H100 at its 700 W cap and the SM clock
  // fell to 1275-1600 MHz for the cases after them (20 ms nvidia-smi samples, docs/notes/history.md,
  // "Sparse attention v9"), so a case's number depended on its place in the sweep. The power
  // controller reacts within ~100 ms; a second of idle gives every case the same start.
  int cooldown_ms = 1000;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) fail("dsv4 bench: ", a, ": expected a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") { usage(); return 0; }
    else if (a == "--filter") filter = value();
    else if (a == "--json") json_path = value();
    else if (a == "--list") list = true;
    // Exact ints (std::stoi took "12x" as 12); the ranges are checked below.
    else if (a == "--warmup") warmup = static_cast<int>(cli::parse_int_flag("warmup", value(), INT_MIN, INT_MAX));
    else if (a == "--reps") reps = static_cast<int>(cli::parse_int_flag("reps", value(), INT_MIN, INT_MAX));
    else if (a == "--cooldown-ms") cooldown_ms = static_cast<int>(cli::parse_int_flag("cooldown-ms", value(), INT_MIN, INT_MAX));
    else { std::fprintf(stderr, "dsv4 bench: unknown option '%s'\n", a.c_str()); usage(); return 2; }
  }
  if (reps < 20) fail("dsv4 bench: --reps: expected >= 20 (median of at least 20 runs), got ", reps);
  if (warmup < 1) fail("dsv4 bench: --warmup: expected >= 1, got ", warmup);
  if (cooldown_ms < 0) fail("dsv4 bench: --cooldown-ms: expected >= 0, got ", cooldown_ms);

  std::vector<std::pair<std::string, Case>> selected;
  for (const auto& g : registered_groups())
    for (auto& c : g.factory())
      if (name_matches(c.name, filter)) selected.emplace_back(g.group, std::move(c));
  if (list) {
    for (const auto& [group, c] : selected) std::printf("%-8s %-44s %s\n", group.c_str(), c.name.c_str(), c.config.c_str());
    return 0;
  }
  if (!rt::built()) {
    std::fprintf(stderr, "dsv4 bench: this build has no CUDA backend; the benchmarks need a GPU\n");
    return 2;
  }
  if (device_count() == 0) {
    std::fprintf(stderr, "dsv4 bench: no CUDA device found; the benchmarks need a GPU\n");
    return 2;
  }
  if (selected.empty()) { std::fprintf(stderr, "dsv4 bench: no case matches '%s'\n", filter.c_str()); return 2; }
  const std::string device = device_name();
  std::printf("device: %s   date: %s   median of %d runs after %d warm-up, %d ms idle before each case\n",
              device.c_str(), utc_now().c_str(), reps, warmup, cooldown_ms);
  std::printf("%-44s %10s %9s %9s %8s %10s %8s\n", "case", "us", "TFLOP/s", "GB/s", "%ceil", "FlashMLA", "ratio");
  nlohmann::json results = nlohmann::json::array();
  for (const auto& [group, c] : selected) {
    const LaunchFn launch = c.setup();
    // Wall-clock window of warm-up + timed runs (Unix ms), to line a case up with clock and
    // power logs (nvidia-smi -lms) sampled beside the sweep.
    const auto unix_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
    std::this_thread::sleep_for(std::chrono::milliseconds(cooldown_ms));
    const int64_t run_from_ms = unix_ms();
    const Timing t = time_launch(launch, c.rotations, warmup, reps);
    const int64_t run_to_ms = unix_ms();
    const double tflops = c.flops / (t.median_us * 1e-6) / 1e12;
    const double gbps = c.bytes / (t.median_us * 1e-6) / 1e9;
    const double tflops_ceiling = c.fp8 ? kFp8TflopsCeiling : kBf16TflopsCeiling;
    const double pct = c.memory_bound ? 100.0 * gbps / kHbmGbpsCeiling : 100.0 * tflops / tflops_ceiling;
    const double ratio = c.anchor_tflops > 0 ? tflops / c.anchor_tflops : 0.0;
    char anchor[32] = "-", ratio_s[32] = "-";
    if (c.anchor_tflops > 0) {
      std::snprintf(anchor, sizeof anchor, "%.0f", c.anchor_tflops);
      std::snprintf(ratio_s, sizeof ratio_s, "%.2fx", ratio);
    }
    std::printf("%-44s %10.1f %9.1f %9.0f %7.1f%% %10s %8s\n", c.name.c_str(), t.median_us, tflops, gbps, pct, anchor, ratio_s);
    std::fflush(stdout);
    results.push_back({{"group", group}, {"name", c.name}, {"config", c.config}, {"median_us", t.median_us},
                       {"min_us", t.min_us}, {"max_us", t.max_us}, {"reps", t.reps}, {"flops", c.flops},
                       {"bytes", c.bytes}, {"tflops", tflops}, {"gbps", gbps},
                       {"bound", c.memory_bound ? "memory" : "compute"}, {"tflops_ceiling", tflops_ceiling},
                       {"percent_of_ceiling", pct},
                       {"flashmla_us", c.anchor_us}, {"flashmla_tflops", c.anchor_tflops},
                       {"ratio_vs_flashmla", ratio}, {"run_from_unix_ms", run_from_ms},
                       {"run_to_unix_ms", run_to_ms}});
  }
  std::printf("TFLOP/s counted as FlashMLA does (docs/performance.md); ratio = our TFLOP/s / FlashMLA's (> 1: faster).\n");
  if (!json_path.empty()) {
    nlohmann::json doc = {{"device", device}, {"date", utc_now()}, {"warmup", warmup}, {"reps", reps},
                          {"cooldown_ms", cooldown_ms},
                          {"ceilings", {{"bf16_tflops", kBf16TflopsCeiling}, {"fp8_tflops", kFp8TflopsCeiling},
                                        {"hbm_gbps", kHbmGbpsCeiling}}},
                          {"results", results}};
    std::ofstream f(json_path);
    if (!f) fail("dsv4 bench: --json: cannot write '", json_path, "'");
    f << doc.dump(2) << "\n";
  }
  return 0;
}

}  // namespace dsv4::bench
