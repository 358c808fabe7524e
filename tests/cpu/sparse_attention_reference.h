// Test-side references for the sparse attention ops, written independently of src/: a paged KV
// cache filled with random tokens byte by byte and decoded by hand (docs/spec.md §7 byte layouts with
// the scalar conversions of dtype.h), and the docs/spec.md §6 attention formula in float64.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dsv4/dtype.h"
#include "dsv4/kv_layout.h"
#include "dsv4/tensor.h"

namespace dsv4::test {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Bytes per block, computed here from docs/spec.md §7 (not with kv_geometry).
inline int64_t spec_block_bytes(KvLayout layout, int block_size) {
  switch (layout) {
    case KvLayout::model1_fp8: return (int64_t{block_size} * 584 + 575) / 576 * 576;
    case KvLayout::v32_fp8: return int64_t{block_size} * 656;
    case KvLayout::bf16: return int64_t{block_size} * 1024;
    case KvLayout::fp8_per_tensor: return int64_t{block_size} * 512;
  }
  return 0;
}
inline int spec_dim(KvLayout layout) { return layout == KvLayout::v32_fp8 ? 576 : 512; }

// A paged cache whose every byte starts as 0xFF (NaN in fp8, bf16 and ue8m0 alike): a token
// becomes readable only when fill_token writes it, so a read of anything else shows as NaN.
// block_stride (bytes, 0 = the block bytes): blocks that far apart, as FlashMLA's and vLLM's
// padded caches have; the padding stays NaN bytes, so reading it shows too.
class TestCache {
 public:
  TestCache(KvLayout layout, int block_size, int64_t num_blocks, float tensor_scale = 1.0f,
            int64_t block_stride = 0)
      : layout_(layout), block_size_(block_size), block_bytes_(spec_block_bytes(layout, block_size)),
        block_stride_(block_stride > 0 ? block_stride : block_bytes_), tensor_scale_(tensor_scale),
        data_(DType::uint8, {num_blocks, block_stride_}) {
    data_.fill_bytes(0xFF);
  }

  // uint8 [num_blocks, block_bytes] with the block stride.
  KvCacheView view() const {
    KvCacheView v;
    v.data = data_.view();
    v.data.shape[1] = block_bytes_;
    v.layout = layout_;
    v.block_size = block_size_;
    v.tensor_scale = tensor_scale_;
    return v;
  }
  int64_t num_slots() const { return data_.shape()[0] * block_size_; }
  int dim() const { return spec_dim(layout_); }
  int64_t block_stride() const { return block_stride_; }
  // Every byte, padding included: [num_blocks, block_stride].
  const HostTensor& bytes() const { return data_; }

  // Writes random bytes for one token: fp8 codes of N(0, 8²) (never NaN), power-of-two scales
  // 2^-4..2^-2 (so values are O(1)), bf16 N(0, 1) rope / bf16 values.
  void fill_token(int64_t slot, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-4, -2);
    auto fp8 = [&] { return float_to_fp8_e4m3(8.0f * normal(rng)); };
    auto bf16 = [&] { return float_to_bf16_bits(normal(rng)); };
    uint8_t* block = block_ptr(slot);
    const int64_t off = slot % block_size_;
    switch (layout_) {
      case KvLayout::model1_fp8: {
        uint8_t* row = block + off * 576;
        for (int i = 0; i < 448; ++i) row[i] = fp8();
        for (int i = 0; i < 64; ++i) put_u16(row + 448 + 2 * i, bf16());
        uint8_t* scales = block + int64_t{block_size_} * 576 + off * 8;
        for (int s = 0; s < 7; ++s) scales[s] = static_cast<uint8_t>(127 + exponent(rng));
        scales[7] = 0;
        return;
      }
      case KvLayout::v32_fp8: {
        uint8_t* row = block + off * 656;
        for (int i = 0; i < 512; ++i) row[i] = fp8();
        for (int s = 0; s < 4; ++s) {
          const float scale = std::ldexp(1.0f, exponent(rng));
          std::memcpy(row + 512 + 4 * s, &scale, 4);
        }
        for (int i = 0; i < 64; ++i) put_u16(row + 528 + 2 * i, bf16());
        return;
      }
      case KvLayout::bf16: {
        uint8_t* row = block + off * 1024;
        for (int i = 0; i < 512; ++i) put_u16(row + 2 * i, bf16());
        return;
      }
      case KvLayout::fp8_per_tensor: {
        uint8_t* row = block + off * 512;
        for (int i = 0; i < 512; ++i) row[i] = float_to_fp8_e4m3(normal(rng) * 4.0f);
        return;
      }
    }
  }

