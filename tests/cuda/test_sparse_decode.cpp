// CUDA sparse FP8 decode (split-KV + combine) against a float64 reference written here.
//
// The reference decodes the cache bytes by hand (fp8 · scale, bf16 rope) following docs/spec.md §7 and
// evaluates docs/spec.md §6 in double precision over the valid slots of both scopes. Inputs are fresh
// random data; outputs are poisoned (NaN bytes) before every call; rows of the cache that no
// selected slot refers to hold NaN bytes, so reading one shows up.
//
// FP8 queries (q_scale > 0 in a Case): q holds e4m3 codes; the kernel attends with the bf16 query
// they mean, bf16(fp8 · q_scale) (the product rounded once to fp32, then to bf16), which the
// reference takes as its query: a bf16 query like the others, so the same bounds hold.
//
// Tolerances: K/V are exact in bf16 (fp8 · power-of-two scale), q is bf16, so the kernel's only
// roundings are the fp32 accumulation, exp2/log2 approximations, the bf16 rounding of the
// probabilities P before P·V (relative 2^-9 each) and of the output (2^-9). Per output element
// we allow 1.5e-2 of the row's largest |out| (a few bf16 ulps of the biggest value); lse (fp32
// from fp32 logits) within 2e-3 absolute.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <random>
#include <vector>

#include "cpu/sparse_attention_reference.h"
#include "cuda/attention/sparse_decode.h"
#include "cuda/gpu_test_util.h"
#include "cuda/output_digest.h"
#include "dsv4/dtype.h"
#include "dsv4/kv_layout.h"
#include "dsv4/ops.h"

namespace dsv4 {
namespace {

using test::DeviceBuffer;

// A device copy of `host`, or an empty buffer (null pointer) for an empty vector.
template <typename T>
DeviceBuffer<T> upload_or_empty(const std::vector<T>& host) {
  return host.empty() ? DeviceBuffer<T>() : DeviceBuffer<T>(host);
}

// Block bytes and dims from docs/spec.md §7, not from kv_geometry (the shared test helpers).
using test::spec_block_bytes;
using test::spec_dim;
// FP8_PER_TENSOR caches of these tests: a scale that is not a power of two, so the kernel's
// rounding of fp8 · scale to bf16 is exercised.
constexpr float kTensorScale = 0.0371f;

// One paged cache, host bytes (poisoned with 0xFF = NaN except encoded tokens).
struct HostCache {
  KvLayout layout;
  int block_size;
  int64_t num_blocks, block_bytes;
  std::vector<uint8_t> bytes;
  HostCache(KvLayout l, int bs, int64_t slots)
      : layout(l), block_size(bs), num_blocks((slots + bs - 1) / bs), block_bytes(spec_block_bytes(l, bs)),
        bytes(static_cast<size_t>(num_blocks * block_bytes), 0xFF) {}
  int64_t num_slots() const { return num_blocks * block_size; }
  int dim() const { return spec_dim(layout); }
  void encode(int64_t slot, const std::vector<float>& v) {
    const KvGeometry g = kv_geometry(layout, block_size);
    kv_encode_token(g, bytes.data() + (slot / block_size) * block_bytes, static_cast<int>(slot % block_size), v.data(),
                    kTensorScale);
  }
  // Hand decode of value i of a slot (docs/spec.md §7), independent of kv_layout.h's decoder, as
  // the kernel hands it to the tensor cores: bf16. For MODEL1 that is exact (fp8 times a power of
  // two); V3.2 reads its fp32 scale as bf16 and rounds fp8 · bf16(scale) once (exact for the UE8M0
  // scales kv_encode_token writes); for FP8_PER_TENSOR it is bf16(fp8 · scale), rounded once from
  // the fp32 product (the kernel's stated contract for that layout).
  double value(int64_t slot, int i) const {
    const uint8_t* blk = bytes.data() + (slot / block_size) * block_bytes;
    const int off = static_cast<int>(slot % block_size);
    uint16_t bits;
    if (layout == KvLayout::bf16) {
      std::memcpy(&bits, blk + int64_t{off} * 1024 + 2 * i, 2);
      return bf16_bits_to_float(bits);
    }
    if (layout == KvLayout::fp8_per_tensor)
      return bf16_bits_to_float(float_to_bf16_bits(fp8_e4m3_to_float(blk[int64_t{off} * 512 + i]) * kTensorScale));
    if (layout == KvLayout::model1_fp8) {
      const uint8_t* row = blk + off * 576;
      if (i >= 448) {
        std::memcpy(&bits, row + 448 + 2 * (i - 448), 2);
        return bf16_bits_to_float(bits);
      }
      const uint8_t e = blk[int64_t{block_size} * 576 + off * 8 + i / 64];
      return double(fp8_e4m3_to_float(row[i])) * std::ldexp(1.0, int(e) - 127);
    }
    const uint8_t* row = blk + int64_t{off} * 656;
    if (i >= 512) {
      std::memcpy(&bits, row + 528 + 2 * (i - 512), 2);
      return bf16_bits_to_float(bits);
    }
    float scale;
    std::memcpy(&scale, row + 512 + 4 * (i / 128), 4);
    return bf16_bits_to_float(float_to_bf16_bits(fp8_e4m3_to_float(row[i]) * round_bf16(scale)));
  }
};

struct Scope {
  int topk = 0;
  std::vector<int32_t> indices;   // [rows, topk]
  std::vector<int32_t> lengths;   // [b] or empty
};

struct Case {
  const char* name;
  KvLayout layout;
  int h, b, s_q;
  int topk, block;              // main scope
  int extra_topk, extra_block;  // extra scope (0 = none)
  int splits;
  bool lengths = false;         // random topk_length per batch
  bool sink = false;
  double invalid_frac = 0.1;    // fraction of −1 / out-of-range indices
  float q_scale = 0.0f;         // > 0: the query is FP8, codes e4m3(q / q_scale), of this scale
};

// Everything one decode call needs, on the host and device.
struct Problem {
  Case c;
  int d_qk;
  int64_t rows;
  std::vector<uint16_t> q;      // bf16 bits [rows, H, d_qk]
  std::vector<uint8_t> q_fp8;   // c.q_scale > 0: the FP8 query the decode reads, e4m3(q / q_scale)
  HostCache main_cache, extra_cache;
  Scope main, extra;
  std::vector<float> sink;
  float scale;

