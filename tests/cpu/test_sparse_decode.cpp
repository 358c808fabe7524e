// sparse_decode (and make_decode_schedule): split-KV sparse attention over the paged caches,
// against the docs/spec.md §6 formula in float64 with rows decoded by hand from the cache bytes;
// with a bf16 query, and with an FP8 one (q_scale 0.37: the decode attends with the bf16 query the
// codes mean, bf16(fp8 · q_scale), the product of the two exact values rounded once to fp32 and
// once to bf16; the float64 formula takes that q).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_dispatch_support.h"
#include "dsv4/ops.h"
#include "sparse_attention_cases.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;
using dsv4::KvLayout;
using dsv4::TensorView;
using dsv4::test::DecodeScope;
using dsv4::test::TestCache;

struct DecodeCase {
  const char* name;
  KvLayout layout;
  int h, b, s_q, topk;
  bool with_length;   // topk_length given (random, some 0), slots past it hold garbage
  int extra_topk;     // 0: no extra scope
  bool extra_length;  // extra_topk_length given
  bool with_sink;
  int block_size, extra_block_size;
  int64_t block_stride = 0, extra_block_stride = 0;  // cache block strides (0: the block bytes)
};

std::ostream& operator<<(std::ostream& os, const DecodeCase& c) { return os << c.name; }

// A whole decode problem: inputs, poisoned outputs and the float64 reference.
struct DecodeProblem {
  DecodeCase c;
  int d_qk, d_v = 512;
  float scale;
  std::mt19937 rng;
  std::unique_ptr<DecodeScope> main, extra;
  HostTensor q, sink, out, lse;
  HostTensor q_fp8;        // defined after use_fp8_query: the decode's query instead of q
  float q_scale = 1.0f;

  explicit DecodeProblem(const DecodeCase& cs, uint32_t seed = 1234)
      : c(cs), d_qk(dsv4::test::spec_dim(cs.layout)), rng(seed) {
    scale = 1.0f / std::sqrt(float(d_qk)) * 1.25f;  // not the default: the scale must be used
    main = std::make_unique<DecodeScope>(c.layout, c.block_size, c.b, c.s_q, c.topk, c.with_length,
                                         rng, dsv4::test::IndexMix{}, c.block_stride);
    if (c.extra_topk > 0)
      extra = std::make_unique<DecodeScope>(c.layout, c.extra_block_size, c.b, c.s_q, c.extra_topk,
                                            c.extra_length, rng, dsv4::test::IndexMix{},
                                            c.extra_block_stride);
    q = HostTensor(DType::bf16, {c.b, c.s_q, c.h, d_qk});
    dsv4::test::fill_bf16_normal(q, rng);
    if (c.with_sink) sink = dsv4::test::random_sink(c.h, rng);
    out = HostTensor(DType::bf16, {c.b, c.s_q, c.h, d_v});
    lse = HostTensor(DType::fp32, {c.b, c.s_q, c.h});
    poison();
  }

  void poison() {
    out.fill_bytes(0xFF);  // bf16 NaN
    lse.fill_bytes(0xFF);  // fp32 NaN
  }

  // The decode reads an FP8 query of scale `s`: the codes e4m3(q / s) of the bf16 q (values of
  // the same size, a query meaning fp8 · s).
  void use_fp8_query(float s) {
    q_fp8 = HostTensor(DType::fp8_e4m3, q.shape());
    for (int64_t i = 0; i < q.numel(); ++i)
      q_fp8.data<uint8_t>()[i] = dsv4::float_to_fp8_e4m3(dsv4::bf16_bits_to_float(q.data<uint16_t>()[i]) / s);
    q_scale = s;
  }

  dsv4::SparseDecodeArgs args() const {
    dsv4::SparseDecodeArgs a =
        dsv4::test::decode_args(q_fp8.view().defined() ? q_fp8 : q, *main, extra.get(), sink, scale, d_v, out, lse);
    a.q_scale = q_scale;
    return a;
  }
  int topk_total() const { return c.topk + c.extra_topk; }

  // Runs the decode with `schedule` (default: make_decode_schedule) into a NaN workspace.
  void run(const dsv4::DecodeSchedule* schedule = nullptr) {
    const dsv4::DecodeSchedule s =
        schedule ? *schedule : dsv4::make_decode_schedule(c.b, c.s_q, c.h, topk_total(), 132, d_v);
    HostTensor ws(DType::uint8, {s.workspace_bytes});
    ws.fill_bytes(0xFF);
    dsv4::sparse_decode(args(), s, ws);
  }

