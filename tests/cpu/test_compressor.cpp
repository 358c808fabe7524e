// Compressor (docs/spec.md §4): compressor_project and compressor_update_and_emit against an independent
// float64 implementation, over ratios 4 and 128, both targets (KV cache layouts, indexer keys),
// several requests per batch, prompts shorter than a window and chunk splits inside windows
// (state carried across calls must give the same bytes as one call); plus bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "compressor_test_support.h"
#include "dsv4/compressor.h"
#include "dsv4/ops.h"
#include "dsv4/paged_cache.h"

namespace dsv4 {
namespace {

using test::Rng;

constexpr int kHidden = 64;  // small hidden size keeps the projections cheap
// The RoPE of compressed layers (docs/spec.md §3): theta 160000 with YaRN (factor 16 over 65536).
const RopeConfig kRope = dense_test::yarn_rope(64);
constexpr float kPoisonF = std::numeric_limits<float>::quiet_NaN();
constexpr uint8_t kPoisonByte = 0xAB;

// ================================ float64 reference ==========================================

struct Params {
  CompressorConfig cfg;
  std::vector<float> wkv, wgate, ape, norm;  // [W, hidden], [W, hidden], [r, W], [D]
};

Params make_params(const CompressorConfig& cfg, Rng& rng) {
  Params p{cfg, {}, {}, {}, {}};
  const size_t W = static_cast<size_t>(cfg.proj_width());
  p.wkv = rng.floats(W * kHidden, 0.1, 1.0);
  p.wgate = rng.floats(W * kHidden, 0.02, 0.25);  // scores of O(1): a softmax that really mixes
  p.ape = rng.floats(static_cast<size_t>(cfg.ratio) * W, 0.1, 0.5);
  p.norm = std::vector<float>(static_cast<size_t>(cfg.head_dim));
  for (float& w : p.norm) w = static_cast<float>(rng.uniform(0.5, 1.5));
  return p;
}

// kv / score rows of one token in float64.
void project_f64(const Params& p, const float* x, int64_t pos, std::vector<double>& kv,
                 std::vector<double>& s) {
  const int W = p.cfg.proj_width();
  kv.assign(W, 0.0);
  s.assign(W, 0.0);
  for (int c = 0; c < W; ++c) {
    for (int k = 0; k < kHidden; ++k) {
      kv[c] += double{x[k]} * p.wkv[static_cast<size_t>(c) * kHidden + k];
      s[c] += double{x[k]} * p.wgate[static_cast<size_t>(c) * kHidden + k];
    }
    s[c] += p.ape[static_cast<size_t>(pos % p.cfg.ratio) * W + c];
  }
}

// Entries j = 0 .. n/r − 1 of one request whose tokens are x [n, hidden] at positions 0..n−1:
// post RMSNorm and RoPE (and the Hadamard rotation for indexer keys), before quantization.
std::vector<std::vector<double>> reference_entries(const Params& p, const std::vector<float>& x,
                                                   int64_t n) {
  const CompressorConfig& c = p.cfg;
  const int D = c.head_dim, r = c.ratio;
  std::vector<std::vector<double>> kv(n), s(n);
  for (int64_t t = 0; t < n; ++t)
    project_f64(p, &x[static_cast<size_t>(t) * kHidden], t, kv[t], s[t]);
  std::vector<std::vector<double>> entries;
  for (int64_t j = 0; (j + 1) * r <= n; ++j) {
    // (token, column offset) of every pooled row.
    std::vector<std::pair<int64_t, int>> rows;
    if (c.ratio == 4) {
      if (j >= 1)
        for (int64_t t = (j - 1) * r; t < j * r; ++t) rows.push_back({t, 0});
      for (int64_t t = j * r; t < (j + 1) * r; ++t) rows.push_back({t, D});
    } else {
      for (int64_t t = j * r; t < (j + 1) * r; ++t) rows.push_back({t, 0});
    }
    std::vector<double> e(D);
    for (int d = 0; d < D; ++d) {
      double m = -INFINITY, num = 0.0, den = 0.0;
      for (auto [t, off] : rows) m = std::max(m, s[t][off + d]);
      for (auto [t, off] : rows) {
        num += std::exp(s[t][off + d] - m) * kv[t][off + d];
        den += std::exp(s[t][off + d] - m);
      }
      e[d] = num / den;
    }
    double ms = 0.0;
    for (double v : e) ms += v * v;
    ms /= D;
    for (int d = 0; d < D; ++d) e[d] = e[d] / std::sqrt(ms + c.eps) * p.norm[d];
    test::rope_f64(e.data(), D, kRope, j * r);
    if (c.target == CompressorTarget::indexer_keys) e = test::hadamard_f64(e);
    entries.push_back(std::move(e));
  }
  return entries;
}

// ================================ the rig: caches as plain tensors ===========================

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Rig {
  CompressorConfig cfg;
  KvLayout layout;
  int R, out_block, state_block;
  int64_t max_entries;
  HostTensor out_data, out_table, state_rows, state_table, cos_sin;
  std::vector<uint8_t> out_poison;  // the output cache as it was before any call
  std::vector<int64_t> context;     // positions consumed per request

  Rig(const CompressorConfig& c, KvLayout l, int requests, int64_t max_positions, int ob, int sb,
      uint64_t seed)
      : cfg(c),
        layout(l),
        R(requests),
        out_block(ob),
        state_block(sb),
        max_entries(max_positions / c.ratio),
        context(requests, 0) {
    Rng rng(seed);
    // Output cache: blocks handed out in a shuffled order (plus spare blocks nobody owns), so a
    // wrong slot mapping shows.
    const int64_t out_blocks_per_req = std::max<int64_t>(1, ceil_div(max_entries, out_block));
    const int64_t out_blocks = R * out_blocks_per_req + 2;
    const int64_t block_bytes = c.target == CompressorTarget::kv_cache
                                    ? kv_geometry(l, out_block).block_bytes
                                    : int64_t{out_block} * indexer_keys::kEntryBytes;
    out_data = HostTensor(DType::uint8, {out_blocks, block_bytes});
    out_data.fill_bytes(kPoisonByte);
    out_poison.assign(out_data.data<uint8_t>(), out_data.data<uint8_t>() + out_data.nbytes());
    out_table = shuffled_table(R, out_blocks_per_req, out_blocks, rng);
    // Ring: ceil(coff·r / block) blocks per request, also shuffled; rows poisoned with NaN.
    const int64_t ring_blocks = ceil_div(c.ring_rows(), state_block);
    const int64_t state_blocks = R * ring_blocks + 1;
    state_rows = HostTensor(DType::fp32, {state_blocks * state_block, int64_t{c.state_width()}});
    state_rows.fill_bytes(0xFF);
    state_table = shuffled_table(R, ring_blocks, state_blocks, rng);
    cos_sin = build_rope_cache(kRope, std::max<int64_t>(1, max_positions));
  }

  static HostTensor shuffled_table(int rows, int64_t cols, int64_t num_blocks, Rng& rng) {
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng.gen);
    HostTensor t(DType::int32, {rows, cols});
    for (int64_t i = 0; i < rows * cols; ++i) t.data<int32_t>()[i] = ids[static_cast<size_t>(i)];
    return t;
  }