  Problem(const Case& cs, std::mt19937& rng)
      : c(cs), d_qk(spec_dim(cs.layout)), rows(int64_t{cs.b} * cs.s_q),
        main_cache(cs.layout, cs.block, std::max<int64_t>(2 * rows * cs.topk, 64)),
        extra_cache(cs.layout, cs.extra_block > 0 ? cs.extra_block : 64,
                    std::max<int64_t>(2 * rows * cs.extra_topk, 64)),
        scale(static_cast<float>(1.0 / std::sqrt(double(d_qk)))) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    q.resize(static_cast<size_t>(rows * c.h * d_qk));
    for (auto& x : q) x = float_to_bf16_bits(2.0f * normal(rng));
    if (c.q_scale > 0.0f)
      for (uint16_t x : q) q_fp8.push_back(float_to_fp8_e4m3(bf16_bits_to_float(x) / c.q_scale));
    make_scope(main, main_cache, c.topk, rng);
    if (c.extra_topk > 0) make_scope(extra, extra_cache, c.extra_topk, rng);
    if (c.sink) {
      sink.resize(c.h);
      for (auto& s : sink) s = 3.0f * normal(rng);
    }
  }

  void make_scope(Scope& s, HostCache& cache, int topk, std::mt19937& rng) {
    s.topk = topk;
    std::uniform_int_distribution<int64_t> slot(0, cache.num_slots() - 1);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    s.indices.resize(static_cast<size_t>(rows * topk));
    for (auto& x : s.indices) {
      const double r = u(rng);
      x = r < c.invalid_frac * 0.8 ? -1
          : r < c.invalid_frac     ? static_cast<int32_t>(cache.num_slots() + slot(rng) % 1000)
                                   : static_cast<int32_t>(slot(rng));
    }
    if (c.lengths) {
      std::uniform_int_distribution<int> len(0, topk);
      s.lengths.resize(c.b);
      for (auto& l : s.lengths) l = len(rng);
    }
    // Encode only the tokens some selected slot refers to; the rest stay NaN bytes.
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(cache.dim());
    for (int64_t r = 0; r < rows; ++r) {
      for (int j = 0; j < selected_len(s, r); ++j) {
        const int32_t idx = s.indices[r * topk + j];
        if (idx < 0 || idx >= cache.num_slots()) continue;
        for (int i = 0; i < cache.dim(); ++i) {
          const float block_gain = std::ldexp(1.0f, (i / 64) % 5 - 2);  // exercise the scales
          v[i] = block_gain * normal(rng);
        }
        cache.encode(idx, v);
      }
    }
  }
  int selected_len(const Scope& s, int64_t row) const {
    return s.lengths.empty() ? s.topk : std::min(s.topk, s.lengths[row / c.s_q]);
  }

  // The query of (row, head) the decode attends with: the bf16 values, or bf16(fp8 · q_scale).
  std::vector<double> query(int64_t r, int h) const {
    std::vector<double> v(d_qk);
    const int64_t off = (r * c.h + h) * d_qk;
    for (int i = 0; i < d_qk; ++i)
      v[i] = c.q_scale > 0.0f
                 ? double(round_bf16(static_cast<float>(double(fp8_e4m3_to_float(q_fp8[off + i])) * c.q_scale)))
                 : double(bf16_bits_to_float(q[off + i]));
    return v;
  }

