// sparse_prefill: sparse attention over a bf16 KV workspace (FlashMLA sparse prefill semantics:
// -1 and indices >= s_kv are masked), against the docs/spec.md §6 formula in float64.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_dispatch_support.h"
#include "dsv4/ops.h"
#include "sparse_attention_cases.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;
using dsv4::TensorView;

struct PrefillCase {
  const char* name;
  int h, d_qk, s_q, s_kv, topk;
  bool with_length, with_sink;
};
std::ostream& operator<<(std::ostream& os, const PrefillCase& c) { return os << c.name; }

struct PrefillProblem {
  PrefillCase c;
  int d_v = 512;
  float scale;
  HostTensor q, kv_storage, indices, lengths, sink, out, max_logits, lse;
  TensorView kv;  // the first s_kv rows of kv_storage; the rows after it are NaN

  PrefillProblem(const PrefillCase& cs, uint32_t seed) : c(cs) {
    std::mt19937 rng(seed);
    scale = 0.9f / std::sqrt(float(c.d_qk));
    q = HostTensor(DType::bf16, {c.s_q, c.h, c.d_qk});
    dsv4::test::fill_bf16_normal(q, rng);
    // Rows of kv: random, except every 7th row (never selected) and 8 rows past s_kv, all NaN.
    kv_storage = HostTensor(DType::bf16, {c.s_kv + 8, 1, c.d_qk});
    dsv4::test::fill_bf16_normal(kv_storage, rng);
    std::vector<int32_t> clean;
    for (int r = 0; r < c.s_kv + 8; ++r) {
      const bool poisoned = r >= c.s_kv || r % 7 == 3;
      if (!poisoned) clean.push_back(r);
      if (poisoned)
        for (int d = 0; d < c.d_qk; ++d) kv_storage.data<uint16_t>()[int64_t{r} * c.d_qk + d] = 0x7FC0;
    }
    kv = kv_storage.view().slice0(0, c.s_kv);

    indices = HostTensor(DType::int32, {c.s_q, 1, c.topk});
    if (c.with_length) lengths = dsv4::test::random_lengths(c.s_q, c.topk, rng);
    for (int t = 0; t < c.s_q; ++t) {
      const int len = c.with_length ? lengths.data<int32_t>()[t] : c.topk;
      for (int k = 0; k < c.topk; ++k) {
        int32_t& idx = indices.data<int32_t>()[int64_t{t} * c.topk + k];
        const unsigned pick = rng() % 16;
        if (k >= len) idx = 3;  // a NaN row, never counted
        else if (pick == 0) idx = -1;
        else if (pick == 1) idx = c.s_kv + int(rng() % 8);  // masked, and NaN behind it
        else if (pick == 2) idx = INT_MAX;
        else if (pick == 3) idx = -7;
        else if (pick == 4 && k > 0) idx = indices.data<int32_t>()[int64_t{t} * c.topk + k - 1];
        else idx = clean[rng() % clean.size()];
      }
    }
    if (c.with_sink) sink = dsv4::test::random_sink(c.h, rng);
    out = HostTensor(DType::bf16, {c.s_q, c.h, d_v});
    max_logits = HostTensor(DType::fp32, {c.s_q, c.h});
    lse = HostTensor(DType::fp32, {c.s_q, c.h});
    out.fill_bytes(0xFF);
    max_logits.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
  }

  dsv4::SparsePrefillArgs args() const {
    return {.q = q, .kv = kv, .indices = indices, .topk_length = lengths, .attn_sink = sink,
            .softmax_scale = scale, .d_v = d_v, .out = out, .max_logits = max_logits, .lse = lse,
            .work_counter = {}};
  }

