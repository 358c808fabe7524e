// The fused FP8 producers on CUDA against the CPU reference, bit for bit (NaN-free data): the
// inverse RoPE + FP8 quantization of the attention output (inv_rope_fp8_quant), the FP8 q of
// fused_qkv_rms_norm, and quantize_act_fp8 into the CUDA GEMMs' transposed scale layout. Both
// backends share the per-element math (rope_rotate_pair, math/rms_norm.h's summation order, dtype.h's
// UE8M0 rule; the kernels' hardware FP8 conversion is bit-identical to dtype.h's encoder), so any
// difference is a bug. 16-byte aligned rows and rows that take the element-wise path, poisoned
// outputs, untouched padding, and a position outside the table (the token left unwritten).
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <tuple>
#include <vector>

#include "cpu/dense_operands.h"
#include "cpu/rope_reference.h"
#include "cpu_vs_cuda_util.h"
#include "dsv4/ops.h"
#include "gpu_test_util.h"

namespace {
using dense_test::poisoned;
using dense_test::random_tensor;
using dsv4::DType;
using dsv4::HostTensor;
using dsv4::TensorView;
using dsv4::test::expect_bytes_equal;
using dsv4::test::same_view_on_device;
using dsv4::test::Twin;

TensorView transposed(TensorView v) {
  std::swap(v.shape[0], v.shape[1]);
  std::swap(v.strides[0], v.strides[1]);
  return v;
}

// ---- inv_rope_fp8_quant ------------------------------------------------------------------------
struct InvRopeCase {
  int64_t T, H;
  int block;
  DType scale;
  bool transposed_scale;
  int64_t head_pad;  // o's heads are a window of H + head_pad stored heads
  int64_t row_pad;   // o_fp8 rows are HD + row_pad apart (odd: the element-wise path)
  int64_t D = 512;   // head dim
  int R = 64;        // rope dims (the last R of each head)
};
class InvRopeFp8QuantCpuVsCuda : public ::testing::TestWithParam<InvRopeCase> {};

TEST_P(InvRopeFp8QuantCpuVsCuda, BitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  const InvRopeCase c = GetParam();
  const int64_t D = c.D, HD = c.H * D, blocks = HD / c.block;
  HostTensor o_buf = random_tensor(DType::bf16, {c.T, c.H + c.head_pad, D}, 7 + c.T, 1e-3, 8.0);
  dense_test::shape_blocks(o_buf, c.T * (c.H + c.head_pad), D, c.block, 8);  // scale boundaries too
  HostTensor pos(DType::int64, {c.T});
  for (int64_t t = 0; t < c.T; ++t) pos.data<int64_t>()[t] = (t * 1237 + 3) % 65536;
  const Twin o = Twin::of(o_buf), positions = Twin::of(pos);
  const Twin table = Twin::of(dsv4::build_rope_cache(dense_test::yarn_rope(c.R), 65536));
  Twin q = Twin::poisoned(DType::fp8_e4m3, {c.T, HD + c.row_pad});
  Twin s = c.transposed_scale ? Twin::poisoned(c.scale, {blocks, c.T}) : Twin::poisoned(c.scale, {c.T, blocks});
  TensorView o_view = o.host.view(), q_view = q.host.view();
  o_view.shape[1] = c.H;
  q_view.shape[1] = HD;
  const TensorView s_view = c.transposed_scale ? transposed(s.host.view()) : s.host.view();
  dsv4::inv_rope_fp8_quant(o_view, positions.host, table.host, c.block, q_view, s_view);
  dsv4::inv_rope_fp8_quant(same_view_on_device(o, o_view), positions.dev, table.dev, c.block,
                           same_view_on_device(q, q_view), same_view_on_device(s, s_view));
  expect_bytes_equal("o_fp8 (with its padding)", q.host, q.dev_bytes());
  expect_bytes_equal("o_scale", s.host, s.dev_bytes());
}

INSTANTIATE_TEST_SUITE_P(
    Grid, InvRopeFp8QuantCpuVsCuda,
    ::testing::Values(InvRopeCase{1, 64, 128, DType::fp32, true, 0, 0},   // decode, the V4-Flash o
                      InvRopeCase{130, 64, 128, DType::fp32, true, 0, 0},
                      InvRopeCase{37, 16, 128, DType::ue8m0, false, 0, 0},
                      InvRopeCase{9, 8, 64, DType::fp32, false, 0, 0},
                      InvRopeCase{9, 8, 64, DType::ue8m0, true, 0, 0},
                      InvRopeCase{11, 60, 128, DType::fp32, true, 4, 0},  // heads padded to 64
                      InvRopeCase{5, 16, 128, DType::fp32, true, 0, 3},   // unaligned o_fp8 rows
                      InvRopeCase{0, 64, 128, DType::fp32, true, 0, 0},
                      // More tokens than block rows (4096): a block row loops over tokens.
                      InvRopeCase{4100, 1, 128, DType::fp32, true, 0, 0},
                      // 36 / 40 units of 16 values per token: the last warp only partly in the
                      // row; rope dims starting inside an 8-value half (R = 6) or at dim 0 (R = D).
                      InvRopeCase{7, 3, 64, DType::ue8m0, false, 0, 0, 192, 6},
                      InvRopeCase{7, 3, 64, DType::fp32, true, 1, 5, 192, 6},
                      InvRopeCase{6, 5, 128, DType::fp32, true, 0, 0, 128, 128}),
    [](const auto& info) {
      const InvRopeCase& c = info.param;
      std::ostringstream n;
      n << "T" << c.T << "_H" << c.H << "_b" << c.block << "_" << dsv4::dtype_name(c.scale)
        << (c.transposed_scale ? "_scaleT" : "") << (c.head_pad ? "_headpad" : "") << (c.row_pad ? "_rowpad" : "");
      if (c.D != 512 || c.R != 64) n << "_D" << c.D << "_R" << c.R;
      return n.str();
    });

// NaNs and infinities among the values that are only quantized (the dims before the rope dims):
// a NaN's code is 0x7f, an infinity makes its block's scale degenerate (amax = inf) the same way
// on both backends. The kernels test the hardware codes for NaNs once per lane and re-encode
// those lanes value by value. (Positive NaNs only: the GPU's multiply by the block's inverse
// scale returns the positive canonical NaN whatever the input's sign, where the CPU keeps it.)
TEST(InvRopeFp8QuantCpuVsCuda, NanAndInfinityCodesBitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 6, H = 4, D = 512, HD = H * D;
  HostTensor o_buf = random_tensor(DType::bf16, {T, H, D}, 41, 1e-3, 8.0);
  const uint16_t specials[] = {0x7fc0, 0x7f81, 0x7f80, 0xff80};  // quiet NaN, a payload, ±inf
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      if ((t + h) % 3 != 0)  // some heads keep only finite values
        for (int k = 0; k < 3; ++k)
          o_buf.data<uint16_t>()[(t * H + h) * D + (t * 97 + h * 31 + k * 131) % 448] =
              specials[(t + h + k) % 4];
  HostTensor pos(DType::int64, {T});
  for (int64_t t = 0; t < T; ++t) pos.data<int64_t>()[t] = t * 5;
  const Twin o = Twin::of(o_buf), positions = Twin::of(pos);
  const Twin table = Twin::of(dsv4::build_rope_cache(dense_test::yarn_rope(64), 64));
  Twin q = Twin::poisoned(DType::fp8_e4m3, {T, HD}), s = Twin::poisoned(DType::ue8m0, {T, HD / 128});
  dsv4::inv_rope_fp8_quant(o.host, positions.host, table.host, 128, q.host, s.host);
  dsv4::inv_rope_fp8_quant(o.dev, positions.dev, table.dev, 128, q.dev, s.dev);
  expect_bytes_equal("o_fp8", q.host, q.dev_bytes());
  expect_bytes_equal("o_scale", s.host, s.dev_bytes());
}

// A position outside the table cannot be rejected on the host: that token is left unwritten, the
// others match the CPU.
TEST(InvRopeFp8QuantCuda, PositionOutsideTheTableLeavesTheTokenUnwritten) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 4, H = 8, D = 512, HD = H * D;
  const Twin o = Twin::of(random_tensor(DType::bf16, {T, H, D}, 3));
  HostTensor pos(DType::int64, {T});
  for (int64_t t = 0; t < T; ++t) pos.data<int64_t>()[t] = t * 10;
  const Twin table = Twin::of(dsv4::build_rope_cache(dense_test::swa_rope(64), 64));
  HostTensor q_cpu = poisoned(DType::fp8_e4m3, {T, HD}), s_cpu = poisoned(DType::fp32, {T, HD / 128});
  dsv4::inv_rope_fp8_quant(o.host, pos, table.host, 128, q_cpu, s_cpu);
  pos.data<int64_t>()[1] = 64;  // one past the table
  const Twin positions = Twin::of(pos);
  Twin q = Twin::poisoned(DType::fp8_e4m3, {T, HD}), s = Twin::poisoned(DType::fp32, {T, HD / 128});
  dsv4::inv_rope_fp8_quant(o.dev, positions.dev, table.dev, 128, q.dev, s.dev);
  std::memset(q_cpu.data<uint8_t>() + HD, 0xFF, HD);
  std::memset(s_cpu.data<float>() + HD / 128, 0xFF, HD / 128 * sizeof(float));
  expect_bytes_equal("o_fp8", q_cpu, q.dev_bytes());
  expect_bytes_equal("o_scale", s_cpu, s.dev_bytes());
}

