// Entry selection (docs/spec.md §5): indexer_query, indexer_scores, indexer_topk and
// compressed_prefix_indices against independent float64 / std::stable_sort references; causal
// masking at every position; bad input leaves outputs unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "compressor_test_support.h"
#include "dsv4/compressor.h"
#include "dsv4/indexer.h"
#include "dsv4/ops.h"

namespace dsv4 {
namespace {

using test::Rng;

// The RoPE of compressed layers (docs/spec.md §3): theta 160000 with YaRN (factor 16 over 65536).
const RopeConfig kRope = dense_test::yarn_rope(64);
constexpr int kDim = 128;  // indexer head dim
constexpr float kInf = std::numeric_limits<float>::infinity();

using dense_test::bytes_of;
bool same_bytes(const HostTensor& t, const std::vector<uint8_t>& b) {
  return b.size() == t.nbytes() && std::memcmp(b.data(), t.data<uint8_t>(), b.size()) == 0;
}

// ================================ queries ====================================================

class IndexerQuery : public ::testing::TestWithParam<int> {};  // param: H_I

TEST_P(IndexerQuery, MatchesFloat64RopeHadamardFp8) {
  const int64_t H = GetParam(), T = 5, q_lora = 32, hidden = 48;
  Rng rng(40 + H);
  HostTensor qr(DType::fp32, {T, q_lora}), wq_b(DType::fp32, {H * kDim, q_lora}),
      x(DType::fp32, {T, hidden}), wp(DType::fp32, {H, hidden}), pos(DType::int64, {T}),
      q_fp8(DType::fp8_e4m3, {T, H, kDim}), q_scale(DType::fp32, {T, H}), w(DType::fp32, {T, H});
  for (HostTensor* t : {&qr, &wq_b, &x, &wp})
    for (int64_t i = 0; i < t->numel(); ++i)
      t->data<float>()[i] = static_cast<float>(rng.nonzero());
  for (int64_t t = 0; t < T; ++t) pos.data<int64_t>()[t] = rng.integer(0, 255);
  q_fp8.fill_bytes(0x7F);  // fp8 NaN
  q_scale.fill_bytes(0xFF);
  w.fill_bytes(0xFF);
  const HostTensor cos_sin = build_rope_cache(kRope, 256);
  indexer_query(qr, {}, wq_b, {}, x, wp, pos, cos_sin, q_fp8, q_scale, w, {});

  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> q(kDim, 0.0);
      for (int d = 0; d < kDim; ++d)
        for (int64_t k = 0; k < q_lora; ++k)
          q[d] += double{qr.data<float>()[t * q_lora + k]} *
                  wq_b.data<float>()[(h * kDim + d) * q_lora + k];
      test::rope_f64(q.data(), kDim, kRope, pos.data<int64_t>()[t]);
      q = test::hadamard_f64(q);
      double amax = 0.0;
      for (double v : q) amax = std::max(amax, std::fabs(v));
      const double scale = q_scale.data<float>()[t * H + h];
      EXPECT_EQ(scale, test::ue8m0_scale_f64(amax)) << "t " << t << " h " << h;
      // fp8 e4m3 keeps 3 mantissa bits; a value within fp32 noise of a rounding midpoint may go
      // either way, so allow one full step (2^-3 relative, 2^-9 · scale for subnormals).
      for (int d = 0; d < kDim; ++d) {
        const double got = fp8_e4m3_to_float(q_fp8.data<uint8_t>()[(t * H + h) * kDim + d]) * scale;
        ASSERT_NEAR(got, q[d], std::ldexp(std::fabs(q[d]), -3) + std::ldexp(scale, -9))
            << "t " << t << " h " << h << " d " << d;
      }
      double wr = 0.0;
      for (int64_t k = 0; k < hidden; ++k)
        wr += double{x.data<float>()[t * hidden + k]} * wp.data<float>()[h * hidden + k];
      wr /= std::sqrt(128.0 * static_cast<double>(H));  // 128^-0.5 · H^-0.5
      EXPECT_NEAR(w.data<float>()[t * H + h], wr, 1e-5 * (1.0 + std::fabs(wr)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, IndexerQuery, ::testing::Values(4, 64));

TEST(IndexerQueryErrors, BadInputWritesNothing) {
  const int64_t H = 2, T = 3;
  HostTensor qr(DType::fp32, {T, 16}), wq_b(DType::fp32, {H * kDim, 16}), x(DType::fp32, {T, 8}),
      wp(DType::fp32, {H, 8}), wp_bad(DType::fp32, {H + 1, 8}), pos(DType::int32, {T}),
      q_fp8(DType::fp8_e4m3, {T, H, kDim}), q_scale(DType::fp32, {T, H}), w(DType::fp32, {T, H});
  for (HostTensor* t : {&qr, &wq_b, &x, &wp, &wp_bad}) t->fill_bytes(0x3C);
  for (HostTensor* t : {&q_fp8, &q_scale, &w}) t->fill_bytes(0xEE);
  for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[t] = static_cast<int32_t>(t);
  const HostTensor cos_sin = build_rope_cache(kRope, 4);
  const auto q0 = bytes_of(q_fp8), s0 = bytes_of(q_scale), w0 = bytes_of(w);
  dense_test::expect_error(
      [&] { indexer_query(qr, {}, wq_b, {}, x, wp_bad, pos, cos_sin, q_fp8, q_scale, w, {}); },
      {"weights_proj"});
  HostTensor wq_odd(DType::fp32, {H * kDim + 1, 16});
  dense_test::expect_error(
      [&] { indexer_query(qr, {}, wq_odd, {}, x, wp, pos, cos_sin, q_fp8, q_scale, w, {}); },
      {"wq_b.shape[0]"});
  HostTensor q_bad(DType::bf16, {T, H, kDim});
  dense_test::expect_error(
      [&] { indexer_query(qr, {}, wq_b, {}, x, wp, pos, cos_sin, q_bad, q_scale, w, {}); },
      {"q_fp8.dtype"});
  TensorView q_fp8_rows_at_one_address = q_fp8;
  q_fp8_rows_at_one_address.strides[0] = 0;
  dense_test::expect_error(
      [&] {
        indexer_query(qr, {}, wq_b, {}, x, wp, pos, cos_sin, q_fp8_rows_at_one_address, q_scale, w, {});
      },
      {"q_fp8: expected an output whose elements do not overlap"});
  dense_test::expect_error(
      [&] { indexer_query(qr, {}, wq_b, {}, x, wp, pos, cos_sin, q_fp8, w, w, {}); },
      {"weights: expected memory disjoint from q_scale"});
  dense_test::expect_error(
      [&] {
        indexer_query(qr, {}, wq_b, {}, x, wp, pos, cos_sin, q_fp8, q_scale,
                      TensorView(x.data<float>(), DType::fp32, {T, H}), {});
      },
      {"weights: expected memory disjoint from x"});
  pos.data<int32_t>()[2] = 4;  // beyond the 4-row cos/sin table
  dense_test::expect_error(
      [&] { indexer_query(qr, {}, wq_b, {}, x, wp, pos, cos_sin, q_fp8, q_scale, w, {}); },
      {"positions[2]"});
  EXPECT_TRUE(same_bytes(q_fp8, q0) && same_bytes(q_scale, s0) && same_bytes(w, w0));
}

// The workspace is for the CUDA projection: the CPU ignores it (defined or not) and rejects one
// on another device like any other argument.
TEST(IndexerQueryWorkspace, IgnoredOnCpuAndSized) {
  const int64_t H = 2, T = 3;
  Rng rng(44);
  HostTensor qr(DType::fp32, {T, 16}), wq_b(DType::fp32, {H * kDim, 16}), x(DType::fp32, {T, 8}),
      wp(DType::fp32, {H, 8}), pos(DType::int32, {T});
  for (HostTensor* t : {&qr, &wq_b, &x, &wp})
    for (int64_t i = 0; i < t->numel(); ++i)
      t->data<float>()[i] = static_cast<float>(rng.nonzero());
  for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[t] = static_cast<int32_t>(3 * t);
  const HostTensor cos_sin = build_rope_cache(kRope, 8);
  auto run = [&](const TensorView& workspace) {
    std::vector<HostTensor> out;
    out.emplace_back(DType::fp8_e4m3, std::vector<int64_t>{T, H, kDim});
    out.emplace_back(DType::fp32, std::vector<int64_t>{T, H});
    out.emplace_back(DType::fp32, std::vector<int64_t>{T, H});
    for (HostTensor& o : out) o.fill_bytes(0xEE);
    indexer_query(qr, {}, wq_b, {}, x, wp, pos, cos_sin, out[0], out[1], out[2], workspace);
    return out;
  };
  const auto without = run({});
  HostTensor ws(DType::uint8, {indexer_query_workspace_bytes(T, H)});
  ws.fill_bytes(0x5A);
  const auto with = run(ws);
  for (size_t i = 0; i < without.size(); ++i) EXPECT_TRUE(same_bytes(with[i], bytes_of(without[i])));
  EXPECT_TRUE(same_bytes(ws, std::vector<uint8_t>(ws.nbytes(), 0x5A)));  // untouched

  // A CUDA workspace with CPU tensors: mixed devices (checked before anything runs).
  TensorView cuda_ws = ws;
  cuda_ws.device = Device::cuda;
  HostTensor q_fp8(DType::fp8_e4m3, {T, H, kDim}), q_scale(DType::fp32, {T, H}), w(DType::fp32, {T, H});
  for (HostTensor* t : {&q_fp8, &q_scale, &w}) t->fill_bytes(0xEE);
  const auto q0 = bytes_of(q_fp8), s0 = bytes_of(q_scale), w0 = bytes_of(w);
  dense_test::expect_error(
      [&] { indexer_query(qr, {}, wq_b, {}, x, wp, pos, cos_sin, q_fp8, q_scale, w, cuda_ws); },
      {"workspace.device"});
  EXPECT_TRUE(same_bytes(q_fp8, q0) && same_bytes(q_scale, s0) && same_bytes(w, w0));

  EXPECT_EQ(indexer_query_workspace_bytes(5, 64), 5 * 64 * 128 * 4);
  EXPECT_EQ(indexer_query_workspace_bytes(7, 3, 64), 7 * 3 * 64 * 4);
  EXPECT_EQ(indexer_query_workspace_bytes(0, 64), 0);
  dense_test::expect_error([] { indexer_query_workspace_bytes(-1, 64); }, {"T"});
}

// Every indexer op rejects tensors on two devices before reading or writing anything.
TEST(IndexerOpsErrors, MixedDevicesRejected) {
  HostTensor scores(DType::fp32, {2, 4}), pos(DType::int64, {2}), idx(DType::int32, {2, 3});
  scores.fill_bytes(0);
  pos.fill_bytes(0);
  idx.fill_bytes(0x11);
  const auto before = bytes_of(idx);
  TensorView cuda_pos = pos;
  cuda_pos.device = Device::cuda;  // never dereferenced: the device check comes first
  dense_test::expect_error([&] { indexer_topk(scores, cuda_pos, 4, idx); }, {"positions.device"});
  dense_test::expect_error([&] { compressed_prefix_indices(cuda_pos, 4, idx); }, {"indices.device"});
  EXPECT_TRUE(same_bytes(idx, before));
}

// ================================ scores =====================================================

// A batch of tokens over R requests with quantized queries and a paged key cache of random fp8
// keys (shuffled blocks), plus the float64 score of every (token, entry).
struct ScoreRig {
  int64_t T, H, N;
  int ratio = 4, block = 4;
  HostTensor q_fp8, q_scale, w, pos, req, keys, table, scores;
  std::vector<int64_t> n_keys;

  ScoreRig(const std::vector<std::vector<int64_t>>& positions_per_req, int64_t heads,
           int64_t extra_cols, uint64_t seed)
      : H(heads) {
    Rng rng(seed);
    const int64_t R = static_cast<int64_t>(positions_per_req.size());
    T = 0;
    int64_t max_visible = 0;
    for (const auto& ps : positions_per_req) {
      T += static_cast<int64_t>(ps.size());
      int64_t mv = 0;
      for (int64_t p : ps) mv = std::max(mv, (p + 1) / ratio);
      n_keys.push_back(mv);
      max_visible = std::max(max_visible, mv);
    }
    N = max_visible + extra_cols;
    q_fp8 = HostTensor(DType::fp8_e4m3, {T, H, kDim});
    q_scale = HostTensor(DType::fp32, {T, H});
    w = HostTensor(DType::fp32, {T, H});
    pos = HostTensor(DType::int64, {T});
    req = HostTensor(DType::int32, {T});
    int64_t t = 0;
    for (int64_t q = 0; q < R; ++q)
      for (int64_t p : positions_per_req[q]) {
        pos.data<int64_t>()[t] = p;
        req.data<int32_t>()[t] = static_cast<int32_t>(q);
        ++t;
      }
    for (int64_t i = 0; i < T * H * kDim; ++i)
      q_fp8.data<uint8_t>()[i] = float_to_fp8_e4m3(static_cast<float>(rng.nonzero(0.05, 2.0)));
    for (int64_t i = 0; i < T * H; ++i) {
      q_scale.data<float>()[i] = static_cast<float>(std::exp2(rng.integer(-3, 3)));
      w.data<float>()[i] = static_cast<float>(rng.nonzero(0.1, 1.0));
    }
    const int64_t blocks_per_req = std::max<int64_t>(1, (max_visible + block - 1) / block);
    const int64_t num_blocks = R * blocks_per_req + 1;
    keys = HostTensor(DType::uint8, {num_blocks, int64_t{block} * indexer_keys::kEntryBytes});
    for (int64_t b = 0; b < num_blocks; ++b) {
      uint8_t* base = keys.data<uint8_t>() + b * keys.shape()[1];
      for (int i = 0; i < block * kDim; ++i)
        base[i] = float_to_fp8_e4m3(static_cast<float>(rng.nonzero(0.05, 2.0)));
      for (int i = 0; i < block; ++i) {
        const float s = static_cast<float>(std::exp2(rng.integer(-3, 3)));
        std::memcpy(base + block * kDim + i * 4, &s, 4);
      }
    }
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng.gen);
    table = HostTensor(DType::int32, {R, blocks_per_req});
    std::copy_n(ids.begin(), R * blocks_per_req, table.data<int32_t>());
    scores = HostTensor(DType::fp32, {T, N});
    scores.fill_bytes(0xFF);  // NaN: unwritten columns show
  }

  IndexerKeyCacheView key_view() const { return {keys, block}; }
  void run() { indexer_scores(q_fp8, q_scale, w, pos, req, key_view(), table, ratio, scores); }

  // float64 score of token t against entry j, and the sum of |terms| (for the tolerance).
  std::pair<double, double> reference(int64_t t, int64_t j) const {
    const int64_t q = req.data<int32_t>()[t];
    const int64_t b = table.data<int32_t>()[q * table.shape()[1] + j / block];
    const uint8_t* base = keys.data<uint8_t>() + b * keys.shape()[1];
    const int64_t off = j % block;
    float ks;
    std::memcpy(&ks, base + block * kDim + off * 4, 4);
    double score = 0.0, mag = 0.0;
    for (int64_t h = 0; h < H; ++h) {
      double dot = 0.0, dot_abs = 0.0;
      for (int d = 0; d < kDim; ++d) {
        const double prod =
            double{fp8_e4m3_to_float(q_fp8.data<uint8_t>()[(t * H + h) * kDim + d])} *
            fp8_e4m3_to_float(base[off * kDim + d]);
        dot += prod;
        dot_abs += std::fabs(prod);
      }
      const double s = double{q_scale.data<float>()[t * H + h]} * ks;
      score += w.data<float>()[t * H + h] * std::max(0.0, dot * s);
      mag += std::fabs(w.data<float>()[t * H + h]) * dot_abs * s;
    }
    return {score, mag};
  }
};

TEST(IndexerScores, MatchesFloat64AndMasksFutureEntries) {
  // Three requests: a decode far into its sequence, a prefill chunk, and a prompt shorter than
  // one window (nothing visible).
  ScoreRig rig({{57}, {20, 21, 22, 23, 24, 25, 26, 27}, {0, 1, 2}}, 8, 3, 5);
  rig.run();
  for (int64_t t = 0; t < rig.T; ++t) {
    const int64_t visible = (rig.pos.data<int64_t>()[t] + 1) / 4;
    for (int64_t j = 0; j < rig.N; ++j) {
      const float got = rig.scores.data<float>()[t * rig.N + j];
      if (j >= visible) {
        EXPECT_EQ(got, -kInf) << "t " << t << " j " << j;
        continue;
      }
      // fp32 accumulation of 128 exact products and 8 heads: relative error ~(128 + 8) · 2^-24
      // of the sum of magnitudes; 1e-5 of it is a safe bound.
      const auto [ref, mag] = rig.reference(t, j);
      ASSERT_NEAR(got, ref, 1e-5 * mag + 1e-30) << "t " << t << " j " << j;
    }
  }
}

TEST(IndexerScores, CausalMaskAtEveryPositionOfAPrefill) {
  std::vector<int64_t> ps(44);
  std::iota(ps.begin(), ps.end(), 0);
  ScoreRig rig({ps}, 2, 0, 6);
  rig.run();
  for (int64_t t = 0; t < rig.T; ++t)
    for (int64_t j = 0; j < rig.N; ++j) {
      const float got = rig.scores.data<float>()[t * rig.N + j];
      if (j < (t + 1) / 4)
        EXPECT_TRUE(std::isfinite(got)) << "t " << t << " j " << j;
      else
        EXPECT_EQ(got, -kInf) << "t " << t << " j " << j;
    }
}

TEST(IndexerScores, BadInputWritesNothing) {
  ScoreRig rig({{30, 31}, {9}}, 2, 0, 7);
  const auto before = bytes_of(rig.scores);
  // An unmapped block that a visible entry needs.
  HostTensor table = rig.table;
  HostTensor holes(DType::int32, {table.shape()[0], table.shape()[1]});
  std::copy_n(table.data<int32_t>(), table.numel(), holes.data<int32_t>());
  holes.data<int32_t>()[1] = -1;  // request 0, entries 4..7
  dense_test::expect_error(
      [&] {
        indexer_scores(rig.q_fp8, rig.q_scale, rig.w, rig.pos, rig.req, rig.key_view(), holes, 4,
                       rig.scores);
      },
      {"key_block_table"});
  HostTensor narrow(DType::fp32, {rig.T, rig.N - 1});
  dense_test::expect_error(
      [&] {
        indexer_scores(rig.q_fp8, rig.q_scale, rig.w, rig.pos, rig.req, rig.key_view(), rig.table,
                       4, narrow);
      },
      {"scores.shape[1]"});
  rig.req.data<int32_t>()[2] = 2;
  dense_test::expect_error([&] { rig.run(); }, {"token_to_req[2]"});
  rig.req.data<int32_t>()[2] = 1;
  dense_test::expect_error(
      [&] {
        indexer_scores(rig.q_fp8, rig.q_scale, rig.w, rig.pos, rig.req, rig.key_view(), rig.table,
                       0, rig.scores);
      },
      {"ratio"});
  HostTensor w_bad(DType::fp32, {rig.T, rig.H + 1});
  dense_test::expect_error(
      [&] {
        indexer_scores(rig.q_fp8, rig.q_scale, w_bad, rig.pos, rig.req, rig.key_view(), rig.table,
                       4, rig.scores);
      },
      {"weights"});
  IndexerKeyCacheView bad_keys = rig.key_view();
  bad_keys.block_size = 8;  // rows are 4 entries long
  dense_test::expect_error(
      [&] {
        indexer_scores(rig.q_fp8, rig.q_scale, rig.w, rig.pos, rig.req, bad_keys, rig.table, 4,
                       rig.scores);
      },
      {"keys.data"});
  TensorView scores_rows_at_one_address = rig.scores;
  scores_rows_at_one_address.strides[0] = 0;
  dense_test::expect_error(
      [&] {
        indexer_scores(rig.q_fp8, rig.q_scale, rig.w, rig.pos, rig.req, rig.key_view(), rig.table,
                       4, scores_rows_at_one_address);
      },
      {"scores: expected an output whose elements do not overlap"});
  dense_test::expect_error(
      [&] {
        indexer_scores(rig.q_fp8, rig.q_scale, rig.w, rig.pos, rig.req, rig.key_view(), rig.table,
                       4, TensorView(rig.w.data<float>(), DType::fp32, {rig.T, rig.N}));
      },
      {"scores: expected memory disjoint from"});
  EXPECT_TRUE(same_bytes(rig.scores, before));
}

// ================================ top-k ======================================================

// Expected top-k of one row, independently: stable sort of 0..visible−1 by descending score with
// NaN last (stable → ties keep the lowest index first).
std::vector<int32_t> expected_topk(const float* s, int64_t visible, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(visible));
  std::iota(idx.begin(), idx.end(), 0);
  auto rank = [&](int32_t i) {
    return std::isnan(s[i]) ? -std::numeric_limits<double>::infinity() : double{s[i]};
  };
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    const bool na = std::isnan(s[a]), nb = std::isnan(s[b]);
    if (na != nb) return nb;  // numbers before NaN
    return rank(a) > rank(b);
  });
  idx.resize(static_cast<size_t>(std::min(k, visible)));
  idx.resize(static_cast<size_t>(k), -1);
  return idx;
}

