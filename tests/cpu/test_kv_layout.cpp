// KV layouts (docs/spec.md §7): byte geometry against numbers written out by hand, exact bytes of
// hand-built tokens, quantize → dequantize error bounds derived independently here, and
// rejection of bad input with the cache left untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <random>
#include <vector>

#include "dsv4/kv_layout.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;
using dsv4::KvCacheView;
using dsv4::KvLayout;

// ---------------------------------------------------------------------------------------------
// Geometry. Every number below was computed by hand from docs/spec.md §7, e.g. MODEL1 at B = 64:
// data rows 64 x 576 = 36864 B, scale rows 64 x 8 = 512 B, total 37376 B, padded up to the next
// multiple of 576 = 65 x 576 = 37440 B.
struct GeometryCase {
  KvLayout layout;
  int block_size;
  int dim;
  int token_bytes;
  int64_t block_bytes;
  int64_t last_data_offset;   // data_offset(B - 1)
  int64_t first_scale_offset;  // scale_offset(0)
  int64_t last_scale_offset;   // scale_offset(B - 1)
};

class KvGeometryTest : public ::testing::TestWithParam<GeometryCase> {};

TEST_P(KvGeometryTest, MatchesHandComputedBytes) {
  const GeometryCase c = GetParam();
  const dsv4::KvGeometry g = dsv4::kv_geometry(c.layout, c.block_size);
  EXPECT_EQ(g.layout, c.layout);
  EXPECT_EQ(g.block_size, c.block_size);
  EXPECT_EQ(g.dim, c.dim);
  EXPECT_EQ(g.token_bytes, c.token_bytes);
  EXPECT_EQ(g.block_bytes, c.block_bytes);
  EXPECT_EQ(g.data_offset(0), 0);
  EXPECT_EQ(g.data_offset(c.block_size - 1), c.last_data_offset);
  EXPECT_EQ(g.scale_offset(0), c.first_scale_offset);
  EXPECT_EQ(g.scale_offset(c.block_size - 1), c.last_scale_offset);
}

INSTANTIATE_TEST_SUITE_P(
    HandComputed, KvGeometryTest,
    ::testing::Values(
        // MODEL1_FP8: [B x 576 data][B x 8 scales], padded to a multiple of 576.
        //   B=1:   576 + 8 = 584 → 1152 (2 x 576); scales at 576.
        GeometryCase{KvLayout::model1_fp8, 1, 512, 584, 1152, 0, 576, 576},
        //   B=64:  36864 + 512 = 37376 → 37440; last data row 63 x 576 = 36288;
        //          scales from 36864, last at 36864 + 63 x 8 = 37368.
        GeometryCase{KvLayout::model1_fp8, 64, 512, 584, 37440, 36288, 36864, 37368},
        //   B=256: 147456 + 2048 = 149504 → 149760 (260 x 576); last data row 146880;
        //          scales from 147456, last at 147456 + 255 x 8 = 149496.
        GeometryCase{KvLayout::model1_fp8, 256, 512, 584, 149760, 146880, 147456, 149496},
        // V32_FP8: 656 B per token, interleaved; scales live inside the token (same offset).
        GeometryCase{KvLayout::v32_fp8, 1, 576, 656, 656, 0, 0, 0},
        GeometryCase{KvLayout::v32_fp8, 64, 576, 656, 41984, 41328, 0, 41328},
        GeometryCase{KvLayout::v32_fp8, 256, 576, 656, 167936, 167280, 0, 167280},
        // BF16: 1024 B per token.
        GeometryCase{KvLayout::bf16, 1, 512, 1024, 1024, 0, 0, 0},
        GeometryCase{KvLayout::bf16, 64, 512, 1024, 65536, 64512, 0, 64512},
        GeometryCase{KvLayout::bf16, 256, 512, 1024, 262144, 261120, 0, 261120},
        // FP8_PER_TENSOR: 512 B per token.
        GeometryCase{KvLayout::fp8_per_tensor, 1, 512, 512, 512, 0, 0, 0},
        GeometryCase{KvLayout::fp8_per_tensor, 64, 512, 512, 32768, 32256, 0, 32256},
        GeometryCase{KvLayout::fp8_per_tensor, 256, 512, 512, 131072, 130560, 0, 130560}),
    [](const auto& info) {
      return std::string(dsv4::kv_layout_name(info.param.layout)) + "_B" +
             std::to_string(info.param.block_size);
    });