  CompressorOutputView out_view() const {
    CompressorOutputView v;
    if (cfg.target == CompressorTarget::kv_cache) {
      v.kv_cache.data = out_data;
      v.kv_cache.layout = layout;
      v.kv_cache.block_size = out_block;
    } else {
      v.indexer_keys.data = out_data;
      v.indexer_keys.block_size = out_block;
    }
    v.block_table = out_table;
    return v;
  }
  CompressorStateView state_view() const { return {state_rows, state_table, state_block}; }

  int64_t out_slot(int64_t req, int64_t j) const {
    return int64_t{out_table.data<int32_t>()[req * out_table.shape()[1] + j / out_block]} *
               out_block +
           j % out_block;
  }
};

// Projected rows of every position of one request (computed once; calls take slices, so a chunked
// run and a one-shot run see bit-identical rows).
struct RequestRows {
  std::vector<float> x;  // [n, hidden]
  HostTensor kv, score;  // [n, W] fp32
};

RequestRows project_request(const Params& p, int64_t n, Rng& rng) {
  RequestRows rr;
  rr.x = rng.floats(static_cast<size_t>(n) * kHidden);
  const int64_t W = p.cfg.proj_width();
  rr.kv = HostTensor(DType::fp32, {n, W});
  rr.score = HostTensor(DType::fp32, {n, W});
  HostTensor x(DType::fp32, {n, kHidden}), pos(DType::int64, {n});
  std::copy(rr.x.begin(), rr.x.end(), x.data<float>());
  std::iota(pos.data<int64_t>(), pos.data<int64_t>() + n, 0);
  compressor_project(p.cfg, x,
                     TensorView(const_cast<float*>(p.wkv.data()), DType::fp32, {W, kHidden}),
                     TensorView(const_cast<float*>(p.wgate.data()), DType::fp32, {W, kHidden}),
                     TensorView(const_cast<float*>(p.ape.data()), DType::fp32, {p.cfg.ratio, W}),
                     pos, rr.kv, rr.score);
  return rr;
}

// One call: `chunks` = (request, token count) in batch order. Returns the emitted entries
// (request, j) → fp32 row taken from the op's `entries` output.
struct Emitted {
  int64_t req, j;
  std::vector<float> values;
};

std::vector<Emitted> run_call(Rig& rig, const Params& p, const std::vector<RequestRows>& rows,
                              const std::vector<std::pair<int, int64_t>>& chunks) {
  const int64_t W = rig.cfg.proj_width(), D = rig.cfg.head_dim;
  int64_t T = 0;
  for (auto [q, n] : chunks) T += n;
  HostTensor kv(DType::fp32, {T, W}), score(DType::fp32, {T, W}), pos(DType::int64, {T}),
      req(DType::int32, {T}), ctx(DType::int64, {rig.R}), entries(DType::fp32, {T, D});
  entries.fill_bytes(0xFF);
  for (int q = 0; q < rig.R; ++q) ctx.data<int64_t>()[q] = rig.context[q];
  int64_t t = 0;
  for (auto [q, n] : chunks) {
    for (int64_t i = 0; i < n; ++i, ++t) {
      const int64_t p_abs = rig.context[q] + i;
      std::copy_n(rows[q].kv.data<float>() + p_abs * W, W, kv.data<float>() + t * W);
      std::copy_n(rows[q].score.data<float>() + p_abs * W, W, score.data<float>() + t * W);
      pos.data<int64_t>()[t] = p_abs;
      req.data<int32_t>()[t] = q;
    }
  }
  HostTensor norm(DType::fp32, {D});
  std::copy(p.norm.begin(), p.norm.end(), norm.data<float>());
  compressor_update_and_emit(rig.cfg, kv, score, CompressorBatch{pos, req, ctx}, norm, rig.cos_sin,
                             rig.state_view(), rig.out_view(), entries);
  std::vector<Emitted> out;
  for (int64_t i = 0; i < T; ++i) {
    const int64_t p_abs = pos.data<int64_t>()[i];
    const float* row = entries.data<float>() + i * D;
    if ((p_abs + 1) % rig.cfg.ratio == 0) {
      out.push_back({req.data<int32_t>()[i], (p_abs + 1) / rig.cfg.ratio - 1, {row, row + D}});
    } else {
      for (int64_t d = 0; d < D; ++d)
        EXPECT_TRUE(std::isnan(row[d])) << "entries row " << i << " written";
    }
  }
  for (auto [q, n] : chunks) rig.context[q] += n;
  return out;
}

// The bytes the output cache must hold for one entry, from its pre-quantization values,
// encoded independently of the op (test-side FP8 emulation; the layout codec for KV caches).
void encode_expected(const Rig& rig, std::vector<uint8_t>& cache, int64_t slot,
                     std::vector<float> v) {
  const int64_t row_bytes = rig.out_data.shape()[1];
  uint8_t* block = cache.data() + (slot / rig.out_block) * row_bytes;
  const int off = static_cast<int>(slot % rig.out_block);
  if (rig.cfg.target == CompressorTarget::kv_cache) {
    if (rig.layout != KvLayout::model1_fp8)  // the model's FP8 rounding of the nope dims
      for (int b = 0; b < rig.cfg.head_dim - rig.cfg.rope_dims; b += 64)
        test::fp8_round_block_f64(v.data() + b, 64);
    kv_encode_token(kv_geometry(rig.layout, rig.out_block), block, off, v.data());
  } else {
    double amax = 0.0;
    for (float f : v) amax = std::max(amax, std::fabs(double{f}));
    const float scale = static_cast<float>(test::ue8m0_scale_f64(amax));
    for (int d = 0; d < 128; ++d) block[off * 128 + d] = float_to_fp8_e4m3(v[d] / scale);
    std::memcpy(block + int64_t{rig.out_block} * 128 + off * 4, &scale, 4);
  }
}

// ================================ end-to-end schedules =======================================

enum class Schedule { one_shot, decode, chunks };

struct Case {
  const char* name;
  CompressorTarget target;
  KvLayout layout;
  int ratio;
  std::vector<int64_t> lengths;  // one per request
  Schedule schedule;
  int out_block, state_block;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class CompressorSchedule : public ::testing::TestWithParam<Case> {};

// Splits every request into per-call chunk sizes according to the schedule.
std::vector<std::vector<std::pair<int, int64_t>>> make_calls(const Case& c, Rng& rng) {
  std::vector<int64_t> left = c.lengths;
  std::vector<std::vector<std::pair<int, int64_t>>> calls;
  while (std::any_of(left.begin(), left.end(), [](int64_t n) { return n > 0; })) {
    std::vector<std::pair<int, int64_t>> call;
    for (int q = 0; q < static_cast<int>(left.size()); ++q) {
      if (left[q] == 0) continue;
      int64_t n = left[q];
      if (c.schedule == Schedule::decode) n = 1;
      if (c.schedule == Schedule::chunks) n = std::min(left[q], rng.integer(1, c.ratio + 3));
      if (rng.integer(0, 3) == 0 && c.schedule != Schedule::one_shot) continue;  // sit out a call
      call.push_back({q, n});
      left[q] -= n;
    }
    if (!call.empty()) calls.push_back(call);
  }
  return calls;
}

TEST_P(CompressorSchedule, MatchesFloat64AndOneShotBytes) {
  const Case& c = GetParam();
  CompressorConfig cfg;
  cfg.target = c.target;
  cfg.head_dim = c.target == CompressorTarget::kv_cache ? 512 : 128;
  cfg.ratio = c.ratio;
  Rng rng(1234 + c.ratio);
  const Params params = make_params(cfg, rng);
  const int R = static_cast<int>(c.lengths.size());
  std::vector<RequestRows> rows;
  for (int64_t n : c.lengths) rows.push_back(project_request(params, n, rng));
  const int64_t max_len = *std::max_element(c.lengths.begin(), c.lengths.end());

  Rig rig(cfg, c.layout, R, max_len, c.out_block, c.state_block, 99);
  std::vector<Emitted> emitted;
  for (const auto& call : make_calls(c, rng)) {
    auto e = run_call(rig, params, rows, call);
    emitted.insert(emitted.end(), e.begin(), e.end());
  }

  // Every entry emitted exactly once; values vs float64. Tolerance: fp32 GEMM over 64 terms,
  // fp32 softmax over <= 128 rows, RMSNorm and a fp32 cos/sin table give relative errors ~1e-6
  // on O(1) values; 2e-4 absolute + relative leaves margin yet any wrong row, column, ape row,
  // window or RoPE position moves values by O(0.1).
  std::vector<uint8_t> expected = rig.out_poison;
  for (int q = 0; q < R; ++q) {
    const auto ref = reference_entries(params, rows[q].x, c.lengths[q]);
    int64_t found = 0;
    for (const Emitted& e : emitted) {
      if (e.req != q) continue;
      ++found;
      ASSERT_LT(e.j, static_cast<int64_t>(ref.size()));
      for (int d = 0; d < cfg.head_dim; ++d)
        ASSERT_NEAR(e.values[d], ref[e.j][d], 2e-4 + 2e-4 * std::fabs(ref[e.j][d]))
            << c.name << " request " << q << " entry " << e.j << " dim " << d;
      encode_expected(rig, expected, rig.out_slot(q, e.j), e.values);
    }
    EXPECT_EQ(found, static_cast<int64_t>(ref.size())) << "request " << q;
  }
  // The cache holds exactly the encoded entries at their slots and nothing else changed.
  ASSERT_EQ(expected.size(), rig.out_data.nbytes());
  EXPECT_EQ(0, std::memcmp(expected.data(), rig.out_data.data<uint8_t>(), expected.size()))
      << c.name;

  // State carried across calls changes nothing: a one-shot run writes the same bytes.
  if (c.schedule != Schedule::one_shot) {
    Rig once(cfg, c.layout, R, max_len, c.out_block, c.state_block, 99);
    std::vector<std::pair<int, int64_t>> all;
    for (int q = 0; q < R; ++q) all.push_back({q, c.lengths[q]});
    run_call(once, params, rows, all);
    EXPECT_EQ(0, std::memcmp(once.out_data.data<uint8_t>(), rig.out_data.data<uint8_t>(),
                             rig.out_data.nbytes()))
        << c.name << ": chunked run differs from the one-shot run";
  }
}

const CompressorTarget kKv = CompressorTarget::kv_cache;
const CompressorTarget kIdx = CompressorTarget::indexer_keys;
const KvLayout kM1 = KvLayout::model1_fp8;

INSTANTIATE_TEST_SUITE_P(
    Compressor, CompressorSchedule,
    ::testing::Values(
        // ratio 4: shorter than a window, exactly one, many; overlap across every boundary.
        Case{"r4_oneshot", kKv, kM1, 4, {3, 4, 13, 37}, Schedule::one_shot, 4, 4},
        Case{"r4_decode", kKv, kM1, 4, {3, 13, 22}, Schedule::decode, 4, 4},
        Case{"r4_chunks", kKv, kM1, 4, {5, 17, 40}, Schedule::chunks, 3, 3},
        Case{"r4_bf16_cache", kKv, KvLayout::bf16, 4, {9, 21}, Schedule::chunks, 64, 8},
        Case{"r4_fp8_tensor_cache", kKv, KvLayout::fp8_per_tensor, 4, {12}, Schedule::chunks, 2, 5},
        // ratio 128: a prompt shorter than one window, one window, two windows split in chunks.
        Case{"r128_oneshot", kKv, kM1, 128, {100, 128, 300}, Schedule::one_shot, 2, 128},
        Case{"r128_chunks", kKv, kM1, 128, {130, 260}, Schedule::chunks, 2, 64},
        // the indexer's compressor: D 128, Hadamard, FP8 + per-entry scale.
        Case{"indexer_oneshot", kIdx, kM1, 4, {2, 4, 29}, Schedule::one_shot, 64, 4},
        Case{"indexer_decode", kIdx, kM1, 4, {11, 6}, Schedule::decode, 4, 4},
        Case{"indexer_chunks", kIdx, kM1, 4, {33, 8}, Schedule::chunks, 5, 3}),
    [](const auto& info) { return std::string(info.param.name); });

// The MODEL1 cache decodes to the float64 entries within the FP8 / bf16 rounding (by construction:
// nope values are fp8 e4m3 (3 mantissa bits: relative error <= 2^-4, plus half a subnormal step
// 2^-10 · block scale), rope values bf16 (8 significant bits: relative error <= 2^-8)).
TEST(Compressor, Model1CacheDecodesToFloat64Entries) {
  CompressorConfig cfg;  // kv_cache, D 512, ratio 4
  Rng rng(7);
  const Params params = make_params(cfg, rng);
  std::vector<RequestRows> rows{project_request(params, 16, rng)};
  Rig rig(cfg, KvLayout::model1_fp8, 1, 16, 4, 4, 5);
  run_call(rig, params, rows, {{0, 16}});
  const auto ref = reference_entries(params, rows[0].x, 16);
  const KvGeometry g = kv_geometry(KvLayout::model1_fp8, 4);
  for (int64_t j = 0; j < 4; ++j) {
    const int64_t slot = rig.out_slot(0, j);
    std::vector<float> dec(512);
    kv_decode_token(g, rig.out_data.data<uint8_t>() + (slot / 4) * g.block_bytes, slot % 4,
                    dec.data());
    for (int b = 0; b < 7; ++b) {
      double amax = 0.0;
      for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(ref[j][b * 64 + i]));
      const double scale = test::ue8m0_scale_f64(amax);
      for (int i = 0; i < 64; ++i) {
        const double r = ref[j][b * 64 + i];
        EXPECT_NEAR(dec[b * 64 + i], r,
                    std::ldexp(std::fabs(r), -4) + std::ldexp(scale, -10) + 1e-4);
      }
    }
    for (int d = 448; d < 512; ++d)
      EXPECT_NEAR(dec[d], ref[j][d], std::ldexp(std::fabs(ref[j][d]), -8) + 1e-4);
  }
}

// ================================ projection =================================================

TEST(CompressorProject, MatchesFloat64WithApeAtPositionModRatio) {
  for (int ratio : {4, 128}) {
    CompressorConfig cfg;
    cfg.ratio = ratio;
    Rng rng(11 + ratio);
    const Params params = make_params(cfg, rng);
    const int64_t T = 7, W = cfg.proj_width();
    // Positions far apart and not starting at zero: the ape row is p mod r.
    HostTensor x(DType::fp32, {T, kHidden}), pos(DType::int32, {T}), kv(DType::fp32, {T, W}),
        score(DType::fp32, {T, W});
    const std::vector<float> xs = rng.floats(static_cast<size_t>(T) * kHidden);
    std::copy(xs.begin(), xs.end(), x.data<float>());
    for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[t] = static_cast<int32_t>(1000 + 37 * t);
    kv.fill_bytes(0xFF);
    score.fill_bytes(0xFF);
    compressor_project(
        cfg, x, TensorView(const_cast<float*>(params.wkv.data()), DType::fp32, {W, kHidden}),
        TensorView(const_cast<float*>(params.wgate.data()), DType::fp32, {W, kHidden}),
        TensorView(const_cast<float*>(params.ape.data()), DType::fp32, {ratio, W}), pos, kv, score);
    std::vector<double> kv_ref, s_ref;
    for (int64_t t = 0; t < T; ++t) {
      project_f64(params, xs.data() + t * kHidden, pos.data<int32_t>()[t], kv_ref, s_ref);
      // fp32 dot products of 64 terms of magnitude <= 1: error ~1e-6.
      for (int64_t c = 0; c < W; ++c) {
        ASSERT_NEAR(kv.data<float>()[t * W + c], kv_ref[c], 1e-4) << "ratio " << ratio;
        ASSERT_NEAR(score.data<float>()[t * W + c], s_ref[c], 1e-4) << "ratio " << ratio;
      }
    }
  }
}

// ================================ PagedCache-backed state ====================================

TEST(Compressor, RunsOnLayerPagedCaches) {
  // The layer's caches (foundation): the ring lives in compressor_state / indexer_state, entries in
  // compressed / indexer_keys. Two requests, chunked; the entries must match the float64 reference.
  ModelConfig mc = ModelConfig::builtin("tiny");
  LayerCacheOptions opts;
  opts.compressed_blocks = 8;
  opts.state_blocks = 8;
  LayerCaches caches = make_layer_caches(mc, LayerKind::c4a, opts);
  caches.add_request(100);
  caches.add_request(101);
  for (const CompressorConfig cfg :
       {CompressorConfig::attention(mc, 4), CompressorConfig::indexer(mc)}) {
    const bool idx = cfg.target == CompressorTarget::indexer_keys;
    PagedCache& state = idx ? *caches.indexer_state : *caches.compressor_state;
    PagedCache& out = idx ? *caches.indexer_keys : *caches.compressed;
    CompressorConfig c = cfg;
    c.rope_dims = 64;
    Rng rng(idx ? 3 : 4);
    Params params = make_params(c, rng);
    const std::vector<int64_t> lengths{10, 23};
    std::vector<RequestRows> rows;
    for (int64_t n : lengths) rows.push_back(project_request(params, n, rng));
    for (int64_t q = 0; q < 2; ++q) compressor_state_init(state, c, 100 + q);
    const HostTensor cos_sin = build_rope_cache(kRope, 64);
    std::vector<int64_t> ctx{0, 0};
    std::vector<std::vector<std::vector<float>>> got(2);
    for (int64_t step : {7, 3, 13}) {
      std::vector<std::pair<int, int64_t>> chunks;
      for (int q = 0; q < 2; ++q) {
        const int64_t n = std::min(step, lengths[q] - ctx[q]);
        if (n <= 0) continue;
        chunks.push_back({q, n});
        out.append(100 + q,
                   compressor_entries_after(4, ctx[q] + n) - compressor_entries_after(4, ctx[q]));
      }
      const int64_t W = c.proj_width();
      int64_t T = 0;
      for (auto [q, n] : chunks) T += n;
      HostTensor kv(DType::fp32, {T, W}), score(DType::fp32, {T, W}), pos(DType::int64, {T}),
          req(DType::int32, {T}), ctxs(DType::int64, {2}), entries(DType::fp32, {T, c.head_dim}),
          norm(DType::fp32, {c.head_dim});
      std::copy(params.norm.begin(), params.norm.end(), norm.data<float>());
      int64_t t = 0;
      for (auto [q, n] : chunks)
        for (int64_t i = 0; i < n; ++i, ++t) {
          std::copy_n(rows[q].kv.data<float>() + (ctx[q] + i) * W, W, kv.data<float>() + t * W);
          std::copy_n(rows[q].score.data<float>() + (ctx[q] + i) * W, W,
                      score.data<float>() + t * W);
          pos.data<int64_t>()[t] = ctx[q] + i;
          req.data<int32_t>()[t] = q;
        }
      for (int q = 0; q < 2; ++q) ctxs.data<int64_t>()[q] = ctx[q];
      const HostTensor state_table = pack_block_tables(state, {100, 101});
      const HostTensor out_table = pack_block_tables(out, {100, 101});
      CompressorOutputView ov;
      ov.block_table = out_table;
      if (idx)
        ov.indexer_keys = IndexerKeyCacheView{out.storage_view(), out.spec().block_size};
      else
        ov.kv_cache = out.kv_view();
      compressor_update_and_emit(
          c, kv, score, CompressorBatch{pos, req, ctxs}, norm, cos_sin,
          {compressor_state_rows(state, c), state_table, state.spec().block_size}, ov, entries);
      for (int64_t i = 0; i < T; ++i)
        if ((pos.data<int64_t>()[i] + 1) % 4 == 0) {
          const float* r = entries.data<float>() + i * c.head_dim;
          got[req.data<int32_t>()[i]].emplace_back(r, r + c.head_dim);
        }
      for (auto [q, n] : chunks) ctx[q] += n;
    }
    for (int q = 0; q < 2; ++q) {
      const auto ref = reference_entries(params, rows[q].x, lengths[q]);
      ASSERT_EQ(got[q].size(), ref.size());
      for (size_t j = 0; j < ref.size(); ++j)
        for (int d = 0; d < c.head_dim; ++d)
          ASSERT_NEAR(got[q][j][d], ref[j][d], 2e-4 + 2e-4 * std::fabs(ref[j][d]));
    }
  }
}

// ================================ bad input ==================================================

// A valid single-request call (ratio 4, 6 tokens continuing at position 2: emits entry 0 at
// position 3 and entry 1 at position 7; output blocks of one entry) that each test breaks in one
// way.
struct CompressorBadInput : ::testing::Test {
  CompressorConfig cfg;
  Rng rng{21};
  Params params = make_params(cfg, rng);
  std::vector<RequestRows> rows{project_request(params, 8, rng)};
  Rig rig{cfg, KvLayout::model1_fp8, 1, 8, 1, 4, 3};
  HostTensor kv{DType::fp32, {6, 1024}}, score{DType::fp32, {6, 1024}}, pos{DType::int64, {6}},
      req{DType::int32, {6}}, ctx{DType::int64, {1}}, norm{DType::fp32, {512}},
      entries{DType::fp32, {6, 512}};
  std::vector<uint8_t> state_before, entries_before;

