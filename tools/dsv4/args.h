// Small argument parser shared by the `dsv4` subcommands: flags `--name value` (or
// `--name=value`) and boolean `--flag`s declared up front; anything undeclared is an error, so
// a typo never silently falls back to a default.
#pragma once

#include <cstdint>
#include <climits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::cli {

struct FlagSpec {
  std::string name;       // without the leading "--"
  bool takes_value;       // --name VALUE vs. --name
  std::string help;       // one line for --help
  std::string value_name = "V";  // shown in --help: --name V
};

class ParsedArgs {
 public:
  bool has(std::string_view name) const;  // given on the command line
  std::string get_string(std::string_view name, std::string_view fallback = "") const;
  // Integer / floating-point values; a malformed value is a dsv4::Error naming the flag.
  // Integers are exact: an optional '-' and decimal digits, nothing else (no "12x", no " 12",
  // no "1e3"), within [lo, hi] — never wrapped or clamped into the type the caller stores.
  int64_t get_int(std::string_view name, int64_t fallback, int64_t lo = INT64_MIN,
                  int64_t hi = INT64_MAX) const;
  double get_double(std::string_view name, double fallback) const;
  // A finite value > 0 (tolerances, scales): "nan", "inf", 0 and negatives are errors.
  double get_positive_double(std::string_view name, double fallback) const;
  // A boolean flag: present → true; a value flag accepts true/false/1/0/yes/no/on/off.
  bool get_bool(std::string_view name, bool fallback = false) const;
  // Comma-separated integers: "128,256,1024", each exact and within [lo, hi].
  std::vector<int64_t> get_int_list(std::string_view name, std::vector<int64_t> fallback = {},
                                    int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  friend ParsedArgs parse_args(std::string_view, const std::vector<std::string>&,
                               const std::vector<FlagSpec>&, bool);
  std::map<std::string, std::string, std::less<>> values_;
  std::vector<std::string> positional_;
};

// Parses `args` (the words after the subcommand). `--help`/`-h` is always accepted (query with
// has("help")). Unknown flags, a missing value, a repeated flag, or positional words when
// allow_positional is false are errors (dsv4::Error "--name: ..."; main() prefixes the command).
ParsedArgs parse_args(std::string_view command, const std::vector<std::string>& args,
                      const std::vector<FlagSpec>& flags, bool allow_positional = false);

// The integer `text` given for --`flag`, exactly (see ParsedArgs::get_int), within [lo, hi].
int64_t parse_int_flag(std::string_view flag, const std::string& text, int64_t lo = INT64_MIN,
                       int64_t hi = INT64_MAX);

// "usage: ...\n" followed by one aligned line per flag.
std::string format_help(std::string_view usage, const std::vector<FlagSpec>& flags);

}  // namespace dsv4::cli
