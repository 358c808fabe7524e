// qnorm_rope_kv_insert against float64 (docs/spec.md §2 steps 1–2, §3, §7) for all four KV layouts:
//   q: per-head RMSNorm (no weight) then RoPE on the last 64 dims — bf16 output, 2^-8 relative
//      (elementwise for the nope dims, of the pair norm for rotated pairs).
//   kv: RoPE on the last 64 dims, then the layout's quantization computed here from docs/spec.md §7.
//      The nope dims are not rotated, so their FP8 values and UE8M0 scales are predicted exactly;
//      rotated dims are bf16 (2^-8 of the pair norm) or fp8 per-tensor (2^-4 relative + half the
//      subnormal quantum + the bf16 tolerance).
//   The cache bytes, decoded here with an independent docs/spec.md §7 decoder, equal the kv the op
//   returns; bytes outside the written tokens are untouched; slot -1 stores nothing.
//   With an FP8 query (Fp8QueryOutput): the codes are e4m3(q / q_scale) of the float64 q within
//   half an e4m3 step, saturating at ±448; q holds exactly what they mean, bf16(fp8 · q_scale);
//   kv and the cache are the bytes of the same call without one.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <tuple>
#include <vector>

#include "cuda_dispatch_support.h"
#include "dense_test_support.h"
#include "dsv4/ops.h"
#include "rope_reference.h"

