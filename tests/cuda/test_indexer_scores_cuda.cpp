// The CUDA indexer scores (FP8 tensor cores, src/cuda/indexer/scores/) against the float64 formula
// on the same fp8 operands and against the CPU op. Skipped without a GPU.
//
// Tolerance (include/dsv4/indexer.h): per visible score |gpu − exact| <= 2^-5 · M_j with
// M_j = Σ_h |w_h| · q_scale_h · k_scale_j · Σ_d |q̂_h,d · k̂_j,d| (the bound of Hopper's aligned,
// truncating FP8 accumulation over 4 MMA steps of 32 products), and over a call's visible scores
// RMS(Δ / M_j) <= 2^-12 (a bit-level model of that accumulator gives ~2^-18 on these operands; a
// wrong key row, head factor or dimension pairing gives ~2^-6). Columns past the visible count are
// exactly −inf; a token with no request row or a visible entry whose block is unmapped is NaN.
// With small-integer operands every product and partial sum is exact in the MMA and in fp32, so
// the one-CTA layout tests demand the CPU's bits: a descriptor, swizzle or fragment-mapping
// mistake cannot hide behind the tolerance.
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

#include "cuda/indexer/indexer.h"
#include "dsv4/device_tensor.h"
#include "dsv4/fp8_block.h"
#include "dsv4/indexer.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/status.h"
#include "gpu_test_util.h"
#include "indexer_test_util.h"

namespace dsv4 {
namespace {

using namespace indexer_test;

constexpr int kDim = 128;
constexpr int kRatio = 4;
constexpr float kInf = std::numeric_limits<float>::infinity();
const double kMaxRelToM = std::ldexp(1.0, -5);
const double kRmsRelToM = std::ldexp(1.0, -12);

// One token of a batch: its request (row of the block table) and absolute position.
struct Token {
  int64_t req, pos;
};

// How the operands are drawn: Gaussian rows through the production quantizers (realistic
// magnitudes, one power-of-two scale per row), or small integers (exact arithmetic everywhere).
enum class Values { gaussian, small_integers };

struct BatchSpec {
  std::vector<Token> tokens;
  int64_t num_requests = 1;
  int H = 64, block = 64;
  Values values = Values::gaussian;
  DType pos_dtype = DType::int64, req_dtype = DType::int32;
  int64_t q_head_stride = kDim;  // bytes between heads (> 128: padded rows, 4-byte copy path)
  int64_t extra_columns = 3;     // N = max visible + this
  uint32_t seed = 1;
};

// A batch of tokens over a paged indexer key cache with shuffled blocks, the float64 reference
// scores and the magnitudes M of the tolerance.
struct ScoresBatch {
  BatchSpec spec;
  int64_t T = 0, H = 0, N = 0, R = 0;
  int block = 0;
  HostTensor q_storage, q_scale, w, pos, req, keys, table;
  TensorView q_fp8;  // [T, H, 128] view of q_storage (padded head stride when asked)
  std::vector<int64_t> visible;
  std::vector<double> exact, magnitude;  // [T, N]: float64 score and M for visible columns