TEST(KvGeometry, RejectsBadBlockSize) {
  EXPECT_THROW(dsv4::kv_geometry(KvLayout::model1_fp8, 0), dsv4::Error);
  EXPECT_THROW(dsv4::kv_geometry(KvLayout::bf16, -64), dsv4::Error);
}

TEST(KvLayoutName, ParsesBothCasesAndRejectsUnknown) {
  EXPECT_EQ(dsv4::parse_kv_layout("model1_fp8"), KvLayout::model1_fp8);
  EXPECT_EQ(dsv4::parse_kv_layout("MODEL1_FP8"), KvLayout::model1_fp8);
  EXPECT_EQ(dsv4::parse_kv_layout("V32_FP8"), KvLayout::v32_fp8);
  EXPECT_EQ(dsv4::parse_kv_layout("bf16"), KvLayout::bf16);
  EXPECT_EQ(dsv4::parse_kv_layout("Fp8_Per_Tensor"), KvLayout::fp8_per_tensor);
  try {
    dsv4::parse_kv_layout("fp4");
    FAIL() << "no error";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fp4'"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Helpers: a cache of `blocks` blocks poisoned with 0xAB, and fp32 rows / slot tensors.
struct TestCache {
  HostTensor storage;
  KvCacheView view;
  TestCache(KvLayout layout, int block_size, int64_t blocks, float tensor_scale = 1.0f) {
    const auto g = dsv4::kv_geometry(layout, block_size);
    storage = HostTensor(DType::uint8, {blocks, g.block_bytes});
    storage.fill_bytes(0xAB);
    view.data = storage.view();
    view.layout = layout;
    view.block_size = block_size;
    view.tensor_scale = tensor_scale;
  }
  const uint8_t* bytes() const { return storage.data<uint8_t>(); }
  std::vector<uint8_t> snapshot() const { return {bytes(), bytes() + storage.nbytes()}; }
};

HostTensor slots_tensor(const std::vector<int64_t>& s) {
  HostTensor t(DType::int64, {static_cast<int64_t>(s.size())});
  for (size_t i = 0; i < s.size(); ++i) t.data<int64_t>()[i] = s[i];
  return t;
}

uint16_t read_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
float read_f32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// ---------------------------------------------------------------------------------------------
// Exact bytes of a hand-built token. Nope quantization blocks:
//   block 0: amax 448 → scale 2^ceil(log2(448/448)) = 2^0, UE8M0 byte 127; 1.0 → fp8 0x38,
//            -448 → 0xFE.
//   block 1: amax 1.0 → 1/448 = 2^-8.8 → scale 2^-8, byte 119; 1.0/2^-8 = 256 = 2^8 → fp8
//            exponent field 8+7 = 15, mantissa 0 → 0x78; 0.5 → 128 → 0x70.
//   others : all zero → amax/448 = 0 is floored to 1e-4 → 2^ceil(log2 1e-4) = 2^ceil(-13.29)
//            = 2^-13, byte 114; values 0x00.
// Rope: 1.0 → bf16 0x3F80, -2.0 → 0xC000.
std::vector<float> hand_token(int dim, int nope, int quant_block) {
  std::vector<float> v(static_cast<size_t>(dim), 0.0f);
  v[0] = 1.0f;
  v[1] = -448.0f;
  v[static_cast<size_t>(quant_block)] = 1.0f;
  v[static_cast<size_t>(quant_block) + 1] = 0.5f;
  v[static_cast<size_t>(nope)] = 1.0f;
  v[static_cast<size_t>(nope) + 1] = -2.0f;
  return v;
}

TEST(KvQuantize, Model1HandBuiltTokenExactBytes) {
  // Block size 2, token at offset 1 of block 1 (slot 3): data row at 576, scale row at
  // 2 x 576 + 8 = 1160 inside the block; block bytes 2 x 584 = 1168 → 1728.
  TestCache cache(KvLayout::model1_fp8, 2, 2);
  ASSERT_EQ(cache.storage.shape()[1], 1728);
  const std::vector<float> v = hand_token(512, 448, 64);
  HostTensor values(DType::fp32, {1, 512});
  std::copy(v.begin(), v.end(), values.data<float>());
  dsv4::kv_quantize(cache.view, values, slots_tensor({3}));

  const uint8_t* block = cache.bytes() + 1728;
  const uint8_t* row = block + 576;
  EXPECT_EQ(row[0], 0x38);
  EXPECT_EQ(row[1], 0xFE);
  EXPECT_EQ(row[2], 0x00);
  EXPECT_EQ(row[64], 0x78);
  EXPECT_EQ(row[65], 0x70);
  EXPECT_EQ(row[447], 0x00);
  EXPECT_EQ(read_u16(row + 448), 0x3F80);
  EXPECT_EQ(read_u16(row + 450), 0xC000);
  EXPECT_EQ(read_u16(row + 452), 0x0000);
  const uint8_t* scales = block + 1160;
  const uint8_t want_scales[8] = {127, 119, 114, 114, 114, 114, 114, 0};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(scales[i], want_scales[i]) << "scale byte " << i;
  // Untouched: token 0's data and scale rows of block 1, the padding, and all of block 0.
  for (int i = 0; i < 576; ++i) ASSERT_EQ(block[i], 0xAB) << "block 1 byte " << i;
  for (int i = 1152; i < 1160; ++i) ASSERT_EQ(block[i], 0xAB) << "block 1 byte " << i;
  for (int i = 1168; i < 1728; ++i) ASSERT_EQ(block[i], 0xAB) << "padding byte " << i;
  for (int i = 0; i < 1728; ++i) ASSERT_EQ(cache.bytes()[i], 0xAB) << "block 0 byte " << i;
}

TEST(KvQuantize, V32HandBuiltTokenExactBytes) {
  // Block size 4, slot 2: token bytes [2 x 656, 3 x 656) of block 0. Scales are fp32 powers of
  // two at +512: 1.0, 2^-8, then 2^-13 twice; rope bf16 at +528.
  TestCache cache(KvLayout::v32_fp8, 4, 1);
  const std::vector<float> v = hand_token(576, 512, 128);
  HostTensor values(DType::fp32, {1, 576});
  std::copy(v.begin(), v.end(), values.data<float>());
  dsv4::kv_quantize(cache.view, values, slots_tensor({2}));
  const uint8_t* tok = cache.bytes() + 2 * 656;
  EXPECT_EQ(tok[0], 0x38);
  EXPECT_EQ(tok[1], 0xFE);
  EXPECT_EQ(tok[128], 0x78);
  EXPECT_EQ(tok[129], 0x70);
  EXPECT_EQ(read_f32(tok + 512), 1.0f);
  EXPECT_EQ(read_f32(tok + 516), 1.0f / 256.0f);
  EXPECT_EQ(read_f32(tok + 520), 1.0f / 8192.0f);
  EXPECT_EQ(read_f32(tok + 524), 1.0f / 8192.0f);
  EXPECT_EQ(read_u16(tok + 528), 0x3F80);
  EXPECT_EQ(read_u16(tok + 530), 0xC000);
  for (int i = 0; i < 2 * 656; ++i) ASSERT_EQ(cache.bytes()[i], 0xAB) << "byte " << i;
  for (int i = 3 * 656; i < 4 * 656; ++i) ASSERT_EQ(cache.bytes()[i], 0xAB) << "byte " << i;
}

TEST(KvQuantize, Bf16AndPerTensorHandBuiltTokenExactBytes) {
  TestCache bf(KvLayout::bf16, 2, 1);
  TestCache pt(KvLayout::fp8_per_tensor, 2, 1, /*tensor_scale=*/0.5f);
  HostTensor values(DType::fp32, {1, 512});
  for (int i = 0; i < 512; ++i) values.data<float>()[i] = 0.0f;
  values.data<float>()[0] = 1.0f;     // bf16 0x3F80; per-tensor 1.0/0.5 = 2 → fp8 0x40
  values.data<float>()[1] = -3.0f;    // bf16 0xC040; -6 → fp8 0xCC
  values.data<float>()[511] = 0.25f;  // bf16 0x3E80; 0.5 → fp8 0x30
  dsv4::kv_quantize(bf.view, values, slots_tensor({1}));
  dsv4::kv_quantize(pt.view, values, slots_tensor({1}));
  EXPECT_EQ(read_u16(bf.bytes() + 1024), 0x3F80);
  EXPECT_EQ(read_u16(bf.bytes() + 1026), 0xC040);
  EXPECT_EQ(read_u16(bf.bytes() + 1024 + 1022), 0x3E80);
  EXPECT_EQ(pt.bytes()[512], 0x40);
  EXPECT_EQ(pt.bytes()[513], 0xCC);
  EXPECT_EQ(pt.bytes()[1023], 0x30);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(bf.bytes()[i], 0xAB);
  for (int i = 0; i < 512; ++i) ASSERT_EQ(pt.bytes()[i], 0xAB);
}

// ---------------------------------------------------------------------------------------------
// Round trip: every element's error is at most half an ulp of the stored format at the stored
// (scaled) magnitude, times the scale — the rounding error of one round-to-nearest step. The
// scale is derived here from the docs/spec.md formula in double precision.

// Half-ulp of fp8 e4m3fn at magnitude y (y <= 448): subnormals (y < 2^-6) have ulp 2^-9,
// normals 2^(floor(log2 y) - 3).
double fp8_half_ulp(double y) {
  if (y < std::ldexp(1.0, -6)) return std::ldexp(1.0, -10);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(y))) - 4);
}
// Half-ulp of bf16 (8 significant bits) at magnitude y.
double bf16_half_ulp(double y) {
  if (y == 0) return 0;
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(y))) - 8);
}
double ue8m0_scale(double amax) {
  return std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(std::max(amax / 448.0, 1e-4)))));
}

