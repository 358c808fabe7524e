// fp8x16_to_bf16x16_pow2 (src/cuda/common/fp8_convert.cuh), on the GPU: for every UE8M0 scale
// byte and every e4m3 code, its bf16 equals the host's round_bf16(fp8 · scale) bit for bit
// (subnormal codes, products that round into bf16's subnormal range or to zero, overflow to
// infinity), and a NaN code or scale gives a NaN. The MODEL1 decode producer dequantizes with it
// (kernel.cuh, store_slot).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/common/fp8_convert.cuh"
#include "dsv4/dtype.h"
#include "gpu_test_util.h"

namespace {

using dsv4::test::DeviceBuffer;

// Thread i converts chunk i % 16 (codes 16c .. 16c + 15) at scale byte i / 16.
__global__ void convert_all_codes(uint4* out) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= 256 * 16) return;
  const uint32_t first = 16u * (i % 16);
  uint32_t w[4];
  for (int k = 0; k < 4; ++k) w[k] = (first + 4 * k) * 0x01010101u + 0x03020100u;  // codes first+4k .. +3
  const float scale = dsv4::ue8m0_to_float(static_cast<uint8_t>(i / 16));
  dsv4::cuda::fp8x16_to_bf16x16_pow2(make_uint4(w[0], w[1], w[2], w[3]), dsv4::cuda::pow2_scale_bf16x2(scale),
                                     out[2 * i], out[2 * i + 1]);
}

bool bf16_is_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

TEST(Fp8ConvertCuda, PowerOfTwoScaleMatchesHostRoundingForEveryCodeAndScaleByte) {
  DSV4_SKIP_WITHOUT_GPU();
  const std::vector<uint4> poison(2 * 256 * 16, make_uint4(0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu));
  DeviceBuffer<uint4> out_d(poison);
  convert_all_codes<<<32, 128>>>(out_d.data());
  DSV4_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<uint4> out = out_d.download();
  int subnormal = 0, zero_from_nonzero = 0, infinite = 0, nan = 0;
  for (int u = 0; u < 256; ++u) {
    const float scale = dsv4::ue8m0_to_float(static_cast<uint8_t>(u));
    for (int code = 0; code < 256; ++code) {
      const uint4& chunk = out[2 * (16 * u + code / 16) + (code % 16) / 8];
      const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
      const auto got = static_cast<uint16_t>(words[(code % 8) / 2] >> (16 * (code % 2)));
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

}  // namespace