namespace {
using namespace dense_test;
using dsv4::KvLayout;

constexpr float kEps = 1e-6f;
constexpr int64_t kMaxPos = 70000;
constexpr int64_t kRope = 64;

// ---- docs/spec.md §7 geometry and decoding, written independently of kv_layout.h ------------------
int layout_dim(KvLayout l) { return l == KvLayout::v32_fp8 ? 576 : 512; }
int64_t block_bytes(KvLayout l, int64_t B) {
  switch (l) {
    case KvLayout::model1_fp8: return (B * 584 + 575) / 576 * 576;
    case KvLayout::v32_fp8: return B * 656;
    case KvLayout::bf16: return B * 1024;
    case KvLayout::fp8_per_tensor: return B * 512;
  }
  return 0;
}
// Byte ranges [begin, end) of one token within its block.
std::vector<std::pair<int64_t, int64_t>> token_byte_ranges(KvLayout l, int64_t B, int64_t off) {
  switch (l) {
    case KvLayout::model1_fp8: return {{off * 576, off * 576 + 576}, {B * 576 + off * 8, B * 576 + off * 8 + 8}};
    case KvLayout::v32_fp8: return {{off * 656, off * 656 + 656}};
    case KvLayout::bf16: return {{off * 1024, off * 1024 + 1024}};
    case KvLayout::fp8_per_tensor: return {{off * 512, off * 512 + 512}};
  }
  return {};
}
double read_bf16(const uint8_t* p) { return bf16_value(static_cast<uint16_t>(p[0] | (p[1] << 8))); }
double read_f32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
// Value i of the token at `slot`.
double decode(KvLayout l, const uint8_t* cache, int64_t B, int64_t slot, int64_t i, double tensor_scale) {
  const uint8_t* block = cache + (slot / B) * block_bytes(l, B);
  const int64_t off = slot % B;
  switch (l) {
    case KvLayout::model1_fp8: {
      const uint8_t* row = block + off * 576;
      if (i >= 448) return read_bf16(row + 448 + 2 * (i - 448));
      return fp8_value(row[i]) * std::ldexp(1.0, block[B * 576 + off * 8 + i / 64] - 127);
    }
    case KvLayout::v32_fp8: {
      const uint8_t* row = block + off * 656;
      if (i >= 512) return read_bf16(row + 528 + 2 * (i - 512));
      return fp8_value(row[i]) * read_f32(row + 512 + 4 * (i / 128));
    }
    case KvLayout::bf16: return read_bf16(block + off * 1024 + 2 * i);
    case KvLayout::fp8_per_tensor: return fp8_value(block[off * 512 + i]) * tensor_scale;
  }
  return 0;
}

const HostTensor& rope_table(bool yarn) {
  static std::map<bool, HostTensor> tables;
  auto it = tables.find(yarn);
  if (it == tables.end()) it = tables.emplace(yarn, dsv4::build_rope_cache(yarn ? yarn_rope() : swa_rope(), kMaxPos)).first;
  return it->second;
}

// A batch: T tokens with distinct slots (token 3 has none: -1) spread over the cache, positions
// including 0 and the last table row.
struct Batch {
  HostTensor q, kv, positions, slots;
  std::vector<double> qd, kvd;
};
Batch make_batch(int64_t T, int64_t H, int64_t D, int64_t num_slots, uint64_t seed) {
  Batch b{random_tensor(DType::bf16, {T, H, D}, seed), random_tensor(DType::bf16, {T, D}, seed + 1),
          HostTensor(DType::int64, {T}), HostTensor(DType::int64, {T}), {}, {}};
  // Token magnitudes differ (×2^-6 .. ×2^6) so the UE8M0 scales differ too.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i)
      b.kv.set(t * D + i, static_cast<float>(std::ldexp(at(b.kv, t * D + i), static_cast<int>((t * 5) % 13) - 6)));
  std::mt19937_64 rng(seed);
  std::vector<int64_t> perm(static_cast<size_t>(num_slots));
  for (int64_t i = 0; i < num_slots; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t t = 0; t < T; ++t) {
    b.slots.data<int64_t>()[t] = t == 3 ? -1 : perm[t];
    b.positions.data<int64_t>()[t] = t == 0 ? 0 : t == 1 ? kMaxPos - 1 : static_cast<int64_t>(rng() % kMaxPos);
  }
  b.qd = to_doubles(b.q);
  b.kvd = to_doubles(b.kv);
  return b;
}

// Float64 q of token t, head h after the head norm and RoPE (`value`), and per value the magnitude
// its fp32 computation's error scales with (`magnitude`: the value itself for a nope dim, its
// pair's norm for a rotated one).
struct HeadQuery {
  std::vector<double> value, magnitude;
};
HeadQuery reference_query(const Batch& b, int64_t t, int64_t h, int64_t H, int64_t D,
                          const std::vector<double>& freqs) {
  const int64_t p = b.positions.data<int64_t>()[t], base = (t * H + h) * D;
  double ss = 0;
  for (int64_t i = 0; i < D; ++i) ss += b.qd[base + i] * b.qd[base + i];
  const double inv = 1.0 / std::sqrt(ss / D + kEps);
  HeadQuery q{std::vector<double>(D), std::vector<double>(D)};
  for (int64_t i = 0; i < D - kRope; ++i) {
    q.value[i] = b.qd[base + i] * inv;
    q.magnitude[i] = std::fabs(q.value[i]);
  }
  for (int64_t j = 0; j < kRope / 2; ++j) {
    const int64_t i = D - kRope + 2 * j;
    reference_rotate(b.qd[base + i] * inv, b.qd[base + i + 1] * inv, p * freqs[j], q.value[i], q.value[i + 1]);
    q.magnitude[i] = q.magnitude[i + 1] = std::hypot(q.value[i], q.value[i + 1]);
  }
  return q;
}

// Float64 expectation of the layout's stored value for dim i of a token whose RoPE'd kv is `v`,
// exact for the nope dims; `exact` says whether it is.
double expected_stored(KvLayout l, const std::vector<double>& v, int64_t i, double tensor_scale, bool& exact) {
  const int64_t D = static_cast<int64_t>(v.size()), N = D - kRope;
  exact = i < N;
  auto block_quant = [&](int64_t block) {
    const int64_t b0 = i / block * block;
    double amax = 0;
    for (int64_t j = b0; j < b0 + block; ++j) amax = std::max(amax, std::fabs(v[j]));
    const int k = ue8m0_exponent(amax);
    return fp8_round(std::ldexp(v[i], -k)) * std::ldexp(1.0, k);
  };
  switch (l) {
    case KvLayout::model1_fp8: return i < N ? block_quant(64) : v[i];
    case KvLayout::v32_fp8: return i < N ? block_quant(128) : v[i];
    case KvLayout::bf16: return v[i];
    case KvLayout::fp8_per_tensor: return fp8_round(v[i] / tensor_scale) * tensor_scale;
  }
  return 0;
}

struct Case {
  KvLayout layout;
  int64_t H;
  int64_t block_size;
  bool yarn;
};
class QnormRopeKvInsert : public ::testing::TestWithParam<Case> {};

TEST_P(QnormRopeKvInsert, MatchesFloat64AndCacheRoundTrips) {
  const Case c = GetParam();
  const int64_t T = 6, D = layout_dim(c.layout), B = c.block_size, num_blocks = 4;
  const double tensor_scale = 0.0625;
  HostTensor cache = HostTensor(DType::uint8, {num_blocks, block_bytes(c.layout, B)});
  cache.fill_bytes(0xAB);
  const auto cache_before = bytes_of(cache);
  Batch b = make_batch(T, c.H, D, num_blocks * B, 40 + c.H + B);
  const dsv4::KvCacheView view{cache.view(), c.layout, static_cast<int>(B), static_cast<float>(tensor_scale)};
  dsv4::qnorm_rope_kv_insert(b.q, b.kv, b.positions, rope_table(c.yarn), kEps, view, b.slots);

  const std::vector<double> f = reference_rope_freqs(c.yarn ? yarn_rope() : swa_rope());
  const double bf16_rel = std::ldexp(1.0, -8);
  std::vector<bool> written(cache.nbytes(), false);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = b.positions.data<int64_t>()[t];
    // q: head norm then RoPE, rounded once to bf16.
    for (int64_t h = 0; h < c.H; ++h) {
      const HeadQuery want = reference_query(b, t, h, c.H, D, f);
      for (int64_t i = 0; i < D; ++i)
        ASSERT_NEAR(at(b.q, (t * c.H + h) * D + i), want.value[i], bf16_rel * want.magnitude[i])
            << "q t " << t << " h " << h << " i " << i;
    }
    // kv: RoPE in float64, then the layout's quantization.
    std::vector<double> v(b.kvd.begin() + t * D, b.kvd.begin() + (t + 1) * D);
    for (int64_t j = 0; j < kRope / 2; ++j) {
      const int64_t i = D - kRope + 2 * j;
      double ya, yb;
      reference_rotate(v[i], v[i + 1], p * f[j], ya, yb);
      v[i] = ya;
      v[i + 1] = yb;
    }
    const int64_t slot = b.slots.data<int64_t>()[t];
    for (int64_t i = 0; i < D; ++i) {
      bool exact = false;
      const double want = expected_stored(c.layout, v, i, tensor_scale, exact);
      const double got = at(b.kv, t * D + i);
      if (exact) {
        ASSERT_EQ(got, want) << "kv t " << t << " i " << i;
      } else {
        const int64_t pair = D - kRope + (i - (D - kRope)) / 2 * 2;
        double tol = bf16_rel * std::hypot(v[pair], v[pair + 1]);
        if (c.layout == KvLayout::fp8_per_tensor) tol += std::ldexp(std::fabs(want), -4) + tensor_scale * std::ldexp(1.0, -10);
        ASSERT_NEAR(got, want, tol) << "kv t " << t << " i " << i;
      }
      if (slot >= 0) {
        ASSERT_EQ(got, decode(c.layout, cache.data<uint8_t>(), B, slot, i, tensor_scale)) << "cache t " << t << " i " << i;
      }
    }
    if (slot >= 0) {
      for (const auto& [lo, hi] : token_byte_ranges(c.layout, B, slot % B))
        for (int64_t k = lo; k < hi; ++k) written[(slot / B) * block_bytes(c.layout, B) + k] = true;
      if (c.layout == KvLayout::model1_fp8) {  // the scale row's pad byte is zero
        EXPECT_EQ(cache.data<uint8_t>()[(slot / B) * block_bytes(c.layout, B) + B * 576 + (slot % B) * 8 + 7], 0);
      }
    }
  }
  for (size_t k = 0; k < written.size(); ++k)
    if (!written[k]) {
      ASSERT_EQ(cache.data<uint8_t>()[k], cache_before[k]) << "stray write at byte " << k;
    }
}