struct RoundTripCase {
  KvLayout layout;
  int block_size;
  DType value_dtype;
  float tensor_scale;
};

class KvRoundTripTest : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(KvRoundTripTest, ErrorWithinHalfUlpTimesScale) {
  const RoundTripCase c = GetParam();
  const auto g = dsv4::kv_geometry(c.layout, c.block_size);
  const int64_t blocks = 3, n = 2 * c.block_size + 1;  // spans blocks, leaves slots unwritten
  TestCache cache(c.layout, c.block_size, blocks, c.tensor_scale);

  // Fresh non-zero data with a different magnitude per token and per 64-value group, so scales
  // differ across quantization blocks; stays inside ±448·tensor_scale for FP8_PER_TENSOR.
  std::mt19937 rng(1234 + c.block_size);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  HostTensor values(c.value_dtype, {n, g.dim});
  std::vector<double> x(static_cast<size_t>(n * g.dim));
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < g.dim; ++i) {
      const float mag = c.layout == KvLayout::fp8_per_tensor
                            ? 400.0f * c.tensor_scale * (0.1f + 0.9f * ((t + i / 64) % 5) / 4.0f)
                            : std::ldexp(1.0f, static_cast<int>((t * 7 + i / 64 * 3) % 17) - 8);
      float v = unit(rng) * mag;
      if (v == 0.0f) v = mag * 0.5f;
      values.set(t * g.dim + i, v);
      x[static_cast<size_t>(t * g.dim + i)] = values.get(t * g.dim + i);  // bf16-rounded input
    }
  // Token t goes to slot (t * 5) % (blocks * B): scattered, distinct.
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) slots[static_cast<size_t>(t)] = (t * 5) % (blocks * c.block_size);
  dsv4::kv_quantize(cache.view, values, slots_tensor(slots));

  HostTensor out(DType::fp32, {n, g.dim});
  out.fill_bytes(0xFF);  // NaN poison: any unwritten element fails the comparisons
  dsv4::kv_dequantize(cache.view, slots_tensor(slots), out);

  const int nope = c.layout == KvLayout::model1_fp8 ? 448 : c.layout == KvLayout::v32_fp8 ? 512 : 0;
  const int qblock = c.layout == KvLayout::model1_fp8 ? 64 : 128;
  for (int64_t t = 0; t < n; ++t) {
    for (int i = 0; i < g.dim; ++i) {
      const double xi = x[static_cast<size_t>(t * g.dim + i)];
      const double got = out.get(t * g.dim + i);
      double bound;
      if (c.layout == KvLayout::bf16 || i >= nope) {
        if (c.layout == KvLayout::fp8_per_tensor) {
          bound = fp8_half_ulp(std::fabs(xi) / c.tensor_scale) * c.tensor_scale;
        } else {
          bound = bf16_half_ulp(std::fabs(xi));
        }
      } else {
        double amax = 0;
        const int b0 = i / qblock * qblock;
        for (int k = b0; k < b0 + qblock; ++k)
          amax = std::max(amax, std::fabs(x[static_cast<size_t>(t * g.dim + k)]));
        const double s = ue8m0_scale(amax);
        bound = fp8_half_ulp(std::fabs(xi) / s) * s;
      }
      ASSERT_LE(std::fabs(got - xi), bound)
          << "token " << t << " value " << i << " x " << xi << " got " << got;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, KvRoundTripTest,
    ::testing::Values(RoundTripCase{KvLayout::model1_fp8, 1, DType::fp32, 1.0f},
                      RoundTripCase{KvLayout::model1_fp8, 64, DType::fp32, 1.0f},
                      RoundTripCase{KvLayout::model1_fp8, 16, DType::bf16, 1.0f},
                      RoundTripCase{KvLayout::v32_fp8, 1, DType::fp32, 1.0f},
                      RoundTripCase{KvLayout::v32_fp8, 64, DType::bf16, 1.0f},
                      RoundTripCase{KvLayout::bf16, 64, DType::fp32, 1.0f},
                      // Power-of-two tensor scales keep x / scale exact, so the bound is exact.
                      RoundTripCase{KvLayout::fp8_per_tensor, 64, DType::fp32, 0.25f},
                      RoundTripCase{KvLayout::fp8_per_tensor, 8, DType::bf16, 4.0f}),
    [](const auto& info) {
      return std::string(dsv4::kv_layout_name(info.param.layout)) + "_B" +
             std::to_string(info.param.block_size) + "_" +
             std::string(dsv4::dtype_name(info.param.value_dtype));
    });

TEST(KvDequantize, MinusOneSlotGivesZeroRowAndBf16Output) {
  TestCache cache(KvLayout::model1_fp8, 4, 1);
  HostTensor values(DType::fp32, {1, 512});
  for (int i = 0; i < 512; ++i) values.data<float>()[i] = 1.0f;  // exact in fp8 and bf16
  dsv4::kv_quantize(cache.view, values, slots_tensor({2}));
  HostTensor out(DType::bf16, {2, 512});
  out.fill_bytes(0xFF);
  dsv4::kv_dequantize(cache.view, slots_tensor({-1, 2}), out);
  for (int i = 0; i < 512; ++i) {
    ASSERT_EQ(out.get(i), 0.0f) << i;
    ASSERT_EQ(out.get(512 + i), 1.0f) << i;
  }
}

// V3.2's fp32 block scales are read as bf16, rounded to nearest even, as FlashMLA reads them
// (docs/spec.md §7). kv_quantize writes UE8M0 scales (exact either way), so these are written by
// hand, as another writer might: block 0's 1 + 2^-8 + 2^-12 reads as 1 + 2^-7 (rounded up; a
// float product would give 1.0042724609375), block 1's 3 · 2^-10 + 2^-20 as 3 · 2^-10 (down).
TEST(KvDequantize, V32ScaleIsReadAsBf16) {
  TestCache cache(KvLayout::v32_fp8, 4, 1);
  uint8_t* tok = cache.storage.data<uint8_t>() + 1 * 656;  // slot 1
  std::memset(tok, 0, 656);
  tok[0] = 0x38;    // 1.0
  tok[128] = 0x40;  // 2.0
  const float scales[4] = {1.0f + 0x1p-8f + 0x1p-12f, 3.0f * 0x1p-10f + 0x1p-20f, 1.0f, 1.0f};
  std::memcpy(tok + 512, scales, sizeof(scales));
  HostTensor out(DType::fp32, {1, 576});
  out.fill_bytes(0xFF);
  dsv4::kv_dequantize(cache.view, slots_tensor({1}), out);
  EXPECT_EQ(out.get(0), 1.0078125f);       // 1.0 · (1 + 2^-7)
  EXPECT_EQ(out.get(128), 0.005859375f);   // 2.0 · 3 · 2^-10
  EXPECT_EQ(out.get(1), 0.0f);
  EXPECT_EQ(out.get(575), 0.0f);
}

TEST(KvQuantize, MinusOneSlotIsSkippedAndInt32SlotsWork) {
  TestCache cache(KvLayout::bf16, 2, 1);
  HostTensor values(DType::fp32, {2, 512});
  for (int i = 0; i < 1024; ++i) values.data<float>()[i] = 2.0f;
  HostTensor slots(DType::int32, {2});
  slots.data<int32_t>()[0] = -1;
  slots.data<int32_t>()[1] = 0;
  dsv4::kv_quantize(cache.view, values, slots);
  EXPECT_EQ(read_u16(cache.bytes()), 0x4000);                    // slot 0 written (2.0)
  for (int i = 1024; i < 2048; ++i) ASSERT_EQ(cache.bytes()[i], 0xAB);  // slot 1 untouched
}

// A cache whose blocks are further apart than their bytes (FlashMLA's and vLLM's padded caches):
// each block holds exactly the bytes of the dense cache, its padding is never written, reads
// come back the same, and a block stride below the block bytes or off 16 bytes is refused.
TEST(KvQuantize, PaddedBlockStrideKeepsBlocksAndPadding) {
  for (const KvLayout layout : {KvLayout::model1_fp8, KvLayout::v32_fp8}) {
    SCOPED_TRACE(dsv4::kv_layout_name(layout));
    const auto g = dsv4::kv_geometry(layout, 4);
    const int64_t stride = g.block_bytes + 48;
    TestCache dense(layout, 4, 3);
    HostTensor padded_storage(DType::uint8, {3, stride});
    padded_storage.fill_bytes(0xAB);
    KvCacheView padded = dense.view;
    padded.data = dsv4::TensorView(padded_storage.data<void>(), DType::uint8, {3, g.block_bytes});
    padded.data.strides[0] = stride;

    HostTensor values(DType::fp32, {3, g.dim});
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < values.numel(); ++i) values.data<float>()[i] = normal(rng);
    dsv4::kv_quantize(dense.view, values, slots_tensor({1, 6, 11}));
    dsv4::kv_quantize(padded, values, slots_tensor({1, 6, 11}));
    for (int64_t b = 0; b < 3; ++b) {
      const uint8_t* got = padded_storage.data<uint8_t>() + b * stride;
      EXPECT_EQ(0, std::memcmp(got, dense.bytes() + b * g.block_bytes, g.block_bytes)) << b;
      for (int64_t i = g.block_bytes; i < stride; ++i) ASSERT_EQ(got[i], 0xAB) << b << " " << i;
    }
    HostTensor from_dense(DType::fp32, {3, g.dim}), from_padded(DType::fp32, {3, g.dim});
    dsv4::kv_dequantize(dense.view, slots_tensor({11, 1, 6}), from_dense);
    dsv4::kv_dequantize(padded, slots_tensor({11, 1, 6}), from_padded);
    EXPECT_EQ(0, std::memcmp(from_dense.data<uint8_t>(), from_padded.data<uint8_t>(), from_dense.nbytes()));

    for (const int64_t bad : {g.block_bytes - 16, g.block_bytes + 8}) {
      KvCacheView wrong = padded;
      wrong.data.strides[0] = bad;
      try {
        dsv4::kv_quantize(wrong, values, slots_tensor({1, 6, 11}));
        ADD_FAILURE() << "block stride " << bad << " accepted";
      } catch (const dsv4::Error& e) {
        EXPECT_NE(std::string(e.what()).find("cache.data.stride(0) (block stride, bytes)"),
                  std::string::npos) << e.what();
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input: the documented error, and the cache / output unchanged.
void expect_error_unchanged(const TestCache& cache, const std::function<void()>& call,
                            const std::string& needle) {
  const std::vector<uint8_t> before = cache.snapshot();
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.snapshot(), before) << "cache modified by a rejected call";
}

TEST(KvQuantize, RejectsBadInputWithoutWriting) {
  TestCache cache(KvLayout::model1_fp8, 4, 2);  // 8 slots
  HostTensor good(DType::fp32, {2, 512});
  for (int i = 0; i < 1024; ++i) good.data<float>()[i] = 0.5f;
  HostTensor ints(DType::int32, {2, 512});
  HostTensor narrow(DType::fp32, {2, 511});
  HostTensor wide(DType::fp32, {2, 1024});
  dsv4::TensorView strided = wide.view();  // [2, 512] with an inner stride of 2
  strided.shape[1] = 512;
  strided.strides[1] = 2;
  strided.strides[0] = 1024;

  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(cache.view, ints, slots_tensor({0, 1})); },
                         "values.dtype");
  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(cache.view, narrow, slots_tensor({0, 1})); },
                         "values");
  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(cache.view, strided, slots_tensor({0, 1})); },
                         "values");
  // The first slot is valid: nothing may be written before the bad second one is found.
  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(cache.view, good, slots_tensor({0, 8})); },
                         "slots[1]");
  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(cache.view, good, slots_tensor({0, -2})); },
                         "slots[1]");
  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(cache.view, good, slots_tensor({3, 3})); },
                         "more than once");
  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(cache.view, good, slots_tensor({0})); },
                         "slots");
  HostTensor float_slots(DType::fp32, {2});
  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(cache.view, good, float_slots); },
                         "slots.dtype");

  KvCacheView wrong_rows = cache.view;  // geometry of block size 8 does not match 4-token rows
  wrong_rows.block_size = 8;
  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(wrong_rows, good, slots_tensor({0, 1})); },
                         "block bytes");
  KvCacheView wrong_layout = cache.view;
  wrong_layout.layout = KvLayout::bf16;
  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(wrong_layout, good, slots_tensor({0, 1})); },
                         "cache.data.shape[1]");
  KvCacheView wrong_dtype = cache.view;
  wrong_dtype.data.dtype = DType::int32;
  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(wrong_dtype, good, slots_tensor({0, 1})); },
                         "cache.data.dtype");
}

