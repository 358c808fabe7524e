// `dsv4 bench decode`: the sparse FP8 decode configs of PERF.md (split-KV + combine end to end).
//
// Each case builds MODEL1 / V32 paged caches filled with valid random tokens, several sets of
// random indices and queries (rotated call to call so the gathered rows are not L2-resident),
// and times every call with CUDA events; the median is reported. FLOPs are counted as FlashMLA
// does: 2 · b · s_q · H · (topk + extra_topk) · (d_qk + d_v); bytes = every gathered row once +
// q + out.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "commands.h"

#ifdef DSV4_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/attention/sparse_decode.h"
#include "dsv4/dtype.h"
#include "dsv4/kv_layout.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"

namespace dsv4::cli {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("dsv4 bench decode: ", what, ": ", cudaGetErrorString(e));
}

struct DecodeCase {
  const char* name;
  KvLayout layout;
  int b, s_q, h;
  int topk, block;              // main scope
  int extra_topk, extra_block;  // extra scope (0: none)
  double flashmla_us;           // PERF.md anchor (0: none)
};

const std::vector<DecodeCase>& decode_cases() {
  using L = KvLayout;
  static const std::vector<DecodeCase> cases = {
      {"v32_b128_h128_sq2_topk2048", L::v32_fp8, 128, 2, 128, 2048, 64, 0, 0, 370.0},
      {"v32_b64_h128_sq2_topk2048", L::v32_fp8, 64, 2, 128, 2048, 64, 0, 0, 189.0},
      {"flash_b128_h64_sq2_128+512", L::model1_fp8, 128, 2, 64, 128, 256, 512, 64, 98.6},
      {"flash_b256_h64_sq2_128+512", L::model1_fp8, 256, 2, 64, 128, 256, 512, 64, 187.5},
      {"pro_b128_h128_sq2_128+1024_blk64", L::model1_fp8, 128, 2, 128, 128, 256, 1024, 64, 210.6},
      {"pro_b128_h128_sq2_128+1024_blk2", L::model1_fp8, 128, 2, 128, 128, 256, 1024, 2, 152.9},
      {"peak_b148_h128_sq2_topk16384", L::model1_fp8, 148, 2, 128, 16384, 64, 0, 0, 2669.0},
      {"flash_b1_h64_sq1_128+512", L::model1_fp8, 1, 1, 64, 128, 256, 512, 64, 0.0},
      {"flash_b16_h64_sq1_128+512", L::model1_fp8, 16, 1, 64, 128, 256, 512, 64, 0.0},
      {"pro_b1_h128_sq1_128+1024", L::model1_fp8, 1, 1, 128, 128, 256, 1024, 64, 0.0},
      {"pro_b16_h128_sq1_128+1024", L::model1_fp8, 16, 1, 128, 128, 256, 1024, 64, 0.0},
  };
  return cases;
}

