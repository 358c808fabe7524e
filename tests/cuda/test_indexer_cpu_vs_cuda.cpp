// The CPU reference of the indexer ops (src/cpu/indexer.cpp) against their CUDA twins
// (src/cuda/indexer/) on the same inputs: query rows (RoPE, Hadamard, FP8), top-k and the C128A
// prefix plan; the whole indexer_query through dsv4::linear; the CUDA handling of out-of-range
// index values; CUDA-specific rejections and mixed devices. Skipped without a GPU. The scores
// (FP8 tensor cores, a stated tolerance) are in test_indexer_scores_cuda.cpp.
//
// Tolerances: everything is bit-exact (both sides do the same fp32 operations in the same order,
// or only index math; top-k gets the same scores on both sides) except the full indexer_query,
// whose projections may sum in another order on the two backends (see QueryThroughLinear).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/indexer_rows.h"
#include "cuda/indexer/indexer.h"
#include "dsv4/device_tensor.h"
#include "dsv4/indexer.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#include "gpu_test_util.h"
#include "indexer_test_util.h"

namespace dsv4 {
namespace {

using namespace indexer_test;

constexpr int kDim = 128;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The RoPE of the compressed layers: theta 160000, YaRN factor 16 over 65536, R dims.
RopeConfig yarn_rope(int R) {
  RopeConfig cfg;
  cfg.theta = 160000.0;
  cfg.rope_dims = R;
  cfg.yarn = true;
  cfg.factor = 16.0;
  cfg.original_seq_len = 65536;
  return cfg;
}

// ================================ query rows =================================================

struct QueryCase {
  int64_t T;
  int H, R;
  DType pos_dtype;
};

class IndexerQueryRowsCpuVsCuda : public ::testing::TestWithParam<QueryCase> {};

// cpu:: and cuda::indexer_query_rows on the same q [T, H, 128] and weights [T, H]: the FP8 codes,
// their scales and (when asked) the scaled weights must be the same bytes; outputs poisoned.
void expect_query_rows_match(const HostTensor& q, const HostTensor& w, const HostTensor& pos,
                             const HostTensor& cos_sin, bool check_weights) {
  const int64_t T = q.shape()[0], H = q.shape()[1];
  HostTensor q_cpu = copy_of(q), w_cpu = copy_of(w);
  HostTensor codes_cpu = poisoned_host(DType::fp8_e4m3, {T, H, kDim}),
             scale_cpu = poisoned_host(DType::fp32, {T, H});
  cpu::indexer_query_rows(q_cpu, pos, cos_sin, codes_cpu, scale_cpu, w_cpu);
  DeviceTensor q_d = DeviceTensor::from_host(q), w_d = DeviceTensor::from_host(w),
               pos_d = DeviceTensor::from_host(pos), cs_d = DeviceTensor::from_host(cos_sin);
  DeviceTensor codes_d = poisoned_device(DType::fp8_e4m3, {T, H, kDim}),
               scale_d = poisoned_device(DType::fp32, {T, H});
  cuda::indexer_query_rows(q_d, pos_d, cs_d, codes_d, scale_d, w_d, nullptr);
  expect_same_bytes("q_fp8", codes_cpu, synced_to_host(codes_d));
  expect_same_bytes("q_scale", scale_cpu, synced_to_host(scale_d));
  if (check_weights) expect_same_bytes("weights", w_cpu, synced_to_host(w_d));
}

// The same projected rows into both backends' row step: RoPE, Hadamard and FP8 are the same fp32
// operations in the same order, so codes, scales and weights must be bit-identical.
TEST_P(IndexerQueryRowsCpuVsCuda, BitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  const auto [T, H, R, pos_dtype] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(100 + T + H + R));
  const int64_t max_pos = 4096;
  HostTensor q(DType::fp32, {T, H, kDim}), w(DType::fp32, {T, H});
  // Row magnitudes over many octaves: scales from tiny (the 1e-4 floor) to large.
  for (int64_t r = 0; r < T * H; ++r) {
    const float mag = std::ldexp(1.0f, static_cast<int>(integer(rng, -24, 12)));
    for (int d = 0; d < kDim; ++d) q.data<float>()[r * kDim + d] = nonzero(rng) * mag;
  }
  for (int64_t i = 0; i < T * H; ++i) w.data<float>()[i] = nonzero(rng);
  std::vector<int64_t> pv(static_cast<size_t>(T));
  for (auto& p : pv) p = integer(rng, 0, max_pos - 1);
  const HostTensor pos = index_tensor(pos_dtype, pv);
  const HostTensor cos_sin = build_rope_cache(yarn_rope(R), max_pos);