  void expect_matches_reference() const {
    std::vector<std::vector<double>> rows(c.s_kv);
    for (int r = 0; r < c.s_kv; ++r) {
      rows[r].resize(c.d_qk);
      for (int d = 0; d < c.d_qk; ++d)
        rows[r][d] = dsv4::bf16_bits_to_float(kv_storage.data<uint16_t>()[int64_t{r} * c.d_qk + d]);
    }
    for (int t = 0; t < c.s_q; ++t) {
      const int len = lengths.view().defined() ? lengths.data<int32_t>()[t] : c.topk;
      std::vector<const std::vector<double>*> selected;
      for (int k = 0; k < len; ++k) {
        const int32_t idx = indices.data<int32_t>()[int64_t{t} * c.topk + k];
        if (idx >= 0 && idx < c.s_kv) selected.push_back(&rows[idx]);
      }
      std::vector<dsv4::test::HeadResult> ref;
      double max_out = 0.0;
      for (int h = 0; h < c.h; ++h) {
        std::vector<double> qv(c.d_qk);
        for (int d = 0; d < c.d_qk; ++d)
          qv[d] = dsv4::bf16_bits_to_float(q.data<uint16_t>()[(int64_t{t} * c.h + h) * c.d_qk + d]);
        const double s = c.with_sink ? double(sink.data<float>()[h]) : -dsv4::test::kInf;
        ref.push_back(dsv4::test::reference_head(qv, selected, scale, s, d_v));
        for (double v : ref.back().out) max_out = std::max(max_out, std::abs(v));
      }
      const double out_tol = dsv4::test::kOutTol * max_out;
      for (int h = 0; h < c.h; ++h) {
        const int64_t r = int64_t{t} * c.h + h;
        const float got_lse = lse.data<float>()[r], got_max = max_logits.data<float>()[r];
        if (selected.empty()) {
          EXPECT_EQ(got_lse, INFINITY) << "token " << t;
          EXPECT_EQ(got_max, -INFINITY) << "token " << t;
        } else {
          EXPECT_NEAR(got_lse, ref[h].lse, dsv4::test::kLseTol * std::max(1.0, std::abs(ref[h].lse)));
          EXPECT_NEAR(got_max, ref[h].max_logit, dsv4::test::kLseTol * std::max(1.0, std::abs(ref[h].max_logit)));
        }
        for (int d = 0; d < d_v; ++d)
          ASSERT_NEAR(dsv4::bf16_bits_to_float(out.data<uint16_t>()[r * d_v + d]), ref[h].out[d],
                      selected.empty() ? 0.0 : out_tol)
              << "token " << t << " head " << h << " dim " << d;
      }
    }
  }
};