  explicit ScoresBatch(const BatchSpec& s) : spec(s) {
    std::mt19937 rng(s.seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    T = static_cast<int64_t>(s.tokens.size());
    H = s.H;
    R = s.num_requests;
    block = s.block;
    std::vector<int64_t> keys_of(static_cast<size_t>(R), 0), pv, rv;
    int64_t max_visible = 0;
    for (const Token& tok : s.tokens) {
      const int64_t v = tok.pos < 0 ? 0 : (tok.pos + 1) / kRatio;
      visible.push_back(v);
      max_visible = std::max(max_visible, v);
      keys_of[tok.req] = std::max(keys_of[tok.req], v);
      pv.push_back(tok.pos);
      rv.push_back(tok.req);
    }
    N = max_visible + s.extra_columns;
    pos = index_tensor(s.pos_dtype, pv);
    req = index_tensor(s.req_dtype, rv);

    // Queries: fp8 codes + one power-of-two scale per (token, head); weights.
    q_storage = HostTensor(DType::fp8_e4m3, {T, H, s.q_head_stride});
    q_storage.fill_bytes(0x7F);  // fp8 NaN in the padding: read by mistake, it shows
    q_fp8 = q_storage.view();
    q_fp8.shape[2] = kDim;
    q_scale = HostTensor(DType::fp32, {T, H});
    w = HostTensor(DType::fp32, {T, H});
    std::vector<float> row(kDim);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        uint8_t* codes = q_storage.data<uint8_t>() + (t * H + h) * s.q_head_stride;
        float& qs = q_scale.data<float>()[t * H + h];
        float& wt = w.data<float>()[t * H + h];
        if (s.values == Values::gaussian) {
          const float mag = std::exp(0.5f * normal(rng));
          for (float& x : row) x = normal(rng) * mag;
          qs = exp2_int(fp8_quantize_block(row.data(), kDim, codes));
          wt = 0.3f * normal(rng);
        } else {
          for (int d = 0; d < kDim; ++d) codes[d] = float_to_fp8_e4m3(static_cast<float>(integer(rng, -3, 3)));
          qs = std::ldexp(1.0f, static_cast<int>(integer(rng, -1, 1)));
          wt = static_cast<float>(integer(rng, -8, 8)) / 8.0f;
        }
      }

    // Keys: each request's entries in its own shuffled blocks, 2 spare blocks, −1 past its end.
    int64_t per_req = 1;
    for (int64_t k : keys_of) per_req = std::max(per_req, (k + block - 1) / block);
    const int64_t num_blocks = R * per_req + 2;
    const int64_t block_bytes = int64_t{block} * indexer_keys::kEntryBytes;
    keys = HostTensor(DType::uint8, {num_blocks, block_bytes});
    for (int64_t b = 0; b < num_blocks; ++b) {
      uint8_t* base = keys.data<uint8_t>() + b * block_bytes;
      for (int off = 0; off < block; ++off) {
        if (s.values == Values::gaussian) {
          const float mag = std::exp(0.5f * normal(rng));
          for (float& x : row) x = normal(rng) * mag;
          indexer_key_encode(base, block, off, row.data());
        } else {
          uint8_t* codes = base + indexer_key_data_offset(off);
          for (int d = 0; d < kDim; ++d) codes[d] = float_to_fp8_e4m3(static_cast<float>(integer(rng, -3, 3)));
          const float ks = std::ldexp(1.0f, static_cast<int>(integer(rng, -1, 1)));
          std::memcpy(base + indexer_key_scale_offset(block, off), &ks, 4);
        }
      }
    }
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table = HostTensor(DType::int32, {R, per_req + 1});  // one unmapped column past every request
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k <= per_req; ++k) {
        const bool mapped = k < (keys_of[r] + block - 1) / block;
        table.data<int32_t>()[r * (per_req + 1) + k] = mapped ? ids[r * per_req + k] : -1;
      }
    compute_reference();
  }

  // The float64 formula on the fp8 operands: score = Σ_h w_h · max(0, q̂_h·k̂_j) · q_scale_h · k_scale_j.
  // Operands are decoded once (the sums are the costly part of these tests on the host).
  void compute_reference() {
    exact.assign(static_cast<size_t>(T * N), 0.0);
    magnitude.assign(static_cast<size_t>(T * N), 0.0);
    std::vector<double> qf(static_cast<size_t>(T * H * kDim));
    for (int64_t r = 0; r < T * H; ++r)
      for (int d = 0; d < kDim; ++d)
        qf[r * kDim + d] = fp8_e4m3_to_float(q_storage.data<uint8_t>()[r * spec.q_head_stride + d]);
    std::vector<std::vector<double>> kf(static_cast<size_t>(R)), ksf(static_cast<size_t>(R));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t q = spec.tokens[t].req;
      for (int64_t j = static_cast<int64_t>(ksf[q].size()); j < visible[t]; ++j) {
        const int32_t b = table.data<int32_t>()[q * table.shape()[1] + j / block];
        const uint8_t* base = keys.data<uint8_t>() + b * keys.shape()[1];
        const uint8_t* kc = indexer_key_codes(base, static_cast<int>(j % block));
        for (int d = 0; d < kDim; ++d) kf[q].push_back(fp8_e4m3_to_float(kc[d]));
        ksf[q].push_back(indexer_key_scale(base, block, static_cast<int>(j % block)));
      }
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t q = spec.tokens[t].req;
      for (int64_t j = 0; j < visible[t]; ++j) {
        const double* k = kf[q].data() + j * kDim;
        double s = 0.0, m = 0.0;
        for (int64_t h = 0; h < H; ++h) {
          const double* qh = qf.data() + (t * H + h) * kDim;
          double dot = 0.0, mag = 0.0;
          for (int d = 0; d < kDim; ++d) {
            dot += qh[d] * k[d];
            mag += std::fabs(qh[d] * k[d]);
          }
          const double c = double{w.data<float>()[t * H + h]} * q_scale.data<float>()[t * H + h] * ksf[q][j];
          s += c * std::max(0.0, dot);
          m += std::fabs(c) * mag;
        }
        exact[t * N + j] = s;
        magnitude[t * N + j] = m;
      }
    }
  }