  // The float64 reference of one (b, s, h).
  dsv4::test::HeadResult reference(int bi, int si, int hi,
                                   std::map<std::pair<int, int64_t>, std::vector<double>>& rows_cache,
                                   double sink_override = NAN, int drop = -1) const {
    // The query's values: bf16, or an FP8 query's bf16(fp8 · q_scale).
    std::vector<double> qv(d_qk);
    const int64_t q_off = ((int64_t{bi} * c.s_q + si) * c.h + hi) * d_qk;
    for (int d = 0; d < d_qk; ++d) {
      if (q_fp8.view().defined()) {
        const double meant = double(dsv4::fp8_e4m3_to_float(q_fp8.data<uint8_t>()[q_off + d])) * q_scale;
        qv[d] = dsv4::round_bf16(static_cast<float>(meant));
      } else {
        qv[d] = dsv4::bf16_bits_to_float(q.data<uint16_t>()[q_off + d]);
      }
    }
    std::vector<const std::vector<double>*> rows;
    int position = 0;
    for (int scope = 0; scope < 2; ++scope) {
      const DecodeScope* sd = scope == 0 ? main.get() : extra.get();
      if (!sd) continue;
      const int topk = int(sd->indices.shape()[2]);
      for (int k = 0; k < sd->counted(bi); ++k) {
        const int32_t slot = sd->indices.data<int32_t>()[(int64_t{bi} * c.s_q + si) * topk + k];
        if (slot == -1) continue;
        if (position++ == drop) continue;
        auto [it, fresh] = rows_cache.try_emplace({scope, slot});
        if (fresh) it->second = sd->cache->decode(slot);  // bf16 rows, as the decode reads them
        rows.push_back(&it->second);
      }
    }
    const double s = !std::isnan(sink_override) ? sink_override
                     : c.with_sink             ? double(sink.data<float>()[hi])
                                               : -dsv4::test::kInf;
    return dsv4::test::reference_head(qv, rows, scale, s, d_v);
  }

  // Compares out/lse with the reference (tolerances: sparse_attention_reference.h).
  void expect_matches_reference() const {
    std::map<std::pair<int, int64_t>, std::vector<double>> rows_cache;
    std::vector<dsv4::test::HeadResult> ref;
    double max_out = 0.0;
    for (int bi = 0; bi < c.b; ++bi)
      for (int si = 0; si < c.s_q; ++si)
        for (int hi = 0; hi < c.h; ++hi) {
          ref.push_back(reference(bi, si, hi, rows_cache));
          for (double v : ref.back().out) max_out = std::max(max_out, std::abs(v));
        }
    const double out_tol = dsv4::test::kOutTol * std::max(max_out, 1e-30);
    int bad = 0;
    for (size_t r = 0; r < ref.size() && bad < 10; ++r) {
      const float got_lse = lse.data<float>()[r];
      if (std::isinf(ref[r].lse)) {
        if (!(std::isinf(got_lse) && got_lse > 0)) ++bad;
        EXPECT_TRUE(std::isinf(got_lse) && got_lse > 0) << "row " << r << " lse " << got_lse;
      } else {
        const double tol = dsv4::test::kLseTol * std::max(1.0, std::abs(ref[r].lse));
        if (!(std::abs(got_lse - ref[r].lse) <= tol)) ++bad;
        EXPECT_NEAR(got_lse, ref[r].lse, tol) << "row " << r;
      }
      for (int d = 0; d < d_v; ++d) {
        const double got = dsv4::bf16_bits_to_float(out.data<uint16_t>()[r * d_v + d]);
        if (!(std::abs(got - ref[r].out[d]) <= out_tol)) {
          ADD_FAILURE() << "row " << r << " dim " << d << ": got " << got << ", want "
                        << ref[r].out[d] << " (tol " << out_tol << ")";
          if (++bad >= 10) break;
        }
      }
    }
  }
};

// ---- the grid --------------------------------------------------------------------------------
class SparseDecodeGrid : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(SparseDecodeGrid, MatchesFloat64Reference) {
  DecodeProblem p(GetParam());
  p.run();
  p.expect_matches_reference();
}

// Same inputs through one split and through the default (many-split) plan: equal up to fp32
// rounding of the merge (the combine of one split is exact): outputs within 2 bf16 ulps.
TEST_P(SparseDecodeGrid, OneSplitEqualsManySplits) {
  DecodeProblem p(GetParam(), 99);
  const dsv4::DecodeSchedule many =
      dsv4::make_decode_schedule(p.c.b, p.c.s_q, p.c.h, p.topk_total(), 132, p.d_v);
  dsv4::DecodeSchedule one;
  one.num_splits = 1;
  one.split_len = (p.topk_total() + 63) / 64 * 64;
  one.workspace_bytes = int64_t{p.c.b} * p.c.s_q * p.c.h * (p.d_v + 1) * 4;
  p.run(&one);
  const HostTensor out1 = p.out, lse1 = p.lse;
  std::vector<uint16_t> out_one(out1.data<uint16_t>(), out1.data<uint16_t>() + out1.numel());
  std::vector<float> lse_one(lse1.data<float>(), lse1.data<float>() + lse1.numel());
  p.out = HostTensor(DType::bf16, p.out.shape());
  p.lse = HostTensor(DType::fp32, p.lse.shape());
  p.poison();
  p.run(&many);
  for (int64_t i = 0; i < p.lse.numel(); ++i) {
    if (std::isinf(lse_one[i]))
      EXPECT_EQ(p.lse.data<float>()[i], lse_one[i]);
    else
      EXPECT_NEAR(p.lse.data<float>()[i], lse_one[i], 1e-5 * std::max(1.0f, std::abs(lse_one[i])));
  }
  // Elements near 0 come from cancelling sums: their fp32 reordering error is relative to the
  // terms (~max|out|), not to the element; then each side may round to a different bf16.
  float max_out = 0.0f;
  for (uint16_t bits : out_one) max_out = std::max(max_out, std::abs(dsv4::bf16_bits_to_float(bits)));
  for (int64_t i = 0; i < p.out.numel(); ++i) {
    const float a = dsv4::bf16_bits_to_float(out_one[i]);
    const float b = dsv4::bf16_bits_to_float(p.out.data<uint16_t>()[i]);
    ASSERT_NEAR(a, b, std::abs(a) * (2.0f / 256) + 1e-5f * max_out) << "element " << i;
  }
}