  expect_query_rows_match(q, w, pos, cos_sin, /*check_weights=*/true);
}

INSTANTIATE_TEST_SUITE_P(Shapes, IndexerQueryRowsCpuVsCuda,
                         ::testing::Values(QueryCase{1, 64, 64, DType::int64},
                                           QueryCase{37, 64, 64, DType::int32},
                                           QueryCase{5, 4, 128, DType::int64},
                                           QueryCase{9, 3, 2, DType::int32},
                                           QueryCase{7, 1, 64, DType::int64},  // one head: t = row
                                           QueryCase{0, 64, 64, DType::int64}));

// q_fp8 rows that are not 4-byte aligned (a [T, H, 128] window at byte 1 of [T, H, 131]): the
// kernel's byte-store path; the padding around the window stays as poisoned as on the CPU.
TEST(IndexerQueryRowsCpuVsCuda, UnalignedCodeRowsBitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 5, H = 6, kPadded = kDim + 3, max_pos = 64;
  std::mt19937 rng(31);
  HostTensor q(DType::fp32, {T, H, kDim}), w(DType::fp32, {T, H});
  for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = nonzero(rng);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = nonzero(rng);
  std::vector<int64_t> pv(static_cast<size_t>(T));
  for (auto& p : pv) p = integer(rng, 0, max_pos - 1);
  const HostTensor pos = index_tensor(DType::int32, pv);
  const HostTensor cos_sin = build_rope_cache(yarn_rope(64), max_pos);
  auto window = [&](TensorView v) {  // [T, H, 128] at byte 1 of a [T, H, 131] buffer
    v.data = static_cast<uint8_t*>(v.data) + 1;
    v.shape[2] = kDim;
    return v;
  };

  HostTensor q_cpu = copy_of(q), w_cpu = copy_of(w);
  HostTensor codes_cpu = poisoned_host(DType::fp8_e4m3, {T, H, kPadded}),
             scale_cpu = poisoned_host(DType::fp32, {T, H});
  cpu::indexer_query_rows(q_cpu, pos, cos_sin, window(codes_cpu.view()), scale_cpu, w_cpu);
  DeviceTensor q_d = DeviceTensor::from_host(q), w_d = DeviceTensor::from_host(w),
               pos_d = DeviceTensor::from_host(pos), cs_d = DeviceTensor::from_host(cos_sin);
  DeviceTensor codes_d = poisoned_device(DType::fp8_e4m3, {T, H, kPadded}),
               scale_d = poisoned_device(DType::fp32, {T, H});
  cuda::indexer_query_rows(q_d, pos_d, cs_d, window(codes_d), scale_d, w_d, nullptr);
  expect_same_bytes("q_fp8 (with its padding)", codes_cpu, synced_to_host(codes_d));
  expect_same_bytes("q_scale", scale_cpu, synced_to_host(scale_d));
  expect_same_bytes("weights", w_cpu, synced_to_host(w_d));
}

// Rows a·e_0: the Hadamard spreads a over all 128 dims exactly (sums with zeros), so
// amax = fl(a · 128^-0.5) can be put exactly on a UE8M0 boundary (amax / 448 a power of two),
// one ulp either side of it, or around the 1e-4 floor, where the scale's exponent flips.
TEST(IndexerQueryRowsCpuVsCuda, ScaleBoundaryRowsBitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 16, H = 24, max_pos = 8;
  const float s = static_cast<float>(1.0 / std::sqrt(128.0));
  HostTensor q = HostTensor::zeros(DType::fp32, {T, H, kDim}), w(DType::fp32, {T, H});
  std::mt19937 rng(9);
  for (int64_t r = 0; r < T * H; ++r) {
    const int kind = static_cast<int>(r % 3);
    float target = (r / 3) % 2 ? 448.0f * 1e-4f : std::ldexp(448.0f, static_cast<int>(r % 29) - 20);
    if (kind == 1) target = std::nextafter(target, kInf);
    if (kind == 2) target = std::nextafter(target, 0.0f);
    float a = target / s;
    for (int i = 0; i < 64 && a * s != target; ++i) a = std::nextafter(a, a * s < target ? kInf : 0.0f);
    q.data<float>()[r * kDim] = (r & 1) ? -a : a;
    w.data<float>()[r] = nonzero(rng);
  }
  const HostTensor pos = index_tensor(DType::int64, std::vector<int64_t>(T, 3));
  const HostTensor cos_sin = build_rope_cache(yarn_rope(2), max_pos);
  expect_query_rows_match(q, w, pos, cos_sin, /*check_weights=*/false);
}

// CUDA cannot reject a position outside the cos/sin table: that token gets codes 0 and scale NaN;
// the other tokens are unaffected and its weights are still scaled.
TEST(IndexerQueryRowsCuda, OutOfTablePositionMarksTheToken) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 4, H = 8, max_pos = 64;
  std::mt19937 rng(7);
  HostTensor q(DType::fp32, {T, H, kDim}), w(DType::fp32, {T, H});
  for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = nonzero(rng);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = nonzero(rng);
  const HostTensor cos_sin = build_rope_cache(yarn_rope(64), max_pos);
  const std::vector<int64_t> bad = {5, -1, 17, max_pos};  // tokens 1 and 3 out of the table
  std::vector<int64_t> good = bad;
  good[1] = good[3] = 0;
  HostTensor q_cpu = copy_of(q), w_cpu = copy_of(w);
  HostTensor codes_cpu = poisoned_host(DType::fp8_e4m3, {T, H, kDim}),
             scale_cpu = poisoned_host(DType::fp32, {T, H});
  cpu::indexer_query_rows(q_cpu, index_tensor(DType::int64, good), cos_sin, codes_cpu, scale_cpu,
                          w_cpu);