  struct OnDevice {
    DeviceTensor q, q_scale, w, pos, req, keys, table;
  };
  OnDevice upload() const {
    return {DeviceTensor::from_host(q_storage), DeviceTensor::from_host(q_scale), DeviceTensor::from_host(w),
            DeviceTensor::from_host(pos),       DeviceTensor::from_host(req),     DeviceTensor::from_host(keys),
            DeviceTensor::from_host(table)};
  }
  // q_fp8's view (padded strides) on the device copy of q_storage.
  TensorView q_view(const DeviceTensor& q) const {
    TensorView v = q.view();
    v.shape[2] = kDim;
    return v;
  }

  HostTensor run_cpu() const {
    HostTensor scores = poisoned_host(DType::fp32, {T, N});
    indexer_scores(q_fp8, q_scale, w, pos, req, {keys, block}, table, kRatio, scores);
    return scores;
  }
  // The public op (automatic launch shape), or the CUDA entry point with a forced one.
  HostTensor run_cuda(const cuda::ScoresTiling* tiling = nullptr) const {
    const OnDevice d = upload();
    DeviceTensor scores = poisoned_device(DType::fp32, {T, N});
    if (tiling == nullptr)
      indexer_scores(q_view(d.q), d.q_scale, d.w, d.pos, d.req, {d.keys, block}, d.table, kRatio, scores);
    else
      cuda::indexer_scores(q_view(d.q), d.q_scale, d.w, d.pos, d.req, {d.keys, block}, d.table, kRatio, scores,
                           nullptr, *tiling);
    return synced_to_host(scores);
  }

  // Every column against the formula: −inf past the visible count, within the tolerance before.
  void expect_within_tolerance(const HostTensor& gpu, const std::string& what) const {
    double sum_sq = 0.0;
    int64_t n = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < N; ++j) {
        const float g = gpu.data<float>()[t * N + j];
        if (j >= visible[t]) {
          ASSERT_EQ(g, -kInf) << what << ": t " << t << " j " << j << " (past the visible " << visible[t] << ")";
          continue;
        }
        const double e = exact[t * N + j], m = magnitude[t * N + j];
        ASSERT_TRUE(std::isfinite(g)) << what << ": t " << t << " j " << j;
        ASSERT_LE(std::fabs(g - e), kMaxRelToM * m) << what << ": t " << t << " j " << j << " exact " << e
                                                     << " gpu " << g << " M " << m;
        if (m > 0) {
          sum_sq += ((g - e) / m) * ((g - e) / m);
          ++n;
        }
      }
    if (n > 0) {
      const double rms = std::sqrt(sum_sq / static_cast<double>(n));
      EXPECT_LE(rms, kRmsRelToM) << what << ": RMS of (gpu - exact) / M over " << n << " scores";
      ::testing::Test::RecordProperty("rms_rel_to_M", std::to_string(rms));
    }
  }
};

// Every launch shape the kernel has for the batch's heads: tokens per CTA (1, 2, 4 within 256
// columns) × key tiles per CTA (automatic, 1: every tile its own CTA, 3: chunks that end inside
// a row).
std::vector<cuda::ScoresTiling> tilings_for(int H) {
  const int padded = H <= 64 ? 64 : H <= 128 ? 128 : 256;
  std::vector<cuda::ScoresTiling> out;
  for (int tokens : {1, 2, 4})
    if (tokens * padded <= 256)
      for (int chunk : {0, 1, 3}) out.push_back({tokens, chunk});
  return out;
}

std::string tiling_name(const cuda::ScoresTiling& t) {
  return "tokens/CTA " + std::to_string(t.tokens_per_cta) + ", tiles/CTA " + std::to_string(t.chunk_tiles);
}

// ================================ layout: one CTA, exact =====================================