class SparsePrefillGrid : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(SparsePrefillGrid, MatchesFloat64Reference) {
  PrefillProblem p(GetParam(), 5);
  dsv4::sparse_prefill(p.args());
  p.expect_matches_reference();
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SparsePrefillGrid,
    ::testing::Values(PrefillCase{"h16_d512", 16, 512, 5, 300, 64, false, true},
                      PrefillCase{"h16_d576_len", 16, 576, 6, 200, 100, true, false},
                      PrefillCase{"h64_d512_len_sink", 64, 512, 4, 700, 256, true, true},
                      PrefillCase{"h128_d576_topk512", 128, 576, 2, 1000, 512, true, true},
                      PrefillCase{"h128_d512", 128, 512, 2, 400, 128, false, false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(SparsePrefill, AllMaskedGivesZeroInfAndMinusInf) {
  PrefillProblem p(PrefillCase{"masked", 16, 512, 3, 50, 64, false, true}, 8);
  for (int64_t i = 0; i < p.indices.numel(); ++i)
    p.indices.data<int32_t>()[i] = i % 3 == 0 ? -1 : i % 3 == 1 ? 50 : 1 << 20;  // none < s_kv
  dsv4::sparse_prefill(p.args());
  for (int64_t i = 0; i < p.lse.numel(); ++i) {
    EXPECT_EQ(p.lse.data<float>()[i], INFINITY);
    EXPECT_EQ(p.max_logits.data<float>()[i], -INFINITY);
  }
  for (int64_t i = 0; i < p.out.numel(); ++i) ASSERT_EQ(p.out.data<uint16_t>()[i], 0u);
}

// A +inf sink zeroes the output but not lse / max_logits (they exclude the sink).
TEST(SparsePrefill, PlusInfSinkZeroesOutputOnly) {
  PrefillProblem p(PrefillCase{"sink", 16, 512, 2, 100, 64, false, true}, 9);
  for (int h = 0; h < 16; ++h) p.sink.data<float>()[h] = INFINITY;
  dsv4::sparse_prefill(p.args());
  for (int64_t i = 0; i < p.out.numel(); ++i)
    ASSERT_EQ(dsv4::bf16_bits_to_float(p.out.data<uint16_t>()[i]), 0.0f);
  const std::vector<float> lse_sunk(p.lse.data<float>(), p.lse.data<float>() + p.lse.numel());
  const std::vector<float> max_sunk(p.max_logits.data<float>(),
                                    p.max_logits.data<float>() + p.max_logits.numel());
  p.sink = HostTensor();
  p.c.with_sink = false;
  dsv4::sparse_prefill(p.args());
  p.expect_matches_reference();
  for (int64_t i = 0; i < p.lse.numel(); ++i) {
    EXPECT_EQ(p.lse.data<float>()[i], lse_sunk[i]);
    EXPECT_EQ(p.max_logits.data<float>()[i], max_sunk[i]);
  }
}

// FlashMLA's own prefill inputs (tests/lib.py generate_testcase: every tensor non_contiguous,
// invalid indices among -1, -7, s_kv.., INT_MAX) as vLLM hands them over: q with heads padded
// (20 → 24) by NaN rows and padded rows, kv rows padded, indices in a padded buffer whose
// [s_q, 1] dims are swapped, out / max_logits / lse slices of wider buffers. The real heads must
// be bit-identical to the dense run (which matches the float64 reference), and no byte outside
// the output views may change.
TEST(SparsePrefill, FlashMlaStyleStridedInputsMatchDenseBitForBit) {
  using dsv4::test::StridedTensor;
  const PrefillCase c{"flashmla", 20, 576, 5, 200, 100, true, true};
  PrefillProblem dense(c, 6);
  dsv4::sparse_prefill(dense.args());
  dense.expect_matches_reference();

  const int h_pad = 24;
  HostTensor q_heads(DType::bf16, {c.s_q, h_pad, c.d_qk});
  q_heads.fill_bytes(0xFF);
  for (int t = 0; t < c.s_q; ++t)
    std::memcpy(q_heads.data<uint16_t>() + int64_t{t} * h_pad * c.d_qk,
                dense.q.data<uint16_t>() + int64_t{t} * c.h * c.d_qk, size_t(c.h) * c.d_qk * 2);
  const StridedTensor q = StridedTensor::copy_of(q_heads, {2, 3, 8}, false);
  const StridedTensor kv = StridedTensor::copy_of(HostTensor::copy_of(dense.kv), {3, 1, 16}, false);
  const StridedTensor idx = StridedTensor::copy_of(dense.indices, {2, 1, 4}, true);
  HostTensor sink(DType::fp32, {h_pad});
  for (int h = 0; h < h_pad; ++h) sink.data<float>()[h] = h < c.h ? dense.sink.data<float>()[h] : 0.0f;
  StridedTensor out(DType::bf16, {c.s_q, h_pad, 512}, {1, 2, 8}, false);
  StridedTensor ml(DType::fp32, {c.s_q, h_pad}, {2, 3}, false);
  StridedTensor lse(DType::fp32, {c.s_q, h_pad}, {1, 5}, false);
  const HostTensor out_before = out.snapshot(), ml_before = ml.snapshot(), lse_before = lse.snapshot();

  dsv4::sparse_prefill({.q = q.view, .kv = kv.view, .indices = idx.view,
                        .topk_length = dense.lengths, .attn_sink = sink,
                        .softmax_scale = dense.scale, .d_v = 512, .out = out.view,
                        .max_logits = ml.view, .lse = lse.view, .work_counter = {}});

  const HostTensor got_out = out.dense(), got_ml = ml.dense(), got_lse = lse.dense();
  for (int t = 0; t < c.s_q; ++t) {
    EXPECT_EQ(0, std::memcmp(got_out.data<uint16_t>() + int64_t{t} * h_pad * 512,
                             dense.out.data<uint16_t>() + int64_t{t} * c.h * 512,
                             size_t(c.h) * 512 * 2)) << t;
    EXPECT_EQ(0, std::memcmp(got_ml.data<float>() + t * h_pad, dense.max_logits.data<float>() + t * c.h,
                             size_t(c.h) * 4)) << t;
    EXPECT_EQ(0, std::memcmp(got_lse.data<float>() + t * h_pad, dense.lse.data<float>() + t * c.h,
                             size_t(c.h) * 4)) << t;
  }
  out.expect_only_view_written(out_before);
  ml.expect_only_view_written(ml_before);
  lse.expect_only_view_written(lse_before);
}

TEST(SparsePrefill, BadInputThrowsAndWritesNothing) {
  const PrefillCase c{"bad", 16, 512, 3, 100, 64, true, true};
  PrefillProblem p(c, 4);
  HostTensor q_bad_d(DType::bf16, {3, 16, 256}), kv_576(DType::bf16, {100, 1, 576});
  HostTensor idx_bad(DType::int32, {3, 2, 64}), len_bad(DType::int32, {4});
  HostTensor out_bad(DType::bf16, {3, 16, 500}), ml_bad(DType::fp32, {3, 15});
  HostTensor kv_fp32(DType::fp32, {100, 1, 512});
  HostTensor counter(DType::int32, {1}), counter_fp32(DType::fp32, {1});
  struct Bad {
    const char* what;
    std::function<void(dsv4::SparsePrefillArgs&)> mutate;
  };
  const std::vector<Bad> cases = {
      {"q.shape[2]", [&](auto& a) { a.q = q_bad_d; }},
      {"kv.shape", [&](auto& a) { a.kv = kv_576; }},
      {"kv.dtype", [&](auto& a) { a.kv = kv_fp32; }},
      {"indices.shape", [&](auto& a) { a.indices = idx_bad; }},
      {"topk_length.shape", [&](auto& a) { a.topk_length = len_bad; }},
      {"topk_length[1]", [&](auto&) { p.lengths.data<int32_t>()[1] = -1; }},
      {"topk_length[2]", [&](auto&) { p.lengths.data<int32_t>()[2] = 65; }},
      {"out.shape", [&](auto& a) { a.out = out_bad; }},
      {"max_logits.shape", [&](auto& a) { a.max_logits = ml_bad; }},
      {"d_v", [&](auto& a) { a.d_v = 0; }},
      {"softmax_scale", [&](auto& a) { a.softmax_scale = INFINITY; }},
      // scale · log2(e) subnormal (the CUDA kernel's masked −inf · scale would be NaN under FTZ).
      {"softmax_scale", [&](auto& a) { a.softmax_scale = 4e-39f; }},
      // scale · log2(e) overflows to inf.
      {"softmax_scale", [&](auto& a) { a.softmax_scale = -3e38f; }},
      {"attn_sink.device", [&](auto& a) { a.attn_sink.device = dsv4::Device::cuda; }},
      // Outputs: no two elements at one address, non-negative strides, no aliasing.
      {"out: expected an output whose elements do not overlap", [&](auto& a) { a.out.strides[0] = 0; }},
      {"out.stride(1)", [&](auto& a) { a.out.strides[1] = -512; }},
      {"out: expected memory disjoint from q", [&](auto& a) { a.out = p.q; }},
      {"max_logits: expected memory disjoint from out",
       [&](auto& a) { a.max_logits = TensorView(a.out.data, DType::fp32, {3, 16}); }},
      {"lse: expected memory disjoint from max_logits", [&](auto& a) { a.lse = a.max_logits; }},
      // The optional work counter: int32, at least one element, disjoint from the rest.
      {"work_counter.dtype", [&](auto& a) { a.work_counter = counter_fp32; }},
      {"work_counter.shape[0]", [&](auto& a) { a.work_counter = TensorView(counter.data<int32_t>(), DType::int32, {0}); }},
      {"work_counter: expected memory disjoint from topk_length",
       [&](auto& a) { a.work_counter = TensorView(a.topk_length.data, DType::int32, {1}); }},
      {"work_counter: expected memory disjoint from lse",
       [&](auto& a) { a.work_counter = TensorView(a.lse.data, DType::int32, {1}); }},
  };
  const std::vector<int32_t> lengths(p.lengths.data<int32_t>(), p.lengths.data<int32_t>() + 3);
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.what);
    std::copy(lengths.begin(), lengths.end(), p.lengths.data<int32_t>());
    for (HostTensor* t : {&p.out, &p.max_logits, &p.lse}) t->fill_bytes(0xA5);
    dsv4::SparsePrefillArgs a = p.args();
    bad.mutate(a);
    dsv4::test::expect_error([&] { dsv4::sparse_prefill(a); }, {bad.what, "sparse_prefill"});
    for (const HostTensor* t : {&p.out, &p.max_logits, &p.lse})
      for (size_t i = 0; i < t->nbytes(); ++i) ASSERT_EQ(t->data<uint8_t>()[i], 0xA5) << i;
  }
}

// The work counter is the CUDA kernel's scratch: the CPU backend takes one (a caller need not
// know the backend) and leaves it alone.
TEST(SparsePrefill, WorkCounterIsAcceptedAndLeftAlone) {
  PrefillProblem p(PrefillCase{"counter", 16, 576, 3, 100, 64, true, true}, 8);
  HostTensor counter(DType::int32, {2});
  counter.fill_bytes(0x5A);
  dsv4::SparsePrefillArgs a = p.args();
  a.work_counter = counter;
  dsv4::sparse_prefill(a);
  p.expect_matches_reference();
  for (size_t i = 0; i < counter.nbytes(); ++i) ASSERT_EQ(counter.data<uint8_t>()[i], 0x5A) << i;
}

TEST(SparsePrefill, CudaTensorsReachTheCudaKernelOrNameTheMissingBackend) {
  PrefillProblem p(PrefillCase{"cuda", 16, 512, 2, 100, 64, true, true}, 3);
  dsv4::SparsePrefillArgs a = p.args();
  for (TensorView* t : {&a.q, &a.kv, &a.indices, &a.topk_length, &a.attn_sink, &a.out, &a.max_logits, &a.lse})
    t->device = dsv4::Device::cuda;
  for (HostTensor* t : {&p.out, &p.max_logits, &p.lse}) t->fill_bytes(0xA5);
  dsv4::test::expect_cuda_dispatch("sparse_prefill", dsv4::ops::kSparsePrefill, [&] { dsv4::sparse_prefill(a); });
  for (const HostTensor* t : {&p.out, &p.max_logits, &p.lse})
    for (size_t i = 0; i < t->nbytes(); ++i) ASSERT_EQ(t->data<uint8_t>()[i], 0xA5) << i;
}

}  // namespace