  // float64 docs/spec.md §6 for every (row, head): out [rows, H, 512], lse [rows, H].
  void reference(std::vector<double>& out, std::vector<double>& lse) const {
    out.assign(static_cast<size_t>(rows * c.h * 512), 0.0);
    lse.assign(static_cast<size_t>(rows * c.h), 0.0);
#pragma omp parallel for schedule(dynamic)
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<std::vector<double>> keys;
      auto gather = [&](const Scope& s, const HostCache& cache) {
        for (int j = 0; j < selected_len(s, r); ++j) {
          const int32_t idx = s.indices[r * s.topk + j];
          if (idx < 0 || idx >= cache.num_slots()) continue;
          std::vector<double> k(d_qk);
          for (int i = 0; i < d_qk; ++i) k[i] = cache.value(idx, i);
          keys.push_back(std::move(k));
        }
      };
      gather(main, main_cache);
      if (c.extra_topk > 0) gather(extra, extra_cache);
      for (int h = 0; h < c.h; ++h) {
        double* o = &out[(r * c.h + h) * 512];
        if (keys.empty()) {
          lse[r * c.h + h] = INFINITY;
          continue;
        }
        const std::vector<double> qh = query(r, h);
        std::vector<double> logit(keys.size());
        double mx = -INFINITY;
        for (size_t k = 0; k < keys.size(); ++k) {
          double dot = 0.0;
          for (int i = 0; i < d_qk; ++i) dot += qh[i] * keys[k][i];
          logit[k] = double(scale) * dot;
          mx = std::max(mx, logit[k]);
        }
        double sum = 0.0;
        for (double l : logit) sum += std::exp(l - mx);
        const double l = mx + std::log(sum);
        for (size_t k = 0; k < keys.size(); ++k) {
          const double w = std::exp(logit[k] - l);
          for (int i = 0; i < 512; ++i) o[i] += w * keys[k][i];
        }
        if (c.sink) {
          const double f = 1.0 / (1.0 + std::exp(double(sink[h]) - l));
          for (int i = 0; i < 512; ++i) o[i] *= f;
        }
        lse[r * c.h + h] = l;
      }
    }
  }
};

struct DeviceResult {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

// Uploads, poisons the outputs, runs dsv4::cuda::sparse_decode with a hand-made schedule.
DeviceResult run_cuda(const Problem& pb) {
  const Case& c = pb.c;
  DeviceResult res;
  const DeviceBuffer<uint16_t> q(pb.q);
  const auto q_fp8 = upload_or_empty(pb.q_fp8);
  const DeviceBuffer<uint8_t> kc(pb.main_cache.bytes);
  const DeviceBuffer<int32_t> ki(pb.main.indices);
  const auto kl = upload_or_empty(pb.main.lengths);
  const auto ec = c.extra_topk > 0 ? DeviceBuffer<uint8_t>(pb.extra_cache.bytes) : DeviceBuffer<uint8_t>();
  const auto ei = upload_or_empty(pb.extra.indices);
  const auto el = upload_or_empty(pb.extra.lengths);
  const auto sink = upload_or_empty(pb.sink);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(pb.rows * c.h * 512));
  DeviceBuffer<float> lse(static_cast<size_t>(pb.rows * c.h));
  out.poison();
  lse.poison();

  const Device gpu = Device::cuda;
  SparseDecodeArgs a;
  if (c.q_scale > 0.0f) {
    a.q = TensorView(q_fp8.data(), DType::fp8_e4m3, {c.b, c.s_q, c.h, pb.d_qk}, gpu);
    a.q_scale = c.q_scale;
  } else {
    a.q = TensorView(q.data(), DType::bf16, {c.b, c.s_q, c.h, pb.d_qk}, gpu);
  }
  a.k_cache.data = TensorView(kc.data(), DType::uint8, {pb.main_cache.num_blocks, pb.main_cache.block_bytes}, gpu);
  a.k_cache.layout = c.layout;
  a.k_cache.block_size = c.block;
  a.k_cache.tensor_scale = kTensorScale;
  a.indices = TensorView(ki.data(), DType::int32, {c.b, c.s_q, c.topk}, gpu);
  if (!pb.main.lengths.empty()) a.topk_length = TensorView(kl.data(), DType::int32, {c.b}, gpu);
  if (c.extra_topk > 0) {
    a.extra_k_cache.data = TensorView(ec.data(), DType::uint8,
                                      {pb.extra_cache.num_blocks, pb.extra_cache.block_bytes}, gpu);
    a.extra_k_cache.layout = c.layout;
    a.extra_k_cache.block_size = c.extra_block;
    a.extra_k_cache.tensor_scale = kTensorScale;
    a.extra_indices = TensorView(ei.data(), DType::int32, {c.b, c.s_q, c.extra_topk}, gpu);
    if (!pb.extra.lengths.empty()) a.extra_topk_length = TensorView(el.data(), DType::int32, {c.b}, gpu);
  }
  if (c.sink) a.attn_sink = TensorView(sink.data(), DType::fp32, {c.h}, gpu);
  a.softmax_scale = pb.scale;  // the reference's (d_qk^-0.5 unless a test sets another)
  a.out = TensorView(out.data(), DType::bf16, {c.b, c.s_q, c.h, 512}, gpu);
  a.lse = TensorView(lse.data(), DType::fp32, {c.b, c.s_q, c.h}, gpu);

