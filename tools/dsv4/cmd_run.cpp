#include <cstdio>

#include "commands.h"

namespace dsv4::cli {
int cmd_run(const Args&) {
  std::fprintf(stderr, "dsv4 run: not available yet in this build\n");
  return 2;
}
}  // namespace dsv4::cli
