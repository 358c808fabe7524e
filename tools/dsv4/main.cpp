// dsv4: command-line tool of dsv4attn.
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "dsv4/status.h"
#include "dsv4/version.h"

namespace {
void usage() {
  std::puts(
      "usage: dsv4 <command> [options]  |  dsv4 --version\n"
      "  info    build, backends and device; --config PATH, --layouts [--block-size B], --ops\n"
      "  run     serving simulation through a model's attention stack (the main job)\n"
      "  bench   kernel benchmarks (docs/performance.md configs); `bench layer`: layer steps against their floors\n"
      "Run `dsv4 <command> --help` for its options.");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "-V") {
    std::printf("dsv4attn %s\n", dsv4::version());
    return 0;
  }
  dsv4::cli::Args args(argv + 2, argv + argc);
  try {
    if (cmd == "info") return dsv4::cli::cmd_info(args);
    if (cmd == "run") return dsv4::cli::cmd_run(args);
    if (cmd == "bench") return dsv4::cli::cmd_bench(args);
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "dsv4 %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4 %s: internal error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "dsv4: unknown command '%s'\n", cmd.c_str());
  usage();
  return 2;
}
