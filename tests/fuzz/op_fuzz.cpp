// dsv4_fuzz: a fuzz driver over every op's front door (issue 16, item 7).
//
// Each case draws an op from op_table(), a valid argument set for it, and 0–3 generic mutations
// (mutate.h), then calls the op through the public API and checks:
//   - it returns or throws dsv4::Error — any other exception is a failure, and a crash or a
//     sanitizer report ends the process (the ctest entry runs an ASan + UBSan build);
//   - on rejection, no byte of any buffer changed (outputs are poisoned with random bytes and
//     every buffer is compared after the call, caches and in-place inputs included);
//   - on acceptance, no byte outside the output / inout views changed (a write past a view, or
//     into an input, shows here even when the sanitizers cannot see it: in the padding of a
//     strided view, or in device memory);
//   - an unmutated case is accepted on the CPU (the happy path runs, and the generators stay
//     honest), and every op is accepted at least once and rejected at least once per run.
// Every case is reproducible from (seed, case number): a failure prints the command that replays it.
//
// Usage: dsv4_fuzz [--seconds N] [--seed S] [--cases N] [--op NAME] [--case I] [--require-cuda]
//                  [--verbose]
// With a CUDA device present, a quarter of the valid cases run on the device, and the device
// mutations mix CPU and CUDA arguments; --require-cuda exits 77 (skipped) without one.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>

#include "dsv4/device_tensor.h"
#include "dsv4/status.h"
#include "mutate.h"
#include "op_table.h"

namespace {

using namespace dsv4::fuzz;

struct Options {
  double seconds = 30;
  uint64_t seed = 1;
  int64_t cases = -1;      // stop after this many (-1: run for `seconds`)
  int64_t only_case = -1;  // replay one case
  std::string op;          // only this op
  bool require_cuda = false;
  bool verbose = false;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "dsv4_fuzz: %s\nusage: dsv4_fuzz [--seconds N] [--seed S] [--cases N] [--op NAME] "
               "[--case I] [--require-cuda] [--verbose]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int k = 1; k < argc; ++k) {
    const std::string a = argv[k];
    auto value = [&]() -> std::string {
      if (k + 1 >= argc) usage(("missing value of " + a).c_str());
      return argv[++k];
    };
    if (a == "--seconds") o.seconds = std::stod(value());
    else if (a == "--seed") o.seed = std::stoull(value());
    else if (a == "--cases") o.cases = std::stoll(value());
    else if (a == "--case") o.only_case = std::stoll(value());
    else if (a == "--op") o.op = value();
    else if (a == "--require-cuda") o.require_cuda = true;
    else if (a == "--verbose") o.verbose = true;
    else usage(("unknown argument " + a).c_str());
  }
  return o;
}