  // Hand-made schedule: splits of equal length, a multiple of the 64-slot tile.
  const int total = c.topk + c.extra_topk;
  DecodeSchedule sched;
  sched.num_splits = c.splits;
  sched.split_len = ((total + c.splits - 1) / c.splits + 63) / 64 * 64;
  sched.workspace_bytes = pb.rows * c.h * c.splits * (512 + 1) * 4;
  DeviceBuffer<uint8_t> ws(static_cast<size_t>(sched.workspace_bytes));
  ws.poison();  // partials must all be written
  cuda::sparse_decode(a, sched, ws.view(DType::uint8, {sched.workspace_bytes}), nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  res.out = out.download();
  res.lse = lse.download();
  const std::vector<uint8_t> partials = ws.download();  // the split kernel's own output (splits > 1)
  test::check_output_digest({{res.out.data(), res.out.size() * 2}, {res.lse.data(), res.lse.size() * 4},
                             {partials.data(), partials.size()}});
  return res;
}

void expect_matches_reference(const Problem& pb, const DeviceResult& res) {
  std::vector<double> ref_out, ref_lse;
  pb.reference(ref_out, ref_lse);
  const int64_t n_rows = pb.rows * pb.c.h;
  int bad = 0;
  double worst = 0.0;
  for (int64_t r = 0; r < n_rows && bad < 8; ++r) {
    const double ref_l = ref_lse[r], got_l = res.lse[r];
    if (std::isinf(ref_l)) {
      if (!(std::isinf(got_l) && got_l > 0)) ++bad, ADD_FAILURE() << "row " << r << ": lse " << got_l << " want +inf";
    } else if (!(std::fabs(got_l - ref_l) <= 2e-3)) {
      ++bad, ADD_FAILURE() << "row " << r << ": lse " << got_l << " want " << ref_l;
    }
    double amax = 0.0;
    for (int i = 0; i < 512; ++i) amax = std::max(amax, std::fabs(ref_out[r * 512 + i]));
    const double tol = 1.5e-2 * amax + 1e-30;
    for (int i = 0; i < 512; ++i) {
      const double got = bf16_bits_to_float(res.out[r * 512 + i]);
      const double err = std::fabs(got - ref_out[r * 512 + i]);
      if (amax > 0) worst = std::max(worst, err / amax);
      if (!(err <= tol) && !(amax == 0.0 && got == 0.0)) {
        ++bad, ADD_FAILURE() << "row " << r << " dim " << i << ": out " << got << " want " << ref_out[r * 512 + i];
        break;
      }
    }
  }
  ::testing::Test::RecordProperty("worst_rel_err", std::to_string(worst));
}

std::vector<Case> grid() {
  using L = KvLayout;
  return {
      // MODEL1 V4-Flash-like: SWA 128 (block 256) + extra 512 (block 64), H 64.
      {"flash_h64_b2_sq2_direct", L::model1_fp8, 64, 2, 2, 128, 256, 512, 64, 1, false, true},
      {"flash_h64_b2_sq2_split3", L::model1_fp8, 64, 2, 2, 128, 256, 512, 64, 3, false, true},
      {"flash_h64_b16_sq1_split2", L::model1_fp8, 64, 16, 1, 128, 256, 512, 64, 2, true, false},
      // MODEL1 V4-Pro-like: H 128, extra 1024 with block 64 and block 2.
      {"pro_h128_b2_sq2_blk64", L::model1_fp8, 128, 2, 2, 128, 64, 1024, 64, 4, true, true},
      {"pro_h128_b3_sq1_blk2", L::model1_fp8, 128, 3, 1, 128, 256, 1024, 2, 5, false, true},
      {"pro_h128_b1_sq2_blk2_direct", L::model1_fp8, 128, 1, 2, 128, 64, 1024, 2, 1, true, false},
      // V3.2: d 576, H 128, topk 2048.
      {"v32_h128_b2_sq2_direct", L::v32_fp8, 128, 2, 2, 2048, 64, 0, 0, 1, false, false},
      {"v32_h128_b2_sq2_split8", L::v32_fp8, 128, 2, 2, 2048, 64, 0, 0, 8, true, true},
      // Odd sizes: topk not a multiple of the tile, padded H (32 → one 64-row block), tiny topk.
      {"odd_topk_h64", L::model1_fp8, 64, 1, 2, 100, 64, 37, 2, 2, false, true},
      {"padded_h32", L::model1_fp8, 32, 2, 1, 128, 64, 64, 64, 1, true, true},
      {"padded_h96_v32", L::v32_fp8, 96, 1, 1, 200, 16, 0, 0, 2, false, false},
      {"tiny_topk3", L::model1_fp8, 64, 2, 1, 3, 64, 0, 0, 1, false, false},
      // Block sizes that are not powers of two, and 1: the kernel finds a slot's block with a
      // divider prepared on the host (multiply-high and shift; the identity for 1). MODEL1 H 64 and
      // in a cluster, V3.2 in a cluster, BF16 rows by cp.async.
      {"odd_blocks_h64_blk48_extra_blk6", L::model1_fp8, 64, 2, 2, 128, 48, 96, 6, 2, true, true},
      {"odd_blocks_h128_blk40_extra_blk6", L::model1_fp8, 128, 1, 2, 128, 40, 96, 6, 1, false, false},
      {"odd_blocks_v32_h128_blk1", L::v32_fp8, 128, 1, 2, 256, 1, 0, 0, 2, false, true},
      {"odd_blocks_bf16_h64_blk24_extra_blk3", L::bf16, 64, 1, 2, 128, 24, 64, 3, 1, false, true},
      // Head-block pairs run as 2-CTA clusters that share the gather (H 128 above, H 256 here:
      // two clusters per split); an odd number of head blocks (H 192) runs without.
      {"clusters_h256_split3", L::model1_fp8, 256, 2, 1, 128, 64, 320, 2, 3, true, true},
      {"no_cluster_h192_v32", L::v32_fp8, 192, 2, 1, 300, 64, 0, 0, 2, false, true},
      // V3.2 at H 64 (a tensor-parallel rank's heads; the peak H 64 d 576 shape): one head block,
      // no cluster, the kernel that stores each slot's rope chunks first (kRopeFirst).
      {"v32_h64_b2_sq2_split3", L::v32_fp8, 64, 2, 2, 2048, 64, 0, 0, 3, true, true},
      {"v32_h64_b1_sq2_blk40_direct", L::v32_fp8, 64, 1, 2, 200, 40, 0, 0, 1, false, false, 0.3},
      // A whole split of −1 in a cluster: both CTAs mask every key of every tile.
      {"cluster_all_invalid", L::v32_fp8, 128, 1, 2, 256, 64, 0, 0, 2, false, true, 1.0},
      // The full-width layouts (FlashInfer port): BF16 rows copied by cp.async without a cluster,
      // staged in registers and shared in one (H 128); FP8 with one tensor scale.
      {"bf16_h64_b2_sq2_direct", L::bf16, 64, 2, 2, 128, 64, 512, 64, 1, false, true},
      {"bf16_h64_b16_sq1_split2", L::bf16, 64, 16, 1, 128, 256, 512, 64, 2, true, false},
      {"bf16_h128_b2_sq2_blk2_split3", L::bf16, 128, 2, 2, 128, 64, 1024, 2, 3, true, true},
      {"bf16_padded_h32_odd_topk", L::bf16, 32, 1, 2, 100, 16, 37, 2, 1, false, true},
      {"fp8t_h64_b2_sq2_direct", L::fp8_per_tensor, 64, 2, 2, 128, 256, 512, 64, 1, false, true},
      {"fp8t_h128_b2_sq2_blk2_split4", L::fp8_per_tensor, 128, 2, 2, 128, 64, 1024, 2, 4, true, true},
      {"fp8t_h192_no_cluster_split2", L::fp8_per_tensor, 192, 1, 1, 300, 64, 0, 0, 2, false, false},
      // FP8 queries (q_scale 0.37, the FlashInfer port's FP8 decode) through load_q's FP8 path on
      // every layout and CTA shape: with FP8_PER_TENSOR caches (no cluster, H 64 and 192; the H 128
      // cluster), MODEL1 (cluster), V3.2 (d 576, cluster) and BF16 (rows by cp.async; padded H 32).
      {"fp8q_fp8t_h64_b2_sq2_direct", L::fp8_per_tensor, 64, 2, 2, 128, 256, 512, 64, 1, false, true, 0.1, 0.37f},
      {"fp8q_fp8t_h128_b2_sq2_blk2_split4", L::fp8_per_tensor, 128, 2, 2, 128, 64, 1024, 2, 4, true, true, 0.1, 0.37f},
      {"fp8q_fp8t_h192_no_cluster_split2", L::fp8_per_tensor, 192, 1, 1, 300, 64, 0, 0, 2, false, false, 0.1, 0.37f},
      {"fp8q_model1_h128_b3_sq1_blk2", L::model1_fp8, 128, 3, 1, 128, 256, 1024, 2, 5, false, true, 0.1, 0.37f},
      {"fp8q_v32_h128_b2_sq2_split8", L::v32_fp8, 128, 2, 2, 2048, 64, 0, 0, 8, true, true, 0.1, 0.37f},
      {"fp8q_bf16_padded_h32_odd_topk", L::bf16, 32, 1, 2, 100, 16, 37, 2, 1, false, true, 0.1, 0.37f},
  };
}

class SparseDecodeCuda : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { DSV4_SKIP_WITHOUT_GPU(); }
};

