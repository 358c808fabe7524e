// `dsv4 bench` harness: a registry of benchmark cases, CUDA-event timing (median of ≥ 20 after
// warm-up), FLOP/byte accounting as docs/performance.md defines it, a table and JSON output.
//
// A file of cases (bench_prefill.cpp, bench_decode.cpp, ...) registers one factory:
//   static const dsv4::bench::Registrar kRegistered("prefill", &my_cases);
// where my_cases() returns the cases; cmd_bench needs no edit when a file is added.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/ops.h"  // Stream

namespace dsv4::bench {

// docs/performance.md ceilings of the lent H100 (re-measured values go to bench/RESULTS.md).
inline constexpr double kBf16TflopsCeiling = 780.0;
inline constexpr double kFp8TflopsCeiling = 1396.0;
inline constexpr double kHbmGbpsCeiling = 2960.0;

// Launches one run on `stream`; `rotation` picks the input set (inputs rotate beyond L2 for
// memory-bound cases so the timing does not measure the cache).
using LaunchFn = std::function<void(Stream stream, int rotation)>;

struct Case {
  std::string name;       // unique; matched by --filter
  std::string config;     // human-readable shape description
  double flops = 0;       // as FlashMLA counts them (docs/performance.md)
  double bytes = 0;       // fewest bytes the op must move through HBM
  bool memory_bound = false;
  bool fp8 = false;           // compute-bound on FP8 tensor cores: % of kFp8TflopsCeiling
  double anchor_us = 0;       // FlashMLA on the same GPU (docs/performance.md), 0 = none
  double anchor_tflops = 0;
  int rotations = 1;          // input sets the launch cycles through
  // Allocates and fills the inputs (on the device), returns the launcher. Called only when the
  // case runs; whatever it allocates is owned by the returned closure.
  std::function<LaunchFn()> setup;
};

using CaseFactory = std::vector<Case> (*)();

struct Registrar {
  Registrar(const char* group, CaseFactory factory);
};

struct RegisteredGroup {
  std::string group;
  CaseFactory factory;
};
const std::vector<RegisteredGroup>& registered_groups();

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
  int reps = 0;
};

// Times `launch` with CUDA events around each run: `warmup` untimed runs, then `reps` timed ones.
Timing time_launch(const LaunchFn& launch, int rotations, int warmup, int reps);

// Device helpers for case setup, through the library's runtime services (src/runtime/): the
// harness decides at run time whether there is a GPU. They throw dsv4::Error on failure.
std::shared_ptr<void> device_alloc(size_t bytes);  // freed when the last owner goes
// `bytes` on the device filled with `pattern` repeated (a host pattern for a large input whose
// values need not differ across it: a cache of ≥ 1 GiB so its gathered rows miss L2).
std::shared_ptr<void> device_tiled(const std::vector<uint8_t>& pattern, size_t bytes);
int device_count();
std::string device_name();
int device_sm_count();
// Number of input sets whose total size exceeds 2× the L2 cache (at least 1).
int rotations_beyond_l2(double bytes_per_set);

// Runs the cases selected by the CLI arguments; returns the exit code.
int run_bench_cli(const std::vector<std::string>& args);
// `dsv4 bench layer` (bench_layer.cpp): whole-layer steps against their floors.
int run_layer_bench_cli(const std::vector<std::string>& args);

}  // namespace dsv4::bench