std::vector<Case> insert_grid() {
  std::vector<Case> grid;
  for (const KvLayout l : {KvLayout::model1_fp8, KvLayout::v32_fp8, KvLayout::bf16, KvLayout::fp8_per_tensor})
    for (const int64_t H : {16, 64, 128})
      for (const int64_t B : {64, 3}) grid.push_back({l, H, B, H != 64});
  return grid;
}
INSTANTIATE_TEST_SUITE_P(Grid, QnormRopeKvInsert, ::testing::ValuesIn(insert_grid()), [](const auto& info) {
  std::ostringstream n;
  n << dsv4::kv_layout_name(info.param.layout) << "_H" << info.param.H << "_B" << info.param.block_size
    << (info.param.yarn ? "_yarn" : "");
  return n.str();
});

// A per-tensor scale that is not a power of two: the returned kv is the bf16 rounding of
// fp8 · scale, within one bf16 rounding of the decoded cache value.
TEST(QnormRopeKvInsertEdges, PerTensorArbitraryScale) {
  const int64_t T = 6, D = 512, B = 16;
  HostTensor cache = HostTensor::zeros(DType::uint8, {2, block_bytes(KvLayout::fp8_per_tensor, B)});
  Batch b = make_batch(T, 16, D, 2 * B, 3);
  const double ts = 0.37;
  dsv4::qnorm_rope_kv_insert(b.q, b.kv, b.positions, rope_table(false), kEps,
                             {cache.view(), KvLayout::fp8_per_tensor, static_cast<int>(B), static_cast<float>(ts)}, b.slots);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = b.slots.data<int64_t>()[t];
    if (slot < 0) continue;
    for (int64_t i = 0; i < D; ++i) {
      const double want = decode(KvLayout::fp8_per_tensor, cache.data<uint8_t>(), B, slot, i, ts);
      ASSERT_NEAR(at(b.kv, t * D + i), want, std::ldexp(std::fabs(want), -8));
    }
  }
}

