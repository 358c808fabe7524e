// `dsv4 info`: the build (version, compiler, backends, CUDA architectures), the device, a model's
// attention settings (--config / --model), the KV layouts' byte geometry (--layouts) and the
// op × backend matrix with each backend's features (--ops).
#include <omp.h>

#include <cstdio>
#include <string>

#include "args.h"
#include "commands.h"
#include "dsv4/config.h"
#include "dsv4/kv_layout.h"
#include "dsv4/status.h"
#include "dsv4/version.h"
#include "ops/describe.h"
#include "runtime/device_runtime.h"

#ifndef DSV4_CUDA_ARCHS_STR
#define DSV4_CUDA_ARCHS_STR ""
#endif

namespace dsv4::cli {

namespace {

const std::vector<FlagSpec>& info_flags() {
  static const std::vector<FlagSpec> flags = {
      {"config", true, "print the attention settings of a config.json (file or directory)", "PATH"},
      {"model", true, "print the attention settings of a built-in model (" , "NAME"},
      {"layouts", false, "print each KV layout's bytes per token and per block"},
      {"block-size", true, "tokens per block for --layouts (default 64)", "B"},
      {"ops", false, "print the op x backend matrix and each backend's supported features"},
  };
  return flags;
}

std::vector<FlagSpec> flags_with_model_names() {
  std::vector<FlagSpec> flags = info_flags();
  std::string names;
  for (const auto& n : ModelConfig::builtin_names()) names.append(names.empty() ? "" : ", ").append(n);
  flags[1].help += names + ")";
  return flags;
}

void print_build() {
  std::printf("dsv4attn %s\n", dsv4::version());
#if defined(__clang__)
  std::printf("compiler      clang %s\n", __clang_version__);
#elif defined(__GNUC__)
  std::printf("compiler      gcc %s\n", __VERSION__);
#endif
  std::printf("cpu backend   yes (OpenMP, %d threads)\n", omp_get_max_threads());
  if (!rt::built()) {
    std::printf("cuda backend  not built (no GPU support in this binary)\n");
    return;
  }
  const int cudart = rt::runtime_version();
  std::printf("cuda backend  yes (archs sm_%s, built with CUDA runtime %d.%d)\n", DSV4_CUDA_ARCHS_STR,
              cudart / 1000, (cudart % 1000) / 10);
  std::string why;
  const std::vector<rt::DeviceInfo> gpus = rt::devices(&why);
  if (gpus.empty()) std::printf("gpu           none (%s)\n", why.c_str());
  for (size_t d = 0; d < gpus.size(); ++d)
    std::printf("gpu %zu         %s, sm_%d%d, %d SMs, %.1f GiB\n", d, gpus[d].name.c_str(),
                gpus[d].sm_major, gpus[d].sm_minor, gpus[d].sms,
                static_cast<double>(gpus[d].total_bytes) / (1024.0 * 1024.0 * 1024.0));
}

void print_layouts(int block_size) {
  std::printf("KV layouts at block size %d (tokens per block):\n", block_size);
  std::printf("  %-16s %5s %12s %14s %10s\n", "layout", "dim", "bytes/token", "bytes/block",
              "padding");
  for (KvLayout l : {KvLayout::model1_fp8, KvLayout::v32_fp8, KvLayout::bf16,
                     KvLayout::fp8_per_tensor}) {
    const KvGeometry g = kv_geometry(l, block_size);
    std::printf("  %-16s %5d %12d %14lld %10lld\n", std::string(kv_layout_name(l)).c_str(), g.dim,
                g.token_bytes, static_cast<long long>(g.block_bytes),
                static_cast<long long>(g.block_bytes - int64_t{block_size} * g.token_bytes));
  }
}

}  // namespace

int cmd_info(const Args& argv) {
  const std::vector<FlagSpec> flags = flags_with_model_names();
  const ParsedArgs args = parse_args("info", argv, flags);
  if (args.has("help")) {
    std::fputs(format_help("dsv4 info [--config PATH | --model NAME | --layouts [--block-size B] | --ops]",
                           flags)
                   .c_str(),
               stdout);
    std::puts("Without options: version, build (backends, CUDA archs) and the GPU if present.");
    return 0;
  }
  if (args.has("block-size") && !args.has("layouts"))
    fail("--block-size: only meaningful with --layouts");
  bool printed = false;
  if (args.has("config")) {
    std::fputs(describe(ModelConfig::from_json_file(args.get_string("config"))).c_str(), stdout);
    printed = true;
  }
  if (args.has("model")) {
    std::fputs(describe(ModelConfig::builtin(args.get_string("model"))).c_str(), stdout);
    printed = true;
  }
  if (args.has("layouts")) {
    const int64_t b = args.get_int("block-size", 64, 1, 1 << 16);
    print_layouts(static_cast<int>(b));
    printed = true;
  }
  if (args.has("ops")) {
    std::fputs(ops::describe_op_matrix().c_str(), stdout);
    printed = true;
  }
  if (!printed) print_build();
  return 0;
}

}  // namespace dsv4::cli