// One CTA's tile: G tokens of one request, each seeing exactly the 64 keys of one block (a
// single wgmma tile), small-integer operands: the GPU must give the CPU's bits (and both the
// exact value). Any mistake in the smem layouts, the wgmma descriptors or the accumulator
// fragment → (key, head) mapping moves scores by whole units.
TEST(IndexerScoresTileCuda, IntegerOperandsGiveTheCpuBits) {
  DSV4_SKIP_WITHOUT_GPU();
  for (const int H : {64, 4, 100, 128, 200}) {
    for (const cuda::ScoresTiling& tiling : tilings_for(H)) {
      if (tiling.chunk_tiles != 1) continue;
      BatchSpec spec;
      spec.H = H;
      spec.values = Values::small_integers;
      spec.seed = static_cast<uint32_t>(10 * H + tiling.tokens_per_cta);
      // Positions 255..258: visible 64 each (one whole block = one tile); N = 67 adds −inf columns.
      for (int tau = 0; tau < tiling.tokens_per_cta; ++tau) spec.tokens.push_back({0, 255 + tau});
      const ScoresBatch batch(spec);
      const HostTensor cpu = batch.run_cpu();
      const HostTensor gpu = batch.run_cuda(&tiling);
      SCOPED_TRACE("H " + std::to_string(H) + ", " + tiling_name(tiling));
      expect_same_bytes("scores", cpu, gpu);
      for (int64_t i = 0; i < batch.T * batch.N; ++i)
        if (i % batch.N < 64) ASSERT_EQ(cpu.data<float>()[i], batch.exact[i]) << "cpu vs exact, element " << i;
    }
  }
}

// A CTA of 4 tokens from 3 requests (segments handled one after the other with the same Q
// operand) and a visible count that ends inside the tile: still the CPU's bits.
TEST(IndexerScoresTileCuda, TokensOfSeveralRequestsInOneCta) {
  DSV4_SKIP_WITHOUT_GPU();
  BatchSpec spec;
  spec.values = Values::small_integers;
  spec.num_requests = 3;
  spec.tokens = {{2, 200}, {0, 255}, {2, 130}, {1, 90}};
  spec.seed = 77;
  const ScoresBatch batch(spec);
  const cuda::ScoresTiling tiling{4, 1};
  expect_same_bytes("scores", batch.run_cpu(), batch.run_cuda(&tiling));
}

// ================================ realistic batches, tolerance ===============================

struct ScoresCase {
  const char* name;
  BatchSpec spec;
};
std::ostream& operator<<(std::ostream& os, const ScoresCase& c) { return os << c.name; }

// Positions at window edges: the last token of a window (a new entry just visible), the first
// one after it, and visible counts at tile (64) and block boundaries ± 1.
std::vector<int64_t> edge_positions() {
  return {0, 2, 3, 4, 7, 251, 254, 255, 256, 259, 511, 515, 1023, 4095, 4099};
}

// Decode: one token per request, contexts from 0 to ~4k entries (different per request).
BatchSpec decode_batch(int H, int block, uint32_t seed) {
  BatchSpec s;
  s.H = H;
  s.block = block;
  s.seed = seed;
  std::mt19937 rng(seed);
  const std::vector<int64_t> edges = edge_positions();
  s.num_requests = 48;
  for (int64_t r = 0; r < s.num_requests; ++r)
    s.tokens.push_back({r, r < static_cast<int64_t>(edges.size()) ? edges[r] : integer(rng, 0, 4 * 4096)});
  std::shuffle(s.tokens.begin(), s.tokens.end(), rng);  // requests in any row order
  return s;
}

// Prefill: chunks of consecutive positions of three requests (one continuing a long context).
BatchSpec prefill_batch(int H, int block, uint32_t seed) {
  BatchSpec s;
  s.H = H;
  s.block = block;
  s.seed = seed;
  s.num_requests = 3;
  s.pos_dtype = DType::int32;
  s.req_dtype = DType::int64;
  for (int64_t p = 1000; p < 1203; ++p) s.tokens.push_back({0, p});
  for (int64_t p = 0; p < 130; ++p) s.tokens.push_back({1, p});
  for (int64_t p = 4090; p < 4167; ++p) s.tokens.push_back({2, p});
  return s;
}

// A serving step: decodes first (one token each), then two prefill chunks, rows of the table
// in another order than the tokens.
BatchSpec mixed_batch(int H, int block, uint32_t seed) {
  BatchSpec s;
  s.H = H;
  s.block = block;
  s.seed = seed;
  s.num_requests = 7;
  const int64_t decode_pos[5] = {255, 3, 1500, 64, 700};
  for (int r = 0; r < 5; ++r) s.tokens.push_back({6 - r, decode_pos[r]});
  for (int64_t p = 250; p < 321; ++p) s.tokens.push_back({1, p});
  for (int64_t p = 0; p < 45; ++p) s.tokens.push_back({0, p});
  return s;
}