TEST_P(SparseDecodeCuda, MatchesFloat64Reference) {
  std::mt19937 rng(1234 + static_cast<unsigned>(std::hash<std::string>{}(GetParam().name) & 0xffff));
  const Problem pb(GetParam(), rng);
  expect_matches_reference(pb, run_cuda(pb));
}

TEST_P(SparseDecodeCuda, BitIdenticalAcrossRuns) {
  std::mt19937 rng(99);
  const Problem pb(GetParam(), rng);
  const DeviceResult a = run_cuda(pb), b = run_cuda(pb);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4));
}

INSTANTIATE_TEST_SUITE_P(Grid, SparseDecodeCuda, ::testing::ValuesIn(grid()),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- edge cases ------------------------------------------------------------------------------
class SparseDecodeCudaEdge : public ::testing::Test {
 protected:
  void SetUp() override { DSV4_SKIP_WITHOUT_GPU(); }
};

TEST_F(SparseDecodeCudaEdge, AllInvalidIndicesGiveZeroAndPlusInf) {
  for (int splits : {1, 3}) {
    std::mt19937 rng(7);
    Case c{"all_invalid", KvLayout::model1_fp8, 64, 2, 2, 128, 64, 64, 64, splits, false, true, 1.0};
    const Problem pb(c, rng);  // invalid_frac 1: every index −1 or out of range
    const DeviceResult r = run_cuda(pb);
    for (float l : r.lse) ASSERT_TRUE(std::isinf(l) && l > 0) << "splits " << splits;
    for (uint16_t o : r.out) ASSERT_EQ(o & 0x7fff, 0) << "splits " << splits;
  }
}

TEST_F(SparseDecodeCudaEdge, ZeroAndShortTopkLengths) {
  for (int splits : {1, 4}) {
    std::mt19937 rng(8);
    Case c{"lengths", KvLayout::model1_fp8, 64, 4, 2, 128, 64, 512, 64, splits, true, true};
    Problem pb(c, rng);
    pb.main.lengths = {0, 5, 128, 64};
    pb.extra.lengths = {0, 512, 1, 300};  // batch 0: nothing valid at all
    // Re-encode so every selected slot is a real token (lengths changed after construction).
    std::vector<float> v(512);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto* s : {&pb.main, &pb.extra}) {
      HostCache& cache = s == &pb.main ? pb.main_cache : pb.extra_cache;
      for (int64_t r = 0; r < pb.rows; ++r)
        for (int j = 0; j < pb.selected_len(*s, r); ++j) {
          const int32_t idx = s->indices[r * s->topk + j];
          if (idx < 0 || idx >= cache.num_slots()) continue;
          for (auto& x : v) x = normal(rng);
          cache.encode(idx, v);
        }
    }
    const DeviceResult r = run_cuda(pb);
    expect_matches_reference(pb, r);
    for (int i = 0; i < 2 * 64; ++i) EXPECT_TRUE(std::isinf(r.lse[i]) && r.lse[i] > 0);
  }
}

