#include "bench_harness.h"
#include "commands.h"

namespace dsv4::cli {
// `dsv4 bench layer ...` times whole layer steps; anything else runs the kernel cases.
int cmd_bench(const Args& args) {
  if (!args.empty() && args[0] == "layer")
    return dsv4::bench::run_layer_bench_cli(Args(args.begin() + 1, args.end()));
  return dsv4::bench::run_bench_cli(args);
}
}  // namespace dsv4::cli
