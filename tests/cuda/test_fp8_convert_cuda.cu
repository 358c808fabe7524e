// fp8x16_to_bf16x16_bf16_scale (src/cuda/common/fp8_convert.cuh), on the GPU: its bf16 equals
// the host's round_bf16(fp8 · scale) bit for bit for every e4m3 code at every UE8M0 scale byte
// (MODEL1's, by both ways the decode producer makes its factor: pow2_scale_bf16x2 of the byte's
// float, and ue8m0_scale_bf16x2 from the byte) and at every bf16 scale reached by rounding a float
// with low mantissa bits set (rounded_scale_bf16x2, V3.2's fp32 scales read as bf16): subnormal
// codes, products that round into bf16's subnormal range or to zero, overflow to infinity; a NaN
// code or scale gives a NaN. The decode producer dequantizes with it (sparse_decode/producer.cuh,
// store_slot).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/common/fp8_convert.cuh"
#include "dsv4/dtype.h"
#include "gpu_test_util.h"

namespace {

using dsv4::test::DeviceBuffer;

// How a sweep turns a UE8M0 byte into the bf16x2 factor: through its float (pow2_scale_bf16x2 of
// ue8m0_to_float) or from the byte itself (ue8m0_scale_bf16x2), the decode producer's two ways.
enum class Ue8m0Factor { via_float, from_byte };

// Thread i converts chunk i % 16 (codes 16c .. 16c + 15) at scale byte u = i / 16. From the byte,
// u sits at byte u % 4 of a word whose other bytes are 0x00, 0xff or 0x7f by i % 3: a read that
// took in a neighbour would show as a wrong scale.
template <Ue8m0Factor kFactor>
__global__ void convert_all_codes(uint4* out) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= 256 * 16) return;
  const uint32_t first = 16u * (i % 16);
  uint32_t w[4];
  for (int k = 0; k < 4; ++k) w[k] = (first + 4 * k) * 0x01010101u + 0x03020100u;  // codes first+4k .. +3
  const uint32_t u = static_cast<uint32_t>(i / 16);
  uint32_t factor;
  if constexpr (kFactor == Ue8m0Factor::via_float) {
    factor = dsv4::cuda::pow2_scale_bf16x2(dsv4::ue8m0_to_float(static_cast<uint8_t>(u)));
  } else {
    const int byte = static_cast<int>(u % 4);
    const uint32_t others = (i % 3 == 0 ? 0u : i % 3 == 1 ? 0xffffffffu : 0x7f7f7f7fu) & ~(0xffu << (8 * byte));
    factor = dsv4::cuda::ue8m0_scale_bf16x2(others | (u << (8 * byte)), byte);
  }
  dsv4::cuda::fp8x16_to_bf16x16_bf16_scale(make_uint4(w[0], w[1], w[2], w[3]), factor, out[2 * i], out[2 * i + 1]);
}

bool bf16_is_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// The bf16 that code `code` became at scale number `scale_index` of a sweep whose thread
// i converted chunk i % 16 (codes 16·(i % 16) ...) at scale i / 16 into out[2i], out[2i + 1].
uint16_t converted(const std::vector<uint4>& out, uint32_t scale_index, int code) {
  const uint4& chunk = out[2 * (16 * scale_index + code / 16) + (code % 16) / 8];
  const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
  return static_cast<uint16_t>(words[(code % 8) / 2] >> (16 * (code % 2)));
}

class Fp8ConvertUe8m0 : public ::testing::TestWithParam<Ue8m0Factor> {};

TEST_P(Fp8ConvertUe8m0, PowerOfTwoScaleMatchesHostRoundingForEveryCodeAndScaleByte) {
  DSV4_SKIP_WITHOUT_GPU();
  const std::vector<uint4> poison(2 * 256 * 16, make_uint4(0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu));
  DeviceBuffer<uint4> out_d(poison);
  if (GetParam() == Ue8m0Factor::via_float) {
    convert_all_codes<Ue8m0Factor::via_float><<<32, 128>>>(out_d.data());
  } else {
    convert_all_codes<Ue8m0Factor::from_byte><<<32, 128>>>(out_d.data());
  }
  DSV4_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<uint4> out = out_d.download();
  int subnormal = 0, zero_from_nonzero = 0, infinite = 0, nan = 0;
  for (int u = 0; u < 256; ++u) {
    const float scale = dsv4::ue8m0_to_float(static_cast<uint8_t>(u));
    for (int code = 0; code < 256; ++code) {
      const uint16_t got = converted(out, u, code);
      const float value = dsv4::fp8_e4m3_to_float(static_cast<uint8_t>(code));
      const uint16_t want = dsv4::float_to_bf16_bits(dsv4::ieee_mul(value, scale));
      if (bf16_is_nan(want)) {
        ASSERT_TRUE(bf16_is_nan(got)) << "code 0x" << std::hex << code << std::dec << ", scale byte " << u;
        ++nan;
        continue;
      }
      ASSERT_EQ(got, want) << "code 0x" << std::hex << code << std::dec << ", scale byte " << u;
      subnormal += (want & 0x7f80) == 0 && (want & 0x7f) != 0;
      zero_from_nonzero += (want & 0x7fff) == 0 && value != 0.f;
      infinite += (want & 0x7fff) == 0x7f80;
    }
  }
  // The sweep reaches the edges it claims: NaN codes (2 per scale) and the NaN scale (byte 255),
  // subnormal results, underflow to zero, and overflow.
  EXPECT_EQ(nan, 2 * 255 + 256);
  EXPECT_GT(subnormal, 0);
  EXPECT_GT(zero_from_nonzero, 0);
  EXPECT_GT(infinite, 0);
}

