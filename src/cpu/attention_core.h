// The shared inner piece of the CPU sparse attention ops (decode, prefill, combine): an online
// softmax over a stream of rows for all H heads of one query, and its finalisation with the
// attention sink (docs/spec.md §6). Internal to src/cpu.
//
// Rows arrive in tiles of kRowTile; each row is dequantized once into the tile and reused by
// every head (the CPU analogue of the kernels' KV tile shared by a head group). Accumulation is
// fp32 with the usual running max: for head h, after rows with logits P_i,
//   max = max_i P_i,  sum = Σ exp(P_i − max),  acc = Σ exp(P_i − max) · v_i,
// so lse = max + ln(sum) and the normalized output is acc / sum.
//
// The combine reuses the same state: a split's partial (o_s, lse_s) is a "row" with value o_s and
// logit lse_s, since Σ_s exp(lse_s − lse) o_s with lse = ln Σ_s exp(lse_s) is exactly the softmax
// merge of the splits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dsv4/dtype.h"
#include "dsv4/fp8_block.h"

namespace dsv4::cpu {

inline constexpr int kRowTile = 64;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
inline constexpr float kPosInf = std::numeric_limits<float>::infinity();

// Running softmax state of `heads` heads over values of width d_v.
class HeadGroupSoftmax {
 public:
  HeadGroupSoftmax(int heads, int d_v)
      : heads_(heads), d_v_(d_v), max_(heads), sum_(heads), acc_(static_cast<size_t>(heads) * d_v) {
    reset();
  }

  void reset() {
    std::fill(max_.begin(), max_.end(), kNegInf);
    std::fill(sum_.begin(), sum_.end(), 0.0f);
    std::fill(acc_.begin(), acc_.end(), 0.0f);
  }

  // Adds n rows: logits of head h at logits[h * logit_stride + j], value j at
  // values[j * value_stride + (0..d_v)]. A logit of −inf marks a row with no mass (an empty
  // split in the combine): it is skipped and its value never read, so garbage there cannot leak.
  void add(const float* logits, int64_t logit_stride, const float* values, int64_t value_stride,
           int n) {
    if (static_cast<int>(weights_.size()) < n) {
      weights_.resize(n);
      rows_.resize(n);
    }
    for (int h = 0; h < heads_; ++h) {
      const float* lh = logits + h * logit_stride;
      float tile_max = kNegInf;
      for (int j = 0; j < n; ++j) tile_max = std::fmax(tile_max, lh[j]);
      if (tile_max == kNegInf) continue;
      const float new_max = std::fmax(max_[h], tile_max);
      float* acc = acc_.data() + static_cast<int64_t>(h) * d_v_;
      const float alpha = std::exp(max_[h] - new_max);  // 0 when nothing was added before
      if (alpha != 1.0f) {
        sum_[h] *= alpha;
#pragma omp simd
        for (int d = 0; d < d_v_; ++d) acc[d] *= alpha;
      }
      int kept = 0;
      for (int j = 0; j < n; ++j) {
        if (lh[j] == kNegInf) continue;
        weights_[kept] = std::exp(lh[j] - new_max);
        sum_[h] += weights_[kept];
        rows_[kept++] = values + j * value_stride;
      }
      accumulate(acc, kept);
      max_[h] = new_max;
    }
  }

  bool empty(int h) const { return max_[h] == kNegInf; }
  // Largest logit seen (natural units); −inf when no row was added.
  float max_logit(int h) const { return max_[h]; }
  // ln Σ exp(P_i) without any sink; −inf when no row was added.
  float lse(int h) const { return empty(h) ? kNegInf : max_[h] + std::log(sum_[h]); }

  // The split partial of head h: o = acc / sum (zeros when empty) and lse (−inf when empty).
  void write_partial(int h, float* o, float* lse_out) const {
    *lse_out = lse(h);
    const float inv = empty(h) ? 0.0f : 1.0f / sum_[h];
    const float* acc = acc_.data() + static_cast<int64_t>(h) * d_v_;
    for (int d = 0; d < d_v_; ++d) o[d] = acc[d] * inv;
  }

  // The final output of head h (docs/spec.md §6): out = acc / sum · exp(lse) / (exp(lse) + exp(sink)),
  // written as bf16; lse_out excludes the sink. No valid row: out = 0, lse = +inf.
  // sink = −inf (or no sink) leaves out unchanged; sink = +inf gives out = 0.
  void write_output(int h, float sink, uint16_t* out_bf16, float* lse_out) const {
    if (empty(h)) {
      for (int d = 0; d < d_v_; ++d) out_bf16[d] = float_to_bf16_bits(0.0f);
      *lse_out = kPosInf;
      return;
    }
    const float lse_h = lse(h);
    // exp(lse) / (exp(lse) + exp(sink)) = 1 / (1 + exp(sink − lse)): no overflow for large lse.
    const float sink_factor = 1.0f / (1.0f + std::exp(sink - lse_h));
    const float scale = sink_factor / sum_[h];
    const float* acc = acc_.data() + static_cast<int64_t>(h) * d_v_;
    for (int d = 0; d < d_v_; ++d) out_bf16[d] = float_to_bf16_bits(acc[d] * scale);
    *lse_out = lse_h;
  }