TEST_F(SparseDecodeCudaEdge, InfiniteSinks) {
  for (int splits : {1, 2}) {
    std::mt19937 rng(9);
    Case c{"sinks", KvLayout::model1_fp8, 64, 1, 1, 128, 64, 128, 64, splits, false, true};
    Problem pb(c, rng);
    for (int h = 0; h < 64; ++h) pb.sink[h] = h % 2 ? INFINITY : -INFINITY;
    const DeviceResult r = run_cuda(pb);
    expect_matches_reference(pb, r);  // −inf: no effect; +inf: out = 0, lse unchanged
    for (int h = 1; h < 64; h += 2)
      for (int i = 0; i < 512; ++i) ASSERT_EQ(r.out[h * 512 + i] & 0x7fff, 0);
  }
}

// A negative softmax scale (the ops take any finite one): the largest scaled logit is then the
// smallest q·k, so a softmax that took its max before scaling would be wrong; every layout's kernel
// (H 64 and the H 128 cluster), split and not.
TEST_F(SparseDecodeCudaEdge, NegativeSoftmaxScale) {
  for (KvLayout layout : {KvLayout::model1_fp8, KvLayout::v32_fp8, KvLayout::bf16, KvLayout::fp8_per_tensor})
    for (int h : {64, 128})
      for (int splits : {1, 3}) {
        std::mt19937 rng(11);
        Case c{"negative_scale", layout, h, 2, 2, 128, 64, 0, 0, splits, false, true};
        Problem pb(c, rng);
        pb.scale = -0.06f;
        SCOPED_TRACE(testing::Message() << "layout " << int(layout) << " H " << h << " splits " << splits);
        expect_matches_reference(pb, run_cuda(pb));
      }
}

// Logits that grow tile after tile (key j of a row is u·c·(j + 1), q a jittered ±u): the
// kernel's reference max (kLazyRescaleSlack in attention_tile.cuh: P and the row sums are
// relative to a max that moves only when a tile exceeds it by more than the slack) lags the
// true max and moves every few tiles, so both the skipped and the applied O rescale of both
// consumer warpgroups are checked, on the cluster (H 128) and single-CTA (H 64) paths, with and
// without splits.
TEST_F(SparseDecodeCudaEdge, LogitsGrowAcrossTiles) {
  struct Variant {
    KvLayout layout;
    int h, splits;
  };
  for (const Variant var : {Variant{KvLayout::model1_fp8, 128, 1}, Variant{KvLayout::v32_fp8, 64, 2}}) {
    std::mt19937 rng(21);
    Case c{"grow", var.layout, var.h, 1, 2, 1024, 64, 0, 0, var.splits, false, true, 0.0};
    Problem pb(c, rng);
    std::uniform_real_distribution<float> jitter(0.9f, 1.1f);
    std::vector<float> u(pb.d_qk);
    for (auto& x : u) x = (rng() & 1) ? 1.f : -1.f;
    for (size_t i = 0; i < pb.q.size(); ++i) pb.q[i] = float_to_bf16_bits(u[i % pb.d_qk] * jitter(rng));
    // Per key a logit step of ~0.043 (natural units) at d 512: a 64-key tile raises the max by
    // ~4 in base 2, so the reference max moves about every other tile.
    const float step = 0.0019f * std::sqrt(512.f / pb.d_qk);
    std::vector<float> v(pb.d_qk);
    for (int64_t r = 0; r < pb.rows; ++r)
      for (int j = 0; j < c.topk; ++j) {
        const int32_t slot = static_cast<int32_t>(r * c.topk + j);  // distinct, < num_slots
        pb.main.indices[r * c.topk + j] = slot;
        for (int i = 0; i < pb.d_qk; ++i) v[i] = u[i] * step * static_cast<float>(j + 1);
        pb.main_cache.encode(slot, v);
      }
    expect_matches_reference(pb, run_cuda(pb));
  }
}

