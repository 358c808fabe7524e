// The README's op-API example, compiled and run as written (with the elided fill done here), so
// the documentation cannot drift from the API.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "dsv4/ops.h"

TEST(Readme, SparsePrefillExampleRuns) {
  using namespace dsv4;
  HostTensor q(DType::bf16, {4, 64, 512}), kv(DType::bf16, {1000, 1, 512});
  HostTensor idx(DType::int32, {4, 1, 512}), sink(DType::fp32, {64});
  HostTensor out(DType::bf16, {4, 64, 512}), max_logits(DType::fp32, {4, 64}), lse(DType::fp32, {4, 64});
  std::mt19937 rng(3);
  std::normal_distribution<float> n;
  for (int64_t i = 0; i < q.numel(); ++i) q.set(i, n(rng));
  for (int64_t i = 0; i < kv.numel(); ++i) kv.set(i, n(rng));
  for (int64_t i = 0; i < idx.numel(); ++i) idx.data<int32_t>()[i] = i % 7 == 0 ? -1 : static_cast<int32_t>(rng() % 1000);
  for (int64_t i = 0; i < sink.numel(); ++i) sink.set(i, n(rng));
  out.fill_bytes(0xFF);
  SparsePrefillArgs a;
  a.q = q; a.kv = kv; a.indices = idx; a.attn_sink = sink; a.d_v = 512;
  a.out = out; a.max_logits = max_logits; a.lse = lse;
  sparse_prefill(a);
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isfinite(out.get(i))) << i;
  for (int64_t i = 0; i < lse.numel(); ++i) ASSERT_TRUE(std::isfinite(lse.get(i))) << i;
}
