// A whole mixed serving batch decoded by ONE sparse_decode call, as the FlashInfer port's DSV4
// decode takes it (tests/cpu/test_sparse_decode_mixed_batch.cpp, and its CUDA twin in
// tests/cuda/test_sparse_attention_cpu_vs_cuda.cpp): requests with different q lengths — a
// prompt from scratch, one-token decodes, an MTP pair, a chunk continuing a prefix — flattened
// into T tokens, each token its own query row q [T, 1, H, D] with its own causal index lists:
//   main scope  — the token's SWA window in the SWA cache, indices [T, 1, window], topk_length [T];
//   extra scope — the compressed entries its position sees (one per `ratio` positions), indices
//                 [T, 1, max entries], extra_topk_length [T].
// The slots come from per-request random slot maps (a paged cache as a serving engine fills it);
// index slots past a token's length hold values no cache has. The expected output is built from
// the requests and positions (which rows a token at position p of request r attends), not from
// the index tensors the call reads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "dsv4/ops.h"
#include "sparse_attention_cases.h"

namespace dsv4::test {

struct MixedRequest {
  int64_t context;  // tokens already cached before this step
  int64_t q_len;    // tokens this step
};

struct MixedBatchDecode {
  static constexpr int kWindow = 128, kRatio = 4, kBlock = 64, kExtraBlock = 2;
  KvLayout layout;
  int heads;
  std::vector<MixedRequest> requests;
  std::unique_ptr<TestCache> swa, compressed;
  std::vector<std::vector<int64_t>> swa_slot, entry_slot;  // [request][position / entry] → slot
  std::vector<std::pair<int, int64_t>> tokens;             // token → (request, position)
  int64_t max_entries = 1;
  HostTensor q, indices, lengths, extra_indices, extra_lengths, sink, out, lse;

  MixedBatchDecode(KvLayout l, int h, std::vector<MixedRequest> reqs, uint32_t seed)
      : layout(l), heads(h), requests(std::move(reqs)) {
    std::mt19937 rng(seed);
    int64_t positions = 0, entries = 0;
    for (const MixedRequest& r : requests) {
      positions += r.context + r.q_len;
      entries += (r.context + r.q_len) / kRatio;
      max_entries = std::max(max_entries, (r.context + r.q_len) / kRatio);
    }
    const float tensor_scale = l == KvLayout::fp8_per_tensor ? 0.37f : 1.0f;
    swa = std::make_unique<TestCache>(l, kBlock, positions / kBlock + 2, tensor_scale);
    compressed = std::make_unique<TestCache>(l, kExtraBlock, entries / kExtraBlock + 2, tensor_scale);
    swa_slot = assign_slots(*swa, [](const MixedRequest& r) { return r.context + r.q_len; }, rng);
    entry_slot = assign_slots(*compressed, [](const MixedRequest& r) { return (r.context + r.q_len) / kRatio; }, rng);

    for (int r = 0; r < static_cast<int>(requests.size()); ++r)
      for (int64_t i = 0; i < requests[r].q_len; ++i) tokens.push_back({r, requests[r].context + i});
    const int64_t T = static_cast<int64_t>(tokens.size());
    const int d = spec_dim(l);
    q = HostTensor(DType::bf16, {T, 1, h, d});
    fill_bf16_normal(q, rng);
    sink = random_sink(h, rng);
    indices = HostTensor(DType::int32, {T, 1, kWindow});
    lengths = HostTensor(DType::int32, {T});
    extra_indices = HostTensor(DType::int32, {T, 1, max_entries});
    extra_lengths = HostTensor(DType::int32, {T});
    for (int64_t t = 0; t < T; ++t) {
      const auto [r, p] = tokens[static_cast<size_t>(t)];
      const std::vector<int64_t> window = window_positions(p);
      fill_row(indices.data<int32_t>() + t * kWindow, kWindow, window, swa_slot[r]);
      lengths.data<int32_t>()[t] = static_cast<int32_t>(window.size());
      std::vector<int64_t> visible((p + 1) / kRatio);
      std::iota(visible.begin(), visible.end(), 0);
      fill_row(extra_indices.data<int32_t>() + t * max_entries, max_entries, visible, entry_slot[r]);
      extra_lengths.data<int32_t>()[t] = static_cast<int32_t>(visible.size());
    }
    out = HostTensor(DType::bf16, {T, 1, h, 512});
    lse = HostTensor(DType::fp32, {T, 1, h});
    out.fill_bytes(0xFF);  // NaN: every row must be written
    lse.fill_bytes(0xFF);
  }

