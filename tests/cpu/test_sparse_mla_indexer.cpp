// The V3.2 indexer's row preparation (sparse_mla_indexer.h) against float64 formulas: NeoX RoPE on
// the first R dims, Hadamard rotation, FP8 with one power-of-two scale per row, the head weights'
// scaling; the key side's LayerNorm and its cache write; bad input writes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "compressor_test_support.h"
#include "dsv4/ops.h"
#include "dsv4/sparse_mla_indexer.h"
#include "rope_reference.h"

namespace dsv4 {
namespace {

using test::Rng;
constexpr int kDim = 128;

// The V3.2 rope: theta 10000 with YaRN (factor 40 over 4096).
RopeConfig v32_rope() { return ModelConfig::builtin("v3.2").rope_for_layer(0); }

// RoPE in halves (v_i, v_{i+R/2}) on the first R dims, Hadamard, then the exact FP8 round trip
// expected from the row: returns the rotated row and writes its power-of-two scale.
std::vector<double> prepared_row_f64(std::vector<double> v, const RopeConfig& rope, int64_t p,
                                     double* scale) {
  const std::vector<double> f = dense_test::reference_rope_freqs(rope);
  const size_t half = f.size();
  for (size_t i = 0; i < half; ++i) {
    const double c = std::cos(static_cast<double>(p) * f[i]), s = std::sin(static_cast<double>(p) * f[i]);
    const double a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = a * s + b * c;
  }
  v = test::hadamard_f64(v);
  double amax = 0.0;
  for (double e : v) amax = std::max(amax, std::fabs(e));
  *scale = test::ue8m0_scale_f64(amax);
  return v;
}

// fp8 e4m3 keeps 3 mantissa bits: a value within fp32 noise of a rounding midpoint may go either
// way, so one full step is allowed (2^-3 relative, 2^-9 · scale for subnormals).
void expect_fp8_row(const uint8_t* codes, double scale, const std::vector<double>& want,
                    const char* what, int64_t row) {
  for (int d = 0; d < kDim; ++d)
    ASSERT_NEAR(fp8_e4m3_to_float(codes[d]) * scale, want[d],
                std::ldexp(std::fabs(want[d]), -3) + std::ldexp(scale, -9))
        << what << " row " << row << " d " << d;
}

TEST(SparseMlaIndexer, QueriesMatchFloat64) {
  const int64_t T = 4, n = 3;
  Rng rng(7);
  HostTensor x(DType::fp32, {T, n, kDim}), pos(DType::int32, {T});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng.nonzero(0.1, 3.0));
  for (int64_t t = 0; t < T; ++t) pos.data<int32_t>()[t] = static_cast<int32_t>(rng.integer(0, 5000));
  const HostTensor cos_sin = build_rope_cache(v32_rope(), 5001);
  HostTensor codes(DType::fp8_e4m3, {T, n, kDim}), scales(DType::fp32, {T, n});
  codes.fill_bytes(0x7F);  // fp8 NaN
  scales.fill_bytes(0xFF);
  // The head weights as a column window of wider rows (row stride n + 2).
  HostTensor weights_buf(DType::fp32, {T, n + 2});
  for (int64_t i = 0; i < weights_buf.numel(); ++i) weights_buf.data<float>()[i] = static_cast<float>(rng.uniform(-3.0, 3.0));
  const HostTensor weights_in = HostTensor::copy_of(weights_buf, DType::fp32);
  TensorView weights = weights_buf.view();
  weights.shape[1] = n;
  sparse_mla_indexer_quantize(x, pos, cos_sin, codes, scales, weights, nullptr);
  for (int64_t r = 0; r < T * n; ++r) {
    const std::vector<double> v(x.data<float>() + r * kDim, x.data<float>() + (r + 1) * kDim);
    double scale = 0;
    const std::vector<double> want = prepared_row_f64(v, v32_rope(), pos.data<int32_t>()[r / n], &scale);
    EXPECT_EQ(scales.data<float>()[r], scale) << "row " << r;
    expect_fp8_row(codes.data<uint8_t>() + r * kDim, scale, want, "query", r);
  }
  // w · (n · d)^-0.5: two fp32 roundings (the scale's and the product's), 2^-23 relative at most.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < n + 2; ++c) {
      const double w_in = weights_in.data<float>()[t * (n + 2) + c], got = weights_buf.data<float>()[t * (n + 2) + c];
      if (c >= n) {
        EXPECT_EQ(got, w_in) << "outside the view: t " << t << " c " << c;
        continue;
      }
      const double want = w_in / std::sqrt(static_cast<double>(n * kDim));
      EXPECT_NEAR(got, want, std::ldexp(std::fabs(want), -23)) << "weight t " << t << " h " << c;
    }
}

