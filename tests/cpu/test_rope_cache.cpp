// rope_frequencies and build_rope_cache against docs/spec.md §3: hand-derived YaRN correction range for
// the V4 compressed-layer config, the float64 formula written in tests/cpu/rope_reference.h, and
// the cos/sin table at positions up to 70k (fp32 table entries: one rounding, ≤ 2^-25 absolute
// for values ≤ 1, so 6e-8 absolute).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dense_test_support.h"
#include "dsv4/ops.h"
#include "rope_reference.h"

namespace {
using namespace dense_test;

TEST(RopeFrequencies, PlainThetaPowers) {
  for (const int R : {32, 64, 128}) {
    std::vector<double> f(R / 2, -1.0);
    dsv4::rope_frequencies(swa_rope(R), f.data());
    for (int i = 0; i < R / 2; ++i)
      EXPECT_NEAR(f[i], std::pow(10000.0, -2.0 * i / R), 1e-15 * std::pow(10000.0, -2.0 * i / R)) << i;
    EXPECT_EQ(f[0], 1.0);
  }
}

// V4 compressed layers: corr(32) = 64·ln(65536/(64π)) / (2 ln 160000) = 15.45 → low 15;
// corr(1) = 64·ln(65536/(2π)) / (2 ln 160000) = 24.71 → high 25. So dims i <= 15 keep
// theta^(-2i/64), dims i >= 25 are divided by 16, and i = 20 is the half blend.
TEST(RopeFrequencies, YarnV4CorrectionRangeByHand) {
  std::vector<double> f(32, -1.0);
  dsv4::rope_frequencies(yarn_rope(), f.data());
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(160000.0, -2.0 * i / 64);
    const double ramp = i <= 15 ? 0.0 : i >= 25 ? 1.0 : (i - 15) / 10.0;
    const double want = base * (1 - ramp) + base / 16 * ramp;
    EXPECT_NEAR(f[i], want, 1e-14 * want) << i;
  }
  EXPECT_NEAR(f[20], std::pow(160000.0, -40.0 / 64) * (0.5 + 0.5 / 16), 1e-18);
}

TEST(RopeFrequencies, MatchesReferenceFormulaOverConfigs) {
  for (const double L0 : {4096.0, 65536.0, 1e6})
    for (const double factor : {4.0, 40.0})
      for (const int R : {32, 64}) {
        dsv4::RopeConfig c = yarn_rope(R);
        c.original_seq_len = static_cast<long long>(L0);
        c.factor = factor;
        std::vector<double> f(R / 2);
        dsv4::rope_frequencies(c, f.data());
        const std::vector<double> want = reference_rope_freqs(c);
        for (int i = 0; i < R / 2; ++i) EXPECT_NEAR(f[i], want[i], 1e-14 * want[i]) << L0 << " " << i;
      }
}

TEST(BuildRopeCache, CosSinTableRows) {
  const int64_t max_pos = 70000;
  for (const dsv4::RopeConfig& cfg : {swa_rope(), yarn_rope()}) {
    const HostTensor table = dsv4::build_rope_cache(cfg, max_pos);
    ASSERT_EQ(table.dtype(), DType::fp32);
    ASSERT_EQ(table.shape(), (std::vector<int64_t>{max_pos, 64}));
    const std::vector<double> f = reference_rope_freqs(cfg);
    for (const int64_t p : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{4095}, int64_t{65535}, max_pos - 1})
      for (int i = 0; i < 32; ++i) {
        EXPECT_NEAR(table.data<float>()[p * 64 + i], std::cos(p * f[i]), 6e-8) << "cos p " << p << " i " << i;
        EXPECT_NEAR(table.data<float>()[p * 64 + 32 + i], std::sin(p * f[i]), 6e-8) << "sin p " << p << " i " << i;
      }
    for (int i = 0; i < 32; ++i) {  // position 0 is the identity rotation, exactly
      EXPECT_EQ(table.data<float>()[i], 1.0f);
      EXPECT_EQ(table.data<float>()[32 + i], 0.0f);
    }
  }
}

TEST(RopeConfigErrors, RejectBadConfigs) {
  std::vector<double> f(64);
  dsv4::RopeConfig odd = swa_rope();
  odd.rope_dims = 63;
  expect_error([&] { dsv4::rope_frequencies(odd, f.data()); }, {"rope_frequencies", "cfg.rope_dims", "63"});
  dsv4::RopeConfig theta = swa_rope();
  theta.theta = 1.0;
  expect_error([&] { dsv4::build_rope_cache(theta, 16); }, {"build_rope_cache", "cfg.theta"});
  dsv4::RopeConfig no_len = yarn_rope();
  no_len.original_seq_len = 0;
  expect_error([&] { dsv4::rope_frequencies(no_len, f.data()); }, {"cfg.original_seq_len", "YaRN"});
  dsv4::RopeConfig no_factor = yarn_rope();
  no_factor.factor = 0.0;
  expect_error([&] { dsv4::rope_frequencies(no_factor, f.data()); }, {"cfg.factor"});
  expect_error([&] { dsv4::build_rope_cache(swa_rope(), 0); }, {"max_pos", ">= 1", "got 0"});
  expect_error([&] { dsv4::rope_frequencies(swa_rope(), nullptr); }, {"freqs"});
}

}  // namespace
