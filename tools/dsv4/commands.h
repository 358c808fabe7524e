// Subcommands of the `dsv4` CLI. Each takes the arguments after its name and returns the exit
// code. Argument parsing helpers live in args.h.
#pragma once

#include <string>
#include <vector>

namespace dsv4::cli {

using Args = std::vector<std::string>;

int cmd_info(const Args& args);   // build, backends, device; --config, --layouts
int cmd_run(const Args& args);    // the main job: serving simulation through the attention stack
int cmd_bench(const Args& args);  // kernel benchmarks of docs/performance.md; `bench layer`: layer steps

}  // namespace dsv4::cli
