#include "args.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "dsv4/status.h"

namespace dsv4::cli {

namespace {
const FlagSpec* find_flag(const std::vector<FlagSpec>& flags, std::string_view name) {
  for (const auto& f : flags)
    if (f.name == name) return &f;
  return nullptr;
}

}  // namespace

int64_t parse_int_flag(std::string_view flag, const std::string& text, int64_t lo, int64_t hi) {
  const auto range = [&] { return detail::concat("an integer in [", lo, ", ", hi, "]"); };
  // strtoll alone would take " 12", "+12" and stop quietly at "12x": only [-]digits are exact.
  const size_t first = !text.empty() && text[0] == '-' ? 1 : 0;
  const bool digits = text.size() > first &&
                      std::all_of(text.begin() + static_cast<std::ptrdiff_t>(first), text.end(),
                                  [](unsigned char c) { return std::isdigit(c) != 0; });
  if (!digits) fail("--", flag, ": expected ", range(), ", got '", text, "'");
  errno = 0;
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v < lo || v > hi)
    fail("--", flag, ": expected ", range(), ", got ", text);
  return v;
}

ParsedArgs parse_args(std::string_view command, const std::vector<std::string>& args,
                      const std::vector<FlagSpec>& flags, bool allow_positional) {
  ParsedArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word == "-h" || word == "--help") {
      out.values_["help"] = "true";
      continue;
    }
    if (word.rfind("--", 0) != 0 || word.size() == 2) {
      if (!allow_positional)
        fail("unexpected argument '", word, "' (see `dsv4 ", command, " --help`)");
      out.positional_.push_back(word);
      continue;
    }
    std::string name = word.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* spec = find_flag(flags, name);
    if (!spec) fail("unknown option '--", name, "' (see `dsv4 ", command, " --help`)");
    if (out.values_.count(name)) fail("--", name, " given more than once");
    if (spec->takes_value && !inline_value) {
      if (i + 1 >= args.size()) fail("--", name, ": missing value");
      value = args[++i];
    } else if (!spec->takes_value) {
      value = inline_value ? value : "true";
    }
    out.values_[name] = value;
  }
  return out;
}

bool ParsedArgs::has(std::string_view name) const { return values_.find(name) != values_.end(); }

std::string ParsedArgs::get_string(std::string_view name, std::string_view fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::string(fallback) : it->second;
}

int64_t ParsedArgs::get_int(std::string_view name, int64_t fallback, int64_t lo, int64_t hi) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : parse_int_flag(name, it->second, lo, hi);
}

double ParsedArgs::get_double(std::string_view name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0' || errno == ERANGE)
    fail("--", name, ": expected a number, got '", it->second, "'");
  return v;
}

double ParsedArgs::get_positive_double(std::string_view name, double fallback) const {
  const double v = get_double(name, fallback);
  if (!(v > 0.0) || !std::isfinite(v))
    fail("--", name, ": expected a finite number > 0, got '", get_string(name), "'");
  return v;
}

bool ParsedArgs::get_bool(std::string_view name, bool fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  std::string v = it->second;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  fail("--", name, ": expected true or false, got '", it->second, "'");
}

std::vector<int64_t> ParsedArgs::get_int_list(std::string_view name, std::vector<int64_t> fallback,
                                              int64_t lo, int64_t hi) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  std::vector<int64_t> out;
  std::stringstream ss(it->second);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(parse_int_flag(name, item, lo, hi));
  if (out.empty()) fail("--", name, ": expected a list like 1,2,3, got ''");
  return out;
}

std::string format_help(std::string_view usage, const std::vector<FlagSpec>& flags) {
  std::ostringstream os;
  os << "usage: " << usage << "\n";
  size_t width = 6;  // "--help"
  std::vector<std::string> left;
  for (const auto& f : flags) {
    left.push_back("--" + f.name + (f.takes_value ? " " + f.value_name : ""));
    width = std::max(width, left.back().size());
  }
  for (size_t i = 0; i < flags.size(); ++i)
    os << "  " << left[i] << std::string(width - left[i].size() + 2, ' ') << flags[i].help << "\n";
  os << "  --help" << std::string(width - 6 + 2, ' ') << "this help\n";
  return os.str();
}

}  // namespace dsv4::cli