// V3.2's fp32 block scales are read as bf16, rounded to nearest even, as FlashMLA reads them
// (docs/spec.md §7). With one valid key per row the output is that key's V exactly (softmax weight
// 1, no sink), so every output element must be bf16(fp8 · bf16(scale)) bit for bit. The scales
// here carry low mantissa bits (another writer's fp32 scales), which makes that differ from
// bf16(fp8 · scale) in many elements: checked too, so the test can tell the two readings apart. On
// the single-CTA (H 64) and cluster (H 128) paths.
TEST_F(SparseDecodeCudaEdge, V32ScalesAreReadAsBf16) {
  for (int h : {64, 128}) {
    std::mt19937 rng(31);
    Case c{"v32_scales", KvLayout::v32_fp8, h, 2, 2, 64, 64, 0, 0, 1, false, false, 0.0};
    Problem pb(c, rng);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> gain(1.05f, 1.95f);  // not a power of two
    std::vector<float> v(576);
    for (int64_t r = 0; r < pb.rows; ++r) {
      for (int j = 0; j < c.topk; ++j) pb.main.indices[r * c.topk + j] = j == 5 ? static_cast<int32_t>(r) : -1;
      for (auto& x : v) x = normal(rng);
      pb.main_cache.encode(r, v);
      uint8_t* scales = pb.main_cache.bytes.data() + r * 656 + 512;  // block size 64: slot r of block 0
      for (int s = 0; s < 4; ++s) {
        float f;
        std::memcpy(&f, scales + 4 * s, 4);
        f *= gain(rng);
        std::memcpy(scales + 4 * s, &f, 4);
      }
    }
    const DeviceResult res = run_cuda(pb);
    int differs_from_fp32_scale = 0;
    for (int64_t r = 0; r < pb.rows; ++r) {
      const uint8_t* row = pb.main_cache.bytes.data() + r * 656;
      for (int head = 0; head < h; ++head)
        for (int i = 0; i < 512; ++i) {
          float scale;
          std::memcpy(&scale, row + 512 + 4 * (i / 128), 4);
          const float code = fp8_e4m3_to_float(row[i]);
          const uint16_t want = float_to_bf16_bits(code * round_bf16(scale));
          ASSERT_EQ(res.out[(r * h + head) * 512 + i], want) << "H " << h << ", row " << r << ", head " << head
                                                              << ", dim " << i;
          differs_from_fp32_scale += want != float_to_bf16_bits(code * scale);
        }
    }
    EXPECT_GT(differs_from_fp32_scale, pb.rows * h * 512 / 20) << "H " << h;
  }
}

// ---- combine alone ---------------------------------------------------------------------------
// 5 splits: part of one group of the 16 splits a lane loads at once; 70: four groups and a
// partial one, and three rounds of the 32 lse values the lanes read at once, the last partial.
// An empty split's partial o is NaN: the combine reads it before it knows the weight, and must
// not let it reach the output. b 1 (128 rows) takes four warps a row on any GPU of 64 SMs or more,
// b 3 (384 rows) a warp a row on one of fewer than 192 (combine.cu).
TEST_F(SparseDecodeCudaEdge, CombineMatchesFloat64Formula) {
  for (const auto& [b, splits] : {std::pair{1, 5}, std::pair{1, 70}, std::pair{3, 5}, std::pair{3, 70}}) {
    SCOPED_TRACE("b " + std::to_string(b) + ", splits " + std::to_string(splits));
    const int s_q = 2, h = 64;
    const int64_t rows = int64_t{b} * s_q * h;
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> po(static_cast<size_t>(rows * splits * 512)), plse(static_cast<size_t>(rows * splits)),
        sink(h);
    for (auto& x : po) x = normal(rng);
    for (int64_t i = 0; i < rows * splits; ++i) plse[i] = (i % 7 == 3) ? -INFINITY : 4.0f * normal(rng);
    for (int s = 0; s < splits; ++s) plse[5 * splits + s] = -INFINITY;  // one row with no valid key
    for (int64_t i = 0; i < rows * splits; ++i)
      if (plse[i] == -INFINITY) std::fill_n(po.begin() + i * 512, 512, std::numeric_limits<float>::quiet_NaN());
    for (int i = 0; i < h; ++i) sink[i] = i == 0 ? INFINITY : i == 1 ? -INFINITY : normal(rng);
    const DeviceBuffer<float> dpo(po), dplse(plse), dsink(sink);
    DeviceBuffer<uint16_t> dout(static_cast<size_t>(rows * 512));
    DeviceBuffer<float> dlse(static_cast<size_t>(rows));
    dout.poison();
    dlse.poison();
    cuda::sparse_attention_combine(dpo.view(DType::fp32, {b, s_q, h, splits, 512}),
                                   dplse.view(DType::fp32, {b, s_q, h, splits}), dsink.view(DType::fp32, {h}),
                                   dout.view(DType::bf16, {b, s_q, h, 512}), dlse.view(DType::fp32, {b, s_q, h}),
                                   nullptr);
    DSV4_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto out = dout.download();
    const auto lse = dlse.download();
    for (int64_t r = 0; r < rows; ++r) {
      double m = -INFINITY;
      for (int s = 0; s < splits; ++s) m = std::max(m, double(plse[r * splits + s]));
      if (m == -INFINITY) {
        ASSERT_TRUE(std::isinf(lse[r]) && lse[r] > 0) << r;
        for (int i = 0; i < 512; ++i) ASSERT_EQ(out[r * 512 + i] & 0x7fff, 0);
        continue;
      }
      double sum = 0.0;
      for (int s = 0; s < splits; ++s) sum += std::exp(double(plse[r * splits + s]) - m);
      const double l = m + std::log(sum);
      ASSERT_NEAR(lse[r], l, 1e-4 * std::max(1.0, std::fabs(l))) << r;
      const double f = 1.0 / (1.0 + std::exp(double(sink[r % h]) - l));
      for (int i = 0; i < 512; ++i) {
        double o = 0.0;
        for (int s = 0; s < splits; ++s)
          if (plse[r * splits + s] != -INFINITY)  // an empty split adds nothing (its o is NaN here)
            o += std::exp(double(plse[r * splits + s]) - l) * po[(r * splits + s) * 512 + i];
        o *= f;
        // bf16 output rounding (2^-9 relative) plus fp32 arithmetic on O(1) values.
        ASSERT_NEAR(bf16_bits_to_float(out[r * 512 + i]), o, 4e-3 * std::fabs(o) + 1e-5) << r << "," << i;
      }
    }
  }
}

