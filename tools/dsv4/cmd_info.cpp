#include <cstdio>

#include "commands.h"

namespace dsv4::cli {
int cmd_info(const Args&) {
#ifdef DSV4_WITH_CUDA
  std::puts("dsv4attn 0.1.0  backends: cpu cuda");
#else
  std::puts("dsv4attn 0.1.0  backends: cpu");
#endif
  return 0;
}
}  // namespace dsv4::cli
