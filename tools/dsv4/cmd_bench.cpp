#include <cstdio>

#include "commands.h"

namespace dsv4::cli {
int cmd_bench(const Args& args) {
  if (!args.empty() && args[0] == "decode") return bench_decode(Args(args.begin() + 1, args.end()));
  std::fprintf(stderr, "dsv4 bench: not available yet in this build (try `dsv4 bench decode`)\n");
  return 2;
}
}  // namespace dsv4::cli