// ---- the FP8 query (Fp8QueryOutput) -------------------------------------------------------------
// The nearest bf16 of v (round to nearest even), from the format's definition.
double bf16_round(double v) {
  const float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_value(static_cast<uint16_t>(u >> 16));
}

struct Fp8QueryCase {
  KvLayout layout;
  float q_scale;
};
class QnormRopeKvInsertFp8Query : public ::testing::TestWithParam<Fp8QueryCase> {};

// Per q value x (float64, reference_query), with s = q_scale:
//   fp8(code) · s == sat(x) within half an e4m3 step: 2^-4 |sat(x)| for a normal code, half the
//   subnormal quantum 2^-9 (in units of s) below, plus 2^-16 of the value's magnitude for the fp32
//   norm / RoPE / 1/s arithmetic ahead of the rounding (~1e-6 relative, far below an fp8 step);
//   sat(x) = x clamped to ±448 · s (e4m3's largest finite value; saturated codes are exactly ±448);
//   q == bf16(fp8(code) · s) exactly (two exact values, their product rounded once to fp32 then to
//   bf16: what the op states q holds).
// The codes sit in a wider poisoned buffer (heads and rows padded): every code is written (none
// is the NaN poison), the padding is not. kv and the cache equal the call without an FP8 query.
TEST_P(QnormRopeKvInsertFp8Query, CodesAreTheScaledQueryAndQHoldsWhatTheyMean) {
  const Fp8QueryCase c = GetParam();
  const int64_t T = 6, H = 16, D = layout_dim(c.layout), B = 8, num_blocks = 2;
  const double s = c.q_scale;
  HostTensor cache = HostTensor(DType::uint8, {num_blocks, block_bytes(c.layout, B)});
  HostTensor cache_plain = HostTensor(DType::uint8, {num_blocks, block_bytes(c.layout, B)});
  cache.fill_bytes(0xAB);
  cache_plain.fill_bytes(0xAB);
  Batch b = make_batch(T, H, D, num_blocks * B, 77), plain = make_batch(T, H, D, num_blocks * B, 77);
  const int64_t head_pad = 1, row_pad = 16;
  HostTensor codes_buf = poisoned(DType::fp8_e4m3, {T, H + head_pad, D + row_pad});
  TensorView q_fp8(codes_buf.data<uint8_t>(), DType::fp8_e4m3, {T, H, D});
  q_fp8.strides = {(H + head_pad) * (D + row_pad), D + row_pad, 1};
  const float kv_scale = 0.0625f;
  dsv4::qnorm_rope_kv_insert(b.q, b.kv, b.positions, rope_table(false), kEps,
                             {cache.view(), c.layout, static_cast<int>(B), kv_scale}, b.slots,
                             dsv4::Fp8QueryOutput{q_fp8, c.q_scale});
  dsv4::qnorm_rope_kv_insert(plain.q, plain.kv, plain.positions, rope_table(false), kEps,
                             {cache_plain.view(), c.layout, static_cast<int>(B), kv_scale}, plain.slots);
  ASSERT_EQ(bytes_of(b.kv), bytes_of(plain.kv));
  ASSERT_EQ(bytes_of(cache), bytes_of(cache_plain));

  const std::vector<double> f = reference_rope_freqs(swa_rope());
  const uint8_t* buf = codes_buf.data<uint8_t>();
  int saturated = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const HeadQuery want = reference_query(b, t, h, H, D, f);
      const uint8_t* codes = buf + t * q_fp8.strides[0] + h * q_fp8.strides[1];
      for (int64_t i = 0; i < D; ++i) {
        SCOPED_TRACE(::testing::Message() << "t " << t << " h " << h << " i " << i);
        ASSERT_NE(codes[i] & 0x7F, 0x7F) << "a NaN code: unwritten";
        const double x = want.value[i], sat = std::clamp(x, -448.0 * s, 448.0 * s);
        const double got = fp8_value(codes[i]) * s;
        ASSERT_NEAR(got, sat, std::ldexp(std::fabs(sat), -4) + std::ldexp(s, -10) +
                                  std::ldexp(want.magnitude[i], -16));
        if (std::fabs(x) >= 464.0 * s) {  // beyond the rounding range of 448: saturated
          ASSERT_EQ(codes[i] & 0x7F, 0x7E);
          ++saturated;
        }
        ASSERT_EQ(at(b.q, (t * H + h) * D + i), bf16_round(got));
      }
    }
  if (c.q_scale < 1.0f / 256) {
    EXPECT_GT(saturated, 0) << "the saturating case saturated nothing";
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H + head_pad; ++h)
      for (int64_t i = 0; i < D + row_pad; ++i)
        if (h >= H || i >= D) {
          ASSERT_EQ(buf[(t * (H + head_pad) + h) * (D + row_pad) + i], 0xFF) << "padding written";
        }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, QnormRopeKvInsertFp8Query,
    ::testing::Values(Fp8QueryCase{KvLayout::fp8_per_tensor, 0.37f}, Fp8QueryCase{KvLayout::fp8_per_tensor, 1.0f},
                      Fp8QueryCase{KvLayout::model1_fp8, 0.37f}, Fp8QueryCase{KvLayout::v32_fp8, 0.37f},
                      Fp8QueryCase{KvLayout::bf16, 0.37f},
                      // q_scale 2^-9: the normed q (|x| up to ~2) exceeds 448 · 2^-9 = 0.875.
                      Fp8QueryCase{KvLayout::fp8_per_tensor, 1.0f / 512}),
    [](const auto& info) {
      std::ostringstream n;
      n << dsv4::kv_layout_name(info.param.layout) << "_q_scale_"
        << (info.param.q_scale == 0.37f ? "0_37" : info.param.q_scale == 1.0f ? "1" : "2e_9");
      return n.str();
    });