TEST(KvQuantize, PerTensorRejectsNonPositiveScale) {
  TestCache cache(KvLayout::fp8_per_tensor, 4, 1, /*tensor_scale=*/0.0f);
  HostTensor good(DType::fp32, {1, 512});
  expect_error_unchanged(cache, [&] { dsv4::kv_quantize(cache.view, good, slots_tensor({0})); },
                         "tensor_scale");
}

TEST(KvDequantize, RejectsBadInputWithoutWriting) {
  TestCache cache(KvLayout::v32_fp8, 4, 1);
  HostTensor out(DType::fp32, {2, 576});
  out.fill_bytes(0x5A);
  const std::vector<uint8_t> out_before(out.data<uint8_t>(), out.data<uint8_t>() + out.nbytes());
  auto expect_rejected = [&](const std::function<void()>& call, const std::string& needle) {
    expect_error_unchanged(cache, call, needle);
    EXPECT_EQ(std::memcmp(out.data<uint8_t>(), out_before.data(), out.nbytes()), 0)
        << "output modified by a rejected call";
  };
  expect_rejected([&] { dsv4::kv_dequantize(cache.view, slots_tensor({0, 4}), out); }, "slots[1]");
  HostTensor out_512(DType::fp32, {2, 512});
  expect_rejected([&] { dsv4::kv_dequantize(cache.view, slots_tensor({0, 1}), out_512); }, "out");
  HostTensor out_fp16(DType::fp16, {2, 576});
  expect_rejected([&] { dsv4::kv_dequantize(cache.view, slots_tensor({0, 1}), out_fp16); },
                  "out.dtype");
  expect_rejected([&] { dsv4::kv_dequantize(cache.view, slots_tensor({0, 1, 2}), out); }, "slots");
}

}  // namespace
