// Float64 reference of one layer for one request (see include/dsv4/reference.h). Written from
// docs/spec.md on its own, sharing no layer code with the batched path, so that the two check each
// other. Single-threaded loops over positions, parallel over output rows where it is cheap.
#include "dsv4/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "dsv4/dtype.h"
#include "dsv4/status.h"
#include "layer/reference_math.h"

namespace dsv4 {

namespace {

using namespace reference_math;  // NOLINT(google-build-using-namespace)

// The model's FP8 rounding of a row's nope dims [0, D - R): blocks of 64, one UE8M0 scale each
// (what MODEL1 stores; idempotent).
void nope_block_round(double* v, int D, int R) {
  for (int b = 0; b < (D - R) / 64; ++b) {
    double amax = 0;
    for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(v[b * 64 + i]));
    const int k = ue8m0_exponent_for_amax(static_cast<float>(amax));
    for (int i = 0; i < 64; ++i) {
      double& x = v[b * 64 + i];
      x = fp8_e4m3_to_float(float_to_fp8_e4m3(static_cast<float>(std::ldexp(x, -k)))) * std::ldexp(1.0, k);
    }
  }
}

// n values as a per-tensor FP8 tensor of `scale` hands them back to its bf16 readers:
// bf16(fp8(v / scale) · scale), the division as the encoder's fp32 multiply by 1 / scale, the
// product in fp32 and rounded to bf16 (exact for a power-of-two scale). The layer's cache rows
// (kv_scale) and, over such a cache, its queries (q_scale).
void fp8_tensor_round(double* v, int64_t n, float scale) {
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < n; ++i)
    v[i] = round_bf16(fp8_e4m3_to_float(float_to_fp8_e4m3(static_cast<float>(v[i]) * inv)) * scale);
}

// A row as the layer's cache of `layout` hands it back. MODEL1: nope dims FP8 blocks of 64, rope
// dims bf16. BF16: every dim bf16. FP8_PER_TENSOR: every dim fp8_tensor_round at kv_scale, as
// every reader takes it (the gather's bf16 rows, the decode's tensor-core operands, the insert's
// kv).
void layout_round(double* v, int D, int R, KvLayout layout, float kv_scale) {
  switch (layout) {
    case KvLayout::bf16:
      for (int i = 0; i < D; ++i) v[i] = round_bf16(static_cast<float>(v[i]));
      return;
    case KvLayout::fp8_per_tensor: fp8_tensor_round(v, D, kv_scale); return;
    default:
      nope_block_round(v, D, R);
      for (int i = D - R; i < D; ++i) v[i] = round_bf16(static_cast<float>(v[i]));
      return;
  }
}

// A compressed entry as the layer's cache hands it back: the model's values (nope dims FP8-rounded
// in blocks of 64, rope dims as computed), then the layout's encoding.
void entry_round(double* v, int D, int R, KvLayout layout, float kv_scale) {
  nope_block_round(v, D, R);
  layout_round(v, D, R, layout, kv_scale);
}

// A compressor's projections of every position and its emitted entries (docs/spec.md §4).
struct Compressor {
  int r = 0, coff = 1, hd = 0;
  Mat kv, score;  // [L, coff*hd]: x·wkvᵀ and x·wgateᵀ + ape[p mod r]
  std::vector<double> norm;

  Compressor(const CompressorWeights& w, int ratio, int head_dim, const Mat& X)
      : r(ratio), coff(ratio == 4 ? 2 : 1), hd(head_dim), norm(to_vec(w.norm)) {
    kv = project(X, to_mat(w.wkv));
    score = project(X, to_mat(w.wgate));
    const Mat ape = to_mat(w.ape);
    for (int64_t p = 0; p < X.rows; ++p)
      for (int64_t i = 0; i < coff * hd; ++i) score.a[p * score.cols + i] += ape.row(p % r)[i];
  }
  // Entry j (all its positions added): softmax-pooled, RMS-normed (un-rotated).
  std::vector<double> pool(int64_t j, double eps) const {
    std::vector<double> e(hd);
    for (int d = 0; d < hd; ++d) {
      // Rows: (position, dim offset). For r = 4: previous window with dims [0, hd), current
      // window with dims [hd, 2hd); for r = 128: the window with dims [0, hd).
      std::vector<std::pair<int64_t, int>> rows;
      if (coff == 2 && j > 0)
        for (int64_t t = (j - 1) * r; t < j * r; ++t) rows.push_back({t, d});
      for (int64_t t = j * r; t < (j + 1) * r; ++t) rows.push_back({t, coff == 2 ? hd + d : d});
      double mx = -kInf;
      for (auto [t, c] : rows) mx = std::max(mx, score.row(t)[c]);
      double den = 0, num = 0;
      for (auto [t, c] : rows) {
        const double wgt = std::exp(score.row(t)[c] - mx);
        den += wgt;
        num += wgt * kv.row(t)[c];
      }
      e[d] = num / den;
    }
    rmsnorm(e.data(), hd, &norm, eps);
    return e;
  }
};

}  // namespace