  DeviceTensor q_d = DeviceTensor::from_host(q), w_d = DeviceTensor::from_host(w),
               pos_d = DeviceTensor::from_host(index_tensor(DType::int64, bad)),
               cs_d = DeviceTensor::from_host(cos_sin);
  DeviceTensor codes_d = poisoned_device(DType::fp8_e4m3, {T, H, kDim}),
               scale_d = poisoned_device(DType::fp32, {T, H});
  cuda::indexer_query_rows(q_d, pos_d, cs_d, codes_d, scale_d, w_d, nullptr);
  const HostTensor codes = synced_to_host(codes_d), scale = synced_to_host(scale_d), wg = synced_to_host(w_d);
  expect_same_bytes("weights", w_cpu, wg);
  for (int64_t t = 0; t < T; ++t) {
    const bool invalid = t == 1 || t == 3;
    for (int64_t h = 0; h < H; ++h) {
      const float s = scale.data<float>()[t * H + h];
      if (invalid)
        EXPECT_TRUE(std::isnan(s)) << t;
      else
        EXPECT_EQ(s, scale_cpu.data<float>()[t * H + h]) << t;
      for (int d = 0; d < kDim; ++d) {
        const int64_t i = (t * H + h) * kDim + d;
        ASSERT_EQ(codes.data<uint8_t>()[i], invalid ? 0 : codes_cpu.data<uint8_t>()[i])
            << "t " << t << " h " << h << " d " << d;
      }
    }
  }
}

