// sparse_attention_combine: merging split-KV partials (o_s, lse_s) with the sink, against the
// float64 formula lse = ln Σ_s exp(lse_s), out = Σ_s exp(lse_s − lse) o_s · exp(lse) /
// (exp(lse) + exp(sink)).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "dsv4/ops.h"
#include "sparse_attention_reference.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;

struct CombineCase {
  int b, s_q, h, splits, d_v;
  bool with_sink;
};
std::ostream& operator<<(std::ostream& os, const CombineCase& c) {
  return os << "b" << c.b << "_s" << c.s_q << "_h" << c.h << "_splits" << c.splits << "_dv" << c.d_v
            << (c.with_sink ? "_sink" : "");
}

struct CombineProblem {
  CombineCase c;
  HostTensor po, plse, sink, out, lse;

  // Random partials; each split is empty (lse −inf, o NaN: must not leak) with probability 1/4,
  // and every split of the first (b, s, h) row is empty.
  CombineProblem(const CombineCase& cs, uint32_t seed)
      : c(cs),
        po(DType::fp32, {cs.b, cs.s_q, cs.h, cs.splits, cs.d_v}),
        plse(DType::fp32, {cs.b, cs.s_q, cs.h, cs.splits}),
        out(DType::bf16, {cs.b, cs.s_q, cs.h, cs.d_v}),
        lse(DType::fp32, {cs.b, cs.s_q, cs.h}) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < po.numel(); ++i) po.data<float>()[i] = normal(rng);
    for (int64_t i = 0; i < plse.numel(); ++i) {
      const bool empty = i < c.splits || rng() % 4 == 0;
      plse.data<float>()[i] = empty ? -INFINITY : 3.0f * normal(rng);
      if (empty)
        for (int d = 0; d < c.d_v; ++d) po.data<float>()[i * c.d_v + d] = NAN;
    }
    if (c.with_sink) {
      sink = HostTensor(DType::fp32, {c.h});
      for (int i = 0; i < c.h; ++i) sink.data<float>()[i] = 2.0f * normal(rng);
      sink.data<float>()[0] = -INFINITY;
      if (c.h > 1) sink.data<float>()[1] = INFINITY;
    }
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
  }

  void run() { dsv4::sparse_attention_combine(po, plse, sink, out, lse); }

  void expect_matches_reference() const {
    const int64_t rows = int64_t{c.b} * c.s_q * c.h;
    for (int64_t r = 0; r < rows; ++r) {
      const int hi = int(r % c.h);
      double m = -dsv4::test::kInf;
      for (int s = 0; s < c.splits; ++s) m = std::max(m, double(plse.data<float>()[r * c.splits + s]));
      const float got_lse = lse.data<float>()[r];
      std::vector<double> want(c.d_v, 0.0);
      if (m == -dsv4::test::kInf) {
        EXPECT_EQ(got_lse, INFINITY) << "row " << r;
      } else {
        double sum = 0.0;
        for (int s = 0; s < c.splits; ++s) sum += std::exp(double(plse.data<float>()[r * c.splits + s]) - m);
        const double ref_lse = m + std::log(sum);
        EXPECT_NEAR(got_lse, ref_lse, dsv4::test::kLseTol * std::max(1.0, std::abs(ref_lse))) << "row " << r;
        const double sk = c.with_sink ? double(sink.data<float>()[hi]) : -dsv4::test::kInf;
        const double factor = sk == dsv4::test::kInf ? 0.0 : std::exp(ref_lse) / (std::exp(ref_lse) + std::exp(sk));
        for (int s = 0; s < c.splits; ++s) {
          const double l = plse.data<float>()[r * c.splits + s];
          if (l == -dsv4::test::kInf) continue;
          const double w = std::exp(l - ref_lse) * factor;
          for (int d = 0; d < c.d_v; ++d) want[d] += w * po.data<float>()[(r * c.splits + s) * c.d_v + d];
        }
      }
      // bf16 output of an fp32 merge of O(1) values: half a bf16 ulp of the element plus fp32
      // noise (see kOutTol); the row's own max|want| sets the scale.
      double max_want = 0.0;
      for (double v : want) max_want = std::max(max_want, std::abs(v));
      for (int d = 0; d < c.d_v; ++d) {
        const double got = dsv4::bf16_bits_to_float(out.data<uint16_t>()[r * c.d_v + d]);
        ASSERT_NEAR(got, want[d], std::abs(want[d]) / 256 + 1e-6 * max_want) << "row " << r << " dim " << d;
      }
    }
  }
};