class IndexerTopk : public ::testing::TestWithParam<int64_t> {};  // param: K

TEST_P(IndexerTopk, MatchesStableSortWithTiesAndCausality) {
  const int64_t K = GetParam(), T = 40, N = 50;
  Rng rng(70 + K);
  HostTensor scores(DType::fp32, {T, N}), pos(DType::int32, {T}), idx(DType::int32, {T, K}),
      lens(DType::int32, {T});
  for (int64_t t = 0; t < T; ++t) {
    pos.data<int32_t>()[t] = static_cast<int32_t>(rng.integer(0, 4 * N - 1));
    const int64_t visible = (pos.data<int32_t>()[t] + 1) / 4;
    for (int64_t j = 0; j < N; ++j) {
      float v = static_cast<float>(rng.integer(-3, 3)) * 0.5f;  // few levels: many ties
      if (rng.integer(0, 30) == 0) v = std::numeric_limits<float>::quiet_NaN();
      if (rng.integer(0, 30) == 0) v = -kInf;
      // Future entries hold the largest values: they must still never be picked.
      scores.data<float>()[t * N + j] = j < visible ? v : 1e30f;
    }
  }
  idx.fill_bytes(0x7F);
  lens.fill_bytes(0x7F);
  indexer_topk(scores, pos, 4, idx, lens);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t visible = (pos.data<int32_t>()[t] + 1) / 4;
    const auto want = expected_topk(scores.data<float>() + t * N, visible, K);
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(idx.data<int32_t>()[t * K + k], want[k])
          << "t " << t << " k " << k << " visible " << visible;
    EXPECT_EQ(lens.data<int32_t>()[t], std::min(K, visible));
  }
}

