// Runs the built `dsv4` binary (its path comes from the build: DSV4_CLI_PATH) with arguments and
// captures its exit status and combined stdout/stderr.
#pragma once

#include <cstdio>
#include <string>
#include <sys/wait.h>

namespace dsv4_test {

struct CliResult {
  int status;
  std::string output;
};

// `env` is prepended to the command line (e.g. "OMP_NUM_THREADS=1").
inline CliResult run_cli(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + (env.empty() ? "" : " ") + std::string(DSV4_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return {-1, ""};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int raw = pclose(pipe);
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, out};
}

}  // namespace dsv4_test