// An FP8 query with a scale that is not a power of two (the FlashInfer port's FP8 decode): every
// shape and layout of the grid against the same float64 formula and tolerances.
TEST_P(SparseDecodeGrid, Fp8QueryMatchesFloat64Reference) {
  DecodeProblem p(GetParam(), 7);
  p.use_fp8_query(0.37f);
  p.run();
  p.expect_matches_reference();
}

constexpr KvLayout M1 = KvLayout::model1_fp8, V32 = KvLayout::v32_fp8, BF = KvLayout::bf16,
                   PT = KvLayout::fp8_per_tensor;
INSTANTIATE_TEST_SUITE_P(
    Shapes, SparseDecodeGrid,
    ::testing::Values(
        //          name                   layout  h   b  s_q topk  len   extra elen  sink  B   eB
        DecodeCase{"model1_h16_small",      M1,    16, 2, 2,  96,   false, 0,   false, true, 64, 64},
        DecodeCase{"model1_h64_swa_c128",   M1,    64, 3, 1,  128,  true,  64,  true,  true, 64, 2},
        DecodeCase{"model1_h128_c4a",       M1,   128, 2, 1,  512,  true,  128, true,  true, 64, 64},
        DecodeCase{"model1_h16_tiny_blocks", M1,   16, 2, 1,  150,  true,  70,  false, false, 3, 2},
        DecodeCase{"v32_h16_len",           V32,   16, 3, 1,  200,  true,  0,   false, true, 64, 64},
        DecodeCase{"v32_h64_extra",         V32,   64, 2, 2,  256,  false, 64,  true,  false, 64, 64},
        DecodeCase{"v32_h128_topk2048",     V32,  128, 1, 1,  2048, false, 0,   false, true, 64, 64},
        DecodeCase{"bf16_h16",              BF,    16, 2, 1,  128,  true,  64,  true,  true, 64, 16},
        DecodeCase{"fp8pt_h16",             PT,    16, 2, 1,  128,  false, 64,  false, true, 32, 64}),
    [](const auto& info) { return std::string(info.param.name); });

// ---- edge cases ------------------------------------------------------------------------------
DecodeCase small_case(int topk = 64, int extra = 64) {
  return DecodeCase{"small", M1, 16, 2, 1, topk, false, extra, false, true, 64, 64};
}

TEST(SparseDecode, AllInvalidGivesZeroAndInfLse) {
  DecodeProblem p(small_case());
  for (HostTensor* idx : {&p.main->indices, &p.extra->indices})
    for (int64_t i = 0; i < idx->numel(); ++i) idx->data<int32_t>()[i] = -1;
  p.run();
  for (int64_t i = 0; i < p.lse.numel(); ++i) EXPECT_EQ(p.lse.data<float>()[i], INFINITY);
  for (int64_t i = 0; i < p.out.numel(); ++i) ASSERT_EQ(p.out.data<uint16_t>()[i], 0u) << i;
}

TEST(SparseDecode, ZeroLengthsInBothScopesAreEmpty) {
  DecodeCase c = small_case(64, 64);
  c.with_length = c.extra_length = true;  // random_lengths gives batch 1 length 0
  DecodeProblem p(c);
  p.extra->lengths.data<int32_t>()[1] = 0;
  p.run();
  p.expect_matches_reference();
  for (int h = 0; h < c.h; ++h) EXPECT_EQ(p.lse.data<float>()[c.h + h], INFINITY);
}

TEST(SparseDecode, SinkMinusInfIsNoSinkAndPlusInfZeroesOutput) {
  DecodeProblem with_sink(small_case()), no_sink(small_case());
  no_sink.sink = HostTensor();
  no_sink.c.with_sink = false;
  for (int h = 0; h < 16; ++h) with_sink.sink.data<float>()[h] = -INFINITY;
  with_sink.run();
  no_sink.run();
  EXPECT_EQ(0, std::memcmp(with_sink.out.data<uint8_t>(), no_sink.out.data<uint8_t>(), with_sink.out.nbytes()));
  EXPECT_EQ(0, std::memcmp(with_sink.lse.data<uint8_t>(), no_sink.lse.data<uint8_t>(), with_sink.lse.nbytes()));

  for (int h = 0; h < 16; ++h) with_sink.sink.data<float>()[h] = INFINITY;
  with_sink.poison();
  with_sink.run();
  for (int64_t i = 0; i < with_sink.out.numel(); ++i)
    ASSERT_EQ(dsv4::bf16_bits_to_float(with_sink.out.data<uint16_t>()[i]), 0.0f) << i;
  // lse excludes the sink: unchanged.
  EXPECT_EQ(0, std::memcmp(with_sink.lse.data<uint8_t>(), no_sink.lse.data<uint8_t>(), with_sink.lse.nbytes()));
}