class IndexerScoresCuda : public ::testing::TestWithParam<ScoresCase> {};

// The public op (automatic launch shape) and every forced launch shape: within the tolerance of
// the float64 formula, −inf past the causal limit.
TEST_P(IndexerScoresCuda, WithinToleranceOfTheFormula) {
  DSV4_SKIP_WITHOUT_GPU();
  const ScoresBatch batch(GetParam().spec);
  batch.expect_within_tolerance(batch.run_cuda(), "automatic launch");
  for (const cuda::ScoresTiling& tiling : tilings_for(batch.spec.H))
    batch.expect_within_tolerance(batch.run_cuda(&tiling), tiling_name(tiling));
}

INSTANTIATE_TEST_SUITE_P(
    Batches, IndexerScoresCuda,
    ::testing::Values(ScoresCase{"decode_h64_b64", decode_batch(64, 64, 1)},
                      ScoresCase{"prefill_h64_b64", prefill_batch(64, 64, 2)},
                      ScoresCase{"mixed_h64_b16", mixed_batch(64, 16, 3)},
                      // Blocks of several 64-key tiles (one table read per tile, tile → block
                      // by division).
                      ScoresCase{"prefill_h64_b128", prefill_batch(64, 128, 14)},
                      ScoresCase{"decode_h64_b192", decode_batch(64, 192, 15)},
                      ScoresCase{"mixed_h4_b4_tiny", mixed_batch(4, 4, 4)},
                      ScoresCase{"decode_h100_b32", decode_batch(100, 32, 5)},
                      ScoresCase{"prefill_h128_b64", prefill_batch(128, 64, 6)},
                      ScoresCase{"mixed_h200_b64", mixed_batch(200, 64, 7)},
                      // Key rows only 4-byte aligned (blocks of 132 / 396 bytes): word copies.
                      ScoresCase{"mixed_h64_b1_unaligned", mixed_batch(64, 1, 8)},
                      ScoresCase{"decode_h64_b3_unaligned", decode_batch(64, 3, 9)},
                      // Padded query heads (stride 132 bytes): word copies of Q.
                      ScoresCase{"prefill_h64_padded_q", [] {
                                   BatchSpec s = prefill_batch(64, 64, 10);
                                   s.q_head_stride = 132;
                                   return s;
                                 }()},
                      // Two long rows (20000 entries: 313 tiles, chunked over CTAs).
                      ScoresCase{"long_rows", [] {
                                   BatchSpec s;
                                   s.num_requests = 2;
                                   s.tokens = {{0, 80003}, {1, 60000}};
                                   s.seed = 11;
                                   return s;
                                 }()}),
    [](const auto& info) { return std::string(info.param.name); });

// The CPU op and the CUDA op on the same batch: both within the tolerance of the formula (the
// CPU far tighter), so they agree within twice of it; and two CUDA runs give the same bits.
TEST(IndexerScoresCuda, AgreesWithTheCpuOpAndIsDeterministic) {
  DSV4_SKIP_WITHOUT_GPU();
  const ScoresBatch batch(mixed_batch(64, 64, 12));
  const HostTensor cpu = batch.run_cpu(), gpu = batch.run_cuda();
  batch.expect_within_tolerance(cpu, "cpu");
  batch.expect_within_tolerance(gpu, "cuda");
  expect_same_bytes("two CUDA runs", gpu, batch.run_cuda());
}

// ================================ out-of-range indices and rejections ========================

// What the CPU rejects, CUDA marks: a token whose request row is out of range, and a visible
// entry whose block is unmapped, score NaN; everything else is within the tolerance.
// Blocks of 4 keys take the per-key copies, blocks of 64 the per-tile ones.
class IndexerScoresOutOfRangeCuda : public ::testing::TestWithParam<int> {};