INSTANTIATE_TEST_SUITE_P(BothFactors, Fp8ConvertUe8m0,
                         ::testing::Values(Ue8m0Factor::via_float, Ue8m0Factor::from_byte),
                         [](const ::testing::TestParamInfo<Ue8m0Factor>& info) {
                           return info.param == Ue8m0Factor::via_float ? std::string("via_float") : std::string("from_byte");
                         });

// The float scale of the V3.2 sweep for bf16 pattern `b`: b's bits with low bits set below
// bf16's mantissa, by b % 3 below, at and above the rounding tie, so rounding it to bf16 goes
// down, to the even neighbour, or up.
__host__ __device__ float scale_with_low_bits(uint32_t b) {
  const uint32_t low = b % 3 == 0 ? 0x1234u : b % 3 == 1 ? 0x8000u : 0xC001u;
  const uint32_t bits = (b << 16) | low;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// Thread i converts chunk i % 16 at the scale of bf16 pattern i / 16, rounded to bf16.
__global__ void convert_all_codes_rounded_scales(uint4* out) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= 65536 * 16) return;
  const uint32_t first = 16u * (i % 16);
  uint32_t w[4];
  for (int k = 0; k < 4; ++k) w[k] = (first + 4 * k) * 0x01010101u + 0x03020100u;
  const float scale = scale_with_low_bits(static_cast<uint32_t>(i / 16));
  dsv4::cuda::fp8x16_to_bf16x16_bf16_scale(make_uint4(w[0], w[1], w[2], w[3]),
                                           dsv4::cuda::rounded_scale_bf16x2(scale), out[2 * i], out[2 * i + 1]);
}

TEST(Fp8ConvertCuda, RoundedFloatScaleMatchesHostForEveryCodeAndBf16Scale) {
  DSV4_SKIP_WITHOUT_GPU();
  const std::vector<uint4> poison(2 * 65536 * 16, make_uint4(0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu));
  DeviceBuffer<uint4> out_d(poison);
  convert_all_codes_rounded_scales<<<65536 * 16 / 256, 256>>>(out_d.data());
  DSV4_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<uint4> out = out_d.download();
  int subnormal = 0, infinite = 0, nan = 0, scale_rounded_up = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float scale = scale_with_low_bits(b);
    const float scale_bf16 = dsv4::round_bf16(scale);  // the host reads it so (kv_layout.h)
    scale_rounded_up += std::abs(scale_bf16) > std::abs(scale);
    for (int code = 0; code < 256; ++code) {
      const uint16_t got = converted(out, b, code);
      const float value = dsv4::fp8_e4m3_to_float(static_cast<uint8_t>(code));
      const uint16_t want = dsv4::float_to_bf16_bits(dsv4::ieee_mul(value, scale_bf16));
      if (bf16_is_nan(want)) {
        ASSERT_TRUE(bf16_is_nan(got)) << "code 0x" << std::hex << code << ", scale bits 0x" << b;
        ++nan;
        continue;
      }
      ASSERT_EQ(got, want) << "code 0x" << std::hex << code << ", scale bits 0x" << b;
      subnormal += (want & 0x7f80) == 0 && (want & 0x7f) != 0;
      infinite += (want & 0x7fff) == 0x7f80;
    }
  }
  // The sweep reaches the edges it claims: scales rounded up (a third of them, and the ties of odd
  // patterns), NaN codes and scales, subnormal results and overflow.
  EXPECT_GT(scale_rounded_up, 10000);
  EXPECT_GT(nan, 2 * 65536);
  EXPECT_GT(subnormal, 0);
  EXPECT_GT(infinite, 0);
}

}  // namespace