// Every slot the same row: uniform softmax, out = that row, lse = P + ln(count); duplicates
// count once per occurrence, as in FlashMLA.
TEST(SparseDecode, DuplicateIndicesCountEachTime) {
  DecodeProblem p(small_case(64, 0));
  p.sink = HostTensor();
  p.c.with_sink = false;
  const int32_t slot = int32_t(p.main->clean_slots[3]);
  for (int64_t i = 0; i < p.main->indices.numel(); ++i) p.main->indices.data<int32_t>()[i] = slot;
  p.run();
  p.expect_matches_reference();
  const std::vector<double> row = p.main->cache->decode(slot);
  std::vector<double> q(p.d_qk);
  for (int d = 0; d < p.d_qk; ++d) q[d] = dsv4::bf16_bits_to_float(p.q.data<uint16_t>()[d]);
  double dot = 0;
  for (int d = 0; d < p.d_qk; ++d) dot += q[d] * row[d];
  EXPECT_NEAR(p.lse.data<float>()[0], p.scale * dot + std::log(64.0), 1e-4);
  for (int d = 0; d < p.d_v; ++d)
    EXPECT_NEAR(dsv4::bf16_bits_to_float(p.out.data<uint16_t>()[d]), row[d], std::abs(row[d]) / 128 + 1e-6);
}

// q and out may be row-strided views (e.g. heads padded in a larger buffer): same bits as the
// dense run, and the padding of out is left alone.
TEST(SparseDecode, StridedQueryAndOutputMatchDense) {
  DecodeProblem p(small_case());
  p.run();
  const int b = p.c.b, h = p.c.h, d = p.d_qk, pad_heads = 3;
  HostTensor q_big(DType::bf16, {b, 1, h + pad_heads, d}), out_big(DType::bf16, {b, 1, h + pad_heads, 512});
  q_big.fill_bytes(0xFF);
  out_big.fill_bytes(0x5A);
  for (int bi = 0; bi < b; ++bi)
    std::memcpy(q_big.data<uint16_t>() + int64_t{bi} * (h + pad_heads) * d,
                p.q.data<uint16_t>() + int64_t{bi} * h * d, size_t(h) * d * 2);
  TensorView q_view = q_big, out_view = out_big;
  q_view.shape[2] = out_view.shape[2] = h;  // the first h heads of each row
  dsv4::SparseDecodeArgs a = p.args();
  a.q = q_view;
  a.out = out_view;
  const auto s = dsv4::make_decode_schedule(b, 1, h, p.topk_total());
  HostTensor ws(DType::uint8, {s.workspace_bytes});
  dsv4::sparse_decode(a, s, ws);
  for (int bi = 0; bi < b; ++bi) {
    const uint16_t* row = out_big.data<uint16_t>() + int64_t{bi} * (h + pad_heads) * 512;
    EXPECT_EQ(0, std::memcmp(row, p.out.data<uint16_t>() + int64_t{bi} * h * 512, size_t(h) * 512 * 2));
    for (int i = h * 512; i < (h + pad_heads) * 512; ++i) ASSERT_EQ(row[i], 0x5A5A) << i;
  }
}

// FlashMLA's own test inputs (tests/lib.py: non_contiguousify, quantize_k_cache) and what vLLM
// hands over: q whose [b, s_q] dims do not merge, with heads padded (h 20 → 24) by rows of NaN
// (vLLM pads h_q with uninitialized rows); indices of both scopes in transposed, padded buffers;
// out and lse slices of wider buffers; caches whose blocks are padded (V3.2: 64 tokens x 656 B
// every 42640 B, FlashMLA's quantize_k_cache layout). The real heads must be bit-identical to the
// dense run of the same values (which matches the float64 reference), and no byte of the output
// buffers outside the views may change.
class SparseDecodeFlashMlaLayouts : public ::testing::TestWithParam<KvLayout> {};

