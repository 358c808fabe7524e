// Sparse prefill benchmark cases: every prefill config of docs/performance.md (FlashMLA's production shapes,
// s_q 4096), each with attn_sink (the anchor's setting), without it, and with topk_length.
#include <cstdint>
#include <string>
#include <vector>

#include "bench_harness.h"
#include "dsv4/ops.h"
#include "runtime/device_runtime.h"
#include "runtime/random_fill.h"

namespace dsv4::bench {
namespace {

struct PrefillShape {
  const char* model;
  int heads, d_qk, topk, s_kv;
  double anchor_us, anchor_tflops;  // FlashMLA, with attn_sink (docs/performance.md)
};

constexpr int kSq = 4096;
constexpr int kDv = 512;

// topk_length variant: token t attends to topk/2 + (t·7919 mod topk/2) + 1 slots (deterministic,
// spread over [topk/2 + 1, topk], like a causal chunk).
int topk_length_of(int token, int topk) { return topk / 2 + (token * 7919) % (topk / 2) + 1; }

Case make_case(const PrefillShape& s, bool sink, bool with_length) {
  Case c;
  c.name = std::string("prefill_") + s.model + "_h" + std::to_string(s.heads) + "_d" + std::to_string(s.d_qk) +
           "_topk" + std::to_string(s.topk) + "_skv" + std::to_string(s.s_kv) + (sink ? "_sink" : "_nosink") +
           (with_length ? "_len" : "");
  c.config = "s_q 4096, H " + std::to_string(s.heads) + ", d_qk " + std::to_string(s.d_qk) + ", topk " +
             std::to_string(s.topk) + ", s_kv " + std::to_string(s.s_kv) + (sink ? ", attn_sink" : "") +
             (with_length ? ", topk_length" : "");
  double slots = 0;
  for (int t = 0; t < kSq; ++t) slots += with_length ? topk_length_of(t, s.topk) : s.topk;
  c.flops = 2.0 * slots * s.heads * (s.d_qk + kDv);
  c.bytes = double(s.s_kv) * s.d_qk * 2 + double(kSq) * s.heads * (s.d_qk + kDv) * 2 + double(kSq) * s.topk * 4 +
            double(kSq) * s.heads * 8;
  c.memory_bound = false;
  c.anchor_us = s.anchor_us;
  c.anchor_tflops = s.anchor_tflops;
  c.setup = [s, sink, with_length]() -> LaunchFn {
    const size_t q_n = size_t(kSq) * s.heads * s.d_qk, kv_n = size_t(s.s_kv) * s.d_qk;
    const size_t idx_n = size_t(kSq) * s.topk, o_n = size_t(kSq) * s.heads * kDv;
    auto q = device_alloc(q_n * 2), kv = device_alloc(kv_n * 2), idx = device_alloc(idx_n * 4);
    auto out = device_alloc(o_n * 2), ml = device_alloc(size_t(kSq) * s.heads * 4);
    auto lse = device_alloc(size_t(kSq) * s.heads * 4);
    auto sink_buf = device_alloc(size_t(s.heads) * 4), len_buf = device_alloc(size_t(kSq) * 4);
    auto counter = device_alloc(4);
    rt::fill_random_bf16(q.get(), q_n, 1, -1.f, 1.f, nullptr);
    rt::fill_random_bf16(kv.get(), kv_n, 2, -1.f, 1.f, nullptr);
    rt::fill_random_int32(static_cast<int32_t*>(idx.get()), idx_n, 3, s.s_kv, nullptr);
    std::vector<float> sink_h(s.heads);
    for (int h = 0; h < s.heads; ++h) sink_h[h] = -1.f + 2.f * h / s.heads;
    std::vector<int32_t> len_h(kSq);
    for (int t = 0; t < kSq; ++t) len_h[t] = topk_length_of(t, s.topk);
    rt::copy_host_to_device(sink_buf.get(), sink_h.data(), sink_h.size() * 4, "bench prefill: upload sink");
    rt::copy_host_to_device(len_buf.get(), len_h.data(), len_h.size() * 4, "bench prefill: upload topk_length");
    rt::synchronize_device("bench prefill: input setup");
    SparsePrefillArgs a;
    a.q = TensorView(q.get(), DType::bf16, {kSq, s.heads, s.d_qk}, Device::cuda);
    a.kv = TensorView(kv.get(), DType::bf16, {s.s_kv, 1, s.d_qk}, Device::cuda);
    a.indices = TensorView(idx.get(), DType::int32, {kSq, 1, s.topk}, Device::cuda);
    if (with_length) a.topk_length = TensorView(len_buf.get(), DType::int32, {kSq}, Device::cuda);
    if (sink) a.attn_sink = TensorView(sink_buf.get(), DType::fp32, {s.heads}, Device::cuda);
    a.out = TensorView(out.get(), DType::bf16, {kSq, s.heads, kDv}, Device::cuda);
    a.max_logits = TensorView(ml.get(), DType::fp32, {kSq, s.heads}, Device::cuda);
    a.lse = TensorView(lse.get(), DType::fp32, {kSq, s.heads}, Device::cuda);
    a.work_counter = TensorView(counter.get(), DType::int32, {1}, Device::cuda);  // as the torch op passes one
    // The closure owns the buffers (shared_ptr copies) for as long as the case runs.
    return [a, keep = std::vector<std::shared_ptr<void>>{q, kv, idx, out, ml, lse, sink_buf, len_buf, counter}](
               Stream stream, int) { sparse_prefill(a, stream); };
  };
  return c;
}

std::vector<Case> prefill_cases() {
  const PrefillShape shapes[] = {
      {"v32", 128, 576, 2048, 8192, 3471, 673},   {"v32", 128, 576, 2048, 65536, 4074, 574},
      {"flash", 64, 512, 512, 8192, 537, 512},    {"flash", 64, 512, 512, 65536, 700, 393},
      {"pro", 128, 512, 1024, 8192, 1785, 616},   {"pro", 128, 512, 1024, 65536, 2025, 543},
      {"d512", 128, 512, 2048, 8192, 3324, 662},
  };
  std::vector<Case> cases;
  for (const auto& s : shapes) {
    cases.push_back(make_case(s, true, false));
    cases.push_back(make_case(s, false, false));
    cases.push_back(make_case(s, true, true));
  }
  return cases;
}

const Registrar kRegistered("prefill", &prefill_cases);

}  // namespace
}  // namespace dsv4::bench