class QnormRopeKvInsertErrors : public ::testing::Test {
 protected:
  static constexpr int64_t T = 4, H = 16, D = 512, B = 8, kBlocks = 2;
  HostTensor cache = HostTensor(DType::uint8, {kBlocks, block_bytes(KvLayout::model1_fp8, B)});
  Batch b = make_batch(T, H, D, kBlocks * B, 9);
  HostTensor q_fp8 = HostTensor(DType::fp8_e4m3, {T, H, D});  // an FP8 query output, 0x5A bytes
  dsv4::KvCacheView view() const { return {cache.view(), KvLayout::model1_fp8, static_cast<int>(B), 1.0f}; }

  void SetUp() override {
    cache.fill_bytes(0x5A);
    q_fp8.fill_bytes(0x5A);
  }
  // Runs `check` (which expects the calls it makes to be refused), then checks q, kv, the cache
  // and q_fp8 are unchanged.
  void expect_unchanged(const std::function<void()>& check, const std::string& what) {
    const auto q0 = bytes_of(b.q), kv0 = bytes_of(b.kv), c0 = bytes_of(cache), f0 = bytes_of(q_fp8);
    check();
    EXPECT_EQ(bytes_of(b.q), q0) << what;
    EXPECT_EQ(bytes_of(b.kv), kv0) << what;
    EXPECT_EQ(bytes_of(cache), c0) << what;
    EXPECT_EQ(bytes_of(q_fp8), f0) << what;
  }
  // Runs the call expecting the error, then checks q, kv and the cache are unchanged.
  void expect_rejected(const std::function<void()>& call, std::vector<std::string> parts) {
    expect_unchanged([&] { expect_error(call, parts); }, parts.front());
  }
  void call(const TensorView& slots, const TensorView& positions) {
    dsv4::qnorm_rope_kv_insert(b.q, b.kv, positions, rope_table(false), kEps, view(), slots);
  }
};