// ---- fused_qkv_rms_norm with the FP8 q ---------------------------------------------------------
using NormFp8Params = std::tuple<int64_t /*T*/, DType /*q_out*/, bool /*with q_out*/, bool /*unaligned*/>;
class FusedQkvRmsNormFp8CpuVsCuda : public ::testing::TestWithParam<NormFp8Params> {};

TEST_P(FusedQkvRmsNormFp8CpuVsCuda, BitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  const auto [T, q_dt, with_q_out, unaligned] = GetParam();
  const int64_t Q = 1024, D = 512, pad = unaligned ? 3 : 0;
  // q and kv as column windows of one projection output [T, Q + D + pad] (+ pad: unaligned rows).
  const Twin qkv = Twin::of(random_tensor(DType::fp32, {T, Q + D + pad}, 21 + T, 1e-3, 16.0));
  TensorView q_in = qkv.host.view(), kv_in = qkv.host.view();
  q_in.data = qkv.host.data<float>() + pad;
  q_in.shape[1] = Q;
  kv_in.data = qkv.host.data<float>() + pad + Q;
  kv_in.shape[1] = D;
  const Twin wq = Twin::of(random_tensor(DType::bf16, {Q}, 23, 0.5, 1.5));
  const Twin wkv = Twin::of(random_tensor(DType::bf16, {D}, 24, 0.5, 1.5));
  Twin q_out = Twin::poisoned(q_dt, {T, Q}), kv_out = Twin::poisoned(DType::bf16, {T, D});
  Twin q8 = Twin::poisoned(DType::fp8_e4m3, {T, Q}), s = Twin::poisoned(DType::fp32, {Q / 128, T});
  const TensorView s_view = transposed(s.host.view());
  dsv4::fused_qkv_rms_norm(q_in, wq.host, kv_in, wkv.host, 1e-6f, with_q_out ? q_out.host.view() : TensorView{},
                           kv_out.host, q8.host, s_view, nullptr);
  dsv4::fused_qkv_rms_norm(same_view_on_device(qkv, q_in), wq.dev, same_view_on_device(qkv, kv_in), wkv.dev, 1e-6f,
                           with_q_out ? q_out.dev.view() : TensorView{}, kv_out.dev, q8.dev,
                           same_view_on_device(s, s_view), nullptr);
  expect_bytes_equal("q_fp8", q8.host, q8.dev_bytes());
  expect_bytes_equal("q_scale", s.host, s.dev_bytes());
  expect_bytes_equal("kv_out", kv_out.host, kv_out.dev_bytes());
  expect_bytes_equal("q_out (or its untouched poison)", q_out.host, q_out.dev_bytes());
}