// Expected TopkOrder::column output of one row, by a different route than expected_topk: column j
// is selected iff fewer than min(k, visible) columns rank ahead of it (a higher score, NaN below
// every number, or an equal score — NaN equal to NaN, −0 to +0 — at a lower column); the selected
// columns are then listed in ascending order, then −1.
std::vector<int32_t> expected_topk_by_column(const float* s, int64_t visible, int64_t k) {
  auto ahead = [s](int64_t i, int64_t j) {  // does column i rank ahead of column j?
    const bool ni = std::isnan(s[i]), nj = std::isnan(s[j]);
    if (ni != nj) return nj;
    const bool equal = ni || double{s[i]} == double{s[j]};
    return equal ? i < j : double{s[i]} > double{s[j]};
  };
  const int64_t count = std::min(k, visible);
  std::vector<int32_t> idx;
  for (int64_t j = 0; j < visible; ++j) {
    int64_t rank = 0;
    for (int64_t i = 0; i < visible; ++i) rank += ahead(i, j) ? 1 : 0;
    if (rank < count) idx.push_back(static_cast<int32_t>(j));
  }
  idx.resize(static_cast<size_t>(k), -1);
  return idx;
}

// TopkOrder::column: the selection of TopkOrder::score (same set, same lens), listed by ascending
// column. Rows of every kind — few levels (ties) with NaN, ±inf and ±0; distinct values; all
// equal; all NaN — and visible counts 0, N (the most the CPU accepts: it rejects visible > N),
// around K and random, so count == visible and count < visible both occur (and K > visible for
// K 64 > N). Future columns hold the largest values: they must never be picked.
TEST_P(IndexerTopk, ColumnOrderIsTheScoreOrderSetByColumn) {
  const int64_t K = GetParam(), T = 48, N = 50;
  Rng rng(170 + K);
  HostTensor scores(DType::fp32, {T, N}), pos(DType::int64, {T});
  for (int64_t t = 0; t < T; ++t) {
    int64_t p;
    switch (t % 6) {
      case 0: p = rng.integer(0, 2); break;                    // nothing visible
      case 1: p = 4 * N - 1; break;                            // visible == N
      case 2: p = std::max<int64_t>(0, 4 * std::min(N, K) - 1 - rng.integer(0, 6)); break;  // ~K
      default: p = rng.integer(0, 4 * N - 1); break;
    }
    pos.data<int64_t>()[t] = p;
    const int64_t visible = (p + 1) / 4;
    for (int64_t j = 0; j < N; ++j) {
      float v;
      switch ((t / 6) % 4) {
        case 0:
          v = static_cast<float>(rng.integer(-3, 3)) * 0.5f;
          switch (rng.integer(0, 20)) {
            case 0: v = std::numeric_limits<float>::quiet_NaN(); break;
            case 1: v = -std::numeric_limits<float>::quiet_NaN(); break;
            case 2: v = -kInf; break;
            case 3: v = kInf; break;
            case 4: v = -0.0f; break;
            default: break;
          }
          break;
        case 1: v = static_cast<float>(rng.nonzero(1e-3, 1e3)); break;
        case 2: v = 0.25f; break;
        default: v = std::numeric_limits<float>::quiet_NaN(); break;
      }
      scores.data<float>()[t * N + j] = j < visible ? v : 1e30f;
    }
  }
  HostTensor by_score(DType::int32, {T, K}), by_column(DType::int32, {T, K}),
      lens_score(DType::int32, {T}), lens_column(DType::int32, {T});
  for (HostTensor* h : {&by_score, &by_column, &lens_score, &lens_column}) h->fill_bytes(0x7F);
  indexer_topk(scores, pos, 4, by_score, lens_score);  // the default: TopkOrder::score
  indexer_topk(scores, pos, 4, by_column, lens_column, nullptr, TopkOrder::column);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t visible = (pos.data<int64_t>()[t] + 1) / 4, count = std::min(K, visible);
    const float* row = scores.data<float>() + t * N;
    const auto want = expected_topk_by_column(row, visible, K);
    const auto want_by_score = expected_topk(row, visible, K);
    const int32_t* got = by_column.data<int32_t>() + t * K;
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(got[k], want[k]) << "t " << t << " k " << k << " visible " << visible;
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(by_score.data<int32_t>()[t * K + k], want_by_score[k]) << "t " << t << " k " << k;
    // The same set either way: the score order's selection, sorted, is the column order's.
    std::vector<int32_t> score_set(by_score.data<int32_t>() + t * K,
                                   by_score.data<int32_t>() + t * K + count);
    std::sort(score_set.begin(), score_set.end());
    EXPECT_TRUE(std::equal(score_set.begin(), score_set.end(), got)) << "t " << t;
    EXPECT_EQ(lens_column.data<int32_t>()[t], count) << "t " << t;
    EXPECT_EQ(lens_score.data<int32_t>()[t], count) << "t " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(K, IndexerTopk, ::testing::Values(1, 8, 64));

TEST(IndexerTopkErrors, BadInputWritesNothing) {
  HostTensor scores(DType::fp32, {2, 4}), pos(DType::int64, {2}), idx(DType::int32, {2, 3});
  scores.fill_bytes(0);
  pos.data<int64_t>()[0] = 3;
  pos.data<int64_t>()[1] = 19;  // 5 entries visible, only 4 columns of scores
  idx.fill_bytes(0x11);
  const auto before = bytes_of(idx);
  dense_test::expect_error([&] { indexer_topk(scores, pos, 4, idx); }, {"scores.shape[1]"});
  pos.data<int64_t>()[1] = -1;
  dense_test::expect_error([&] { indexer_topk(scores, pos, 4, idx); }, {"positions[1]"});
  pos.data<int64_t>()[1] = 2;
  HostTensor idx64(DType::int64, {2, 3});
  dense_test::expect_error([&] { indexer_topk(scores, pos, 4, idx64); }, {"indices.dtype"});
  HostTensor lens_bad(DType::int32, {3});
  dense_test::expect_error([&] { indexer_topk(scores, pos, 4, idx, lens_bad); }, {"lens"});
  dense_test::expect_error(
      [&] { indexer_topk(scores, pos, 4, idx, TensorView(idx.data<int32_t>(), DType::int32, {2})); },
      {"lens: expected memory disjoint from indices"});
  TensorView idx_rows_overlap = idx;
  idx_rows_overlap.strides[0] = 2;  // rows of 3 entries, 2 apart
  dense_test::expect_error([&] { indexer_topk(scores, pos, 4, idx_rows_overlap); },
                           {"indices: expected an output whose elements do not overlap"});
  dense_test::expect_error(
      [&] { indexer_topk(scores, pos, 4, TensorView(scores.data<float>(), DType::int32, {2, 3})); },
      {"indices: expected memory disjoint from scores"});
  dense_test::expect_error([&] { indexer_topk(scores, pos, 0, idx); }, {"ratio"});
  dense_test::expect_error(
      [&] { indexer_topk(scores, pos, 4, idx, {}, nullptr, static_cast<TopkOrder>(7)); },
      {"indexer_topk: order"});
  // The last position at ratio 1 sees INT64_MAX + 1 entries: refused like any count past the
  // scores (found by the fuzzer as a signed overflow in visible_entries).
  pos.data<int64_t>()[1] = INT64_MAX;
  dense_test::expect_error([&] { indexer_topk(scores, pos, 1, idx); }, {"scores.shape[1]"});
  EXPECT_TRUE(same_bytes(idx, before));
}

// ================================ C128A plan =================================================

// lens may be any non-overlapping strided view (both backends write lens[t * stride(0)]).
TEST(CompressedPrefixIndices, StridedLensWritesOnlyItsElements) {
  const int64_t T = 5, K = 2;
  HostTensor pos(DType::int64, {T}), idx(DType::int32, {T, K}), lens_buf(DType::int32, {T, 2});
  std::iota(pos.data<int64_t>(), pos.data<int64_t>() + T, 126);  // 126..130: 0 or 1 entries
  lens_buf.fill_bytes(0x7F);
  TensorView lens = lens_buf;  // column 0 of [T, 2]: shape [T], stride 2
  lens.ndim = 1;
  lens.shape[0] = T;
  lens.strides[0] = 2;
  compressed_prefix_indices(pos, 128, idx, lens);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(lens_buf.data<int32_t>()[2 * t], t == 0 ? 0 : 1) << t;
    EXPECT_EQ(lens_buf.data<int32_t>()[2 * t + 1], 0x7F7F7F7F) << t;  // untouched
  }
  TensorView lens_overlap = lens;
  lens_overlap.strides[0] = 0;
  dense_test::expect_error([&] { compressed_prefix_indices(pos, 128, idx, lens_overlap); },
                           {"lens: expected an output whose elements do not overlap"});
}

