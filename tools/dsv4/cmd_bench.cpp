#include "bench_harness.h"
#include "commands.h"

namespace dsv4::cli {
int cmd_bench(const Args& args) { return dsv4::bench::run_bench_cli(args); }
}  // namespace dsv4::cli