// The FP8 query output: dtype, shape, strides, scale and memory checked before anything is written
// (q_fp8 included), each error naming q_fp8 or q_scale; a data error (a bad slot) found with an
// FP8 query writes no code either.
TEST_F(QnormRopeKvInsertErrors, Fp8QueryOutput) {
  const HostTensor& table = rope_table(false);
  auto call = [&](const TensorView& codes, float q_scale) {
    dsv4::qnorm_rope_kv_insert(b.q, b.kv, b.positions, table, kEps, view(), b.slots,
                               dsv4::Fp8QueryOutput{codes, q_scale});
  };
  HostTensor q_bf16(DType::bf16, {T, H, D}), q_fewer_heads(DType::fp8_e4m3, {T, H - 1, D});
  HostTensor wide = HostTensor::zeros(DType::fp8_e4m3, {T, H, 2 * D});
  TensorView every_other(wide.data<uint8_t>(), DType::fp8_e4m3, {T, H, D});
  every_other.strides = {H * 2 * D, 2 * D, 2};
  TensorView heads_alias = q_fp8.view();  // every head of a token at the same address
  heads_alias.strides[1] = 0;
  TensorView negative = q_fp8.view();
  negative.strides[0] = -H * D;
  expect_rejected([&] { call(q_bf16, 0.5f); }, {"qnorm_rope_kv_insert", "q_fp8.dtype", "fp8_e4m3", "bf16"});
  expect_rejected([&] { call(q_fewer_heads, 0.5f); }, {"q_fp8.shape", "15"});
  expect_rejected([&] { call(every_other, 0.5f); }, {"q_fp8.stride(-1)", "expected 1", "got 2"});
  expect_rejected([&] { call(heads_alias, 0.5f); }, {"q_fp8", "do not overlap"});
  expect_rejected([&] { call(negative, 0.5f); }, {"q_fp8"});
  for (const float bad : {0.0f, -0.5f, INFINITY, NAN, -INFINITY})
    expect_rejected([&] { call(q_fp8, bad); }, {"qnorm_rope_kv_insert", "q_scale", "a finite value > 0"});
  // A scale whose largest query (448 · q_scale) overflows the bf16 q.
  expect_rejected([&] { call(q_fp8, 1e36f); }, {"q_scale", "bf16(448 * q_scale), is finite", "1e+36"});
  // A scale without codes would be ignored: refused.
  expect_rejected([&] { call(TensorView{}, 2.0f); }, {"q_scale", "1 without q_fp8"});
  // Memory: codes sharing bytes with q, kv or an input (outputs are written while those are used).
  expect_rejected([&] { call(TensorView(b.q.data<uint8_t>(), DType::fp8_e4m3, {T, H, D}), 0.5f); },
                  {"q_fp8: expected memory disjoint from q"});
  HostTensor shared = HostTensor::zeros(DType::fp8_e4m3, {T, H, D});  // codes, with kv / positions inside
  const auto shared0 = bytes_of(shared);
  expect_rejected([&] {
    dsv4::qnorm_rope_kv_insert(b.q, TensorView(shared.data<uint8_t>(), DType::bf16, {T, D}), b.positions, table,
                               kEps, view(), b.slots, dsv4::Fp8QueryOutput{shared, 0.5f});
  }, {"kv: expected memory disjoint from q_fp8"});
  expect_rejected([&] {
    dsv4::qnorm_rope_kv_insert(b.q, b.kv, TensorView(shared.data<uint8_t>(), DType::int64, {T}), table, kEps,
                               view(), b.slots, dsv4::Fp8QueryOutput{shared, 0.5f});
  }, {"q_fp8: expected memory disjoint from positions"});
  EXPECT_EQ(bytes_of(shared), shared0);
  expect_rejected([&] { call(on_cuda(q_fp8), 0.5f); }, {"q_fp8", "device"});
  // A bad slot with an FP8 query: refused before any code is written.
  HostTensor bad_slots = HostTensor::zeros(DType::int64, {T});
  bad_slots.data<int64_t>()[1] = -7;
  expect_rejected([&] {
    dsv4::qnorm_rope_kv_insert(b.q, b.kv, b.positions, table, kEps, view(), bad_slots,
                               dsv4::Fp8QueryOutput{q_fp8, 0.5f});
  }, {"slot_mapping[1]"});
}

