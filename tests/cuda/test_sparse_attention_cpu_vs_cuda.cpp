// The CPU reference against the CUDA kernels, both through the public API (dsv4::sparse_decode,
// dsv4::sparse_prefill) on the same inputs: the contract (scopes, topk_length, -1 / out-of-range
// masking, sink, lse base, empty rows) must agree. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/sparse_attention_reference.h"
#include "dsv4/ops.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;
using dsv4::KvLayout;
using dsv4::TensorView;
using dsv4::test::TestCache;

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A device copy of a host tensor (or a device buffer of its shape), freed on destruction.
class DeviceCopy {
 public:
  explicit DeviceCopy(const TensorView& host, bool upload = true) : view_(host) {
    if (!host.defined()) return;
    bytes_ = static_cast<size_t>(host.numel()) * dsv4::dtype_size(host.dtype);
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(bytes_, 16)), cudaSuccess);
    if (upload) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data, bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    }
    view_.data = ptr_;
    view_.device = dsv4::Device::cuda;
  }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  ~DeviceCopy() {
    if (ptr_) cudaFree(ptr_);
  }
  const TensorView& view() const { return view_; }
  void download(const HostTensor& host) const {
    EXPECT_EQ(cudaMemcpy(host.view().data, ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  TensorView view_;
};

// GPU vs CPU tolerances. Both accumulate in fp32 from the same bf16 q and exactly-dequantized
// keys, but the kernels round the softmax weights to bf16 for the P·V product (as FlashMLA
// does): a relative 2^-9 per weight, plus each side's bf16 output rounding (2^-9 of the
// element). 1e-2 · max|out| bounds both with margin. lse: fp32 logits on both sides,
// different summation order and exp2 vs exp: 2e-4 relative to max(1, |lse|).
constexpr double kGpuOutTol = 1e-2;
constexpr double kGpuLseTol = 2e-4;

void expect_close(const char* what, const HostTensor& cpu_out, const HostTensor& gpu_out,
                  const HostTensor& cpu_lse, const HostTensor& gpu_lse) {
  double max_out = 0.0;
  for (int64_t i = 0; i < cpu_out.numel(); ++i) max_out = std::max(max_out, double(std::abs(cpu_out.get(i))));
  int bad = 0;
  for (int64_t i = 0; i < cpu_out.numel() && bad < 10; ++i) {
    const double a = cpu_out.get(i), b = gpu_out.get(i);
    if (!(std::abs(a - b) <= kGpuOutTol * max_out)) {
      ADD_FAILURE() << what << " out[" << i << "]: cpu " << a << ", gpu " << b << " (max|out| " << max_out << ")";
      ++bad;
    }
  }
  for (int64_t i = 0; i < cpu_lse.numel() && bad < 20; ++i) {
    const double a = cpu_lse.get(i), b = gpu_lse.get(i);
    const bool same_inf = std::isinf(a) && a == b;
    if (!same_inf && !(std::abs(a - b) <= kGpuLseTol * std::max(1.0, std::abs(a)))) {
      ADD_FAILURE() << what << " lse[" << i << "]: cpu " << a << ", gpu " << b;
      ++bad;
    }
  }
}

// ---- decode ------------------------------------------------------------------------------------
struct XDecodeCase {
  const char* name;
  KvLayout layout;
  int h, b, s_q, topk, extra_topk;
  bool with_length, with_sink, all_invalid;
};

// Random indices into `cache` (clean slots), with -1, duplicates and, past topk_length, slots
// of NaN rows or values no cache has.
HostTensor random_indices(int b, int s_q, int topk, const std::vector<int64_t>& clean,
                          const HostTensor* lengths, bool all_invalid, std::mt19937& rng) {
  HostTensor idx(DType::int32, {b, s_q, topk});
  for (int bi = 0; bi < b; ++bi)
    for (int si = 0; si < s_q; ++si)
      for (int k = 0; k < topk; ++k) {
        int32_t& v = idx.data<int32_t>()[(int64_t{bi} * s_q + si) * topk + k];
        const int len = lengths ? lengths->data<int32_t>()[bi] : topk;
        if (all_invalid) v = -1;
        else if (k >= len) v = 1 << 30;
        else if (rng() % 10 == 0) v = -1;
        else if (k > 0 && rng() % 10 == 0) v = idx.data<int32_t>()[(int64_t{bi} * s_q + si) * topk + k - 1];
        else v = int32_t(clean[rng() % clean.size()]);
      }
  return idx;
}

struct XScope {
  std::unique_ptr<TestCache> cache;
  std::vector<int64_t> clean;
  HostTensor indices, lengths;
  XScope(KvLayout layout, int b, int s_q, int topk, bool with_length, bool all_invalid, std::mt19937& rng) {
    cache = std::make_unique<TestCache>(layout, 64, (4 * topk + 63) / 64 + 1);
    for (int64_t s = 0; s < cache->num_slots(); ++s)
      if (rng() % 8 != 0) {  // the rest stays NaN bytes
        cache->fill_token(s, rng);
        clean.push_back(s);
      }
    if (with_length) {
      lengths = HostTensor(DType::int32, {b});
      for (int bi = 0; bi < b; ++bi)
        lengths.data<int32_t>()[bi] = bi == 0 ? topk : bi == 1 ? 0 : int(rng() % (topk + 1));
    }
    indices = random_indices(b, s_q, topk, clean, with_length ? &lengths : nullptr, all_invalid, rng);
  }
};

class SparseDecodeCpuVsCuda : public ::testing::TestWithParam<XDecodeCase> {};

TEST_P(SparseDecodeCpuVsCuda, SameResults) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const XDecodeCase c = GetParam();
  std::mt19937 rng(17);
  XScope main(c.layout, c.b, c.s_q, c.topk, c.with_length, c.all_invalid, rng);
  std::unique_ptr<XScope> extra;
  if (c.extra_topk > 0)
    extra = std::make_unique<XScope>(c.layout, c.b, c.s_q, c.extra_topk, c.with_length, c.all_invalid, rng);
  const int d_qk = dsv4::test::spec_dim(c.layout);
  HostTensor q(DType::bf16, {c.b, c.s_q, c.h, d_qk});
  dsv4::test::fill_bf16_normal(q, rng);
  HostTensor sink;
  if (c.with_sink) {
    sink = HostTensor(DType::fp32, {c.h});
    std::normal_distribution<float> normal(3.0f, 2.0f);
    for (int i = 0; i < c.h; ++i) sink.data<float>()[i] = normal(rng);
    sink.data<float>()[0] = -INFINITY;
    sink.data<float>()[1] = INFINITY;
  }
  HostTensor out_cpu(DType::bf16, {c.b, c.s_q, c.h, 512}), lse_cpu(DType::fp32, {c.b, c.s_q, c.h});
  HostTensor out_gpu(DType::bf16, {c.b, c.s_q, c.h, 512}), lse_gpu(DType::fp32, {c.b, c.s_q, c.h});
  out_gpu.fill_bytes(0xFF);
  lse_gpu.fill_bytes(0xFF);

  dsv4::SparseDecodeArgs a;
  a.q = q;
  a.k_cache = main.cache->view();
  a.indices = main.indices;
  a.topk_length = main.lengths;
  if (extra) {
    a.extra_k_cache = extra->cache->view();
    a.extra_indices = extra->indices;
    a.extra_topk_length = extra->lengths;
  }
  a.attn_sink = sink;
  a.out = out_cpu;
  a.lse = lse_cpu;
  const int topk_total = c.topk + c.extra_topk;
  HostTensor ws_host(DType::uint8, {dsv4::make_decode_schedule(c.b, c.s_q, c.h, topk_total).workspace_bytes});
  dsv4::sparse_decode(a, dsv4::make_decode_schedule(c.b, c.s_q, c.h, topk_total), ws_host);

  // The same on the GPU, with the default plan and with a single split.
  DeviceCopy q_d(q), main_cache_d(main.cache->view().data), main_idx_d(main.indices), main_len_d(main.lengths),
      sink_d(sink), out_d(out_gpu), lse_d(lse_gpu);
  std::unique_ptr<DeviceCopy> extra_cache_d, extra_idx_d, extra_len_d;
  dsv4::SparseDecodeArgs g = a;
  g.q = q_d.view();
  g.k_cache.data = main_cache_d.view();
  g.indices = main_idx_d.view();
  g.topk_length = main_len_d.view();
  if (extra) {
    extra_cache_d = std::make_unique<DeviceCopy>(extra->cache->view().data);
    extra_idx_d = std::make_unique<DeviceCopy>(extra->indices);
    extra_len_d = std::make_unique<DeviceCopy>(extra->lengths);
    g.extra_k_cache.data = extra_cache_d->view();
    g.extra_indices = extra_idx_d->view();
    g.extra_topk_length = extra_len_d->view();
  }
  g.attn_sink = sink_d.view();
  g.out = out_d.view();
  g.lse = lse_d.view();
  for (int num_sms : {132, 1}) {
    SCOPED_TRACE(num_sms == 1 ? "one split" : "default plan");
    const dsv4::DecodeSchedule s = dsv4::make_decode_schedule(c.b, c.s_q, c.h, topk_total, num_sms);
    DeviceCopy ws_d(HostTensor(DType::uint8, {s.workspace_bytes}), false);
    dsv4::sparse_decode(g, s, ws_d.view());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out_d.download(out_gpu);
    lse_d.download(lse_gpu);
    expect_close(c.name, out_cpu, out_gpu, lse_cpu, lse_gpu);
  }
}

constexpr KvLayout M1 = KvLayout::model1_fp8, V32 = KvLayout::v32_fp8;
INSTANTIATE_TEST_SUITE_P(
    Shapes, SparseDecodeCpuVsCuda,
    ::testing::Values(
        //          name                 layout  h    b  s_q topk  extra len   sink  invalid
        XDecodeCase{"model1_h64_c4a",     M1,    64,  4, 1,  512,  128,  true, true,  false},
        XDecodeCase{"model1_h128_swa",    M1,   128,  2, 2,  128,  0,    false, true, false},
        XDecodeCase{"model1_h128_c128a",  M1,   128,  3, 1,  128,  64,   true, false, false},
        XDecodeCase{"v32_h128_topk2048",  V32,  128,  2, 1,  2048, 0,    true, true,  false},
        XDecodeCase{"v32_h64_extra",      V32,   64,  3, 1,  256,  64,   false, false, false},
        XDecodeCase{"model1_all_invalid", M1,    64,  2, 1,  128,  64,   false, true, true}),
    [](const auto& info) { return std::string(info.param.name); });

// ---- prefill -----------------------------------------------------------------------------------
struct XPrefillCase {
  const char* name;
  int h, d_qk, s_q, s_kv, topk;
  bool with_length, with_sink;
};

class SparsePrefillCpuVsCuda : public ::testing::TestWithParam<XPrefillCase> {};

TEST_P(SparsePrefillCpuVsCuda, SameResults) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const XPrefillCase c = GetParam();
  std::mt19937 rng(23);
  HostTensor q(DType::bf16, {c.s_q, c.h, c.d_qk}), kv(DType::bf16, {c.s_kv, 1, c.d_qk});
  dsv4::test::fill_bf16_normal(q, rng);
  dsv4::test::fill_bf16_normal(kv, rng);
  HostTensor idx(DType::int32, {c.s_q, 1, c.topk}), lengths, sink;
  if (c.with_length) {
    lengths = HostTensor(DType::int32, {c.s_q});
    for (int t = 0; t < c.s_q; ++t) lengths.data<int32_t>()[t] = t == 0 ? 0 : t == 1 ? c.topk : int(rng() % (c.topk + 1));
  }
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const unsigned pick = rng() % 16;
    idx.data<int32_t>()[i] = pick == 0 ? -1 : pick == 1 ? c.s_kv + int(rng() % 100) : pick == 2 ? INT_MAX
                                                                                    : int(rng() % c.s_kv);
  }
  if (c.with_sink) {
    sink = HostTensor(DType::fp32, {c.h});
    std::normal_distribution<float> normal(3.0f, 2.0f);
    for (int i = 0; i < c.h; ++i) sink.data<float>()[i] = normal(rng);
    sink.data<float>()[0] = -INFINITY;
    sink.data<float>()[1] = INFINITY;
  }
  HostTensor out_cpu(DType::bf16, {c.s_q, c.h, 512}), ml_cpu(DType::fp32, {c.s_q, c.h}), lse_cpu(DType::fp32, {c.s_q, c.h});
  HostTensor out_gpu(DType::bf16, {c.s_q, c.h, 512}), ml_gpu(DType::fp32, {c.s_q, c.h}), lse_gpu(DType::fp32, {c.s_q, c.h});
  out_gpu.fill_bytes(0xFF);
  ml_gpu.fill_bytes(0xFF);
  lse_gpu.fill_bytes(0xFF);

  dsv4::SparsePrefillArgs a;
  a.q = q;
  a.kv = kv;
  a.indices = idx;
  a.topk_length = lengths;
  a.attn_sink = sink;
  a.out = out_cpu;
  a.max_logits = ml_cpu;
  a.lse = lse_cpu;
  dsv4::sparse_prefill(a);

  DeviceCopy q_d(q), kv_d(kv), idx_d(idx), len_d(lengths), sink_d(sink), out_d(out_gpu), ml_d(ml_gpu), lse_d(lse_gpu);
  dsv4::SparsePrefillArgs g = a;
  g.q = q_d.view();
  g.kv = kv_d.view();
  g.indices = idx_d.view();
  g.topk_length = len_d.view();
  g.attn_sink = sink_d.view();
  g.out = out_d.view();
  g.max_logits = ml_d.view();
  g.lse = lse_d.view();
  dsv4::sparse_prefill(g);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out_d.download(out_gpu);
  ml_d.download(ml_gpu);
  lse_d.download(lse_gpu);
  expect_close(c.name, out_cpu, out_gpu, lse_cpu, lse_gpu);
  expect_close(c.name, out_cpu, out_gpu, ml_cpu, ml_gpu);  // max_logits: same tolerance as lse
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SparsePrefillCpuVsCuda,
    ::testing::Values(XPrefillCase{"h64_d512", 64, 512, 8, 1000, 512, true, true},
                      XPrefillCase{"h128_d512", 128, 512, 4, 3000, 2048, false, true},
                      XPrefillCase{"h128_d576", 128, 576, 4, 3000, 2048, true, false},
                      XPrefillCase{"h64_d576_topk128", 64, 576, 9, 300, 128, true, true}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
