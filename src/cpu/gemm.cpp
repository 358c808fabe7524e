#include "cpu/gemm.h"

#include <algorithm>
#include <vector>

#include "cpu/rows.h"

namespace dsv4::cpu {

namespace {
// Tile sizes: a 128-deep weight chunk of 64 rows is 32 KiB of fp32 (L1/L2 resident), and 64
// activation rows amortize its dequantization. 128 also matches the weight scale blocks, so a
// chunk never needs more than one scale per weight row.
constexpr int64_t kTileT = 64;
constexpr int64_t kTileN = 64;
constexpr int64_t kTileK = 128;

struct WorkItem {
  int64_t problem;
  int64_t t0;
  int64_t n0;
};

// Per-thread scratch: the transposed weight chunk, the activation chunk and the accumulators.
struct TileScratch {
  std::vector<float> w_t = std::vector<float>(kTileK * kTileN);  // [k][n]
  std::vector<float> x = std::vector<float>(kTileT * kTileK);    // [t][k]
  std::vector<float> acc = std::vector<float>(kTileT * kTileN);  // [t][n]
};

// acc[t][0..kTileN) += Σ_k x[t][k] · w_t[k][0..kTileN) for t < tn, k < kn. Four activation rows
// share each weight load. Compiled for AVX-512, AVX2+FMA and baseline x86-64, picked at load
// time (the build itself targets baseline x86-64); results are deterministic on a given machine.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void accumulate_tile(const float* x, const float* w_t, int64_t tn, int64_t kn, float* acc) {
  int64_t t = 0;
  for (; t + 4 <= tn; t += 4) {
    float* a0 = acc + (t + 0) * kTileN;
    float* a1 = acc + (t + 1) * kTileN;
    float* a2 = acc + (t + 2) * kTileN;
    float* a3 = acc + (t + 3) * kTileN;
    const float* x0 = x + (t + 0) * kTileK;
    const float* x1 = x + (t + 1) * kTileK;
    const float* x2 = x + (t + 2) * kTileK;
    const float* x3 = x + (t + 3) * kTileK;
    for (int64_t k = 0; k < kn; ++k) {
      const float* wk = w_t + k * kTileN;
      const float v0 = x0[k], v1 = x1[k], v2 = x2[k], v3 = x3[k];
#pragma omp simd
      for (int64_t n = 0; n < kTileN; ++n) {
        const float w = wk[n];
        a0[n] += v0 * w;
        a1[n] += v1 * w;
        a2[n] += v2 * w;
        a3[n] += v3 * w;
      }
    }
  }
  for (; t < tn; ++t) {
    float* a = acc + t * kTileN;
    const float* xr = x + t * kTileK;
    for (int64_t k = 0; k < kn; ++k) {
      const float* wk = w_t + k * kTileN;
      const float v = xr[k];
#pragma omp simd
      for (int64_t n = 0; n < kTileN; ++n) a[n] += v * wk[n];
    }
  }
}

void run_item(const GemmProblem& p, const WorkItem& item, TileScratch& s) {
  const int64_t K = p.x.cols;
  const int64_t tn = std::min(kTileT, p.x.rows - item.t0);
  const int64_t nn = std::min(kTileN, p.w.rows - item.n0);
  std::fill(s.acc.begin(), s.acc.end(), 0.0f);
  // Lanes past N are computed but never stored; zeroing them keeps stale values (possibly NaN
  // or denormal, which are slow) out of those lanes.
  if (nn < kTileN) std::fill(s.w_t.begin(), s.w_t.end(), 0.0f);
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    const int64_t kn = std::min(kTileK, K - k0);
    for (int64_t n = 0; n < nn; ++n)
      p.w.load_row_segment(item.n0 + n, k0, kn, s.w_t.data() + n, kTileN);
    for (int64_t t = 0; t < tn; ++t)
      p.x.load_row_segment(item.t0 + t, k0, kn, s.x.data() + t * kTileK);
    accumulate_tile(s.x.data(), s.w_t.data(), tn, kn, s.acc.data());
  }
  const int64_t elem = static_cast<int64_t>(dtype_size(p.y.dtype));
  for (int64_t t = 0; t < tn; ++t) {
    char* out = static_cast<char*>(p.y.data) + ((item.t0 + t) * p.y.row_stride + item.n0) * elem;
    store_row(s.acc.data() + t * kTileN, p.y.dtype, nn, out);
  }
}
}  // namespace

ScaledMatrix ScaledMatrix::from_views(const TensorView& values, const TensorView& scale,
                                      int64_t block_rows, int64_t block_cols) {
  ScaledMatrix m;
  m.data = values.data;
  m.dtype = values.dtype;
  m.rows = values.shape[0];
  m.cols = values.shape[1];
  m.row_stride = values.strides[0];
  if (scale.defined()) {
    m.scale = scale.data;
    m.scale_dtype = scale.dtype;
    m.scale_row_stride = scale.strides[0];
    m.scale_col_stride = scale.strides[1];
    m.scale_block_rows = block_rows;
    m.scale_block_cols = block_cols;
  }
  return m;
}

void ScaledMatrix::load_row_segment(int64_t r, int64_t c0, int64_t n, float* out,
                                    int64_t out_stride) const {
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  const char* row = static_cast<const char*>(data) + r * row_stride * elem;
  if (scale == nullptr) {
    load_row_scaled(row + c0 * elem, dtype, n, 1.0f, out, out_stride);
    return;
  }
  // One decode per scale block the range touches.
  const int64_t scale_row = (r / scale_block_rows) * scale_row_stride;
  for (int64_t c = c0; c < c0 + n;) {
    const int64_t block = c / scale_block_cols;
    const int64_t end = std::min((block + 1) * scale_block_cols, c0 + n);
    load_row_scaled(row + c * elem, dtype, end - c,
                    load_scale(scale, scale_dtype, scale_row + block * scale_col_stride),
                    out + (c - c0) * out_stride, out_stride);
    c = end;
  }
}

OutputMatrix OutputMatrix::from_view(const TensorView& t) {
  return OutputMatrix{t.data, t.dtype, t.shape[0], t.shape[1], t.strides[0]};
}

void gemm_xwT(const GemmProblem* problems, int64_t count) {
  std::vector<WorkItem> items;
  for (int64_t p = 0; p < count; ++p)
    for (int64_t n0 = 0; n0 < problems[p].w.rows; n0 += kTileN)
      for (int64_t t0 = 0; t0 < problems[p].x.rows; t0 += kTileT) items.push_back({p, t0, n0});
  const int64_t num_items = static_cast<int64_t>(items.size());
#pragma omp parallel if (num_items > 1)
  {
    TileScratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_items; ++i) run_item(problems[items[i].problem], items[i], scratch);
  }
}

}  // namespace dsv4::cpu
