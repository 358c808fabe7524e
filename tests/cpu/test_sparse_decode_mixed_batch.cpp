// One sparse_decode call for a whole mixed batch with per-request q lengths (tests/mixed_batch_decode.h):
// every token's output and lse against the float64 formula over the rows its request and
// position make it attend, for each cache layout the layer offers, at 64 and 128 heads.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mixed_batch_decode.h"

namespace {

using dsv4::HostTensor;
using dsv4::KvLayout;
using dsv4::test::MixedBatchDecode;

struct MixedCase {
  const char* name;
  KvLayout layout;
  int heads;
};

// A prompt from scratch (7 tokens), a one-token decode at a context past the window, an MTP pair,
// and a 5-token chunk continuing a prefix: 15 query rows of lengths 1..128 + 0..75 entries.
const std::vector<dsv4::test::MixedRequest> kRequests{{0, 7}, {300, 1}, {90, 2}, {150, 5}};

class SparseDecodeMixedBatch : public ::testing::TestWithParam<MixedCase> {};

TEST_P(SparseDecodeMixedBatch, EveryTokenMatchesItsRequestsRows) {
  const MixedCase c = GetParam();
  MixedBatchDecode m(c.layout, c.heads, kRequests, 71);
  const dsv4::DecodeSchedule s = m.schedule();
  HostTensor ws(dsv4::DType::uint8, {s.workspace_bytes});
  ws.fill_bytes(0xFF);
  dsv4::sparse_decode(m.args(m.out, m.lse), s, ws);

  // Tolerances: sparse_attention_reference.h (kOutTol of max|out|, kLseTol of max(1, |lse|)).
  double max_out = 0.0;
  std::vector<dsv4::test::HeadResult> want;
  for (int64_t t = 0; t < static_cast<int64_t>(m.tokens.size()); ++t)
    for (int h = 0; h < c.heads; ++h) {
      want.push_back(m.expected(t, h));
      for (double v : want.back().out) max_out = std::max(max_out, std::abs(v));
    }
  int bad = 0;
  for (size_t row = 0; row < want.size() && bad < 10; ++row) {
    const double lse = m.lse.data<float>()[row];
    if (!(std::abs(lse - want[row].lse) <= dsv4::test::kLseTol * std::max(1.0, std::abs(want[row].lse)))) {
      ADD_FAILURE() << "row " << row << ": lse " << lse << ", want " << want[row].lse;
      ++bad;
    }
    for (int d = 0; d < 512; ++d) {
      const double got = dsv4::bf16_bits_to_float(m.out.data<uint16_t>()[row * 512 + d]);
      if (!(std::abs(got - want[row].out[static_cast<size_t>(d)]) <= dsv4::test::kOutTol * max_out)) {
        ADD_FAILURE() << "row " << row << " dim " << d << ": " << got << ", want "
                      << want[row].out[static_cast<size_t>(d)];
        if (++bad >= 10) break;
      }
    }
  }
}

// The expectation is sensitive: a token given its neighbour's request (the rows of the wrong
// request) misses by far more than the tolerance.
TEST(SparseDecodeMixedBatch, ExpectationTellsRequestsApart) {
  MixedBatchDecode m(KvLayout::model1_fp8, 64, kRequests, 71);
  const dsv4::test::HeadResult a = m.expected(7, 0), b = m.expected(8, 0);  // request 1 vs 2
  double diff = 0.0, scale = 0.0;
  for (int d = 0; d < 512; ++d) {
    diff = std::max(diff, std::abs(a.out[static_cast<size_t>(d)] - b.out[static_cast<size_t>(d)]));
    scale = std::max(scale, std::abs(a.out[static_cast<size_t>(d)]));
  }
  EXPECT_GT(diff, 10 * dsv4::test::kOutTol * scale);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SparseDecodeMixedBatch,
                         ::testing::Values(MixedCase{"model1_h64", KvLayout::model1_fp8, 64},
                                           MixedCase{"model1_h128", KvLayout::model1_fp8, 128},
                                           MixedCase{"bf16_h64", KvLayout::bf16, 64},
                                           MixedCase{"fp8_per_tensor_h128", KvLayout::fp8_per_tensor, 128}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