TEST(SparseMlaIndexer, KeysMatchFloat64AndLandInTheirSlots) {
  const int64_t T = 5;
  const int block = 4;
  Rng rng(8);
  HostTensor k(DType::fp32, {T, kDim}), w(DType::fp32, {kDim}), b(DType::fp32, {kDim});
  HostTensor pos(DType::int64, {T}), slots(DType::int64, {T});
  for (int64_t i = 0; i < k.numel(); ++i) k.data<float>()[i] = static_cast<float>(rng.uniform(-2.0, 3.0));
  for (int i = 0; i < kDim; ++i) {
    w.data<float>()[i] = static_cast<float>(rng.uniform(0.5, 1.5));
    b.data<float>()[i] = static_cast<float>(rng.uniform(-0.3, 0.3));
  }
  const int64_t slot_of[T] = {6, -1, 0, 11, 3};
  for (int64_t t = 0; t < T; ++t) {
    pos.data<int64_t>()[t] = 10 * t + 1;
    slots.data<int64_t>()[t] = slot_of[t];
  }
  const HostTensor cos_sin = build_rope_cache(v32_rope(), 64);
  HostTensor cache(DType::uint8, {3, block * indexer_keys::kEntryBytes});
  cache.fill_bytes(0xEE);
  const IndexerKeyCacheView keys{cache, block};
  sparse_mla_indexer_key_insert(k, w, b, 1e-6f, pos, cos_sin, keys, slots);
  std::vector<bool> written(12, false);
  for (int64_t t = 0; t < T; ++t) {
    if (slot_of[t] < 0) continue;
    written[slot_of[t]] = true;
    std::vector<double> v(k.data<float>() + t * kDim, k.data<float>() + (t + 1) * kDim);
    double mean = 0, var = 0;
    for (double e : v) mean += e;
    mean /= kDim;
    for (double e : v) var += (e - mean) * (e - mean);
    const double inv = 1.0 / std::sqrt(var / kDim + 1e-6);
    for (int i = 0; i < kDim; ++i) v[i] = (v[i] - mean) * inv * w.data<float>()[i] + b.data<float>()[i];
    double scale = 0;
    const std::vector<double> want = prepared_row_f64(v, v32_rope(), pos.data<int64_t>()[t], &scale);
    const uint8_t* blk = cache.data<uint8_t>() + (slot_of[t] / block) * cache.view().strides[0];
    const int off = static_cast<int>(slot_of[t] % block);
    EXPECT_EQ(indexer_key_scale(blk, block, off), scale) << "token " << t;
    expect_fp8_row(indexer_key_codes(blk, off), scale, want, "key", t);
  }
  for (int s = 0; s < 12; ++s) {  // untouched slots keep the poison
    if (written[s]) continue;
    const uint8_t* blk = cache.data<uint8_t>() + (s / block) * cache.view().strides[0];
    EXPECT_EQ(indexer_key_codes(blk, s % block)[0], 0xEE) << "slot " << s;
  }
}