TEST_P(SparseDecodeFlashMlaLayouts, StridedInputsMatchDenseBitForBit) {
  using dsv4::test::StridedTensor;
  const KvLayout layout = GetParam();
  // Padded block strides: V3.2 one token (656 B) per block as FlashMLA's generator; MODEL1 64 B
  // past its 576-aligned block; the extra scope's block 2 blocks padded to a 16-byte multiple.
  const int64_t stride = layout == V32 ? 65 * 656 : dsv4::test::spec_block_bytes(M1, 64) + 64;
  const int64_t extra_stride = (dsv4::test::spec_block_bytes(layout, 2) + 15) / 16 * 16 + 16;
  const DecodeCase dense_case{"dense", layout, 20, 3, 2, 96, true, 40, true, true, 64, 2};
  DecodeCase padded_case = dense_case;
  padded_case.block_stride = stride;
  padded_case.extra_block_stride = extra_stride;
  if (layout == V32) {
    ASSERT_EQ(stride, 42640);
  }

  DecodeProblem dense(dense_case), padded(padded_case);  // the same values (same seed)
  const dsv4::DecodeSchedule sched =
      dsv4::make_decode_schedule(3, 2, 20, dense.topk_total(), 132, 512);
  const int h_pad = 24;
  HostTensor ws(DType::uint8, {int64_t{6} * h_pad * sched.num_splits * (512 + 1) * 4});
  dense.run(&sched);
  dense.expect_matches_reference();

  // q [3, 2, 24, d]: heads 20..23 NaN, [b, s_q] swapped in memory, head and dim rows padded.
  HostTensor q_heads(DType::bf16, {3, 2, h_pad, dense.d_qk});
  q_heads.fill_bytes(0xFF);
  for (int64_t r = 0; r < 6; ++r)
    std::memcpy(q_heads.data<uint16_t>() + r * h_pad * dense.d_qk,
                dense.q.data<uint16_t>() + r * 20 * dense.d_qk, size_t(20) * dense.d_qk * 2);
  const StridedTensor q = StridedTensor::copy_of(q_heads, {1, 2, 3, 8}, true);
  const StridedTensor idx = StridedTensor::copy_of(padded.main->indices, {2, 1, 5}, true);
  const StridedTensor eidx = StridedTensor::copy_of(padded.extra->indices, {1, 3, 7}, true);
  HostTensor sink(DType::fp32, {h_pad});
  for (int h = 0; h < h_pad; ++h) sink.data<float>()[h] = h < 20 ? dense.sink.data<float>()[h] : 0.0f;
  StridedTensor out(DType::bf16, {3, 2, h_pad, 512}, {1, 1, 2, 8}, true);
  StridedTensor lse(DType::fp32, {3, 2, h_pad}, {2, 1, 3}, true);
  const HostTensor out_before = out.snapshot(), lse_before = lse.snapshot();

  dsv4::SparseDecodeArgs a = padded.args();
  a.q = q.view;
  a.indices = idx.view;
  a.extra_indices = eidx.view;
  a.attn_sink = sink;
  a.out = out.view;
  a.lse = lse.view;
  ws.fill_bytes(0xFF);
  dsv4::sparse_decode(a, sched, ws);

  const HostTensor got_out = out.dense(), got_lse = lse.dense();
  for (int64_t r = 0; r < 6; ++r) {
    EXPECT_EQ(0, std::memcmp(got_out.data<uint16_t>() + r * h_pad * 512,
                             dense.out.data<uint16_t>() + r * 20 * 512, size_t(20) * 512 * 2)) << r;
    EXPECT_EQ(0, std::memcmp(got_lse.data<float>() + r * h_pad, dense.lse.data<float>() + r * 20,
                             size_t(20) * 4)) << r;
  }
  out.expect_only_view_written(out_before);
  lse.expect_only_view_written(lse_before);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SparseDecodeFlashMlaLayouts, ::testing::Values(M1, V32),
                         [](const auto& info) { return info.param == M1 ? "model1" : "v32"; });

// A cache whose block stride is below the block bytes (blocks would overlap) or not a multiple
// of 16 (blocks misaligned for the in-place reads) is refused, naming the stride.
TEST(SparseDecode, BadBlockStridesAreRefused) {
  DecodeProblem p(small_case());
  const int64_t block_bytes = dsv4::test::spec_block_bytes(M1, 64);
  HostTensor wide(DType::uint8, {8, block_bytes + 64});
  for (int64_t stride : {block_bytes - 16, block_bytes + 8}) {
    SCOPED_TRACE(stride);
    dsv4::SparseDecodeArgs a = p.args();
    a.k_cache.data = TensorView(wide.data<void>(), DType::uint8, {7, block_bytes});
    a.k_cache.data.strides[0] = stride;
    const auto s = dsv4::make_decode_schedule(p.c.b, p.c.s_q, p.c.h, p.topk_total());
    HostTensor ws(DType::uint8, {s.workspace_bytes});
    p.out.fill_bytes(0xA5);
    dsv4::test::expect_error([&] { dsv4::sparse_decode(a, s, ws); },
                             {"sparse_decode", "k_cache.data.stride(0) (block stride, bytes)"});
    for (size_t i = 0; i < p.out.nbytes(); ++i) ASSERT_EQ(p.out.data<uint8_t>()[i], 0xA5) << i;
  }
}

// The tolerance can fail: dropping one row or ignoring the sink moves the reference beyond it.
TEST(SparseDecode, ReferenceIsSensitiveBeyondTolerance) {
  DecodeProblem p(small_case(64, 0));
  std::map<std::pair<int, int64_t>, std::vector<double>> rows;
  const auto full = p.reference(0, 0, 0, rows, -INFINITY);
  const auto dropped = p.reference(0, 0, 0, rows, -INFINITY, 5);
  const auto sunk = p.reference(0, 0, 0, rows, full.lse - 2.0);  // a sink of ~1/8 the mass
  double max_out = 0, d_drop = 0, d_sink = 0;
  for (int d = 0; d < p.d_v; ++d) {
    max_out = std::max(max_out, std::abs(full.out[d]));
    d_drop = std::max(d_drop, std::abs(full.out[d] - dropped.out[d]));
    d_sink = std::max(d_sink, std::abs(full.out[d] - sunk.out[d]));
  }
  EXPECT_GT(d_drop, dsv4::test::kOutTol * max_out);
  EXPECT_GT(d_sink, dsv4::test::kOutTol * max_out);
}