TEST_F(QnormRopeKvInsertErrors, SlotsOutsideTheCache) {
  for (const int64_t bad : {kBlocks * B, int64_t{-2}, int64_t{1} << 40}) {
    HostTensor slots = HostTensor::zeros(DType::int64, {T});
    for (int64_t t = 0; t < T; ++t) slots.data<int64_t>()[t] = t;
    slots.data<int64_t>()[2] = bad;
    expect_rejected([&] { call(slots, b.positions); },
                    {"qnorm_rope_kv_insert", "slot_mapping[2]", "[0, 16)", std::to_string(bad)});
  }
}

TEST_F(QnormRopeKvInsertErrors, DuplicateSlots) {
  HostTensor slots = HostTensor::zeros(DType::int64, {T});
  for (int64_t t = 0; t < T; ++t) slots.data<int64_t>()[t] = t == 3 ? 1 : t;
  expect_rejected([&] { call(slots, b.positions); }, {"slot_mapping", "distinct", "slot 1"});
}

TEST_F(QnormRopeKvInsertErrors, PositionsOutsideTheTable) {
  HostTensor pos = HostTensor::zeros(DType::int64, {T});
  pos.data<int64_t>()[1] = kMaxPos;
  expect_rejected([&] { call(b.slots, pos); }, {"positions[1]", "got 70000"});
  pos.data<int64_t>()[1] = -5;
  expect_rejected([&] { call(b.slots, pos); }, {"positions[1]", "got -5"});
}