TEST_F(SparseDecodeCudaEdge, RejectsBadArguments) {
  std::mt19937 rng(12);
  Case c{"bad", KvLayout::model1_fp8, 64, 1, 1, 64, 64, 0, 0, 1};
  const Problem pb(c, rng);
  const DeviceBuffer<uint16_t> q(64 * 576), out(64 * 512 + 8);
  const DeviceBuffer<float> lse(64);
  const DeviceBuffer<int32_t> idx(64);
  const DeviceBuffer<uint8_t> kc(pb.main_cache.bytes.size());
  SparseDecodeArgs a;
  a.q = q.view(DType::bf16, {1, 1, 64, 576});  // wrong d_qk for MODEL1
  a.k_cache.data = kc.view(DType::uint8, {pb.main_cache.num_blocks, pb.main_cache.block_bytes});
  a.indices = idx.view(DType::int32, {1, 1, 64});
  a.out = out.view(DType::bf16, {1, 1, 64, 512});
  a.lse = lse.view(DType::fp32, {1, 1, 64});
  DecodeSchedule sched{1, 64, 0};
  EXPECT_THROW(cuda::sparse_decode(a, sched, TensorView(), nullptr), Error);
  a.q = q.view(DType::bf16, {1, 1, 64, 512});
  sched = DecodeSchedule{2, 64, 0};  // needs a workspace
  EXPECT_THROW(cuda::sparse_decode(a, sched, TensorView(), nullptr), Error);
  sched = DecodeSchedule{1, 32, 0};  // does not cover topk
  EXPECT_THROW(cuda::sparse_decode(a, sched, TensorView(), nullptr), Error);
  // out rows are written in 16-byte pieces: a view 2 bytes into the buffer is refused.
  sched = DecodeSchedule{1, 64, 0};
  a.out = TensorView(out.data() + 1, DType::bf16, {1, 1, 64, 512}, Device::cuda);
  try {
    cuda::sparse_decode(a, sched, TensorView(), nullptr);
    ADD_FAILURE() << "misaligned out accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out: expected a 16-byte aligned pointer"), std::string::npos) << e.what();
  }
  a.out = out.view(DType::bf16, {1, 1, 64, 512});
  // q_scale belongs to an FP8 q: a bf16 q with another scale is refused.
  a.q_scale = 0.5f;
  EXPECT_THROW(cuda::sparse_decode(a, sched, TensorView(), nullptr), Error);
  // An FP8 q's rows are read in aligned pieces too: head rows 520 codes apart (a multiple of 8
  // elements, enough for bf16, but 520 bytes) are refused, naming the stride in fp8 elements.
  const DeviceBuffer<uint8_t> q8(64 * 520);
  a.q = TensorView(q8.data(), DType::fp8_e4m3, {1, 1, 64, 512}, Device::cuda);
  a.q.strides = {64 * 520, 64 * 520, 520, 1};
  try {
    cuda::sparse_decode(a, sched, TensorView(), nullptr);
    ADD_FAILURE() << "FP8 q rows 520 bytes apart accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q.stride(2): expected a multiple of 16 elements"), std::string::npos)
        << e.what();
  }
  a.q.strides = {64 * 512, 64 * 512, 512, 1};
  for (const float bad : {0.0f, -1.0f, INFINITY, NAN}) {
    a.q_scale = bad;
    EXPECT_THROW(cuda::sparse_decode(a, sched, TensorView(), nullptr), Error) << bad;
  }
  // This entry applies the front doors' softmax_scale rule too (scale · log2 e a normal float),
  // naming the argument; the bf16 q is otherwise valid here.
  a.q = q.view(DType::bf16, {1, 1, 64, 512});
  a.q_scale = 1.0f;
  for (const float bad : {1e-39f, -1e-39f, 3e38f, -INFINITY, NAN}) {
    a.softmax_scale = bad;
    try {
      cuda::sparse_decode(a, sched, TensorView(), nullptr);
      ADD_FAILURE() << "softmax_scale " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("softmax_scale: expected 0 (d_qk^-0.5) or a magnitude from 8.2e-39"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace dsv4