// An FP8 query's scale matters beyond the tolerance: its reference at q_scale 1 (a decode that
// ignored the scale) is off by more than kOutTol somewhere.
TEST(SparseDecode, Fp8QueryScaleIsNotIgnorable) {
  DecodeProblem p(small_case(64, 0));
  p.use_fp8_query(0.37f);
  std::map<std::pair<int, int64_t>, std::vector<double>> rows;
  const auto scaled = p.reference(0, 0, 0, rows, -INFINITY);
  p.q_scale = 1.0f;
  const auto unscaled = p.reference(0, 0, 0, rows, -INFINITY);
  double max_out = 0, diff = 0;
  for (int d = 0; d < p.d_v; ++d) {
    max_out = std::max(max_out, std::abs(scaled.out[d]));
    diff = std::max(diff, std::abs(scaled.out[d] - unscaled.out[d]));
  }
  EXPECT_GT(diff, dsv4::test::kOutTol * max_out);
  EXPECT_GT(std::abs(scaled.lse - unscaled.lse), dsv4::test::kLseTol * std::max(1.0, std::abs(scaled.lse)));
}

// An FP8 query in FlashMLA-style strides (heads padded with NaN codes, [b, s_q] swapped in memory,
// every dim padded): the same bits as the dense FP8 run (strides change addressing only).
TEST(SparseDecode, StridedFp8QueryMatchesDense) {
  using dsv4::test::StridedTensor;
  DecodeCase c = small_case();
  c.s_q = 2;
  DecodeProblem dense(c), strided(c);
  dense.use_fp8_query(0.37f);
  strided.use_fp8_query(0.37f);
  dense.run();
  const StridedTensor q = StridedTensor::copy_of(strided.q_fp8, {1, 2, 3, 16}, true);
  const auto s = dsv4::make_decode_schedule(c.b, c.s_q, c.h, strided.topk_total());
  HostTensor ws(DType::uint8, {s.workspace_bytes});
  dsv4::SparseDecodeArgs a = strided.args();
  a.q = q.view;
  dsv4::sparse_decode(a, s, ws);
  EXPECT_EQ(0, std::memcmp(strided.out.data<uint8_t>(), dense.out.data<uint8_t>(), dense.out.nbytes()));
  EXPECT_EQ(0, std::memcmp(strided.lse.data<uint8_t>(), dense.lse.data<uint8_t>(), dense.lse.nbytes()));
}

// ---- the schedule ----------------------------------------------------------------------------
TEST(DecodeSchedule, CoversTheIndexListWithoutEmptySplits) {
  for (int b : {1, 2, 8, 64, 300})
    for (int h : {16, 64, 128})
      for (int topk_total : {1, 64, 100, 640, 2048, 2176}) {
        const auto s = dsv4::make_decode_schedule(b, 1, h, topk_total, 132, 512);
        SCOPED_TRACE(::testing::Message() << "b " << b << " h " << h << " topk " << topk_total);
        EXPECT_GE(s.num_splits, 1);
        EXPECT_EQ(s.split_len % dsv4::kDecodeTile, 0);
        EXPECT_GT(s.split_len, 0);
        EXPECT_GE(int64_t{s.num_splits} * s.split_len, topk_total);
        EXPECT_LT(int64_t{s.num_splits - 1} * s.split_len, std::max(topk_total, 1));
        EXPECT_EQ(s.workspace_bytes, int64_t{b} * h * s.num_splits * (512 + 1) * 4);
        // CTAs per split: one per (b, s_q) row and 64-head group. Roughly fills the SMs when
        // there is enough work; while one wave holds every CTA it adds no split beyond the one
        // that reaches num_sms; past one wave it splits only to even out the waves: never when
        // one split already fills whole waves, and never to a longer modeled time (waves x
        // (tiles per split + 1), the model documented in make_decode_schedule).
        const int64_t per_split = int64_t{b} * ((h + 63) / 64);
        const int64_t tiles = std::max(1, (topk_total + 63) / 64);
        EXPECT_GE(per_split * s.num_splits, std::min<int64_t>(132, per_split * tiles) / 2);
        if (per_split <= 132) {
          EXPECT_LT(per_split * (s.num_splits - 1), 132);
        } else {
          if (per_split % 132 == 0) {
            EXPECT_EQ(s.num_splits, 1);
          }
          const int64_t waves1 = (per_split + 131) / 132;
          const int64_t waves = (per_split * s.num_splits + 131) / 132;
          EXPECT_LE(waves * (s.split_len / 64 + 1), waves1 * (tiles + 1));
        }
      }
  EXPECT_EQ(dsv4::make_decode_schedule(1, 1, 64, 2048, 1).num_splits, 1);
  EXPECT_THROW(dsv4::make_decode_schedule(1, 0, 64, 64), dsv4::Error);
  EXPECT_THROW(dsv4::make_decode_schedule(1, 1, 0, 64), dsv4::Error);
  EXPECT_THROW(dsv4::make_decode_schedule(-1, 1, 64, 64), dsv4::Error);
  EXPECT_THROW(dsv4::make_decode_schedule(1, 1, 64, -1), dsv4::Error);
  EXPECT_THROW(dsv4::make_decode_schedule(1, 1, 64, 64, 0), dsv4::Error);
}