// ================================ the whole query ============================================

// Public op on both backends from bf16 inputs. The projections run through dsv4::linear, whose
// fp32 sums may be ordered differently on the two backends, so a value near an fp8 rounding
// midpoint (or an amax near a power-of-two boundary) may land one step apart: dequantized values
// are compared within one fp8 step of the larger scale (2^-3 relative, 2^-9 · scale absolute),
// and weights within 1e-5 of the sum of |terms| (fp32 sums of bf16 products, 4096 terms at most).
TEST(IndexerQueryCpuVsCuda, QueryThroughLinear) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 7, H = 64, q_lora = 256, dim = 512, max_pos = 1024;
  std::mt19937 rng(11);
  auto bf16 = [&](std::vector<int64_t> dims, float hi) {
    HostTensor t(DType::bf16, std::move(dims));
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data<uint16_t>()[i] = float_to_bf16_bits(nonzero(rng, 0.01f, hi));
    return t;
  };
  const HostTensor qr = bf16({T, q_lora}, 1.0f), wq_b = bf16({H * kDim, q_lora}, 0.1f),
                   x = bf16({T, dim}, 1.0f), wp = bf16({H, dim}, 0.1f);
  std::vector<int64_t> pv(static_cast<size_t>(T));
  for (auto& p : pv) p = integer(rng, 0, max_pos - 1);
  const HostTensor pos = index_tensor(DType::int64, pv);
  const HostTensor cos_sin = build_rope_cache(yarn_rope(64), max_pos);

  HostTensor codes_cpu = poisoned_host(DType::fp8_e4m3, {T, H, kDim}),
             scale_cpu = poisoned_host(DType::fp32, {T, H}), w_cpu = poisoned_host(DType::fp32, {T, H});
  indexer_query(qr, {}, wq_b, {}, x, wp, pos, cos_sin, codes_cpu, scale_cpu, w_cpu, {});

  DeviceTensor qr_d = DeviceTensor::from_host(qr), wq_d = DeviceTensor::from_host(wq_b),
               x_d = DeviceTensor::from_host(x), wp_d = DeviceTensor::from_host(wp),
               pos_d = DeviceTensor::from_host(pos), cs_d = DeviceTensor::from_host(cos_sin);
  DeviceTensor codes_d = poisoned_device(DType::fp8_e4m3, {T, H, kDim}),
               scale_d = poisoned_device(DType::fp32, {T, H}), w_d = poisoned_device(DType::fp32, {T, H});
  DeviceTensor ws(DType::uint8, {indexer_query_workspace_bytes(T, H)});
  try {
    indexer_query(qr_d, {}, wq_d, {}, x_d, wp_d, pos_d, cs_d, codes_d, scale_d, w_d, ws);
  } catch (const Error& e) {
    // The CUDA dsv4::linear is written in parallel with these kernels.
    if (std::string(e.what()).find("linear: CUDA backend not implemented") != std::string::npos)
      GTEST_SKIP() << "dsv4::linear has no CUDA backend yet: " << e.what();
    throw;
  }
  const HostTensor codes = synced_to_host(codes_d), scale = synced_to_host(scale_d), wg = synced_to_host(w_d);
  for (int64_t r = 0; r < T * H; ++r) {
    const double sc = scale_cpu.data<float>()[r], sg = scale.data<float>()[r];
    ASSERT_TRUE(sg == sc || sg == 2 * sc || 2 * sg == sc) << "row " << r << ": " << sc << " vs " << sg;
    const double tol = std::ldexp(std::max(sc, sg), -9);
    for (int d = 0; d < kDim; ++d) {
      const double a = fp8_e4m3_to_float(codes_cpu.data<uint8_t>()[r * kDim + d]) * sc;
      const double b = fp8_e4m3_to_float(codes.data<uint8_t>()[r * kDim + d]) * sg;
      ASSERT_LE(std::fabs(a - b), std::ldexp(std::max(std::fabs(a), std::fabs(b)), -3) + tol)
          << "row " << r << " d " << d;
    }
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double mag = 0.0;
      for (int64_t k = 0; k < dim; ++k)
        mag += std::fabs(double{bf16_bits_to_float(x.data<uint16_t>()[t * dim + k])} *
                         bf16_bits_to_float(wp.data<uint16_t>()[h * dim + k]));
      mag /= std::sqrt(128.0 * H);
      EXPECT_NEAR(wg.data<float>()[t * H + h], w_cpu.data<float>()[t * H + h], 1e-5 * mag + 1e-30)
          << "t " << t << " h " << h;
    }
}

