// Float64 reference of one V3.2 sparse-MLA layer for one request (see
// include/dsv4/sparse_mla_reference.h), written from DeepSeek-V3.2's model math on its own.
#include "dsv4/sparse_mla_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dsv4/status.h"
#include "layer/reference_math.h"

namespace dsv4 {

namespace {

using namespace reference_math;  // NOLINT(google-build-using-namespace)

// NeoX rotation of the first 2*freqs.size() dims of v (the indexer's RoPE): (v_i, v_{i+half}).
void rotate_halves(double* v, const std::vector<double>& freqs, double p) {
  const size_t half = freqs.size();
  for (size_t i = 0; i < half; ++i) {
    const double c = std::cos(p * freqs[i]), s = std::sin(p * freqs[i]);
    const double a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = a * s + b * c;
  }
}

// The indexer's row preparation: RoPE, Hadamard rotation, FP8 with one power-of-two scale.
void indexer_row(double* v, int d, const std::vector<double>& freqs, double p) {
  rotate_halves(v, freqs, p);
  hadamard(v, d);
  fp8_round(v, d, d);
}

// Rows of X, FP8-rounded per 1x128 block when `quantize` (a projection input for an FP8 weight).
Mat projection_input(const Mat& X, const Weight& w, bool quantize) {
  if (!(quantize && w.quantized())) return X;
  Mat q = X;
  for (int64_t r = 0; r < q.rows; ++r) fp8_round(q.a.data() + r * q.cols, q.cols, 128);
  return q;
}

void round_all(Mat& m) { bf16_round(m.a.data(), static_cast<int64_t>(m.a.size())); }

}  // namespace

std::vector<double> reference_sparse_mla_layer(const ModelConfig& cfg, const SparseMlaWeights& w,
                                               const std::vector<double>& x,
                                               const ReferenceOptions& opts) {
  validate_sparse_mla_weights(w, cfg, "reference_sparse_mla_layer");
  const int64_t dim = cfg.dim, H = cfg.n_heads, n = cfg.qk_nope_head_dim, R = cfg.rope_head_dim;
  const int64_t c = cfg.nope_dim(), v = cfg.mla_v_head_dim, I = cfg.index_n_heads;
  const int d_i = cfg.index_head_dim;
  DSV4_CHECK(x.size() % static_cast<size_t>(dim) == 0, "reference_sparse_mla_layer: x size ",
             x.size(), " is not a multiple of dim ", dim);
  const int64_t L = static_cast<int64_t>(x.size()) / dim;
  const double eps = cfg.norm_eps, scale = cfg.mla_softmax_scale();
  const std::vector<double> freqs = frequencies(cfg.rope_for_layer(w.layer));
  const bool q8 = opts.fp8_gemm_activations;

  Mat X{L, dim, x};
  // Projections of every position: q_lora (normed), the latent + k_pe row, q per head.
  Mat qa = project(projection_input(X, w.wq_a, q8), to_mat(w.wq_a));
  Mat kv = project(projection_input(X, w.wkv_a, q8), to_mat(w.wkv_a));
  round_all(qa);
  round_all(kv);
  const std::vector<double> q_norm = to_vec(w.q_norm), kv_norm = to_vec(w.kv_norm);
  for (int64_t t = 0; t < L; ++t) {
    double* qr = qa.a.data() + t * qa.cols;
    rmsnorm(qr, qa.cols, &q_norm, eps);
    bf16_round(qr, qa.cols);
    double* row = kv.a.data() + t * kv.cols;
    rmsnorm(row, c, &kv_norm, eps);
    rotate(row, c + R, freqs, static_cast<double>(t));
    bf16_round(row, c + R);
  }
  Mat q = project(projection_input(qa, w.wq_b, q8), to_mat(w.wq_b));  // [L, H*(n+R)]
  round_all(q);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double* head = q.a.data() + t * q.cols + h * (n + R);
      rotate(head, n + R, freqs, static_cast<double>(t));
      bf16_round(head, n + R);
    }

  // What the V32_FP8 cache hands back: the latent FP8 per 128 (UE8M0), k_pe bf16 (already).
  Mat cache = kv;
  for (int64_t t = 0; t < L; ++t) fp8_round(cache.a.data() + t * cache.cols, c, 128);