// ---- bad input: the documented error, and no output byte changed --------------------------------
struct BadDecode {
  const char* what;  // substring of the error message
  std::function<void(dsv4::SparseDecodeArgs&, dsv4::DecodeSchedule&, TensorView& ws)> mutate;
};

TEST(SparseDecode, BadInputThrowsAndWritesNothing) {
  DecodeCase c = small_case(64, 64);
  c.with_length = c.extra_length = true;
  DecodeProblem p(c);
  HostTensor q_fp32(DType::fp32, {c.b, c.s_q, c.h, 512}), q_576(DType::bf16, {c.b, c.s_q, c.h, 576});
  HostTensor idx_bad_shape(DType::int32, {c.b, c.s_q + 1, 64}), idx_i64(DType::int64, {c.b, c.s_q, 64});
  HostTensor sink_bad(DType::fp32, {c.h + 1}), out_bad(DType::bf16, {c.b, c.s_q, c.h, 256});
  HostTensor out_fp32(DType::fp32, {c.b, c.s_q, c.h, 512}), lse_bad(DType::fp32, {c.b, c.h});
  HostTensor small_ws(DType::uint8, {64});
  HostTensor q_fp16(DType::fp16, {c.b, c.s_q, c.h, 512}), q_fp8(DType::fp8_e4m3, {c.b, c.s_q, c.h, 512});
  HostTensor q_fp8_576(DType::fp8_e4m3, {c.b, c.s_q, c.h, 576});
  q_fp8.fill_bytes(0x38);  // 1.0
  HostTensor bad_cache(DType::uint8, {4, 1000});
  TestCache v32_cache(V32, 64, 4);
  const int64_t main_slots = p.main->cache->num_slots(), extra_slots = p.extra->cache->num_slots();
  auto set_index = [](const HostTensor& t, int64_t i, int32_t v) { t.data<int32_t>()[i] = v; };

  const std::vector<BadDecode> cases = {
      {"q.dtype", [&](auto& a, auto&, auto&) { a.q = q_fp32; }},
      {"q.shape[3]", [&](auto& a, auto&, auto&) { a.q = q_576; }},
      {"q.dtype: expected bf16 or fp8_e4m3, got fp16", [&](auto& a, auto&, auto&) { a.q = q_fp16; }},
      {"q.shape[3]", [&](auto& a, auto&, auto&) { a.q = q_fp8_576; a.q_scale = 0.5f; }},
      // q_scale: 1 for a bf16 q; an FP8 q's finite and > 0, its largest query a finite bf16.
      {"q_scale: expected 1 for a bf16 q", [&](auto& a, auto&, auto&) { a.q_scale = 0.5f; }},
      {"q_scale: expected a finite value > 0, got 0", [&](auto& a, auto&, auto&) { a.q = q_fp8; a.q_scale = 0.0f; }},
      {"q_scale: expected a finite value > 0, got -0.5", [&](auto& a, auto&, auto&) { a.q = q_fp8; a.q_scale = -0.5f; }},
      {"q_scale: expected a finite value > 0, got nan", [&](auto& a, auto&, auto&) { a.q = q_fp8; a.q_scale = NAN; }},
      {"q_scale: expected a finite value > 0, got inf", [&](auto& a, auto&, auto&) { a.q = q_fp8; a.q_scale = INFINITY; }},
      {"q_scale: expected a value whose largest query, bf16(448 * q_scale), is finite",
       [&](auto& a, auto&, auto&) { a.q = q_fp8; a.q_scale = 1e36f; }},
      {"indices.shape", [&](auto& a, auto&, auto&) { a.indices = idx_bad_shape; }},
      {"indices.dtype", [&](auto& a, auto&, auto&) { a.indices = idx_i64; }},
      {"indices[0][0][0]", [&](auto&, auto&, auto&) { set_index(p.main->indices, 0, int32_t(main_slots)); }},
      {"indices[0][0][1]", [&](auto&, auto&, auto&) { set_index(p.main->indices, 1, -2); }},
      {"extra_indices[0][0][2]", [&](auto&, auto&, auto&) { set_index(p.extra->indices, 2, int32_t(extra_slots)); }},
      {"topk_length[0]", [&](auto&, auto&, auto&) { set_index(p.main->lengths, 0, -1); }},
      {"topk_length[1]", [&](auto&, auto&, auto&) { set_index(p.main->lengths, 1, 65); }},
      {"extra_topk_length[0]", [&](auto&, auto&, auto&) { set_index(p.extra->lengths, 0, -3); }},
      {"attn_sink.shape", [&](auto& a, auto&, auto&) { a.attn_sink = sink_bad; }},
      {"out.shape", [&](auto& a, auto&, auto&) { a.out = out_bad; }},
      {"out.dtype", [&](auto& a, auto&, auto&) { a.out = out_fp32; }},
      {"lse.shape", [&](auto& a, auto&, auto&) { a.lse = lse_bad; }},
      {"lse.device", [&](auto& a, auto&, auto&) { a.lse.device = dsv4::Device::cuda; }},
      {"d_v", [&](auto& a, auto&, auto&) { a.d_v = 600; }},
      {"softmax_scale", [&](auto& a, auto&, auto&) { a.softmax_scale = NAN; }},
      // scale · log2(e) subnormal (the CUDA prefill's masked −inf · scale would be NaN under FTZ).
      {"softmax_scale", [&](auto& a, auto&, auto&) { a.softmax_scale = -4e-39f; }},
      {"extra_k_cache.layout", [&](auto& a, auto&, auto&) { a.extra_k_cache = v32_cache.view(); }},
      {"extra_indices", [&](auto& a, auto&, auto&) { a.extra_k_cache = dsv4::KvCacheView{}; }},
      {"k_cache", [&](auto& a, auto&, auto&) { a.k_cache.data = bad_cache; }},
      {"schedule.split_len", [&](auto&, auto& s, auto&) { s.split_len = 32; }},
      {"schedule (num_splits * split_len)", [&](auto&, auto& s, auto&) { s.num_splits = 1; s.split_len = 64; }},
      {"workspace bytes", [&](auto&, auto&, auto& ws) { ws = small_ws; }},
      // Outputs: no two elements at one address, non-negative strides, no aliasing.
      {"out: expected an output whose elements do not overlap", [&](auto& a, auto&, auto&) { a.out.strides[0] = 0; }},
      {"out.stride(2)", [&](auto& a, auto&, auto&) { a.out.strides[2] = -512; }},
      {"out: expected memory disjoint from q", [&](auto& a, auto&, auto&) { a.out = a.q; }},
      {"lse: expected memory disjoint from out",
       [&](auto& a, auto&, auto&) { a.lse = TensorView(a.out.data, DType::fp32, {c.b, c.s_q, c.h}); }},
      {"workspace: expected memory disjoint from out",
       [&](auto& a, auto&, auto& ws) { a.out = TensorView(ws.data, DType::bf16, {c.b, c.s_q, c.h, 512}); }},
      {"out: expected memory disjoint from k_cache.data",
       [&](auto& a, auto&, auto&) { a.out = TensorView(a.k_cache.data.data, DType::bf16, {c.b, c.s_q, c.h, 512}); }},
  };
  for (const BadDecode& bad : cases) {
    SCOPED_TRACE(bad.what);
    DecodeProblem fresh(c);  // identical inputs (same seed), fresh copies to mutate
    p.main->indices = fresh.main->indices;
    p.main->lengths = fresh.main->lengths;
    p.extra->indices = fresh.extra->indices;
    p.extra->lengths = fresh.extra->lengths;
    p.out.fill_bytes(0xA5);
    p.lse.fill_bytes(0xA5);
    dsv4::DecodeSchedule s = dsv4::make_decode_schedule(c.b, c.s_q, c.h, 128, 132, 512);
    HostTensor ws(DType::uint8, {s.workspace_bytes});
    ws.fill_bytes(0xA5);
    TensorView wsv = ws;
    dsv4::SparseDecodeArgs a = p.args();
    bad.mutate(a, s, wsv);
    dsv4::test::expect_error([&] { dsv4::sparse_decode(a, s, wsv); }, {bad.what, "sparse_decode"});
    for (const HostTensor* t : {&p.out, &p.lse, &ws})
      for (size_t i = 0; i < t->nbytes(); ++i) ASSERT_EQ(t->data<uint8_t>()[i], 0xA5) << i;
  }
}

TEST(SparseDecode, CudaTensorsReachTheCudaKernelOrNameTheMissingBackend) {
  DecodeProblem p(small_case());
  dsv4::SparseDecodeArgs a = p.args();
  for (TensorView* t : {&a.q, &a.k_cache.data, &a.indices, &a.extra_k_cache.data, &a.extra_indices,
                        &a.attn_sink, &a.out, &a.lse})
    t->device = dsv4::Device::cuda;
  const auto s = dsv4::make_decode_schedule(2, 1, 16, 128);
  HostTensor ws(DType::uint8, {s.workspace_bytes});
  TensorView wsv = ws;
  wsv.device = dsv4::Device::cuda;
  for (HostTensor* t : {&p.out, &p.lse, &ws}) t->fill_bytes(0xA5);
  dsv4::test::expect_cuda_dispatch("sparse_decode", dsv4::ops::kSparseDecode,
                                    [&] { dsv4::sparse_decode(a, s, wsv); });
  for (const HostTensor* t : {&p.out, &p.lse, &ws})
    for (size_t i = 0; i < t->nbytes(); ++i) ASSERT_EQ(t->data<uint8_t>()[i], 0xA5) << i;
}

}  // namespace