// CUDA-specific rejections and mixed devices throw before anything is written.
TEST(IndexerQueryCuda, RejectionsWriteNothing) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 2, H = 2, q_lora = 16, dim = 8;
  HostTensor qr(DType::fp32, {T, q_lora}), wq(DType::fp32, {H * kDim, q_lora}),
      wq8(DType::fp8_e4m3, {H * kDim, q_lora}), wq_scale(DType::fp32, {2, 1}),
      x(DType::fp32, {T, dim}), wp(DType::fp32, {H, dim});
  for (HostTensor* t : {&qr, &wq, &wq8, &wq_scale, &x, &wp}) t->fill_bytes(0x3C);
  const HostTensor pos = index_tensor(DType::int32, {0, 1});
  const HostTensor cos_sin = build_rope_cache(yarn_rope(64), 4);
  DeviceTensor qr_d = DeviceTensor::from_host(qr), wq_d = DeviceTensor::from_host(wq),
               wq8_d = DeviceTensor::from_host(wq8), wqs_d = DeviceTensor::from_host(wq_scale),
               x_d = DeviceTensor::from_host(x), wp_d = DeviceTensor::from_host(wp),
               pos_d = DeviceTensor::from_host(pos), cs_d = DeviceTensor::from_host(cos_sin);
  DeviceTensor codes_d = poisoned_device(DType::fp8_e4m3, {T, H, kDim}),
               scale_d = poisoned_device(DType::fp32, {T, H}), w_d = poisoned_device(DType::fp32, {T, H});
  DeviceTensor ws(DType::uint8, {indexer_query_workspace_bytes(T, H)}),
      ws_small(DType::uint8, {indexer_query_workspace_bytes(T, H) - 1});
  expect_error([&] {
    indexer_query(qr_d, {}, wq8_d, wqs_d, x_d, wp_d, pos_d, cs_d, codes_d, scale_d, w_d, ws);
  }, {"indexer_query", "wq_b.dtype", "CUDA"});
  expect_error([&] {
    indexer_query(qr_d, {}, wq_d, {}, x_d, wp_d, pos_d, cs_d, codes_d, scale_d, w_d, ws_small);
  }, {"indexer_query", "workspace"});
  expect_error([&] {
    indexer_query(qr_d, {}, wq_d, {}, x_d, wp_d, pos_d, cs_d, codes_d, scale_d, w_d, {});
  }, {"indexer_query", "workspace"});
  expect_error([&] {  // positions on the host
    indexer_query(qr_d, {}, wq_d, {}, x_d, wp_d, pos, cs_d, codes_d, scale_d, w_d, ws);
  }, {"indexer_query", "positions.device"});
  const HostTensor codes = synced_to_host(codes_d), scale = synced_to_host(scale_d), w = synced_to_host(w_d);
  for (const HostTensor* t : {&codes, &scale, &w})
    for (int64_t i = 0; i < static_cast<int64_t>(t->nbytes()); ++i)
      ASSERT_EQ(t->data<uint8_t>()[i], 0xFF);
}

// ================================ top-k ======================================================

struct TopkCase {
  int64_t T, N, K;
};

