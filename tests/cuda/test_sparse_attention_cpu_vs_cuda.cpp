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

#include "dsv4/device_tensor.h"
#include "dsv4/ops.h"
#include "gpu_test_util.h"
#include "sparse_attention_cases.h"

namespace {

using dsv4::DeviceTensor;
using dsv4::DType;
using dsv4::HostTensor;
using dsv4::KvLayout;
using dsv4::TensorView;
using dsv4::test::DecodeScope;

// Device copies of the views of one op call, alive as long as this object.
class Uploads {
 public:
  // A device copy of `host` (undefined stays undefined).
  TensorView operator()(const TensorView& host) {
    if (!host.defined()) return {};
    owned_.push_back(DeviceTensor::from_host(host));
    return owned_.back().view();
  }

 private:
  std::vector<DeviceTensor> owned_;
};

// The same call with every tensor copied to the device (outputs included: poison them first).
dsv4::SparseDecodeArgs on_device(dsv4::SparseDecodeArgs a, Uploads& up) {
  for (TensorView* t : {&a.q, &a.k_cache.data, &a.indices, &a.topk_length, &a.extra_k_cache.data,
                        &a.extra_indices, &a.extra_topk_length, &a.attn_sink, &a.out, &a.lse})
    *t = up(*t);
  return a;
}
dsv4::SparsePrefillArgs on_device(dsv4::SparsePrefillArgs a, Uploads& up) {
  for (TensorView* t : {&a.q, &a.kv, &a.indices, &a.topk_length, &a.attn_sink, &a.out,
                        &a.max_logits, &a.lse})
    *t = up(*t);
  return a;
}

// Sinks N(3, 2²) with -inf (no sink) at head 0 and +inf (output zeroed) at head 1.
HostTensor sink_with_infinities(int heads, std::mt19937& rng) {
  HostTensor sink = dsv4::test::random_sink(heads, rng, 3.0f);
  sink.data<float>()[0] = -INFINITY;
  sink.data<float>()[1] = INFINITY;
  return sink;
}

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

class SparseDecodeCpuVsCuda : public ::testing::TestWithParam<XDecodeCase> {};

TEST_P(SparseDecodeCpuVsCuda, SameResults) {
  DSV4_SKIP_WITHOUT_GPU();
  const XDecodeCase c = GetParam();
  std::mt19937 rng(17);
  // Past topk_length: values no cache has (1 << 30) only.
  const dsv4::test::IndexMix mix{c.all_invalid, /*nan_rows_past_length=*/false};
  DecodeScope main(c.layout, 64, c.b, c.s_q, c.topk, c.with_length, rng, mix);
  std::unique_ptr<DecodeScope> extra;
  if (c.extra_topk > 0)
    extra = std::make_unique<DecodeScope>(c.layout, 64, c.b, c.s_q, c.extra_topk, c.with_length,
                                          rng, mix);
  const int d_qk = dsv4::test::spec_dim(c.layout);
  HostTensor q(DType::bf16, {c.b, c.s_q, c.h, d_qk});
  dsv4::test::fill_bf16_normal(q, rng);
  HostTensor sink;
  if (c.with_sink) sink = sink_with_infinities(c.h, rng);
  HostTensor out_cpu(DType::bf16, {c.b, c.s_q, c.h, 512}), lse_cpu(DType::fp32, {c.b, c.s_q, c.h});
  HostTensor out_gpu(DType::bf16, {c.b, c.s_q, c.h, 512}), lse_gpu(DType::fp32, {c.b, c.s_q, c.h});
  out_gpu.fill_bytes(0xFF);
  lse_gpu.fill_bytes(0xFF);

  const int topk_total = c.topk + c.extra_topk;
  const dsv4::SparseDecodeArgs a =
      dsv4::test::decode_args(q, main, extra.get(), sink, 0.0f, 512, out_cpu, lse_cpu);
  HostTensor ws_host(DType::uint8, {dsv4::make_decode_schedule(c.b, c.s_q, c.h, topk_total).workspace_bytes});
  dsv4::sparse_decode(a, dsv4::make_decode_schedule(c.b, c.s_q, c.h, topk_total), ws_host);

  // The same on the GPU, with the default plan and with a single split.
  Uploads up;
  const dsv4::SparseDecodeArgs g = on_device(
      dsv4::test::decode_args(q, main, extra.get(), sink, 0.0f, 512, out_gpu, lse_gpu), up);
  for (int num_sms : {132, 1}) {
    SCOPED_TRACE(num_sms == 1 ? "one split" : "default plan");
    const dsv4::DecodeSchedule s = dsv4::make_decode_schedule(c.b, c.s_q, c.h, topk_total, num_sms);
    DeviceTensor ws_d(DType::uint8, {s.workspace_bytes});
    dsv4::sparse_decode(g, s, ws_d);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dsv4::copy_to_host(g.out, out_gpu);
    dsv4::copy_to_host(g.lse, lse_gpu);
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
  DSV4_SKIP_WITHOUT_GPU();
  const XPrefillCase c = GetParam();
  std::mt19937 rng(23);
  HostTensor q(DType::bf16, {c.s_q, c.h, c.d_qk}), kv(DType::bf16, {c.s_kv, 1, c.d_qk});
  dsv4::test::fill_bf16_normal(q, rng);
  dsv4::test::fill_bf16_normal(kv, rng);
  HostTensor idx(DType::int32, {c.s_q, 1, c.topk}), lengths, sink;
  if (c.with_length) lengths = dsv4::test::random_lengths(c.s_q, c.topk, rng);
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const unsigned pick = rng() % 16;
    idx.data<int32_t>()[i] = pick == 0 ? -1 : pick == 1 ? c.s_kv + int(rng() % 100) : pick == 2 ? INT_MAX
                                                                                    : int(rng() % c.s_kv);
  }
  if (c.with_sink) sink = sink_with_infinities(c.h, rng);
  HostTensor out_cpu(DType::bf16, {c.s_q, c.h, 512}), ml_cpu(DType::fp32, {c.s_q, c.h}), lse_cpu(DType::fp32, {c.s_q, c.h});
  HostTensor out_gpu(DType::bf16, {c.s_q, c.h, 512}), ml_gpu(DType::fp32, {c.s_q, c.h}), lse_gpu(DType::fp32, {c.s_q, c.h});
  out_gpu.fill_bytes(0xFF);
  ml_gpu.fill_bytes(0xFF);
  lse_gpu.fill_bytes(0xFF);

  dsv4::SparsePrefillArgs a{.q = q, .kv = kv, .indices = idx, .topk_length = lengths,
                            .attn_sink = sink, .out = out_cpu, .max_logits = ml_cpu, .lse = lse_cpu};
  dsv4::sparse_prefill(a);

  a.out = out_gpu;
  a.max_logits = ml_gpu;
  a.lse = lse_gpu;
  Uploads up;
  const dsv4::SparsePrefillArgs g = on_device(a, up);
  dsv4::sparse_prefill(g);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dsv4::copy_to_host(g.out, out_gpu);
  dsv4::copy_to_host(g.max_logits, ml_gpu);
  dsv4::copy_to_host(g.lse, lse_gpu);
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
