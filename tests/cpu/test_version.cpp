// The version is written once, in CMakeLists.txt's project() line; the library (dsv4::version()),
// the generated header's macros and `dsv4 --version` must all say what that line says.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "cli_test_support.h"
#include "dsv4/version.h"

namespace {

std::string project_version() {
  std::ifstream f(DSV4_SOURCE_DIR "/CMakeLists.txt");
  std::stringstream text;
  text << f.rdbuf();
  std::smatch m;
  const std::string s = text.str();
  if (!std::regex_search(s, m, std::regex(R"(project\(dsv4attn VERSION ([0-9.]+))"))) return "";
  return m[1];
}

TEST(Version, LibraryHeaderAndProjectAgree) {
  const std::string want = project_version();
  ASSERT_FALSE(want.empty()) << "no project(dsv4attn VERSION ...) in CMakeLists.txt";
  EXPECT_EQ(dsv4::version(), want);
  EXPECT_EQ(DSV4_VERSION_STRING, want);
  EXPECT_EQ(std::to_string(DSV4_VERSION_MAJOR) + "." + std::to_string(DSV4_VERSION_MINOR) + "." +
                std::to_string(DSV4_VERSION_PATCH),
            want);
}

TEST(Version, CliPrintsIt) {
  for (const char* flag : {"--version", "-V"}) {
    const dsv4_test::CliResult r = dsv4_test::run_cli(flag);
    EXPECT_EQ(r.status, 0) << flag;
    EXPECT_EQ(r.output, "dsv4attn " + project_version() + "\n") << flag;
  }
}

}  // namespace