TEST_F(QnormRopeKvInsertErrors, ShapesDtypesAndCache) {
  const HostTensor& table = rope_table(false);
  HostTensor q32(DType::fp32, {T, H, D}), kv_short(DType::bf16, {T, 448}), q_short(DType::bf16, {T, H, 448});
  HostTensor slots_len = HostTensor::zeros(DType::int64, {T + 1});
  HostTensor kv_t(DType::bf16, {T + 1, D});
  HostTensor wrong_cache(DType::uint8, {kBlocks, block_bytes(KvLayout::model1_fp8, B) + 1});
  HostTensor v32_cache(DType::uint8, {kBlocks, block_bytes(KvLayout::v32_fp8, B)});
  HostTensor pt_cache(DType::uint8, {kBlocks, block_bytes(KvLayout::fp8_per_tensor, B)});
  const int B32 = static_cast<int>(B);
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(q32, b.kv, b.positions, table, kEps, view(), b.slots); },
                  {"q.dtype", "bf16", "fp32"});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(b.q, kv_short, b.positions, table, kEps, view(), b.slots); },
                  {"kv.shape"});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(b.q, kv_t, b.positions, table, kEps, view(), b.slots); },
                  {"kv.shape"});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(b.q, b.kv, b.positions, table, kEps, view(), slots_len); },
                  {"slot_mapping.shape[0]", "expected 4", "got 5"});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(b.q, b.kv, b.positions, table, kEps,
                                                   {wrong_cache.view(), KvLayout::model1_fp8, B32, 1.0f}, b.slots); },
                  {"qnorm_rope_kv_insert", "cache"});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(q_short, kv_short, b.positions, table, kEps, view(), b.slots); },
                  {"kv.shape[1]", "512", "MODEL1_FP8", "got 448"});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(b.q, b.kv, b.positions, table, kEps,
                                                   {v32_cache.view(), KvLayout::v32_fp8, B32, 1.0f}, b.slots); },
                  {"kv.shape[1]", "576", "V32_FP8"});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(b.q, b.kv, b.positions, table, kEps,
                                                   {pt_cache.view(), KvLayout::fp8_per_tensor, B32, 0.0f}, b.slots); },
                  {"cache.tensor_scale", "> 0"});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(b.q, b.kv, b.positions, table, -1.0f, view(), b.slots); },
                  {"eps"});
  // Right shapes, but every other element of a wider buffer: the head dim must be contiguous.
  HostTensor kv_wide = random_tensor(DType::bf16, {T, 2 * D}, 11), q_wide = random_tensor(DType::bf16, {T, H, 2 * D}, 12);
  TensorView kv_strided(kv_wide.view().data, DType::bf16, {T, D}), q_strided(q_wide.view().data, DType::bf16, {T, H, D});
  kv_strided.strides = {2 * D, 2};
  q_strided.strides = {H * 2 * D, 2 * D, 2};
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(b.q, kv_strided, b.positions, table, kEps, view(), b.slots); },
                  {"kv.stride(-1)", "expected 1", "got 2"});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(q_strided, b.kv, b.positions, table, kEps, view(), b.slots); },
                  {"q.stride(-1)", "expected 1", "got 2"});
  TensorView q_heads_alias = b.q.view();  // every head of a token at the same address
  q_heads_alias.strides[1] = 0;
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(q_heads_alias, b.kv, b.positions, table, kEps, view(), b.slots); },
                  {"q", "do not overlap"});
  HostTensor slots_i8(DType::uint8, {T});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(b.q, b.kv, b.positions, table, kEps, view(), slots_i8); },
                  {"slot_mapping.dtype", "int64 or int32"});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(on_cuda(b.q), b.kv, b.positions, table, kEps, view(), b.slots); },
                  {"device"});
  dsv4::KvCacheView cuda_cache = view();
  cuda_cache.data = on_cuda(cuda_cache.data);
  expect_unchanged(
      [&] {
        dsv4::test::expect_cuda_dispatch("qnorm_rope_kv_insert", dsv4::ops::kQnormRopeKvInsert, [&] {
          dsv4::qnorm_rope_kv_insert(on_cuda(b.q), on_cuda(b.kv), on_cuda(b.positions), on_cuda(table.view()),
                                     kEps, cuda_cache, on_cuda(b.slots));
        });
      },
      "all-CUDA arguments");
}

}  // namespace