class SparseCombineGrid : public ::testing::TestWithParam<CombineCase> {};

TEST_P(SparseCombineGrid, MatchesFloat64Reference) {
  CombineProblem p(GetParam(), 7);
  p.run();
  p.expect_matches_reference();
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparseCombineGrid,
                         ::testing::Values(CombineCase{1, 1, 16, 1, 512, true},
                                           CombineCase{2, 2, 16, 5, 512, false},
                                           CombineCase{3, 1, 64, 8, 512, true},
                                           CombineCase{1, 2, 128, 33, 512, true},
                                           CombineCase{2, 1, 4, 3, 7, true}));

// One non-empty split with lse L: out = o · sink factor exactly as computed, lse = L.
TEST(SparseCombine, SingleSplitPassesThrough) {
  CombineProblem p(CombineCase{1, 1, 2, 1, 512, false}, 3);
  p.plse.data<float>()[0] = 1.5f;
  p.plse.data<float>()[1] = -0.25f;
  for (int d = 0; d < 2 * 512; ++d) p.po.data<float>()[d] = 0.01f * float(d % 97) - 0.3f;
  p.run();
  EXPECT_EQ(p.lse.data<float>()[0], 1.5f);
  EXPECT_EQ(p.lse.data<float>()[1], -0.25f);
  for (int d = 0; d < 2 * 512; ++d)
    ASSERT_EQ(p.out.data<uint16_t>()[d], dsv4::float_to_bf16_bits(p.po.data<float>()[d])) << d;
}

TEST(SparseCombine, BadInputThrowsAndWritesNothing) {
  const CombineCase c{2, 1, 16, 4, 512, true};
  CombineProblem p(c, 11);
  HostTensor plse_bad(DType::fp32, {2, 1, 16, 5}), po_bf16(DType::bf16, {2, 1, 16, 4, 512});
  HostTensor out_bad(DType::bf16, {2, 1, 16, 256}), lse_bad(DType::fp32, {2, 16}), sink_bad(DType::fp32, {8});
  HostTensor po_4d(DType::fp32, {2, 16, 4, 512});
  dsv4::TensorView out_broadcast = p.out;
  out_broadcast.strides[2] = 0;  // every head at one address
  const dsv4::TensorView out_on_po(p.po.view().data, DType::bf16, {2, 1, 16, 512});
  const dsv4::TensorView lse_on_plse(p.plse.view().data, DType::fp32, {2, 1, 16});
  struct Bad {
    const char* what;
    dsv4::TensorView po, plse, sink, out, lse;
  };
  const std::vector<Bad> cases = {
      {"partial_lse.shape", p.po, plse_bad, p.sink, p.out, p.lse},
      {"partial_o.dtype", po_bf16, p.plse, p.sink, p.out, p.lse},
      {"partial_o.ndim", po_4d, p.plse, p.sink, p.out, p.lse},
      {"out.shape", p.po, p.plse, p.sink, out_bad, p.lse},
      {"lse.shape", p.po, p.plse, p.sink, p.out, lse_bad},
      {"attn_sink.shape", p.po, p.plse, sink_bad, p.out, p.lse},
      {"out: expected an output whose elements do not overlap", p.po, p.plse, p.sink, out_broadcast, p.lse},
      {"out: expected memory disjoint from partial_o", p.po, p.plse, p.sink, out_on_po, p.lse},
      {"lse: expected memory disjoint from partial_lse", p.po, p.plse, p.sink, p.out, lse_on_plse},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.what);
    p.out.fill_bytes(0xA5);
    p.lse.fill_bytes(0xA5);
    try {
      dsv4::sparse_attention_combine(bad.po, bad.plse, bad.sink, bad.out, bad.lse);
      ADD_FAILURE() << "no error";
    } catch (const dsv4::Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad.what), std::string::npos) << e.what();
    }
    for (const HostTensor* t : {&p.out, &p.lse})
      for (size_t i = 0; i < t->nbytes(); ++i) ASSERT_EQ(t->data<uint8_t>()[i], 0xA5) << i;
  }
}

}  // namespace