  void SetUp() override {
    run_call(rig, params, rows, {{0, 2}});  // positions 0, 1 into the ring
    for (int64_t t = 0; t < 6; ++t) {
      std::copy_n(rows[0].kv.data<float>() + (2 + t) * 1024, 1024, kv.data<float>() + t * 1024);
      std::copy_n(rows[0].score.data<float>() + (2 + t) * 1024, 1024,
                  score.data<float>() + t * 1024);
      pos.data<int64_t>()[t] = 2 + t;
      req.data<int32_t>()[t] = 0;
    }
    ctx.data<int64_t>()[0] = 2;
    std::copy(params.norm.begin(), params.norm.end(), norm.data<float>());
    entries.fill_bytes(0xFF);
    state_before.assign(rig.state_rows.data<uint8_t>(),
                        rig.state_rows.data<uint8_t>() + rig.state_rows.nbytes());
    entries_before.assign(entries.data<uint8_t>(), entries.data<uint8_t>() + entries.nbytes());
  }
  void call(const CompressorConfig& c, const TensorView& kv_v, const CompressorBatch& b,
            const CompressorStateView& st, const CompressorOutputView& ov, const TensorView& cs) {
    compressor_update_and_emit(c, kv_v, score, b, norm, cs, st, ov, entries);
  }
  void call() { call(cfg, kv, {pos, req, ctx}, rig.state_view(), rig.out_view(), rig.cos_sin); }
  // Nothing written: ring, output cache (still all poison: this rig emitted nothing yet) and
  // entries.
  void expect_unchanged() {
    EXPECT_EQ(
        0, std::memcmp(state_before.data(), rig.state_rows.data<uint8_t>(), state_before.size()));
    EXPECT_EQ(
        0, std::memcmp(rig.out_poison.data(), rig.out_data.data<uint8_t>(), rig.out_poison.size()));
    EXPECT_EQ(0,
              std::memcmp(entries_before.data(), entries.data<uint8_t>(), entries_before.size()));
  }
};

TEST_F(CompressorBadInput, ValidCallSucceeds) {
  ASSERT_NO_THROW(call());
  EXPECT_NE(
      0, std::memcmp(rig.out_poison.data(), rig.out_data.data<uint8_t>(), rig.out_poison.size()));
}

TEST_F(CompressorBadInput, ShapeAndDtypeMismatches) {
  HostTensor narrow(DType::fp32, {6, 512}), bf(DType::bf16, {6, 1024});
  dense_test::expect_error(
      [&] {
        call(cfg, narrow, {pos, req, ctx}, rig.state_view(), rig.out_view(), rig.cos_sin);
      },
      {"kv_rows"});
  dense_test::expect_error(
      [&] {
        call(cfg, bf, {pos, req, ctx}, rig.state_view(), rig.out_view(), rig.cos_sin);
      },
      {"kv_rows.dtype"});
  HostTensor short_req(DType::int32, {5});
  dense_test::expect_error(
      [&] {
        call(cfg, kv, {pos, short_req, ctx}, rig.state_view(), rig.out_view(), rig.cos_sin);
      },
      {"token_to_req"});
  HostTensor cs_short = build_rope_cache(kRope, 4);
  dense_test::expect_error(
      [&] {
        call(cfg, kv, {pos, req, ctx}, rig.state_view(), rig.out_view(), cs_short);
      },
      {"cos_sin.shape[0]"});
  CompressorStateView bad_rows = rig.state_view();
  HostTensor rows_bf(DType::bf16, {rig.state_rows.shape()[0], 2048});
  bad_rows.rows = rows_bf;
  dense_test::expect_error(
      [&] {
        call(cfg, kv, {pos, req, ctx}, bad_rows, rig.out_view(), rig.cos_sin);
      },
      {"state.rows"});
  CompressorOutputView v32 = rig.out_view();
  v32.kv_cache.layout = KvLayout::v32_fp8;
  dense_test::expect_error(
      [&] {
        call(cfg, kv, {pos, req, ctx}, rig.state_view(), v32, rig.cos_sin);
      },
      {"out.kv_cache"});
  CompressorConfig bad_ratio = cfg;
  bad_ratio.ratio = 5;
  dense_test::expect_error(
      [&] {
        call(bad_ratio, kv, {pos, req, ctx}, rig.state_view(), rig.out_view(), rig.cos_sin);
      },
      {"cfg.ratio"});
  CompressorConfig idx_dim = cfg;
  idx_dim.target = CompressorTarget::indexer_keys;  // D 512 is not an indexer key
  dense_test::expect_error(
      [&] {
        call(idx_dim, kv, {pos, req, ctx}, rig.state_view(), rig.out_view(), rig.cos_sin);
      },
      {"cfg.head_dim"});
  // Outputs: entries must not overlap itself or share memory with an input or the cache.
  dense_test::expect_error(
      [&] {
        compressor_update_and_emit(cfg, kv, score, {pos, req, ctx}, norm, rig.cos_sin,
                                   rig.state_view(), rig.out_view(),
                                   TensorView(kv.data<float>(), DType::fp32, {6, 512}));
      },
      {"entries: expected memory disjoint from kv_rows"});
  TensorView entries_rows_overlap = entries;
  entries_rows_overlap.strides[0] = 256;
  dense_test::expect_error(
      [&] {
        compressor_update_and_emit(cfg, kv, score, {pos, req, ctx}, norm, rig.cos_sin,
                                   rig.state_view(), rig.out_view(), entries_rows_overlap);
      },
      {"entries: expected an output whose elements do not overlap"});
  CompressorStateView state_on_kv = rig.state_view();
  state_on_kv.rows = TensorView(score.data<float>(), DType::fp32, {1, 2048});
  dense_test::expect_error(
      [&] {
        call(cfg, kv, {pos, req, ctx}, state_on_kv, rig.out_view(), rig.cos_sin);
      },
      {"state.rows: expected memory disjoint from score_rows"});
  expect_unchanged();
}

TEST_F(CompressorBadInput, PositionsMustContinueTheState) {
  ctx.data<int64_t>()[0] = 3;  // the state has consumed 2 positions, the batch claims 3
  dense_test::expect_error([&] { call(); }, {"positions[0]"});
  ctx.data<int64_t>()[0] = 2;
  pos.data<int64_t>()[4] = 9;  // a gap inside the run
  dense_test::expect_error([&] { call(); }, {"positions[4]"});
  expect_unchanged();
}

TEST_F(CompressorBadInput, RequestRowsAndRuns) {
  req.data<int32_t>()[2] = 1;  // only one request row
  dense_test::expect_error([&] { call(); }, {"token_to_req[2]"});
  req.data<int32_t>()[2] = -1;
  dense_test::expect_error([&] { call(); }, {"token_to_req[2]"});
  expect_unchanged();
}

TEST_F(CompressorBadInput, RequestTokensMustBeOneRun) {
  // Two requests interleaved 0, 1, 0: the second run of request 0 is rejected.
  Rig two{cfg, KvLayout::model1_fp8, 2, 8, 4, 4, 3};
  HostTensor p3(DType::int64, {3}), r3(DType::int32, {3}), c2(DType::int64, {2}),
      kv3(DType::fp32, {3, 1024}), s3(DType::fp32, {3, 1024});
  const int64_t pv[] = {0, 0, 1};
  const int32_t rv[] = {0, 1, 0};
  std::copy(pv, pv + 3, p3.data<int64_t>());
  std::copy(rv, rv + 3, r3.data<int32_t>());
  c2.data<int64_t>()[0] = c2.data<int64_t>()[1] = 0;
  dense_test::expect_error(
      [&] {
        compressor_update_and_emit(cfg, kv3, s3, {p3, r3, c2}, norm, two.cos_sin, two.state_view(),
                                   two.out_view());
      },
      {"contiguous run"});
}

TEST_F(CompressorBadInput, UnmappedSlots) {
  // Entry 1 (emitted at position 7) has no output block.
  CompressorOutputView ov = rig.out_view();
  HostTensor table(DType::int32, {1, 2});
  table.data<int32_t>()[0] = rig.out_table.data<int32_t>()[0];
  table.data<int32_t>()[1] = -1;
  ov.block_table = table;
  dense_test::expect_error(
      [&] {
        call(cfg, kv, {pos, req, ctx}, rig.state_view(), ov, rig.cos_sin);
      },
      {"entry 1"});
  // The ring row of position 1 (read by entry 0, written by the previous call) is unmapped.
  CompressorStateView st = rig.state_view();
  HostTensor st_table(DType::int32, {1, 2});
  st_table.data<int32_t>()[0] = -1;
  st_table.data<int32_t>()[1] = rig.state_table.data<int32_t>()[1];
  st.block_table = st_table;
  dense_test::expect_error(
      [&] {
        call(cfg, kv, {pos, req, ctx}, st, rig.out_view(), rig.cos_sin);
      },
      {"ring row"});
  expect_unchanged();
}

TEST(CompressorProject, BadInputWritesNothing) {
  CompressorConfig cfg;
  const int64_t T = 3, W = cfg.proj_width();
  HostTensor x(DType::fp32, {T, kHidden}), wkv(DType::fp32, {W, kHidden}),
      wgate(DType::fp32, {W, kHidden}), ape(DType::fp32, {4, W}), pos(DType::int64, {T}),
      kv(DType::fp32, {T, W}), score(DType::fp32, {T, W});
  for (HostTensor* t : {&x, &wkv, &wgate, &ape}) t->fill_bytes(0x3C);
  for (int64_t t = 0; t < T; ++t) pos.data<int64_t>()[t] = t;
  kv.fill_bytes(0xFF);
  score.fill_bytes(0xFF);
  auto unchanged = [&] {
    for (int64_t i = 0; i < T * W; ++i)
      if (!std::isnan(kv.data<float>()[i]) || !std::isnan(score.data<float>()[i])) return false;
    return true;
  };
  HostTensor wbad(DType::fp32, {W, kHidden + 1}), ape_bad(DType::fp32, {128, W});
  dense_test::expect_error([&] { compressor_project(cfg, x, wbad, wgate, ape, pos, kv, score); },
                           {"wkv"});
  dense_test::expect_error([&] { compressor_project(cfg, x, wkv, wgate, ape_bad, pos, kv, score); },
                           {"ape"});
  dense_test::expect_error([&] { compressor_project(cfg, x, wkv, wgate, ape, pos, kv, kv); },
                           {"score_rows"});
  TensorView kv_rows_overlap = kv;
  kv_rows_overlap.strides[0] = W / 2;  // rows of W values, W / 2 apart
  dense_test::expect_error(
      [&] { compressor_project(cfg, x, wkv, wgate, ape, pos, kv_rows_overlap, score); },
      {"kv_rows: expected an output whose elements do not overlap"});
  dense_test::expect_error(
      [&] {
        compressor_project(cfg, x, wkv, wgate, ape, pos, kv,
                           TensorView(wkv.data<float>(), DType::fp32, {T, W}));
      },
      {"score_rows: expected memory disjoint from wkv"});
  pos.data<int64_t>()[1] = -4;
  dense_test::expect_error([&] { compressor_project(cfg, x, wkv, wgate, ape, pos, kv, score); },
                           {"positions[1]"});
  EXPECT_TRUE(unchanged());
}

TEST(CompressorState, InitReservesTheRingOnceAtomically) {
  ModelConfig mc = ModelConfig::builtin("tiny");
  LayerCacheOptions opts;
  opts.state_blocks = 3;
  LayerCaches caches = make_layer_caches(mc, LayerKind::c4a, opts);
  const CompressorConfig c4 = CompressorConfig::attention(mc, 4);
  caches.add_request(1);  // registered by the layer: init only reserves the rows
  compressor_state_init(*caches.compressor_state, c4, 1);
  EXPECT_EQ(caches.compressor_state->num_entries(1), 8);  // coff·r rows
  dense_test::expect_error([&] { compressor_state_init(*caches.compressor_state, c4, 1); },
                           {"reserved once"});
  EXPECT_EQ(caches.compressor_state->num_entries(1), 8);
  // 3 blocks of 4 rows: a second, unregistered request needs 2 blocks, only 1 is free.
  EXPECT_THROW(compressor_state_init(*caches.compressor_state, c4, 2), Error);
  EXPECT_FALSE(caches.compressor_state->has_request(2));
  EXPECT_EQ(caches.compressor_state->pool().num_free(), 1);
  // The indexer's ring has 128-dim rows: the attention config does not fit it.
  dense_test::expect_error([&] { compressor_state_rows(*caches.indexer_state, c4); },
                           {"block_bytes"});
  dense_test::expect_error([&] { compressor_state_init(*caches.indexer_state, c4, 1); },
                           {"block_bytes"});
  EXPECT_EQ(compressor_state_rows(*caches.compressor_state, c4).shape[1], 4 * 512);
  EXPECT_EQ(compressor_state_rows(*caches.indexer_state, CompressorConfig::indexer(mc)).shape[1],
            4 * 128);
}

}  // namespace
}  // namespace dsv4