INSTANTIATE_TEST_SUITE_P(Grid, FusedQkvRmsNormFp8CpuVsCuda,
                         ::testing::Combine(::testing::Values<int64_t>(0, 1, 129), ::testing::Values(DType::bf16, DType::fp32),
                                            ::testing::Bool(), ::testing::Bool()));

// ---- quantize_act_fp8 into the GEMMs' layout ---------------------------------------------------
TEST(QuantizeActFp8CpuVsCudaLayout, TransposedScalesAndUnalignedRows) {
  DSV4_SKIP_WITHOUT_GPU();
  for (const int64_t offset : {int64_t{0}, int64_t{3}}) {  // 3: rows not 16-byte aligned
    SCOPED_TRACE(offset);
    const int64_t T = 33, K = 1024;
    HostTensor wide = random_tensor(DType::bf16, {T, K + 8}, 70 + offset);
    dense_test::shape_blocks(wide, T, K + 8, 8, 71);
    const Twin x = Twin::of(wide);
    TensorView xv = x.host.view();
    xv.data = x.host.data<uint16_t>() + offset;
    xv.shape[1] = K;
    Twin q = Twin::poisoned(DType::fp8_e4m3, {T, K}), s = Twin::poisoned(DType::fp32, {K / 128, T});
    const TensorView s_view = transposed(s.host.view());
    dsv4::quantize_act_fp8(xv, 128, q.host, s_view);
    dsv4::quantize_act_fp8(same_view_on_device(x, xv), 128, q.dev, same_view_on_device(s, s_view));
    expect_bytes_equal("xq", q.host, q.dev_bytes());
    expect_bytes_equal("scale", s.host, s.dev_bytes());
  }
}

}  // namespace