TEST(SparseMlaIndexer, BadInputWritesNothing) {
  const int64_t T = 2;
  HostTensor x(DType::fp32, {T, 2, kDim}), pos(DType::int32, {T});
  x.fill_bytes(0x3C);
  pos.data<int32_t>()[0] = 0;
  pos.data<int32_t>()[1] = 9;  // outside an 8-row table
  const HostTensor cos_sin = build_rope_cache(v32_rope(), 8);
  HostTensor codes(DType::fp8_e4m3, {T, 2, kDim}), scales(DType::fp32, {T, 2});
  codes.fill_bytes(0xEE);
  scales.fill_bytes(0xEE);
  const auto c0 = dense_test::bytes_of(codes), s0 = dense_test::bytes_of(scales);
  dense_test::expect_error([&] { sparse_mla_indexer_quantize(x, pos, cos_sin, codes, scales); },
                           {"positions"});
  pos.data<int32_t>()[1] = 1;
  HostTensor wide(DType::fp32, {T, 2, kDim + 2});
  dense_test::expect_error([&] { sparse_mla_indexer_quantize(wide, pos, cos_sin, codes, scales); },
                           {"x"});
  HostTensor weights(DType::fp32, {T, 3}), weights_bf16(DType::bf16, {T, 2});
  weights.fill_bytes(0x3C);
  weights_bf16.fill_bytes(0x3C);
  const auto w0 = dense_test::bytes_of(weights);
  dense_test::expect_error(
      [&] { sparse_mla_indexer_quantize(x, pos, cos_sin, codes, scales, weights, nullptr); },
      {"sparse_mla_indexer_quantize", "weights.shape", "[2, 2]"});
  dense_test::expect_error(
      [&] { sparse_mla_indexer_quantize(x, pos, cos_sin, codes, scales, weights_bf16, nullptr); },
      {"sparse_mla_indexer_quantize", "weights", "fp32"});
  TensorView weights_over_scales = scales.view();  // in place on another output
  dense_test::expect_error(
      [&] { sparse_mla_indexer_quantize(x, pos, cos_sin, codes, scales, weights_over_scales, nullptr); },
      {"sparse_mla_indexer_quantize", "weights", "disjoint from scales"});
  EXPECT_EQ(w0, dense_test::bytes_of(weights));
  EXPECT_EQ(c0, dense_test::bytes_of(codes));
  EXPECT_EQ(s0, dense_test::bytes_of(scales));

  HostTensor k(DType::fp32, {T, kDim}), w(DType::fp32, {kDim}), b(DType::fp32, {kDim});
  HostTensor slots(DType::int32, {T}), cache(DType::uint8, {1, 4 * indexer_keys::kEntryBytes});
  for (HostTensor* t : {&k, &w, &b}) t->fill_bytes(0x3C);
  cache.fill_bytes(0xEE);
  const auto k0 = dense_test::bytes_of(cache);
  slots.data<int32_t>()[0] = 1;
  slots.data<int32_t>()[1] = 1;  // twice
  dense_test::expect_error(
      [&] { sparse_mla_indexer_key_insert(k, w, b, 1e-6f, pos, cos_sin, {cache, 4}, slots); },
      {"slot_mapping[1]", "twice"});
  slots.data<int32_t>()[1] = 4;  // outside the cache
  dense_test::expect_error(
      [&] { sparse_mla_indexer_key_insert(k, w, b, 1e-6f, pos, cos_sin, {cache, 4}, slots); },
      {"slot_mapping[1]"});
  EXPECT_EQ(k0, dense_test::bytes_of(cache));
  dense_test::expect_error(
      [&] { sparse_mla_indexer_quantize(dense_test::on_cuda(x), dense_test::on_cuda(pos),
                                        dense_test::on_cuda(cos_sin), dense_test::on_cuda(codes),
                                        dense_test::on_cuda(scales)); },
      {"CUDA"});
}

}  // namespace
}  // namespace dsv4