class IndexerTopkCpuVsCuda : public ::testing::TestWithParam<TopkCase> {};

// The CPU indexer_topk (positions pos_cpu) against the CUDA one (positions pos_cuda) on the same
// scores, K columns, in both orders, with and without lens: identical indices and lengths.
void expect_topk_matches_cpu(const HostTensor& scores, const HostTensor& pos_cuda, const HostTensor& pos_cpu,
                             int64_t K) {
  const int64_t T = scores.shape()[0];
  DeviceTensor scores_d = DeviceTensor::from_host(scores), pos_d = DeviceTensor::from_host(pos_cuda);
  for (const TopkOrder order : {TopkOrder::score, TopkOrder::column}) {
    SCOPED_TRACE(order == TopkOrder::score ? "TopkOrder::score" : "TopkOrder::column");
    HostTensor idx_cpu = poisoned_host(DType::int32, {T, K}), lens_cpu = poisoned_host(DType::int32, {T});
    indexer_topk(scores, pos_cpu, 4, idx_cpu, lens_cpu, nullptr, order);

    DeviceTensor idx_d = DeviceTensor(DType::int32, {T, K}), lens_d = DeviceTensor(DType::int32, {T});
    idx_d.fill_bytes(0x7F);  // 0xFF would read as the −1 padding
    lens_d.fill_bytes(0x7F);
    indexer_topk(scores_d, pos_d, 4, idx_d, lens_d, nullptr, order);
    expect_same_bytes("indices", idx_cpu, synced_to_host(idx_d));
    expect_same_bytes("lens", lens_cpu, synced_to_host(lens_d));

    // Without lens: the same indices.
    idx_d.fill_bytes(0x7F);
    indexer_topk(scores_d, pos_d, 4, idx_d, {}, nullptr, order);
    expect_same_bytes("indices (no lens)", idx_cpu, synced_to_host(idx_d));
  }
}

// Rows of several kinds — few levels (ties) with NaN, ±inf and ±0; distinct values; all equal —
// and visible counts from 0 to N; columns past the causal limit hold the largest values. The
// same scores on both sides, in both orders: indices and lengths must be identical. Some rows'
// positions lie past 4·N − 1 or below 0, which CUDA clamps to N or 0 visible entries and the CPU
// refuses: the CPU gets those positions clamped to [0, 4·N − 1], which sees the same entries.
TEST_P(IndexerTopkCpuVsCuda, SameIndices) {
  DSV4_SKIP_WITHOUT_GPU();
  const auto [T, N, K] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(400 + T + N + K));
  HostTensor scores(DType::fp32, {T, N});
  std::vector<int64_t> pv(static_cast<size_t>(T)), pv_cpu(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    switch (t % 6) {
      case 0: pv[t] = integer(rng, 0, 2); break;                 // nothing visible
      case 1: pv[t] = 4 * N - 1; break;                          // everything visible
      case 2: pv[t] = std::max<int64_t>(0, 4 * std::min(N, K) - 1 - integer(rng, 0, 3)); break;  // ~K visible
      case 3:  // beyond the scores (visible clamped to N) or negative (none visible)
        pv[t] = (t / 6) % 2 == 0 ? 4 * N + integer(rng, 0, 1000) : -1 - integer(rng, 0, 5);
        break;
      default: pv[t] = integer(rng, 0, 4 * N - 1); break;
    }
    pv_cpu[t] = std::clamp<int64_t>(pv[t], 0, std::max<int64_t>(0, 4 * N - 1));
    const int64_t visible = (pv_cpu[t] + 1) / 4;
    const int kind = static_cast<int>(t % 3);
    for (int64_t j = 0; j < N; ++j) {
      float v;
      if (kind == 0) {
        v = static_cast<float>(integer(rng, -3, 3)) * 0.5f;  // few levels: many ties
        const int64_t special = integer(rng, 0, 40);
        if (special == 0) v = kNaN;
        if (special == 1) v = -kInf;
        if (special == 2) v = kInf;
        if (special == 3) v = -0.0f;
        if (special == 4) v = -kNaN;
      } else if (kind == 1) {
        v = nonzero(rng, 1e-3f, 1e3f);
      } else {
        v = 0.25f;
      }
      scores.data<float>()[t * N + j] = j < visible ? v : 1e30f;
    }
  }
  expect_topk_matches_cpu(scores, index_tensor(DType::int64, pv), index_tensor(DType::int64, pv_cpu), K);
}