// Device buffer freed at scope exit.
struct Buffer {
  void* ptr = nullptr;
  explicit Buffer(size_t bytes) { check(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)), "cudaMalloc"); }
  ~Buffer() { cudaFree(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

int64_t block_bytes_of(KvLayout layout, int block_size) {
  if (layout == KvLayout::model1_fp8) {
    return (int64_t{block_size} * model1::kTokenBytes + model1::kBlockAlign - 1) / model1::kBlockAlign *
           model1::kBlockAlign;
  }
  return int64_t{block_size} * v32::kTokenBytes;
}

// A cache of `slots` random valid tokens. One pattern of up to 64 MiB is encoded on the host and
// repeated (timing does not depend on which valid values are there, only that they are not 0).
struct BenchCache {
  KvCacheView view;
  std::unique_ptr<Buffer> buf;
  BenchCache(KvLayout layout, int block_size, int64_t slots, std::mt19937& rng) {
    const int64_t bb = block_bytes_of(layout, block_size);
    const int64_t blocks = (slots + block_size - 1) / block_size;
    const KvGeometry g{layout, block_size, layout == KvLayout::model1_fp8 ? 512 : 576,
                       layout == KvLayout::model1_fp8 ? model1::kTokenBytes : v32::kTokenBytes, bb};
    const int64_t pattern_blocks = std::min<int64_t>(blocks, std::max<int64_t>(1, (64 << 20) / bb));
    std::vector<uint8_t> pattern(static_cast<size_t>(pattern_blocks * bb), 0);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(g.dim);
    for (int64_t blk = 0; blk < pattern_blocks; ++blk)
      for (int t = 0; t < block_size; ++t) {
        for (auto& x : v) x = normal(rng);
        kv_encode_token(g, pattern.data() + blk * bb, t, v.data());
      }
    buf = std::make_unique<Buffer>(static_cast<size_t>(blocks * bb));
    for (int64_t blk = 0; blk < blocks; blk += pattern_blocks) {
      const int64_t n = std::min(pattern_blocks, blocks - blk);
      check(cudaMemcpy(static_cast<uint8_t*>(buf->ptr) + blk * bb, pattern.data(), n * bb,
                       cudaMemcpyHostToDevice), "upload cache");
    }
    view.data = TensorView(buf->ptr, DType::uint8, {blocks, bb}, Device::cuda);
    view.layout = layout;
    view.block_size = block_size;
  }
};

// Split plan used until the dispatching make_decode_schedule is merged (same policy): the fewest
// splits whose CTA count fills the SMs in whole waves, with at least 2 tiles per split.
DecodeSchedule bench_schedule(int rows, int h, int topk_total, int num_sms) {
  const int tiles = (topk_total + 63) / 64;
  const int head_blocks = (h + 63) / 64;
  const int64_t base = int64_t{rows} * head_blocks;
  int best = 1;
  double best_cost = 1e30;
  for (int s = 1; s <= std::min(tiles, 64); ++s) {
    const int per_split = (tiles + s - 1) / s;
    const int64_t waves = (base * s + num_sms - 1) / num_sms;
    const double cost = double(waves) * (per_split + 1.0) + (s > 1 ? 0.5 : 0.0);  // +1: fixed CTA cost
    if (cost < best_cost - 1e-9) best_cost = cost, best = s;
  }
  DecodeSchedule sch;
  sch.num_splits = best;
  sch.split_len = (tiles + best - 1) / best * 64;
  sch.workspace_bytes = best > 1 ? int64_t{rows} * h * best * (512 + 1) * 4 : 0;
  return sch;
}

struct CaseResult {
  double us, tflops, gbps;
  int splits;
};

CaseResult run_case(const DecodeCase& c, int num_sms, int iters) {
  std::mt19937 rng(2026);
  const int d_qk = c.layout == KvLayout::model1_fp8 ? 512 : 576;
  const int token_bytes = c.layout == KvLayout::model1_fp8 ? model1::kTokenBytes : v32::kTokenBytes;
  const int64_t rows = int64_t{c.b} * c.s_q;
  const int topk_total = c.topk + c.extra_topk;
  const double touched = double(rows) * topk_total * token_bytes;
  const int sets = static_cast<int>(std::clamp(std::ceil(256e6 / touched), 2.0, 256.0));
  // Caches: at least 4× the rows one call touches and at least 1 GiB, so sets rarely overlap.
  auto cache_slots = [&](int topk, int block) {
    return std::max<int64_t>(4 * rows * topk, (int64_t{1} << 30) / block_bytes_of(c.layout, block) * block);
  };
  BenchCache main(c.layout, c.block, cache_slots(c.topk, c.block), rng);
  std::unique_ptr<BenchCache> extra;
  if (c.extra_topk > 0) extra = std::make_unique<BenchCache>(c.layout, c.extra_block, cache_slots(c.extra_topk, c.extra_block), rng);

  const int64_t q_elems = rows * c.h * d_qk;
  Buffer q(static_cast<size_t>(q_elems * 2 * sets)), idx(static_cast<size_t>(rows * c.topk * 4 * sets)),
      eidx(static_cast<size_t>(rows * std::max(c.extra_topk, 1) * 4 * sets)),
      out(static_cast<size_t>(rows * c.h * 512 * 2)), lse(static_cast<size_t>(rows * c.h * 4)),
      sink(static_cast<size_t>(c.h * 4));
  {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> hq(static_cast<size_t>(q_elems * sets));
    for (auto& x : hq) x = float_to_bf16_bits(normal(rng));
    check(cudaMemcpy(q.ptr, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice), "upload q");
    auto fill_idx = [&](const Buffer& dst, int topk, int64_t slots) {
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(slots - 1));
      std::vector<int32_t> h(static_cast<size_t>(rows * topk * sets));
      for (auto& x : h) x = pick(rng);
      check(cudaMemcpy(dst.ptr, h.data(), h.size() * 4, cudaMemcpyHostToDevice), "upload indices");
    };
    fill_idx(idx, c.topk, main.view.num_slots());
    if (extra) fill_idx(eidx, c.extra_topk, extra->view.num_slots());
    std::vector<float> hs(c.h);
    for (auto& s : hs) s = normal(rng);
    check(cudaMemcpy(sink.ptr, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice), "upload sink");
  }
  const DecodeSchedule sch = bench_schedule(static_cast<int>(rows), c.h, topk_total, num_sms);
  Buffer ws(static_cast<size_t>(std::max<int64_t>(sch.workspace_bytes, 16)));

  auto args_for = [&](int set) {
    SparseDecodeArgs a;
    a.q = TensorView(static_cast<uint16_t*>(q.ptr) + set * q_elems, DType::bf16, {c.b, c.s_q, c.h, d_qk}, Device::cuda);
    a.k_cache = main.view;
    a.indices = TensorView(static_cast<int32_t*>(idx.ptr) + set * rows * c.topk, DType::int32, {c.b, c.s_q, c.topk}, Device::cuda);
    if (extra) {
      a.extra_k_cache = extra->view;
      a.extra_indices = TensorView(static_cast<int32_t*>(eidx.ptr) + set * rows * c.extra_topk, DType::int32,
                                   {c.b, c.s_q, c.extra_topk}, Device::cuda);
    }
    a.attn_sink = TensorView(sink.ptr, DType::fp32, {c.h}, Device::cuda);
    a.out = TensorView(out.ptr, DType::bf16, {c.b, c.s_q, c.h, 512}, Device::cuda);
    a.lse = TensorView(lse.ptr, DType::fp32, {c.b, c.s_q, c.h}, Device::cuda);
    return a;
  };
  const TensorView wsv(ws.ptr, DType::uint8, {std::max<int64_t>(sch.workspace_bytes, 16)}, Device::cuda);
  for (int i = 0; i < 3; ++i) cuda::sparse_decode(args_for(i % sets), sch, wsv, nullptr);
  check(cudaDeviceSynchronize(), "warm-up");

  const int n = std::max(iters, std::min(sets, 200));
  std::vector<cudaEvent_t> ev(2 * n);
  for (auto& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < n; ++i) {
    check(cudaEventRecord(ev[2 * i]), "record");
    cuda::sparse_decode(args_for(i % sets), sch, wsv, nullptr);
    check(cudaEventRecord(ev[2 * i + 1]), "record");
  }
  check(cudaDeviceSynchronize(), "timed runs");
  std::vector<double> times(n);
  for (int i = 0; i < n; ++i) {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "elapsed");
    times[i] = ms * 1e3;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::nth_element(times.begin(), times.begin() + n / 2, times.end());
  const double us = times[n / 2];
  const double flops = 2.0 * rows * c.h * double(topk_total) * (d_qk + 512);
  const double bytes = touched + double(q_elems) * 2 + double(rows) * c.h * 512 * 2;
  return {us, flops / us * 1e-6, bytes / us * 1e-3, sch.num_splits};
}

}  // namespace

int bench_decode(const Args& args) {
  int iters = 30;
  std::string only;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--iters" && i + 1 < args.size()) iters = std::stoi(args[++i]);
    else if (args[i] == "--case" && i + 1 < args.size()) only = args[++i];
  }
  int dev = 0, num_sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  std::printf("%-36s %6s %10s %9s %9s %11s %8s\n", "decode case", "splits", "us", "TFLOP/s", "GB/s",
              "FlashMLA us", "speedup");
  for (const DecodeCase& c : decode_cases()) {
    if (!only.empty() && only != c.name) continue;
    const CaseResult r = run_case(c, num_sms, iters);
    std::printf("%-36s %6d %10.1f %9.1f %9.1f %11.1f %8s\n", c.name, r.splits, r.us, r.tflops, r.gbps,
                c.flashmla_us,
                c.flashmla_us > 0 ? (std::to_string(c.flashmla_us / r.us).substr(0, 5) + "x").c_str() : "-");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace dsv4::cli

#else
namespace dsv4::cli {
int bench_decode(const Args&) {
  std::fprintf(stderr, "dsv4 bench decode: CUDA backend not built\n");
  return 2;
}
}  // namespace dsv4::cli
#endif