std::vector<double> reference_attention_layer(const ModelConfig& cfg, int layer,
                                              const AttentionWeights& w,
                                              const std::vector<double>& x,
                                              const ReferenceOptions& opts) {
  const int64_t dim = cfg.dim, H = cfg.n_heads, D = cfg.head_dim, R = cfg.rope_head_dim;
  const int64_t W = cfg.window_size, G = cfg.o_groups, Lo = cfg.o_lora_rank;
  const double eps = cfg.norm_eps;
  DSV4_CHECK(x.size() % dim == 0, "reference_attention_layer: x size ", x.size(), " not a multiple of dim ", dim);
  const int64_t L = static_cast<int64_t>(x.size()) / dim;
  const int ratio = cfg.compress_ratio(layer);
  const std::vector<double> freqs = frequencies(cfg.rope_for_layer(layer));

  const std::vector<double> q_norm = to_vec(w.q_norm), kv_norm = to_vec(w.kv_norm), sink = to_vec(w.attn_sink);
  Mat X;
  X.rows = L;
  X.cols = dim;
  X.a = x;

  // The input of a projection as it reads it: with an FP8 weight (and fp8_gemm_activations), the
  // rows FP8-rounded per 128 columns as the production Linear quantizes them.
  const auto gemm_input = [&](const Mat& A, const Weight& wt) {
    if (!opts.fp8_gemm_activations || !wt.quantized()) return A;
    Mat q = A;
    for (int64_t r = 0; r < q.rows; ++r) fp8_round(&q.a[r * q.cols], q.cols, 128);
    return q;
  };

  // Projections of every position (batched; see gemm_t), then the per-row norms and roundings.
  Mat QR = project(gemm_input(X, w.wq_a), to_mat(w.wq_a));
  for (int64_t p = 0; p < L; ++p) {
    rmsnorm(&QR.a[p * QR.cols], cfg.q_lora_rank, &q_norm, eps);
    bf16_round(&QR.a[p * QR.cols], cfg.q_lora_rank);
  }
  Mat Q = project(gemm_input(QR, w.wq_b), to_mat(w.wq_b));  // [L, H*D]
  Mat KV = project(gemm_input(X, w.wkv), to_mat(w.wkv));    // [L, D]
  for (int64_t p = 0; p < L; ++p) {
    double* q = &Q.a[p * Q.cols];
    bf16_round(q, H * D);
    for (int64_t h = 0; h < H; ++h) {
      rmsnorm(q + h * D, D, nullptr, eps);
      rotate(q + h * D, D, freqs, static_cast<double>(p));
    }
    // The stored query: bf16, or over per-tensor FP8 caches what the FP8 query means (encoded
    // from the unrounded values, as the insert encodes its fp32 ones).
    if (opts.kv_layout == KvLayout::fp8_per_tensor)
      fp8_tensor_round(q, H * D, opts.q_scale);
    else
      bf16_round(q, H * D);
    double* kv = &KV.a[p * D];
    rmsnorm(kv, D, &kv_norm, eps);
    bf16_round(kv, D);
    rotate(kv, D, freqs, static_cast<double>(p));
    layout_round(kv, static_cast<int>(D), static_cast<int>(R), opts.kv_layout, opts.kv_scale);  // the SWA row as cached
  }

  std::unique_ptr<Compressor> comp, icomp;
  Mat QI, WTS;
  const int HI = cfg.index_n_heads, dI = cfg.index_head_dim;
  if (ratio > 0) comp = std::make_unique<Compressor>(*w.compressor, ratio, static_cast<int>(D), X);
  if (ratio == 4) {
    icomp = std::make_unique<Compressor>(w.indexer->compressor, 4, dI, X);
    QI = project(gemm_input(QR, w.indexer->wq_b), to_mat(w.indexer->wq_b));  // [L, HI*dI]
    WTS = project(X, to_mat(w.indexer->weights_proj));
    for (int64_t p = 0; p < L; ++p) {
      for (int h = 0; h < HI; ++h) {
        double* qh = &QI.a[p * QI.cols + int64_t{h} * dI];
        rotate(qh, dI, freqs, static_cast<double>(p));
        hadamard(qh, dI);
        fp8_round(qh, dI, dI);
        WTS.a[p * HI + h] *= 1.0 / std::sqrt(static_cast<double>(dI)) / std::sqrt(static_cast<double>(HI));
      }
    }
  }

  std::vector<std::vector<double>> entries;    // compressed entries as cached
  std::vector<std::vector<double>> ikeys;      // indexer keys (rotated, FP8-rounded)
  Mat O;  // attention outputs after inverse RoPE (and FP8 rounding) [L, H*D]
  O.rows = L;
  O.cols = H * D;
  O.a.assign(static_cast<size_t>(L * H * D), 0.0);

  for (int64_t p = 0; p < L; ++p) {
    const double* q = &Q.a[p * Q.cols];
    // Compressed entries completed by this token.
    std::vector<int64_t> chosen;
    if (ratio > 0) {
      if ((p + 1) % ratio == 0) {
        const int64_t j = (p + 1) / ratio - 1;
        std::vector<double> e = comp->pool(j, eps);
        rotate(e.data(), D, freqs, static_cast<double>(j * ratio));
        entry_round(e.data(), static_cast<int>(D), static_cast<int>(R), opts.kv_layout, opts.kv_scale);
        entries.push_back(std::move(e));
      }
      const int64_t visible = (p + 1) / ratio;
      if (ratio == 128) {
        for (int64_t j = 0; j < visible; ++j) chosen.push_back(j);
      } else {
        if ((p + 1) % 4 == 0) {
          const int64_t j = (p + 1) / 4 - 1;
          std::vector<double> k = icomp->pool(j, eps);
          rotate(k.data(), cfg.index_head_dim, freqs, static_cast<double>(j * 4));
          hadamard(k.data(), cfg.index_head_dim);
          fp8_round(k.data(), cfg.index_head_dim, cfg.index_head_dim);
          ikeys.push_back(std::move(k));
        }
        // Indexer scores (of the FP8-rounded operands), top-k with ties to the lowest index.
        const double* qi = &QI.a[p * QI.cols];
        const double* wts = &WTS.a[p * HI];
        std::vector<std::pair<double, int64_t>> sc;
        for (int64_t j = 0; j < visible; ++j) {
          double s = 0;
          for (int h = 0; h < HI; ++h) {
            double dot = 0;
            for (int d = 0; d < dI; ++d) dot += qi[int64_t{h} * dI + d] * ikeys[j][d];
            s += wts[h] * std::max(0.0, dot);
          }
          sc.push_back({s, j});
        }
        std::stable_sort(sc.begin(), sc.end(), [](auto& a, auto& b) { return a.first > b.first; });
        for (int64_t k = 0; k < std::min<int64_t>(cfg.index_topk, visible); ++k) chosen.push_back(sc[k].second);
      }
    }

    // Sparse attention over chosen entries + the SWA window, with the sink.
    std::vector<const std::vector<double>*> rows;
    for (int64_t j : chosen) rows.push_back(&entries[j]);
    std::vector<const double*> row_ptrs;
    for (const auto* e : rows) row_ptrs.push_back(e->data());
    for (int64_t t = std::max<int64_t>(0, p - W + 1); t <= p; ++t) row_ptrs.push_back(&KV.a[t * D]);
    double* o = &O.a[p * O.cols];
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
#pragma omp parallel for schedule(static)
    for (int64_t h = 0; h < H; ++h) {
      const double* qh = q + h * D;
      std::vector<double> logit(row_ptrs.size());
      double mx = -kInf;
      for (size_t i = 0; i < row_ptrs.size(); ++i) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += qh[d] * row_ptrs[i][d];
        logit[i] = s * scale;
        mx = std::max(mx, logit[i]);
      }
      double den = 0;
      for (double l : logit) den += std::exp(l - mx);
      const double lse = mx + std::log(den);
      const double keep = 1.0 / (1.0 + std::exp(sink[h] - lse));  // exp(lse)/(exp(lse)+exp(sink))
      double* oh = o + h * D;
      for (size_t i = 0; i < row_ptrs.size(); ++i) {
        const double pr = std::exp(logit[i] - lse) * keep;
        for (int64_t d = 0; d < D; ++d) oh[d] += pr * row_ptrs[i][d];
      }
      bf16_round(oh, D);
      rotate(oh, D, freqs, static_cast<double>(p), -1.0);
      bf16_round(oh, D);
    }
    if (opts.fp8_activations) fp8_round(o, H * D, 128);
  }

  // Grouped wo_a (group g: columns [g*gw, (g+1)*gw) of O times rows [g*Lo, (g+1)*Lo) of wo_a),
  // then wo_b.
  const Mat wo_a = to_mat(w.wo_a);  // [G * Lo, H*D/G]
  const int64_t gw = H * D / G;
  Mat Z;
  Z.rows = L;
  Z.cols = G * Lo;
  Z.a.resize(static_cast<size_t>(L * G * Lo));
  for (int64_t g = 0; g < G; ++g)
    gemm_t(O.a.data() + g * gw, O.cols, L, wo_a.row(g * Lo), wo_a.cols, Lo, gw, Z.a.data() + g * Lo, Z.cols);
  if (opts.fp8_gemm_activations && w.wo_b.quantized()) bf16_round(Z.a.data(), L * G * Lo);  // z is bf16
  Mat Y = project(gemm_input(Z, w.wo_b), to_mat(w.wo_b));
  std::vector<double> y = std::move(Y.a);
  return y;
}

}  // namespace dsv4