  // The token's dim values decoded by hand from the bytes (float64).
  std::vector<double> decode(int64_t slot) const {
    std::vector<double> v(dim());
    const uint8_t* block = block_ptr(slot);
    const int64_t off = slot % block_size_;
    switch (layout_) {
      case KvLayout::model1_fp8: {
        const uint8_t* row = block + off * 576;
        const uint8_t* scales = block + int64_t{block_size_} * 576 + off * 8;
        for (int i = 0; i < 448; ++i)
          v[i] = double(fp8_e4m3_to_float(row[i])) * double(ue8m0_to_float(scales[i / 64]));
        for (int i = 0; i < 64; ++i) v[448 + i] = bf16_bits_to_float(get_u16(row + 448 + 2 * i));
        break;
      }
      case KvLayout::v32_fp8: {
        const uint8_t* row = block + off * 656;
        for (int i = 0; i < 512; ++i) {
          float scale;
          std::memcpy(&scale, row + 512 + 4 * (i / 128), 4);
          v[i] = double(fp8_e4m3_to_float(row[i])) * double(round_bf16(scale));  // read as bf16 (spec §7)
        }
        for (int i = 0; i < 64; ++i) v[512 + i] = bf16_bits_to_float(get_u16(row + 528 + 2 * i));
        break;
      }
      case KvLayout::bf16: {
        const uint8_t* row = block + off * 1024;
        for (int i = 0; i < 512; ++i) v[i] = bf16_bits_to_float(get_u16(row + 2 * i));
        break;
      }
      case KvLayout::fp8_per_tensor: {
        const uint8_t* row = block + off * 512;
        // As the decode reads a row (ops.h): fp8 · scale in fp32, rounded to bf16.
        for (int i = 0; i < 512; ++i) v[i] = round_bf16(fp8_e4m3_to_float(row[i]) * tensor_scale_);
        break;
      }
    }
    return v;
  }

 private:
  uint8_t* block_ptr(int64_t slot) const {
    return data_.data<uint8_t>() + (slot / block_size_) * block_stride_;
  }
  static void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
  static uint16_t get_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }

  KvLayout layout_;
  int block_size_;
  int64_t block_bytes_, block_stride_;
  float tensor_scale_;
  HostTensor data_;
};

// docs/spec.md §6 for one query head over gathered rows, in float64.
struct HeadResult {
  std::vector<double> out;  // d_v
  double lse;               // natural log, without the sink; +inf when no row
  double max_logit;         // −inf when no row
};
inline HeadResult reference_head(const std::vector<double>& q, const std::vector<const std::vector<double>*>& rows,
                                 double scale, double sink, int d_v) {
  HeadResult r{std::vector<double>(d_v, 0.0), kInf, -kInf};
  if (rows.empty()) return r;
  std::vector<double> logits;
  for (const auto* k : rows) {
    double dot = 0.0;
    for (size_t d = 0; d < q.size(); ++d) dot += q[d] * (*k)[d];
    logits.push_back(scale * dot);
    r.max_logit = std::max(r.max_logit, logits.back());
  }
  double sum = 0.0;
  for (double l : logits) sum += std::exp(l - r.max_logit);
  r.lse = r.max_logit + std::log(sum);
  for (size_t i = 0; i < rows.size(); ++i) {
    const double p = std::exp(logits[i] - r.lse);
    for (int d = 0; d < d_v; ++d) r.out[d] += p * (*rows[i])[d];
  }
  // out · exp(lse) / (exp(lse) + exp(sink)), written as docs/spec.md §6 states it (sink −inf: ×1).
  const double factor = std::isinf(sink) && sink > 0 ? 0.0 : std::exp(r.lse) / (std::exp(r.lse) + std::exp(sink));
  for (double& o : r.out) o *= factor;
  return r;
}

// Random bf16 N(0, 1) values (as bits) into a bf16 tensor.
inline void fill_bf16_normal(const HostTensor& t, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  uint16_t* p = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = float_to_bf16_bits(normal(rng));
}

// Tolerances. bf16 outputs: each element is rounded once from an fp32 value, an error of at most
// half a bf16 ulp = 2^-9 ≈ 2e-3 of |out_i| <= max|out|; fp32 accumulation over <= 2k rows of
// O(1) terms adds ~1e-6 relative. 5e-3 · max|ref| is 2.5× the rounding bound, yet an attention
// with one row dropped or a wrong weight moves outputs by far more (checked by the tests'
// sensitivity cases). lse: fp32 logits (dot products of <= 576 products, |P| <= ~10) and one
// log: ~1e-6 absolute; 1e-4 · max(1, |lse|) leaves margin.
inline constexpr double kOutTol = 5e-3;
inline constexpr double kLseTol = 1e-4;

}  // namespace dsv4::test