TEST_P(IndexerScoresOutOfRangeCuda, OutOfRangeIndicesScoreNaN) {
  DSV4_SKIP_WITHOUT_GPU();
  BatchSpec spec = mixed_batch(8, GetParam(), 13);
  ScoresBatch batch(spec);
  const int64_t cols = batch.table.shape()[1];
  batch.req.data<int32_t>()[0] = static_cast<int32_t>(batch.R);  // token 0: no such request
  // Request 1 (a prefill chunk): its second block unmapped, its first out of the cache.
  batch.table.data<int32_t>()[1 * cols + 1] = -1;
  batch.table.data<int32_t>()[1 * cols + 0] = 1 << 30;
  const HostTensor gpu = batch.run_cuda();
  const int64_t B = batch.block;
  for (int64_t t = 0; t < batch.T; ++t) {
    const int64_t q = batch.spec.tokens[t].req;
    for (int64_t j = 0; j < batch.N; ++j) {
      const float g = gpu.data<float>()[t * batch.N + j];
      const bool unmapped = t == 0 || (q == 1 && j / B <= 1);
      if (j < batch.visible[t] && unmapped) {
        ASSERT_TRUE(std::isnan(g)) << "t " << t << " j " << j;
      } else if (j >= batch.visible[t]) {
        ASSERT_EQ(g, -kInf) << "t " << t << " j " << j;
      } else {
        ASSERT_LE(std::fabs(g - batch.exact[t * batch.N + j]), kMaxRelToM * batch.magnitude[t * batch.N + j])
            << "t " << t << " j " << j;
      }
    }
  }
}
INSTANTIATE_TEST_SUITE_P(BlockSizes, IndexerScoresOutOfRangeCuda, ::testing::Values(4, 64));

TEST(IndexerScoresCuda, RejectionsWriteNothing) {
  DSV4_SKIP_WITHOUT_GPU();
  BatchSpec spec;
  spec.H = 4;
  spec.block = 1;
  spec.tokens = {{0, 10}, {0, 39}, {0, 20}};
  const ScoresBatch batch(spec);
  const ScoresBatch::OnDevice d = batch.upload();
  const TensorView q = batch.q_view(d.q);
  DeviceTensor scores_d = poisoned_device(DType::fp32, {batch.T, batch.N});
  // Blocks of one entry (132 bytes) starting 2 bytes in: not 4-byte aligned.
  TensorView shifted = d.keys.view();
  shifted.data = static_cast<uint8_t*>(shifted.data) + 2;
  shifted.shape[0] -= 1;
  expect_error([&] {
    indexer_scores(q, d.q_scale, d.w, d.pos, d.req, {shifted, 1}, d.table, kRatio, scores_d);
  }, {"indexer_scores", "keys.data", "aligned"});
  // Query rows 2 bytes apart from a 4-byte boundary.
  DeviceTensor q_odd(DType::fp8_e4m3, {batch.T, batch.H, 130});
  TensorView q_shifted = q_odd.view();
  q_shifted.data = static_cast<uint8_t*>(q_shifted.data) + 2;
  q_shifted.shape[2] = kDim;
  expect_error([&] {
    indexer_scores(q_shifted, d.q_scale, d.w, d.pos, d.req, {d.keys, 1}, d.table, kRatio, scores_d);
  }, {"indexer_scores", "q_fp8", "aligned"});
  // More index heads than the kernel pads to.
  DeviceTensor q_big = poisoned_device(DType::fp8_e4m3, {batch.T, 257, kDim}),
               s_big = poisoned_device(DType::fp32, {batch.T, 257}), w_big = poisoned_device(DType::fp32, {batch.T, 257});
  expect_error([&] {
    indexer_scores(q_big, s_big, w_big, d.pos, d.req, {d.keys, 1}, d.table, kRatio, scores_d);
  }, {"indexer_scores", "index heads"});
  expect_error([&] {  // the block table on the host
    indexer_scores(q, d.q_scale, d.w, d.pos, d.req, {d.keys, 1}, batch.table, kRatio, scores_d);
  }, {"indexer_scores", "key_block_table.device"});
  const HostTensor s = synced_to_host(scores_d);
  for (int64_t i = 0; i < static_cast<int64_t>(s.nbytes()); ++i) ASSERT_EQ(s.data<uint8_t>()[i], 0xFF);
}

// T = 0 and N = 0 launch nothing.
TEST(IndexerScoresCuda, EmptyShapes) {
  DSV4_SKIP_WITHOUT_GPU();
  BatchSpec spec;
  spec.tokens = {{0, 40}};
  const ScoresBatch batch(spec);
  const ScoresBatch::OnDevice d = batch.upload();
  DeviceTensor q0(DType::fp8_e4m3, {0, 64, kDim}), s0(DType::fp32, {0, 64}), w0(DType::fp32, {0, 64});
  DeviceTensor p0(DType::int64, {0}), r0(DType::int32, {0}), out0(DType::fp32, {0, 5});
  indexer_scores(q0, s0, w0, p0, r0, {d.keys, batch.block}, d.table, kRatio, out0);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace dsv4
