// kv_rope_insert (include/dsv4/kv_rope_insert.h) on the V32_FP8 layout against a float64 formula:
// RoPE on the last 64 dims (GPT-J pairs, the V3.2 YaRN frequencies), then what the 656-byte token
// must hold — 512 latent values FP8 e4m3 in 4 blocks of 128 with UE8M0 fp32 scales, 64 bf16 rope
// values — and kv overwritten with the dequantized token. Slot -1 stores nothing; bad slots write
// nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "compressor_test_support.h"
#include "dsv4/kv_rope_insert.h"
#include "rope_reference.h"

namespace dsv4 {
namespace {

using test::Rng;

TEST(KvRopeInsert, V32TokenMatchesFloat64) {
  const int64_t T = 4, D = v32::kDim, R = v32::kRope;
  const int block = 2;
  const RopeConfig rope = ModelConfig::builtin("v3.2").rope_for_layer(0);
  Rng rng(3);
  HostTensor kv(DType::bf16, {T, D}), pos(DType::int64, {T}), slots(DType::int32, {T});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i)  // magnitudes per token 2^-4 .. 2^5: the scales differ
      kv.set(t * D + i, static_cast<float>(std::ldexp(rng.nonzero(0.1, 1.0), static_cast<int>(3 * t) - 4)));
  const int32_t slot_of[T] = {3, -1, 0, 2};
  for (int64_t t = 0; t < T; ++t) {
    pos.data<int64_t>()[t] = 1000 * t + 7;
    slots.data<int32_t>()[t] = slot_of[t];
  }
  const HostTensor kv_in = HostTensor::copy_of(kv);
  HostTensor cache(DType::uint8, {2, block * v32::kTokenBytes});
  cache.fill_bytes(0xEE);
  const KvCacheView view{cache, KvLayout::v32_fp8, block};
  kv_rope_insert(kv, pos, build_rope_cache(rope, 4096), view, slots);

  const std::vector<double> f = dense_test::reference_rope_freqs(rope);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> v(static_cast<size_t>(D));
    for (int64_t i = 0; i < D; ++i) v[i] = kv_in.get(t * D + i);
    const double p = static_cast<double>(pos.data<int64_t>()[t]);
    for (size_t i = 0; i < f.size(); ++i) {
      double& a = v[D - R + 2 * i];
      double& b = v[D - R + 2 * i + 1];
      const double c = std::cos(p * f[i]), s = std::sin(p * f[i]), a0 = a;
      a = a0 * c - b * s;
      b = a0 * s + b * c;
    }
    // The latent is not rotated: its FP8 encoding (per 128 values, UE8M0 scale) is exact math on
    // the same bf16 inputs, so it must match bit for bit.
    for (int blk = 0; blk < v32::kNumScales; ++blk) {
      double amax = 0;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(v[blk * 128 + i]));
      const double scale = test::ue8m0_scale_f64(amax);
      for (int i = 0; i < 128; ++i) {
        const int64_t k = blk * 128 + i;
        ASSERT_EQ(kv.get(t * D + k), static_cast<float>(dense_test::fp8_round(v[k] / scale) * scale))
            << "token " << t << " latent " << k;
      }
    }
    // bf16 rope: one bf16 ulp of the formula (at most 2^-7 relative; the fp32 rotation may land
    // on the other side of a rounding midpoint than the double one).
    for (int64_t k = D - R; k < D; ++k)
      ASSERT_NEAR(kv.get(t * D + k), v[k], std::ldexp(std::fabs(v[k]), -7) + 1e-30)
          << "token " << t << " rope " << k;
    if (slot_of[t] < 0) continue;
    std::vector<float> stored(static_cast<size_t>(D));
    const KvGeometry g = kv_geometry(KvLayout::v32_fp8, block);
    kv_decode_token(g, cache.data<uint8_t>() + (slot_of[t] / block) * cache.view().strides[0],
                    slot_of[t] % block, stored.data());
    for (int64_t k = 0; k < D; ++k) ASSERT_EQ(stored[k], kv.get(t * D + k)) << "token " << t << " dim " << k;
  }
  // Slot 1 was never written.
  const uint8_t* slot1 = cache.data<uint8_t>() + v32::kTokenBytes;
  for (int b = 0; b < v32::kTokenBytes; ++b) ASSERT_EQ(slot1[b], 0xEE);
}

TEST(KvRopeInsert, BadInputWritesNothing) {
  const int64_t T = 2, D = v32::kDim;
  HostTensor kv(DType::bf16, {T, D}), pos(DType::int32, {T}), slots(DType::int32, {T});
  kv.fill_bytes(0x3C);
  pos.data<int32_t>()[0] = 0;
  pos.data<int32_t>()[1] = 1;
  slots.data<int32_t>()[0] = 0;
  slots.data<int32_t>()[1] = 0;  // twice
  HostTensor cache(DType::uint8, {1, 4 * v32::kTokenBytes});
  cache.fill_bytes(0xEE);
  const std::vector<uint8_t> before(cache.data<uint8_t>(), cache.data<uint8_t>() + cache.nbytes());
  const HostTensor table = build_rope_cache(ModelConfig::builtin("v3.2").rope_for_layer(0), 8);
  const KvCacheView view{cache, KvLayout::v32_fp8, 4};
  EXPECT_THROW(kv_rope_insert(kv, pos, table, view, slots), Error);
  HostTensor narrow(DType::bf16, {T, 512});
  slots.data<int32_t>()[1] = 1;
  EXPECT_THROW(kv_rope_insert(narrow, pos, table, view, slots), Error);  // 512 != V32's 576
  EXPECT_EQ(0, std::memcmp(before.data(), cache.data<uint8_t>(), before.size()));
  // An empty step is valid, even with no memory behind kv.
  const TensorView none(nullptr, DType::bf16, {0, D});
  const TensorView no_index(nullptr, DType::int32, {0});
  kv_rope_insert(none, no_index, table, view, no_index);
}

}  // namespace
}  // namespace dsv4