// Every launch shape of the CUDA top-k (src/cuda/indexer/topk.cu): 128-thread blocks (>= 512
// rows of <= 8192 columns) with sort capacities 512, 1024, 2048 and 512-thread blocks (fewer or
// wider rows: N > 8192, K > 2048) with 512 .. 4096; K = 0; rows where everything visible is
// selected (no threshold; in column order not even a read of the scores) and rows that need it.
INSTANTIATE_TEST_SUITE_P(Shapes, IndexerTopkCpuVsCuda,
                         ::testing::Values(TopkCase{40, 50, 1}, TopkCase{40, 50, 8},
                                           TopkCase{40, 50, 64}, TopkCase{520, 700, 512},
                                           TopkCase{520, 3000, 1024}, TopkCase{520, 3000, 2048},
                                           TopkCase{18, 3000, 2048},
                                           TopkCase{12, 50000, 512}, TopkCase{12, 9000, 1024},
                                           TopkCase{8, 20000, 2048}, TopkCase{6, 50000, 4096},
                                           TopkCase{12, 40, 0}, TopkCase{0, 50, 8}));

// Rows around the CUDA top-k's register cache (src/cuda/indexer/topk.cu, cached_keys_per_thread:
// a row of at most `cached` visible columns is read once into registers, a longer one streamed):
// visible counts just below, at and just above it, and short of it by part of a warp (padding
// keys in some lanes of a warp), all with count < visible so the threshold and compaction run.
struct TopkCacheCase {
  int64_t T, K, cached;
};

class IndexerTopkCacheBoundaryCpuVsCuda : public ::testing::TestWithParam<TopkCacheCase> {};

// Kinds of row: heavy ties at the threshold (three levels; the count-th key inside a level of
// hundreds); mostly NaN and −inf (the count-th key among the NaNs, whose key is the padding's,
// so any padding counted would move the selection); mostly −inf ties; distinct values; ±0 only
// (one key). Columns past the visible ones hold the largest values.
TEST_P(IndexerTopkCacheBoundaryCpuVsCuda, SameIndices) {
  DSV4_SKIP_WITHOUT_GPU();
  const auto [T, K, cached] = GetParam();
  const int64_t N = cached + 300;
  const std::vector<int64_t> visibles = {cached - 1, cached, cached + 1, cached - 17, cached - 128 - 5, N};
  constexpr int kKinds = 5;
  std::mt19937 rng(static_cast<uint32_t>(900 + T + K + cached));
  HostTensor scores(DType::fp32, {T, N});
  std::vector<int64_t> pv(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t visible = visibles[static_cast<size_t>(t) % visibles.size()];
    pv[t] = 4 * visible - 1 + integer(rng, 0, 3);  // (p + 1) div 4 = visible
    const int kind = static_cast<int>(t / static_cast<int64_t>(visibles.size()) % kKinds);
    for (int64_t j = 0; j < N; ++j) {
      const int64_t roll = integer(rng, 0, 99);
      float v;
      switch (kind) {
        case 0: v = roll < 6 ? 2.0f : roll < 56 ? 1.0f : 0.5f; break;
        case 1: v = roll < 80 ? kNaN : roll < 85 ? -kNaN : roll < 95 ? -kInf : roll < 97 ? kInf : 1.5f; break;
        case 2: v = roll < 90 ? -kInf : nonzero(rng); break;
        case 3: v = nonzero(rng, 1e-3f, 1e3f); break;
        default: v = roll < 50 ? 0.0f : -0.0f; break;
      }
      scores.data<float>()[t * N + j] = j < visible ? v : 1e30f;
    }
  }
  const HostTensor pos = index_tensor(DType::int64, pv);
  expect_topk_matches_cpu(scores, pos, pos, K);
}

