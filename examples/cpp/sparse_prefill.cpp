// Sparse prefill through the C++ op API (the README's example): 4 query tokens x 64 heads attend
// to their top-512 of 1000 bf16 KV rows, with an attention sink per head. Tensors on the host run
// the CPU reference; the same call takes device tensors (DeviceTensor) to the CUDA kernel.
#include <cmath>
#include <cstdio>
#include <random>

#include "dsv4/ops.h"
#include "dsv4/version.h"

// Random q, kv and sink; indices into kv's rows with every 7th slot empty (-1).
static void fill(dsv4::HostTensor& q, dsv4::HostTensor& kv, dsv4::HostTensor& idx,
                 dsv4::HostTensor& sink) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (dsv4::HostTensor* t : {&q, &kv, &sink})
    for (int64_t i = 0; i < t->numel(); ++i) t->set(i, normal(rng));
  const int64_t rows = kv.shape()[0];
  for (int64_t i = 0; i < idx.numel(); ++i)
    idx.data<int32_t>()[i] = i % 7 == 0 ? -1 : static_cast<int32_t>(rng() % rows);
}

int main() {
  using namespace dsv4;
  std::printf("dsv4attn %s (headers %s)\n", version(), DSV4_VERSION_STRING);

  // Sparse prefill: 4 query tokens x 64 heads over 1000 bf16 KV rows, top-512 indices each.
  HostTensor q(DType::bf16, {4, 64, 512}), kv(DType::bf16, {1000, 1, 512});
  HostTensor idx(DType::int32, {4, 1, 512}), sink(DType::fp32, {64});
  HostTensor out(DType::bf16, {4, 64, 512}), max_logits(DType::fp32, {4, 64}), lse(DType::fp32, {4, 64});
  fill(q, kv, idx, sink);  // -1 in idx = no entry
  SparsePrefillArgs a;
  a.q = q; a.kv = kv; a.indices = idx; a.attn_sink = sink; a.d_v = 512;
  a.out = out; a.max_logits = max_logits; a.lse = lse;  // lse: natural log, +inf if no valid key
  sparse_prefill(a);  // softmax_scale 0 → 512^-0.5

  for (int64_t i = 0; i < out.numel(); ++i)
    if (!std::isfinite(out.get(i))) {
      std::fprintf(stderr, "out[%lld] is not finite\n", static_cast<long long>(i));
      return 1;
    }
  std::printf("out[0, 0, :4] = %.4f %.4f %.4f %.4f, lse[0, 0] = %.4f\n", out.get(0), out.get(1),
              out.get(2), out.get(3), lse.get(0));
  return 0;
}
