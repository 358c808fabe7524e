// The `dsv4` argument parser (tools/dsv4/args.h): value and boolean flags, `--name=value`,
// typed getters, and the errors for unknown, repeated, missing or malformed arguments.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "args.h"  // tools/dsv4/args.h
#include "dsv4/status.h"

namespace {

using dsv4::cli::FlagSpec;
using dsv4::cli::parse_args;

const std::vector<FlagSpec> kFlags = {
    {"model", true, "model name", "NAME"},
    {"steps", true, "decode steps", "N"},
    {"scale", true, "a number", "X"},
    {"lens", true, "prompt lengths", "L,.."},
    {"check", false, "compare with the reference"},
    {"graphs", true, "true/false", "B"},
};

std::string error_of(const std::vector<std::string>& argv, bool positional = false) {
  try {
    parse_args("run", argv, kFlags, positional);
  } catch (const dsv4::Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(CliArgs, ParsesValuesFlagsAndInlineValues) {
  const auto a = parse_args("run", {"--model", "tiny", "--steps=12", "--check", "--scale", "-0.5",
                                    "--lens", "128,256,1", "--graphs", "off"},
                            kFlags);
  EXPECT_TRUE(a.has("model"));
  EXPECT_FALSE(a.has("help"));
  EXPECT_EQ(a.get_string("model"), "tiny");
  EXPECT_EQ(a.get_int("steps", 0), 12);
  EXPECT_EQ(a.get_double("scale", 1.0), -0.5);
  EXPECT_TRUE(a.get_bool("check"));
  EXPECT_FALSE(a.get_bool("graphs", true));
  EXPECT_EQ(a.get_int_list("lens"), (std::vector<int64_t>{128, 256, 1}));
  EXPECT_TRUE(a.positional().empty());
}

TEST(CliArgs, DefaultsWhenAbsentAndHelp) {
  const auto a = parse_args("run", {"-h"}, kFlags);
  EXPECT_TRUE(a.has("help"));
  EXPECT_EQ(a.get_string("model", "v4-flash"), "v4-flash");
  EXPECT_EQ(a.get_int("steps", 7), 7);
  EXPECT_FALSE(a.get_bool("check"));
  EXPECT_EQ(a.get_int_list("lens", {3}), (std::vector<int64_t>{3}));
  const std::string help = dsv4::cli::format_help("dsv4 run [options]", kFlags);
  EXPECT_NE(help.find("usage: dsv4 run [options]"), std::string::npos) << help;
  EXPECT_NE(help.find("--model NAME"), std::string::npos) << help;
  EXPECT_NE(help.find("--check"), std::string::npos) << help;
}

TEST(CliArgs, ErrorsNameTheArgument) {
  EXPECT_NE(error_of({"--modle", "x"}).find("unknown option '--modle'"), std::string::npos);
  EXPECT_NE(error_of({"--model"}).find("--model: missing value"), std::string::npos);
  EXPECT_NE(error_of({"--check", "--check"}).find("more than once"), std::string::npos);
  EXPECT_NE(error_of({"stray"}).find("unexpected argument 'stray'"), std::string::npos);
  EXPECT_EQ(error_of({"stray"}, /*positional=*/true), "<no error>");
  auto bad_int = parse_args("run", {"--steps", "12x"}, kFlags);
  EXPECT_THROW(bad_int.get_int("steps", 0), dsv4::Error);
  auto bad_list = parse_args("run", {"--lens", "1,,2"}, kFlags);
  EXPECT_THROW(bad_list.get_int_list("lens"), dsv4::Error);
  auto bad_bool = parse_args("run", {"--graphs", "maybe"}, kFlags);
  EXPECT_THROW(bad_bool.get_bool("graphs"), dsv4::Error);
  auto bad_num = parse_args("run", {"--scale", "1.5e"}, kFlags);
  EXPECT_THROW(bad_num.get_double("scale", 0), dsv4::Error);
}

}  // namespace