 private:
  // acc[0..d_v) += Σ_i weights_[i] · rows_[i][0..d_v), four rows per pass so that acc is loaded
  // and stored once per four rows rather than once per row.
  void accumulate(float* acc, int count) const {
    int i = 0;
    for (; i + 4 <= count; i += 4) {
      const float w0 = weights_[i], w1 = weights_[i + 1], w2 = weights_[i + 2], w3 = weights_[i + 3];
      const float *v0 = rows_[i], *v1 = rows_[i + 1], *v2 = rows_[i + 2], *v3 = rows_[i + 3];
#pragma omp simd
      for (int d = 0; d < d_v_; ++d) acc[d] += w0 * v0[d] + w1 * v1[d] + w2 * v2[d] + w3 * v3[d];
    }
    for (; i < count; ++i) {
      const float w = weights_[i];
      const float* v = rows_[i];
#pragma omp simd
      for (int d = 0; d < d_v_; ++d) acc[d] += w * v[d];
    }
  }

  int heads_, d_v_;
  std::vector<float> max_, sum_, acc_;
  std::vector<float> weights_;       // scratch of add(): exp(P_j − max) of the kept rows
  std::vector<const float*> rows_;   // and their values
};

// One query (all H heads, d_qk each) attending to rows fetched on demand. A fetcher
// `bool fetch(int64_t i, float* row)` writes slot i's dequantized row (d_qk floats) and returns
// true, or returns false for an invalid slot (which is then skipped without being read).
// One instance per thread; reset with set_query for each query.
class QueryAttention {
 public:
  QueryAttention(int heads, int d_qk, int d_v, float softmax_scale)
      : heads_(heads), d_qk_(d_qk), scale_(softmax_scale), softmax_(heads, d_v),
        q_(static_cast<size_t>(heads) * d_qk), tile_(static_cast<size_t>(kRowTile) * d_qk),
        logits_(static_cast<size_t>(heads) * kRowTile) {}

  // q_bf16: head h's d_qk values at q_bf16 + h * head_stride (elements).
  void set_query(const uint16_t* q_bf16, int64_t head_stride) {
    for (int h = 0; h < heads_; ++h)
      for (int d = 0; d < d_qk_; ++d)
        q_[static_cast<size_t>(h) * d_qk_ + d] = bf16_bits_to_float(q_bf16[h * head_stride + d]);
    softmax_.reset();
  }
  // The same from e4m3 codes of scale q_scale: the bf16 query they mean, bf16(fp8 · q_scale)
  // (fp8_block.h's rule, then one bf16 rounding; what the CUDA decode converts them to).
  void set_query_fp8(const uint8_t* q_fp8, int64_t head_stride, float q_scale) {
    for (int h = 0; h < heads_; ++h)
      for (int d = 0; d < d_qk_; ++d)
        q_[static_cast<size_t>(h) * d_qk_ + d] =
            round_bf16(fp8_decode_scaled(q_fp8[h * head_stride + d], q_scale));
    softmax_.reset();
  }

  // Attends to slots [begin, end) in order.
  template <typename FetchRow>
  void attend(int64_t begin, int64_t end, FetchRow&& fetch) {
    int n = 0;
    for (int64_t i = begin; i < end; ++i) {
      if (!fetch(i, tile_.data() + static_cast<int64_t>(n) * d_qk_)) continue;
      if (++n == kRowTile) {
        add_tile(n);
        n = 0;
      }
    }
    if (n > 0) add_tile(n);
  }

  const HeadGroupSoftmax& softmax() const { return softmax_; }

 private:
  // Logits of the tile for every head, then the softmax update. Four heads share each pass over
  // a key row (the row is loaded once for four dot products).
  void add_tile(int n) {
    const int64_t d_qk = d_qk_;
    int h = 0;
    for (; h + 4 <= heads_; h += 4) {
      const float *q0 = q_.data() + h * d_qk, *q1 = q0 + d_qk, *q2 = q1 + d_qk, *q3 = q2 + d_qk;
      for (int j = 0; j < n; ++j) {
        const float* k = tile_.data() + j * d_qk;
        float dot0 = 0.0f, dot1 = 0.0f, dot2 = 0.0f, dot3 = 0.0f;
#pragma omp simd reduction(+ : dot0, dot1, dot2, dot3)
        for (int64_t d = 0; d < d_qk; ++d) {
          dot0 += q0[d] * k[d];
          dot1 += q1[d] * k[d];
          dot2 += q2[d] * k[d];
          dot3 += q3[d] * k[d];
        }
        float* l = logits_.data() + static_cast<int64_t>(h) * kRowTile + j;
        l[0] = scale_ * dot0;
        l[kRowTile] = scale_ * dot1;
        l[2 * kRowTile] = scale_ * dot2;
        l[3 * kRowTile] = scale_ * dot3;
      }
    }
    for (; h < heads_; ++h) {
      const float* qh = q_.data() + h * d_qk;
      for (int j = 0; j < n; ++j) {
        const float* k = tile_.data() + j * d_qk;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < d_qk; ++d) dot += qh[d] * k[d];
        logits_[static_cast<size_t>(h) * kRowTile + j] = scale_ * dot;
      }
    }
    softmax_.add(logits_.data(), kRowTile, tile_.data(), d_qk_, n);
  }

  int heads_, d_qk_;
  float scale_;
  HeadGroupSoftmax softmax_;
  std::vector<float> q_, tile_, logits_;
};

// The sink of head h from an optional fp32 [H] array (nullptr: no sink, i.e. −inf).
inline float sink_of(const float* attn_sink, int h) { return attn_sink ? attn_sink[h] : kNegInf; }

}  // namespace dsv4::cpu