TEST(CompressedPrefixIndices, EveryEmittedEntryInOrderThenPadding) {
  const int64_t T = 301, K = 3;
  HostTensor pos(DType::int64, {T}), idx(DType::int32, {T, K}), lens(DType::int32, {T});
  std::iota(pos.data<int64_t>(), pos.data<int64_t>() + T, 0);
  idx.fill_bytes(0x7F);
  compressed_prefix_indices(pos, 128, idx, lens);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t count = t < 127 ? 0 : (t < 255 ? 1 : 2);  // entry j is complete at (j+1)·128 − 1
    for (int64_t k = 0; k < K; ++k)
      EXPECT_EQ(idx.data<int32_t>()[t * K + k], k < count ? k : -1) << t;
    EXPECT_EQ(lens.data<int32_t>()[t], count);
  }
  const auto before = bytes_of(idx);
  HostTensor narrow(DType::int32, {T, 1});
  dense_test::expect_error([&] { compressed_prefix_indices(pos, 128, narrow); },
                           {"indices.shape[1]"});
  dense_test::expect_error([&] { compressed_prefix_indices(pos, 0, idx); }, {"ratio"});
  dense_test::expect_error(
      [&] {
        compressed_prefix_indices(pos, 128, TensorView(pos.data<int64_t>(), DType::int32, {T, K}));
      },
      {"indices: expected memory disjoint from positions"});
  EXPECT_TRUE(same_bytes(idx, before));
}