  // Indexer queries, keys (LayerNorm first) and weights.
  Mat qi = project(projection_input(qa, w.indexer.wq_b, q8), to_mat(w.indexer.wq_b));
  Mat ki = project(projection_input(X, w.indexer.wk, q8), to_mat(w.indexer.wk));
  Mat wts = project(X, to_mat(w.indexer.weights_proj));
  const std::vector<double> kn_w = to_vec(w.indexer.k_norm), kn_b = to_vec(w.indexer.k_norm_bias);
  for (int64_t t = 0; t < L; ++t) {
    double* k = ki.a.data() + t * d_i;
    double mean = 0, var = 0;
    for (int i = 0; i < d_i; ++i) mean += k[i];
    mean /= d_i;
    for (int i = 0; i < d_i; ++i) var += (k[i] - mean) * (k[i] - mean);
    const double inv = 1.0 / std::sqrt(var / d_i + 1e-6);
    for (int i = 0; i < d_i; ++i) k[i] = (k[i] - mean) * inv * kn_w[i] + kn_b[i];
    indexer_row(k, d_i, freqs, static_cast<double>(t));
    for (int64_t h = 0; h < I; ++h)
      indexer_row(qi.a.data() + t * qi.cols + h * d_i, d_i, freqs, static_cast<double>(t));
  }
  const double w_scale = 1.0 / std::sqrt(static_cast<double>(I * d_i));

  // W_UK and W_UV rows of each head, from wkv_b [H*(n+v), c].
  const Mat wkv_b = to_mat(w.wkv_b);
  Mat o{L, H * v, std::vector<double>(static_cast<size_t>(L * H * v))};
  std::vector<double> scores(static_cast<size_t>(L));
  std::vector<int64_t> order(static_cast<size_t>(L));
  const int64_t K = cfg.index_topk;
  for (int64_t t = 0; t < L; ++t) {
    // Top-k of the earlier tokens and itself by indexer score (ties: lowest token first).
    for (int64_t j = 0; j <= t; ++j) {
      double s = 0;
      for (int64_t h = 0; h < I; ++h) {
        const double* qh = qi.row(t) + h * d_i;
        const double dot = std::inner_product(qh, qh + d_i, ki.row(j), 0.0);
        s += wts.row(t)[h] * w_scale * std::max(dot, 0.0);
      }
      scores[j] = s;
    }
    std::iota(order.begin(), order.begin() + t + 1, int64_t{0});
    std::stable_sort(order.begin(), order.begin() + t + 1,
                     [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
    const int64_t k_sel = std::min<int64_t>(K, t + 1);

    for (int64_t h = 0; h < H; ++h) {
      // The absorbed query: q_nope · W_UK (bf16), and q_pe.
      const double* qh = q.row(t) + h * (n + R);
      std::vector<double> ql(static_cast<size_t>(c), 0.0);
      for (int64_t d = 0; d < n; ++d) {
        const double* uk = wkv_b.row(h * (n + v) + d);
        for (int64_t cc = 0; cc < c; ++cc) ql[cc] += qh[d] * uk[cc];
      }
      bf16_round(ql.data(), c);
      std::vector<double> logit(static_cast<size_t>(k_sel));
      double mx = -kInf;
      for (int64_t s = 0; s < k_sel; ++s) {
        const double* row = cache.row(order[s]);
        const double l = std::inner_product(ql.begin(), ql.end(), row, 0.0) +
                         std::inner_product(qh + n, qh + n + R, row + c, 0.0);
        logit[s] = scale * l;
        mx = std::max(mx, logit[s]);
      }
      double den = 0;
      for (double& l : logit) den += (l = std::exp(l - mx));
      std::vector<double> lat(static_cast<size_t>(c), 0.0);
      for (int64_t s = 0; s < k_sel; ++s) {
        const double* row = cache.row(order[s]);
        for (int64_t cc = 0; cc < c; ++cc) lat[cc] += logit[s] / den * row[cc];
      }
      bf16_round(lat.data(), c);
      double* oh = o.a.data() + t * o.cols + h * v;
      for (int64_t vv = 0; vv < v; ++vv)
        oh[vv] = std::inner_product(lat.begin(), lat.end(), wkv_b.row(h * (n + v) + n + vv), 0.0);
      bf16_round(oh, v);
    }
  }
  const Mat y = project(projection_input(o, w.wo, opts.fp8_activations), to_mat(w.wo));
  return y.a;
}

}  // namespace dsv4
