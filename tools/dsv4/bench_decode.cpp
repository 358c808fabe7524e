// Sparse FP8 decode benchmark cases (`dsv4 bench --filter decode`): every decode config of docs/performance.md
// (split-KV + combine end to end, attention sink on) plus the s_q 1 latency cases.
//
// Each case builds MODEL1 / V32 paged caches of valid random tokens (≥ 1 GiB, so rows gathered by
// different input sets rarely share cache lines), and rotates query / index sets beyond L2. FLOPs
// as FlashMLA counts them: 2 · b · s_q · H · (topk + extra_topk) · (d_qk + d_v); bytes = every
// gathered row once + q + out.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "dsv4/kv_layout.h"
#include "dsv4/ops.h"
#include "runtime/device_runtime.h"
#include "runtime/random_fill.h"

namespace dsv4::bench {
namespace {

constexpr int kDv = 512;

struct DecodeShape {
  const char* name;
  KvLayout layout;
  int b, s_q, h;
  int topk, block;              // main scope
  int extra_topk, extra_block;  // extra scope (0: none)
  double anchor_us, anchor_tflops;  // FlashMLA on the same GPU (docs/performance.md), 0 = none
  // extra_topk_length given, uniform in [0, extra_topk] per batch (FlashMLA's CONFIG3 / CONFIG4),
  // so rows carry different work.
  bool extra_lengths = false;
};

// The extra scope's lengths (extra_topk_length [b]) of a case with extra_lengths (fixed seed: the case's FLOPs are known
// when cases are listed, without a device).
std::vector<int32_t> extra_topk_lengths(const DecodeShape& s) {
  std::vector<int32_t> len;
  if (!s.extra_lengths) return len;
  std::mt19937 rng(14);
  std::uniform_int_distribution<int32_t> pick(0, s.extra_topk);
  for (int i = 0; i < s.b; ++i) len.push_back(pick(rng));
  return len;
}

// A paged cache of valid random tokens: one host-encoded pattern (≤ 4 MiB) repeated. The speed of
// a gather does not depend on the values, and encoding them is host time every case and every
// binary of a kernels A/B pays on the device machine (64 MiB took seconds per cache).
KvCacheView make_cache(KvLayout layout, int block_size, int64_t slots, std::shared_ptr<void>& owner) {
  const KvGeometry g = kv_geometry(layout, block_size);
  const int64_t bb = g.block_bytes;
  const int64_t blocks = (slots + block_size - 1) / block_size;
  const int64_t pattern_blocks = std::min<int64_t>(blocks, std::max<int64_t>(1, (int64_t{4} << 20) / bb));
  std::vector<uint8_t> pattern(static_cast<size_t>(pattern_blocks * bb), 0);
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(g.dim);
  for (int64_t blk = 0; blk < pattern_blocks; ++blk)
    for (int t = 0; t < block_size; ++t) {
      for (auto& x : v) x = normal(rng);
      kv_encode_token(g, pattern.data() + blk * bb, t, v.data());
    }
  owner = device_tiled(pattern, static_cast<size_t>(blocks * bb));
  KvCacheView view;
  view.data = TensorView(owner.get(), DType::uint8, {blocks, bb}, Device::cuda);
  view.layout = layout;
  view.block_size = block_size;
  return view;
}

Case make_case(const DecodeShape& s) {
  const KvGeometry geometry = kv_geometry(s.layout, s.block);
  const int d_qk = geometry.dim, token_bytes = geometry.token_bytes;
  const int64_t rows = int64_t{s.b} * s.s_q;
  const int topk_total = s.topk + s.extra_topk;
  const std::vector<int32_t> lengths = extra_topk_lengths(s);
  // Attended slots per query row, on average (every slot, or the extra scope's given lengths).
  double slots_per_row = topk_total;
  if (!lengths.empty()) {
    slots_per_row = s.topk;
    for (int32_t l : lengths) slots_per_row += double(l) / s.b;
  }
  Case c;
  c.name = std::string("decode_") + s.name;
  c.config = std::string(kv_layout_name(s.layout)) + ", b " + std::to_string(s.b) + ", s_q " +
             std::to_string(s.s_q) + ", H " + std::to_string(s.h) + ", topk " + std::to_string(s.topk) +
             " (block " + std::to_string(s.block) + ")" +
             (s.extra_topk > 0 ? " + " + std::to_string(s.extra_topk) + " (block " + std::to_string(s.extra_block) + ")"
                               : std::string()) +
             (lengths.empty() ? "" : ", extra_topk_length U[0, " + std::to_string(s.extra_topk) + "]") + ", attn_sink";
  c.flops = 2.0 * rows * s.h * slots_per_row * (d_qk + kDv);
  const double touched = double(rows) * slots_per_row * token_bytes + double(rows) * slots_per_row * 4;
  c.bytes = touched + double(rows) * s.h * d_qk * 2 + double(rows) * s.h * kDv * 2;
  c.memory_bound = false;
  c.anchor_us = s.anchor_us;
  c.anchor_tflops = s.anchor_tflops;
  // Input sets: enough that one pass over them is 2× the H100's 50 MB L2 (a constant, so listing
  // the cases needs no device).
  c.rotations = static_cast<int>(std::clamp(std::ceil(2.0 * 50e6 / touched), 1.0, 512.0));
  c.setup = [s, d_qk, rows, topk_total, lengths, sets = c.rotations]() -> LaunchFn {
    auto keep = std::make_shared<std::vector<std::shared_ptr<void>>>();
    auto cache_slots = [&](int topk, int block) {  // ≥ 4× what one call touches and ≥ 1 GiB
      return std::max<int64_t>(4 * rows * topk, (int64_t{1} << 30) / kv_geometry(s.layout, block).block_bytes * block);
    };
    std::shared_ptr<void> main_owner, extra_owner;
    const KvCacheView main = make_cache(s.layout, s.block, cache_slots(s.topk, s.block), main_owner);
    KvCacheView extra;
    if (s.extra_topk > 0) extra = make_cache(s.layout, s.extra_block, cache_slots(s.extra_topk, s.extra_block), extra_owner);
    const size_t q_n = static_cast<size_t>(rows) * s.h * d_qk;
    auto q = device_alloc(q_n * 2 * sets);
    auto idx = device_alloc(static_cast<size_t>(rows) * s.topk * 4 * sets);
    auto eidx = device_alloc(static_cast<size_t>(rows) * std::max(s.extra_topk, 1) * 4 * sets);
    auto out = device_alloc(static_cast<size_t>(rows) * s.h * kDv * 2);
    auto lse = device_alloc(static_cast<size_t>(rows) * s.h * 4);
    auto sink = device_alloc(static_cast<size_t>(s.h) * 4);
    auto extra_len = device_alloc(std::max<size_t>(lengths.size(), 1) * 4);
    if (!lengths.empty())
      rt::copy_host_to_device(extra_len.get(), lengths.data(), lengths.size() * 4, "bench decode: upload lengths");
    rt::fill_random_bf16(q.get(), q_n * sets, 11, -1.f, 1.f, nullptr);
    rt::fill_random_int32(static_cast<int32_t*>(idx.get()), static_cast<size_t>(rows) * s.topk * sets, 12,
                            static_cast<int32_t>(main.num_slots()), nullptr);
    if (s.extra_topk > 0)
      rt::fill_random_int32(static_cast<int32_t*>(eidx.get()), static_cast<size_t>(rows) * s.extra_topk * sets,
                              13, static_cast<int32_t>(extra.num_slots()), nullptr);
    std::vector<float> sink_h(s.h);
    for (int h = 0; h < s.h; ++h) sink_h[h] = -1.f + 2.f * h / s.h;
    rt::copy_host_to_device(sink.get(), sink_h.data(), sink_h.size() * 4, "bench decode: upload sink");
    const DecodeSchedule sch = make_decode_schedule(s.b, s.s_q, s.h, topk_total, device_sm_count(), kDv);
    auto ws = device_alloc(static_cast<size_t>(std::max<int64_t>(sch.workspace_bytes, 16)));
    rt::synchronize_device("bench decode: input setup");
    *keep = {main_owner, extra_owner, q, idx, eidx, out, lse, sink, ws, extra_len};

    SparseDecodeArgs base;
    base.k_cache = main;
    if (s.extra_topk > 0) base.extra_k_cache = extra;
    if (!lengths.empty()) base.extra_topk_length = TensorView(extra_len.get(), DType::int32, {s.b}, Device::cuda);
    base.attn_sink = TensorView(sink.get(), DType::fp32, {s.h}, Device::cuda);
    base.out = TensorView(out.get(), DType::bf16, {s.b, s.s_q, s.h, kDv}, Device::cuda);
    base.lse = TensorView(lse.get(), DType::fp32, {s.b, s.s_q, s.h}, Device::cuda);
    const TensorView wsv(ws.get(), DType::uint8, {std::max<int64_t>(sch.workspace_bytes, 16)}, Device::cuda);
    return [s, d_qk, rows, q_n, base, wsv, sch, keep](Stream stream, int set) {
      SparseDecodeArgs a = base;
      const auto& buffers = *keep;
      a.q = TensorView(static_cast<uint16_t*>(buffers[2].get()) + set * q_n, DType::bf16, {s.b, s.s_q, s.h, d_qk},
                       Device::cuda);
      a.indices = TensorView(static_cast<int32_t*>(buffers[3].get()) + set * rows * s.topk, DType::int32,
                             {s.b, s.s_q, s.topk}, Device::cuda);
      if (s.extra_topk > 0)
        a.extra_indices = TensorView(static_cast<int32_t*>(buffers[4].get()) + set * rows * s.extra_topk,
                                     DType::int32, {s.b, s.s_q, s.extra_topk}, Device::cuda);
      sparse_decode(a, sch, wsv, stream);
    };
  };
  return c;
}

std::vector<Case> decode_cases() {
  using L = KvLayout;
  const DecodeShape shapes[] = {
      {"v32_b128_h128_sq2_topk2048", L::v32_fp8, 128, 2, 128, 2048, 64, 0, 0, 370.0, 394},
      {"v32_b64_h128_sq2_topk2048", L::v32_fp8, 64, 2, 128, 2048, 64, 0, 0, 189.0, 386},
      // FlashMLA's smallest V4-Flash case (side_by_side.py's b 2): four query rows, latency-bound.
      {"flash_b2_h64_sq2_128+512", L::model1_fp8, 2, 2, 64, 128, 256, 512, 64, 0, 0},
      {"flash_b128_h64_sq2_128+512", L::model1_fp8, 128, 2, 64, 128, 256, 512, 64, 98.6, 218},
      {"flash_b256_h64_sq2_128+512", L::model1_fp8, 256, 2, 64, 128, 256, 512, 64, 187.5, 229},
      {"pro_b128_h128_sq2_128+1024_blk64", L::model1_fp8, 128, 2, 128, 128, 256, 1024, 64, 210.6, 367},
      {"pro_b128_h128_sq2_128+1024_blk2", L::model1_fp8, 128, 2, 128, 128, 256, 1024, 2, 152.9, 277},
      {"peak_b148_h128_sq2_topk16384", L::model1_fp8, 148, 2, 128, 16384, 64, 0, 0, 2669.0, 476},
      // The same at V3.2's layout (FlashMLA's peak d 576): FlashMLA runs its MODEL1 case 0.89x the
      // time of this one, ours about 1.01x (bench/RESULTS.md), so the two traced side by side say
      // what the MODEL1 cluster producer spends its extra on.
      {"peak_v32_b148_h128_sq2_topk16384", L::v32_fp8, 148, 2, 128, 16384, 64, 0, 0, 0, 0},
      // FlashMLA's CONFIG3 / CONFIG4: the V4-Pro extra scope at block 2 with per-batch lengths.
      {"config3_b128_h64_sq2_128+1024len_blk2", L::model1_fp8, 128, 2, 64, 128, 256, 1024, 2, 0, 0, true},
      {"config4_b128_h128_sq2_128+1024len_blk2", L::model1_fp8, 128, 2, 128, 128, 256, 1024, 2, 0, 0, true},
      {"flash_b1_h64_sq1_128+512", L::model1_fp8, 1, 1, 64, 128, 256, 512, 64, 0, 0},
      {"flash_b16_h64_sq1_128+512", L::model1_fp8, 16, 1, 64, 128, 256, 512, 64, 0, 0},
      {"pro_b1_h128_sq1_128+1024", L::model1_fp8, 1, 1, 128, 128, 256, 1024, 64, 0, 0},
      {"pro_b16_h128_sq1_128+1024", L::model1_fp8, 16, 1, 128, 128, 256, 1024, 64, 0, 0},
      // The full-width layouts (FlashInfer port) at the V4 shapes above, beside MODEL1's.
      {"flash_b128_h64_sq2_128+512_bf16", L::bf16, 128, 2, 64, 128, 256, 512, 64, 0, 0},
      {"flash_b128_h64_sq2_128+512_fp8t", L::fp8_per_tensor, 128, 2, 64, 128, 256, 512, 64, 0, 0},
      {"pro_b128_h128_sq2_128+1024_blk64_bf16", L::bf16, 128, 2, 128, 128, 256, 1024, 64, 0, 0},
      {"pro_b128_h128_sq2_128+1024_blk64_fp8t", L::fp8_per_tensor, 128, 2, 128, 128, 256, 1024, 64, 0, 0},
  };
  std::vector<Case> cases;
  for (const auto& s : shapes) cases.push_back(make_case(s));
  return cases;
}

const Registrar kRegistered("decode", &decode_cases);

}  // namespace
}  // namespace dsv4::bench