// splitmix64: the seed of case i, independent of every other case.
uint64_t case_seed(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct OpStats {
  int64_t accepted = 0, rejected = 0, skipped = 0;
};

enum class Outcome { accepted, rejected, skipped, failed };

struct Runner {
  const Options& opt;
  Devices devices;
  std::vector<const OpSpec*> ops;
  std::map<std::string, OpStats> stats;

  // Builds and runs case i. On a failure prints what happened and how to replay it.
  Outcome run_case(int64_t i) {
    Rng rng(case_seed(opt.seed, static_cast<uint64_t>(i)));
    const OpSpec& op = *ops[static_cast<size_t>(draw(rng, 0, static_cast<int64_t>(ops.size()) - 1))];
    Case c = op.make(rng);
    if (devices.cuda_available && draw(rng, 0, 3) == 0) move_all_to_cuda(c);
    const int64_t draws = draw_of<int64_t>(rng, {0, 1, 1, 1, 2, 3});
    for (int64_t m = 0, tries = 0; m < draws && tries < 64; ++tries)
      if (mutate_once(c, rng, devices)) ++m;
    const int64_t bytes = case_bytes(c);
    if (bytes < 0 || bytes > Materialized::kMaxBytes) {
      ++stats[op.name].skipped;
      return Outcome::skipped;
    }
    const bool on_cuda = [&] {
      for (const Arg& a : c.args)
        if (a.cuda) return true;
      return false;
    }();

    if (opt.verbose) {  // before the call: a crash leaves the case it happened in on stdout
      std::printf("case %lld: %s\n%s", static_cast<long long>(i), op.name.c_str(), c.describe().c_str());
      for (const std::string& mu : c.mutations) std::printf("  mutation: %s\n", mu.c_str());
      std::fflush(stdout);
    }
    std::string failure, error;
    bool rejected = false;
    {
      Materialized m(c, rng, devices.cuda_available);
      const auto before = m.snapshot();
      try {
        op.call(Bound(c, m));
      } catch (const dsv4::Error& e) {
        rejected = true;
        error = e.what();
      } catch (const SanityFailure& e) {
        failure = std::string("sanity check failed: ") + e.what();
      } catch (const std::exception& e) {
        failure = std::string("threw a non-dsv4::Error exception: ") + e.what();
      } catch (...) {
        failure = "threw something that is not a std::exception";
      }
      if (failure.empty()) {
        try {
          failure = check_memory(m, before, rejected);
        } catch (const dsv4::Error& e) {  // copying device buffers back failed
          failure = std::string("reading the buffers back after the call failed (a CUDA fault?): ") + e.what();
        }
      }
    }
    if (failure.empty() && rejected && c.mutations.empty() && !on_cuda)
      failure = "the valid case was rejected: " + error;
    if (opt.verbose || !failure.empty()) {
      std::printf("case %lld: %s %s%s\n", static_cast<long long>(i), op.name.c_str(),
                  rejected ? "rejected" : "accepted", on_cuda ? " (CUDA)" : "");
      if (rejected) std::printf("  error: %s\n", error.c_str());
    }
    if (!failure.empty()) {
      for (const std::string& mu : c.mutations) std::printf("  mutation: %s\n", mu.c_str());
      std::printf("FAILURE: %s\n%s", failure.c_str(), c.describe().c_str());
      std::printf("replay: dsv4_fuzz --seed %llu --case %lld\n", static_cast<unsigned long long>(opt.seed),
                  static_cast<long long>(i));
      return Outcome::failed;
    }
    ++(rejected ? stats[op.name].rejected : stats[op.name].accepted);
    return rejected ? Outcome::rejected : Outcome::accepted;
  }

  // The memory properties: nothing changed on rejection, nothing outside the outputs otherwise.
  static std::string check_memory(const Materialized& m, const std::vector<std::vector<uint8_t>>& before,
                                  bool rejected) {
    const auto after = m.snapshot();
    const auto writable = m.writable_masks();
    for (size_t b = 0; b < before.size(); ++b)
      for (size_t k = 0; k < before[b].size(); ++k)
        if (before[b][k] != after[b][k] && (rejected || !writable[b][k]))
          return (rejected ? "a rejected call changed buffer " : "an accepted call wrote outside its outputs: buffer ") +
                 std::to_string(b) + ", byte " + std::to_string(k);
    return {};
  }
};

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  Runner run{opt, {dsv4::cuda_built(), dsv4::cuda_available()}, {}, {}};
  if (opt.require_cuda && !run.devices.cuda_available) {
    std::printf("dsv4_fuzz: no CUDA device: skipped\n");
    return 77;
  }
  for (const OpSpec& op : op_table())
    if (opt.op.empty() || op.name == opt.op) run.ops.push_back(&op);
  if (run.ops.empty()) usage(("no op named " + opt.op).c_str());

  if (opt.only_case >= 0) return run.run_case(opt.only_case) == Outcome::failed ? 1 : 0;

  const auto start = std::chrono::steady_clock::now();
  int64_t i = 0;
  for (;; ++i) {
    if (opt.cases >= 0 ? i >= opt.cases
                       : std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= opt.seconds)
      break;
    if (run.run_case(i) == Outcome::failed) return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("dsv4_fuzz: seed %llu, %lld cases in %.1f s%s\n", static_cast<unsigned long long>(opt.seed),
              static_cast<long long>(i), secs, run.devices.cuda_available ? " (CUDA device present)" : "");
  std::printf("  %-32s %9s %9s %9s\n", "op", "accepted", "rejected", "skipped");
  bool starved = false;
  for (const OpSpec* op : run.ops) {
    const OpStats& s = run.stats[op->name];
    std::printf("  %-32s %9lld %9lld %9lld\n", op->name.c_str(), static_cast<long long>(s.accepted),
                static_cast<long long>(s.rejected), static_cast<long long>(s.skipped));
    // With enough cases, an op never accepted (or never rejected) means its generator or the
    // mutations stopped reaching it: a fuzz run that tests nothing must not pass.
    if (s.accepted + s.rejected >= 50 && (s.accepted == 0 || s.rejected == 0)) {
      std::printf("FAILURE: %s was never %s\n", op->name.c_str(), s.accepted == 0 ? "accepted" : "rejected");
      starved = true;
    }
  }
  return starved ? 1 : 0;
}