// 128-thread launches (>= 512 rows, N <= 8192, K <= 2048; 24 keys a thread) and 512-thread
// launches (fewer rows; 8 keys a thread), with sort capacities 512 and 2048.
INSTANTIATE_TEST_SUITE_P(Shapes, IndexerTopkCacheBoundaryCpuVsCuda,
                         ::testing::Values(TopkCacheCase{540, 512, 128 * 24}, TopkCacheCase{540, 2048, 128 * 24},
                                           TopkCacheCase{60, 512, 512 * 8}, TopkCacheCase{60, 2048, 512 * 8}));

TEST(IndexerTopkCuda, RejectionsWriteNothing) {
  DSV4_SKIP_WITHOUT_GPU();
  HostTensor scores(DType::fp32, {2, 8});
  for (int64_t i = 0; i < scores.numel(); ++i) scores.data<float>()[i] = static_cast<float>(i);
  const HostTensor pos = index_tensor(DType::int32, {3, 31});
  DeviceTensor scores_d = DeviceTensor::from_host(scores), pos_d = DeviceTensor::from_host(pos);
  DeviceTensor idx_big = poisoned_device(DType::int32, {2, 4097}), idx_d = poisoned_device(DType::int32, {2, 4});
  expect_error([&] { indexer_topk(scores_d, pos_d, 4, idx_big); }, {"indexer_topk", "K"});
  expect_error([&] { indexer_topk(scores_d, pos, 4, idx_d); }, {"indexer_topk", "positions.device"});
  for (const DeviceTensor* d : {&idx_big, &idx_d}) {
    const HostTensor h = synced_to_host(*d);
    for (int64_t i = 0; i < static_cast<int64_t>(h.nbytes()); ++i) ASSERT_EQ(h.data<uint8_t>()[i], 0xFF);
  }
}

// ================================ C128A plan =================================================

TEST(CompressedPrefixIndicesCpuVsCuda, SameIndices) {
  DSV4_SKIP_WITHOUT_GPU();
  for (const DType pos_dtype : {DType::int64, DType::int32}) {
    const int64_t T = 301, K = 9;
    std::mt19937 rng(500);
    std::vector<int64_t> pv(static_cast<size_t>(T));
    for (auto& p : pv) p = integer(rng, 0, 128 * K - 1);
    const HostTensor pos = index_tensor(pos_dtype, pv);
    HostTensor idx_cpu = poisoned_host(DType::int32, {T, K}), lens_cpu = poisoned_host(DType::int32, {T});
    compressed_prefix_indices(pos, 128, idx_cpu, lens_cpu);
    DeviceTensor pos_d = DeviceTensor::from_host(pos);
    DeviceTensor idx_d(DType::int32, {T, K}), lens_d(DType::int32, {T});
    idx_d.fill_bytes(0x7F);
    lens_d.fill_bytes(0x7F);
    compressed_prefix_indices(pos_d, 128, idx_d, lens_d);
    expect_same_bytes("indices", idx_cpu, synced_to_host(idx_d));
    expect_same_bytes("lens", lens_cpu, synced_to_host(lens_d));
  }
  // T = 0 launches nothing; mixed devices are rejected.
  DeviceTensor pos0(DType::int64, {0}), idx0(DType::int32, {0, 4});
  compressed_prefix_indices(pos0, 128, idx0);
  HostTensor idx_host(DType::int32, {0, 4});
  expect_error([&] { compressed_prefix_indices(pos0, 128, idx_host); },
               {"compressed_prefix_indices", "indices.device"});
}

}  // namespace
}  // namespace dsv4