// ================================ the whole C4A selection ====================================

// The indexer's compressor writes keys, indexer_query prepares queries, indexer_scores and
// indexer_topk select: the selection must agree with a float64 selection on unquantized
// operands (the keys before FP8 and queries computed in float64). FP8 moves each score by ~1%,
// which can only swap near-ties: recall is 0.99 here. Dropping the query-side rotation gives
// 0.54, a conjugate RoPE 0.70, so 0.95 separates a faithful pipeline from a broken one.
TEST(IndexerPipeline, TopkRecallAgainstFloat64Selection) {
  const int64_t H = 4, hidden = 64, q_lora = 32, n = 96, K = 6, entries_n = n / 4;
  Rng rng(2024);
  CompressorConfig cfg;
  cfg.head_dim = kDim;
  cfg.target = CompressorTarget::indexer_keys;
  const int64_t W = cfg.proj_width();
  auto random = [&](DType t, std::vector<int64_t> shape, double lo, double hi) {
    HostTensor h(t, std::move(shape));
    for (int64_t i = 0; i < h.numel(); ++i) h.set(i, static_cast<float>(rng.nonzero(lo, hi)));
    return h;
  };
  const HostTensor x = random(DType::fp32, {n, hidden}, 0.1, 1.0),
                   qr = random(DType::fp32, {n, q_lora}, 0.1, 1.0),
                   wkv = random(DType::fp32, {W, hidden}, 0.1, 1.0),
                   wgate = random(DType::fp32, {W, hidden}, 0.02, 0.25),
                   ape = random(DType::fp32, {4, W}, 0.1, 0.5),
                   norm = random(DType::fp32, {kDim}, 0.5, 1.5),
                   wq_b = random(DType::fp32, {H * kDim, q_lora}, 0.1, 1.0),
                   wp = random(DType::fp32, {H, hidden}, 0.1, 1.0);
  HostTensor pos(DType::int64, {n}), req(DType::int32, {n}), ctx(DType::int64, {1});
  std::iota(pos.data<int64_t>(), pos.data<int64_t>() + n, 0);
  std::fill_n(req.data<int32_t>(), n, 0);
  ctx.data<int64_t>()[0] = 0;
  const HostTensor cos_sin = build_rope_cache(kRope, n);

  // Keys: one call over the whole prompt; ring of 8 rows in one block, keys in blocks of 8.
  HostTensor kv(DType::fp32, {n, W}), score(DType::fp32, {n, W}), entries(DType::fp32, {n, kDim});
  compressor_project(cfg, x, wkv, wgate, ape, pos, kv, score);
  HostTensor ring(DType::fp32, {8, cfg.state_width()}), ring_table(DType::int32, {1, 1});
  ring_table.data<int32_t>()[0] = 0;
  const int64_t key_blocks = entries_n / 8;
  HostTensor keys(DType::uint8, {key_blocks, 8 * indexer_keys::kEntryBytes}),
      key_table(DType::int32, {1, key_blocks});
  for (int64_t b = 0; b < key_blocks; ++b)
    key_table.data<int32_t>()[b] = static_cast<int32_t>(key_blocks - 1 - b);
  CompressorOutputView out;
  out.indexer_keys = {keys, 8};
  out.block_table = key_table;
  compressor_update_and_emit(cfg, kv, score, {pos, req, ctx}, norm, cos_sin, {ring, ring_table, 8},
                             out, entries);

  // Selection by the library.
  HostTensor q_fp8(DType::fp8_e4m3, {n, H, kDim}), q_scale(DType::fp32, {n, H}),
      w(DType::fp32, {n, H}), scores(DType::fp32, {n, entries_n}), idx(DType::int32, {n, K});
  indexer_query(qr, {}, wq_b, {}, x, wp, pos, cos_sin, q_fp8, q_scale, w, {});
  indexer_scores(q_fp8, q_scale, w, pos, req, {keys, 8}, key_table, 4, scores);
  indexer_topk(scores, pos, 4, idx);

  // float64 selection: unquantized keys (the entries before FP8) and float64 queries/weights.
  int64_t hits = 0, total = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t visible = (t + 1) / 4;
    std::vector<std::vector<double>> q(static_cast<size_t>(H));
    std::vector<double> wr(static_cast<size_t>(H), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      q[h].assign(kDim, 0.0);
      for (int d = 0; d < kDim; ++d)
        for (int64_t k = 0; k < q_lora; ++k)
          q[h][d] += double{qr.data<float>()[t * q_lora + k]} *
                     wq_b.data<float>()[(h * kDim + d) * q_lora + k];
      test::rope_f64(q[h].data(), kDim, kRope, t);
      q[h] = test::hadamard_f64(q[h]);
      for (int64_t k = 0; k < hidden; ++k)
        wr[h] += double{x.data<float>()[t * hidden + k]} * wp.data<float>()[h * hidden + k];
      wr[h] /= std::sqrt(128.0 * static_cast<double>(H));
    }
    std::vector<float> ref_scores(static_cast<size_t>(visible));
    for (int64_t j = 0; j < visible; ++j) {
      const float* key = entries.data<float>() + (4 * j + 3) * kDim;  // emitted by token 4j + 3
      double sc = 0.0;
      for (int64_t h = 0; h < H; ++h) {
        double dot = 0.0;
        for (int d = 0; d < kDim; ++d) dot += q[h][d] * key[d];
        sc += wr[h] * std::max(0.0, dot);
      }
      ref_scores[j] = static_cast<float>(sc);
    }
    const auto want = expected_topk(ref_scores.data(), visible, K);
    for (int64_t k = 0; k < std::min(K, visible); ++k) {
      ++total;
      const int32_t* row = idx.data<int32_t>() + t * K;
      hits += std::find(row, row + K, want[k]) != row + K;
    }
  }
  ASSERT_GT(total, 0);
  EXPECT_GE(static_cast<double>(hits) / static_cast<double>(total), 0.95) << hits << " / " << total;
}

}  // namespace
}  // namespace dsv4
