// grouped_wo_a against a float64 grouped GEMM written in the test: z[:, gL:(g+1)L] =
// o[:, g·Dg:(g+1)·Dg] · wo_a[g]ᵀ, with group widths Dg = H·D/G for H 16/64/128 and D 512, every
// encoding of o (bf16 / fp32 / fp8 with 1×128 or 1×64 scales) and wo_a (bf16 / fp8 with ue8m0 or
// fp32 128×128 scales). Tolerances: dense_operands.h gemm_tolerance.
#include <gtest/gtest.h>

#include <sstream>
#include <tuple>
#include <vector>

#include "cuda_dispatch_support.h"
#include "dense_operands.h"
#include "dsv4/ops.h"

namespace {
using namespace dense_test;

struct Shape {
  int64_t T, G, L, Dg;
};
struct OEnc {
  Enc enc;
  int64_t block;
};
using Params = std::tuple<Shape, OEnc, Enc /*wo_a*/, DType /*z*/>;
class GroupedWoA : public ::testing::TestWithParam<Params> {};

TEST_P(GroupedWoA, MatchesFloat64) {
  const auto [s, oenc, wenc, z_dt] = GetParam();
  const Operand o = make_operand(oenc.enc, 0, s.T, s.G * s.Dg, 1, oenc.block, 300 + s.T + s.Dg);
  const Operand w = make_operand(wenc, s.G, s.L, s.Dg, 128, 128, 400 + s.L);
  HostTensor z = poisoned(z_dt, {s.T, s.G * s.L});
  dsv4::grouped_wo_a(o.values, o.scale, w.values, w.scale, z);
  for (int64_t g = 0; g < s.G; ++g) {
    const GemmReference ref = reference_gemm(o.real, g * s.Dg, s.G * s.Dg, w.real, g * s.L * s.Dg, s.T, s.L, s.Dg);
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t l = 0; l < s.L; ++l) {
        const double want = ref.y[static_cast<size_t>(t * s.L + l)];
        ASSERT_NEAR(at(z, t * s.G * s.L + g * s.L + l), want,
                    gemm_tolerance(z_dt, want, ref.abs_sum[static_cast<size_t>(t * s.L + l)]))
            << "t " << t << " g " << g << " l " << l;
      }
  }
}

// Small shapes with every encoding (L and Dg not multiples of the tiles / scale blocks where the
// o block allows), and the real group widths: H 16/64/128 × D 512 over G 4/8/16.
std::vector<Params> grouped_grid() {
  std::vector<Params> grid;
  const OEnc os[] = {{Enc::bf16, 0}, {Enc::fp32, 0}, {Enc::fp8_ue8m0, 128}, {Enc::fp8_fp32, 64}};
  const Enc ws[] = {Enc::bf16, Enc::fp8_ue8m0, Enc::fp8_fp32};
  for (const Shape s : {Shape{3, 4, 128, 256}, Shape{67, 2, 96, 192}})
    for (const OEnc o : os)
      for (const Enc w : ws)
        for (const DType z : {DType::bf16, DType::fp32})
          if (!is_fp8(o.enc) || s.Dg % o.block == 0) grid.emplace_back(s, o, w, z);
  for (const Shape s : {Shape{2, 4, 128, 16 * 512 / 4}, Shape{2, 8, 128, 64 * 512 / 8}, Shape{1, 16, 64, 128 * 512 / 16}})
    for (const OEnc o : {OEnc{Enc::bf16, 0}, OEnc{Enc::fp8_ue8m0, 128}})
      grid.emplace_back(s, o, Enc::fp8_ue8m0, DType::bf16);
  return grid;
}
INSTANTIATE_TEST_SUITE_P(Grid, GroupedWoA, ::testing::ValuesIn(grouped_grid()), [](const auto& info) {
  const Shape s = std::get<0>(info.param);
  const OEnc o = std::get<1>(info.param);
  std::ostringstream n;
  n << "T" << s.T << "_G" << s.G << "_L" << s.L << "_Dg" << s.Dg << "_o" << enc_name(o.enc);
  if (o.block) n << o.block;
  n << "_w" << enc_name(std::get<2>(info.param)) << "_z" << dsv4::dtype_name(std::get<3>(info.param));
  return n.str();
});

TEST(GroupedWoAErrors, RejectBadArgumentsAndWriteNothing) {
  const Operand o = make_operand(Enc::fp8_ue8m0, 0, 3, 4 * 256, 1, 128, 1);
  const Operand w = make_operand(Enc::fp8_ue8m0, 4, 128, 256, 128, 128, 2);
  HostTensor z = poisoned(DType::bf16, {3, 4 * 128});
  const auto before = bytes_of(z);
  const Operand o_wide = make_operand(Enc::bf16, 0, 3, 4 * 256 + 8, 1, 1, 3);
  HostTensor z_bad = poisoned(DType::bf16, {3, 4 * 128 + 1});
  // Dg = 192 with 1×128 o blocks: a scale block would straddle two groups.
  const Operand o192 = make_operand(Enc::fp8_ue8m0, 0, 3, 2 * 192, 1, 128, 4);
  const Operand w192 = make_operand(Enc::bf16, 2, 64, 192, 128, 128, 5);
  HostTensor z192 = poisoned(DType::bf16, {3, 128});
  HostTensor ws_bad(DType::ue8m0, {4, 1, 1});
  const Operand w2d = make_operand(Enc::bf16, 0, 128, 256, 128, 128, 6);
  TensorView z_over_o = o.values.view();
  z_over_o.dtype = DType::bf16;
  z_over_o.shape[1] = 4 * 128;

  expect_error([&] { dsv4::grouped_wo_a(o_wide.values, {}, w.values, w.scale, z); },
               {"grouped_wo_a", "o.shape[1]", "1024", "1032"});
  expect_error([&] { dsv4::grouped_wo_a(o.values, o.scale, w.values, w.scale, z_bad); }, {"z.shape", "[3, 512]"});
  expect_error([&] { dsv4::grouped_wo_a(o192.values, o192.scale, w192.values, {}, z192); },
               {"o_scale.shape[1]", "straddle groups"});
  expect_error([&] { dsv4::grouped_wo_a(o.values, o.scale, w.values, ws_bad, z); }, {"wo_a_scale.shape", "[4, 1, 2]"});
  expect_error([&] { dsv4::grouped_wo_a(o.values, o.scale, w.values, {}, z); }, {"wo_a_scale", "expected a tensor"});
  expect_error([&] { dsv4::grouped_wo_a(o.values, {}, w.values, w.scale, z); }, {"o_scale", "expected a tensor"});
  expect_error([&] { dsv4::grouped_wo_a(o.values, o.scale, w2d.values, {}, z); }, {"wo_a.ndim", "3"});
  expect_error([&] { dsv4::grouped_wo_a(o.values, o.scale, w.values, w.scale, z_over_o); }, {"z", "disjoint from o"});
  expect_error([&] { dsv4::grouped_wo_a(o.values, o.scale, w.values, w.scale, on_cuda(z)); }, {"device"});
  dsv4::test::expect_cuda_dispatch("grouped_wo_a", dsv4::ops::kGroupedWoA, [&] {
    dsv4::grouped_wo_a(on_cuda(o.values), on_cuda(o.scale), on_cuda(w.values), on_cuda(w.scale), on_cuda(z));
  });
  EXPECT_EQ(bytes_of(z), before);
  EXPECT_EQ(bytes_of(z192), std::vector<uint8_t>(z192.nbytes(), 0xFF));
}

}  // namespace