  SparseDecodeArgs args(const TensorView& out_v, const TensorView& lse_v) const {
    SparseDecodeArgs a;
    a.q = q;
    a.k_cache = swa->view();
    a.indices = indices;
    a.topk_length = lengths;
    a.extra_k_cache = compressed->view();
    a.extra_indices = extra_indices;
    a.extra_topk_length = extra_lengths;
    a.attn_sink = sink;
    a.d_v = 512;
    a.out = out_v;
    a.lse = lse_v;
    return a;
  }
  DecodeSchedule schedule(int num_sms = 132) const {
    return make_decode_schedule(static_cast<int>(tokens.size()), 1, heads,
                                kWindow + static_cast<int>(max_entries), num_sms);
  }

  // The float64 result of token t, head hi: its request's window rows and visible entries.
  HeadResult expected(int64_t t, int hi) const {
    const auto [r, p] = tokens[static_cast<size_t>(t)];
    const int d = spec_dim(layout);
    std::vector<double> qv(static_cast<size_t>(d));
    const uint16_t* qp = q.data<uint16_t>() + (t * heads + hi) * d;
    for (int i = 0; i < d; ++i) qv[static_cast<size_t>(i)] = bf16_bits_to_float(qp[i]);
    std::vector<std::vector<double>> rows;
    for (int64_t pos : window_positions(p)) rows.push_back(swa->decode(swa_slot[r][static_cast<size_t>(pos)]));
    for (int64_t j = 0; j < (p + 1) / kRatio; ++j) rows.push_back(compressed->decode(entry_slot[r][static_cast<size_t>(j)]));
    std::vector<const std::vector<double>*> ptrs;
    for (const auto& row : rows) ptrs.push_back(&row);
    return reference_head(qv, ptrs, 1.0 / std::sqrt(double(d)), sink.data<float>()[hi], 512);
  }

 private:
  // The positions a token at p attends in the SWA cache: the last kWindow up to itself.
  static std::vector<int64_t> window_positions(int64_t p) {
    std::vector<int64_t> w;
    for (int64_t pos = std::max<int64_t>(0, p - kWindow + 1); pos <= p; ++pos) w.push_back(pos);
    return w;
  }
  // Distinct random slots of `cache` for every request's entries, each slot filled with a token.
  std::vector<std::vector<int64_t>> assign_slots(TestCache& cache,
                                                 int64_t (*count)(const MixedRequest&),
                                                 std::mt19937& rng) const {
    std::vector<int64_t> free(static_cast<size_t>(cache.num_slots()));
    std::iota(free.begin(), free.end(), 0);
    std::shuffle(free.begin(), free.end(), rng);
    std::vector<std::vector<int64_t>> slots;
    size_t next = 0;
    for (const MixedRequest& r : requests) {
      slots.emplace_back();
      for (int64_t i = 0; i < count(r); ++i) {
        slots.back().push_back(free[next++]);
        cache.fill_token(slots.back().back(), rng);
      }
    }
    return slots;
  }
  // Row of `width` index slots: the slots of `entries`, then values no cache has.
  static void fill_row(int32_t* row, int64_t width, const std::vector<int64_t>& entries,
                       const std::vector<int64_t>& slot_of) {
    for (int64_t k = 0; k < width; ++k)
      row[k] = k < static_cast<int64_t>(entries.size())
                   ? static_cast<int32_t>(slot_of[static_cast<size_t>(entries[static_cast<size_t>(k)])])
                   : 1 << 30;
  }
};

}  // namespace dsv4::test
