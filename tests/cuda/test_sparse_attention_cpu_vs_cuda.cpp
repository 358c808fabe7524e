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
#include "cpu_vs_cuda_util.h"
#include "dsv4/ops.h"
#include "gpu_test_util.h"
#include "mixed_batch_decode.h"
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
// different summation order and exp2 vs exp: 2e-4 relative to max(1, |lse|). An FP8 query
// changes none of this: both attend with the same bf16 query its codes mean, bf16(fp8 · q_scale)
// (bit-identical conversions, fp8_convert.cuh).
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
  float q_scale = 0.0f;  // > 0: the query is FP8 (codes e4m3(q / q_scale)) of this scale
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
  if (c.q_scale > 0.0f) {  // the same query values as FP8 codes
    HostTensor codes(DType::fp8_e4m3, {c.b, c.s_q, c.h, d_qk});
    for (int64_t i = 0; i < q.numel(); ++i)
      codes.data<uint8_t>()[i] = dsv4::float_to_fp8_e4m3(q.get(i) / c.q_scale);
    q = codes;
  }
  HostTensor sink;
  if (c.with_sink) sink = sink_with_infinities(c.h, rng);
  HostTensor out_cpu(DType::bf16, {c.b, c.s_q, c.h, 512}), lse_cpu(DType::fp32, {c.b, c.s_q, c.h});
  HostTensor out_gpu(DType::bf16, {c.b, c.s_q, c.h, 512}), lse_gpu(DType::fp32, {c.b, c.s_q, c.h});
  out_gpu.fill_bytes(0xFF);
  lse_gpu.fill_bytes(0xFF);

  const int topk_total = c.topk + c.extra_topk;
  dsv4::SparseDecodeArgs a = dsv4::test::decode_args(q, main, extra.get(), sink, 0.0f, 512, out_cpu, lse_cpu);
  if (c.q_scale > 0.0f) a.q_scale = c.q_scale;
  HostTensor ws_host(DType::uint8, {dsv4::make_decode_schedule(c.b, c.s_q, c.h, topk_total).workspace_bytes});
  dsv4::sparse_decode(a, dsv4::make_decode_schedule(c.b, c.s_q, c.h, topk_total), ws_host);

  // The same on the GPU, with the default plan and with a single split.
  Uploads up;
  dsv4::SparseDecodeArgs g = on_device(
      dsv4::test::decode_args(q, main, extra.get(), sink, 0.0f, 512, out_gpu, lse_gpu), up);
  g.q_scale = a.q_scale;
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

constexpr KvLayout M1 = KvLayout::model1_fp8, V32 = KvLayout::v32_fp8, PT = KvLayout::fp8_per_tensor;
INSTANTIATE_TEST_SUITE_P(
    Shapes, SparseDecodeCpuVsCuda,
    ::testing::Values(
        //          name                 layout  h    b  s_q topk  extra len   sink  invalid
        XDecodeCase{"model1_h64_c4a",     M1,    64,  4, 1,  512,  128,  true, true,  false},
        XDecodeCase{"model1_h128_swa",    M1,   128,  2, 2,  128,  0,    false, true, false},
        XDecodeCase{"model1_h128_c128a",  M1,   128,  3, 1,  128,  64,   true, false, false},
        XDecodeCase{"v32_h128_topk2048",  V32,  128,  2, 1,  2048, 0,    true, true,  false},
        XDecodeCase{"v32_h64_extra",      V32,   64,  3, 1,  256,  64,   false, false, false},
        XDecodeCase{"model1_all_invalid", M1,    64,  2, 1,  128,  64,   false, true, true},
        // FP8 queries (q_scale 0.37): per-tensor FP8 caches (the FlashInfer port's FP8 decode)
        // with and without the H 128 cluster, and a MODEL1 cache.
        XDecodeCase{"fp8q_fp8t_h128",     PT,   128,  2, 1,  128,  64,   true, true,  false, 0.37f},
        XDecodeCase{"fp8q_fp8t_h64",      PT,    64,  3, 2,  256,  0,    false, true, false, 0.37f},
        XDecodeCase{"fp8q_model1_h64_c4a", M1,   64,  4, 1,  512,  128,  true, true,  false, 0.37f},
        // Many batches of random lengths: CTAs take the rows longest first (launch_order.h), with
        // and without the cluster; every row must still be computed once, by the right CTA.
        XDecodeCase{"model1_h128_ordered", M1,  128, 40, 2,  128,  512,  true, true,  false},
        XDecodeCase{"model1_h64_ordered",  M1,   64, 48, 1,  256,  256,  true, false, false}),
    [](const auto& info) { return std::string(info.param.name); });

// One call for a whole mixed batch (tests/mixed_batch_decode.h: a prompt from scratch, a decode,
// an MTP pair and a continuing chunk flattened into T query rows with per-token lengths), on each
// layout the layer offers, H 64 and H 128 (the cluster path): the GPU as the CPU.
TEST(SparseDecodeMixedBatchCpuVsCuda, SameResults) {
  DSV4_SKIP_WITHOUT_GPU();
  const std::vector<dsv4::test::MixedRequest> requests{{0, 7}, {300, 1}, {90, 2}, {150, 5}};
  for (KvLayout layout : {KvLayout::model1_fp8, KvLayout::bf16, KvLayout::fp8_per_tensor})
    for (int heads : {64, 128}) {
      SCOPED_TRACE(std::string(dsv4::kv_layout_name(layout)) + ", H " + std::to_string(heads));
      dsv4::test::MixedBatchDecode m(layout, heads, requests, 71);
      const dsv4::DecodeSchedule s = m.schedule();
      HostTensor ws(DType::uint8, {s.workspace_bytes});
      dsv4::sparse_decode(m.args(m.out, m.lse), s, ws);
      HostTensor out_gpu(DType::bf16, m.out.shape()), lse_gpu(DType::fp32, m.lse.shape());
      out_gpu.fill_bytes(0xFF);
      lse_gpu.fill_bytes(0xFF);
      Uploads up;
      const dsv4::SparseDecodeArgs g = on_device(m.args(out_gpu, lse_gpu), up);
      for (int num_sms : {132, 1}) {
        const dsv4::DecodeSchedule sg = m.schedule(num_sms);
        DeviceTensor ws_d(DType::uint8, {sg.workspace_bytes});
        dsv4::sparse_decode(g, sg, ws_d);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        dsv4::copy_to_host(g.out, out_gpu);
        dsv4::copy_to_host(g.lse, lse_gpu);
        expect_close(num_sms == 1 ? "mixed batch, one split" : "mixed batch", m.out, out_gpu, m.lse, lse_gpu);
      }
    }
}

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

// ---- FlashMLA-style layouts -------------------------------------------------------------------
// What FlashMLA's own tests (tests/lib.py) and vLLM hand over, on both backends: q whose [b, s_q]
// dims do not merge, padded in every dim, with heads padded by NaN rows (vLLM pads h_q to 64 / 128
// with uninitialized memory); indices in transposed, padded buffers; out / lse (/ max_logits)
// slices of wider NaN buffers; caches with padded block strides (V3.2: 64 x 656 B every 42640 B).
// The GPU must agree with the CPU on the same views (tolerances above), equal its own run on dense
// copies bit for bit (strides change addressing only), and leave every byte outside the output
// views alone.
using dsv4::test::StridedTensor;

// A strided host tensor's device twin: the whole buffer copied, the view at the same offset.
struct DeviceStrided {
  DeviceTensor storage;
  TensorView view;

  explicit DeviceStrided(const StridedTensor& host)
      : storage(DeviceTensor::from_host(host.storage.view())), view(host.view) {
    view.data = storage.data<uint8_t>() +
                (static_cast<const uint8_t*>(host.view.data) - host.storage.data<uint8_t>());
    view.device = dsv4::Device::cuda;
  }
  // The device buffer back into `host` (same layout).
  void download_into(StridedTensor& host) const {
    dsv4::copy_to_host(storage.view(), host.storage.view());
  }
};

// The device copy of a (possibly padded) test cache, blocks as far apart as on the host.
struct DeviceCache {
  DeviceTensor bytes;
  dsv4::KvCacheView view;

  explicit DeviceCache(const dsv4::test::TestCache& host)
      : bytes(DeviceTensor::from_host(host.bytes().view())), view(host.view()) {
    view.data.data = bytes.data<void>();
    view.data.device = dsv4::Device::cuda;
  }
};

// The first h heads of a dense [.., H, ..] result (heads at dim `head_dim`).
HostTensor real_heads(const HostTensor& t, int head_dim, int h) {
  TensorView v = t.view();
  v.shape[head_dim] = h;
  return HostTensor::copy_of(v);
}

// q with heads [h_real, H) set to NaN bits (vLLM's uninitialized pad rows).
void nan_pad_heads(const HostTensor& q, int heads, int h_real) {
  const int64_t d = q.shape().back(), rows = q.numel() / (int64_t{heads} * d);
  for (int64_t r = 0; r < rows; ++r)
    for (int h = h_real; h < heads; ++h)
      for (int64_t i = 0; i < d; ++i) q.data<uint16_t>()[(r * heads + h) * d + i] = 0xFFFF;
}

struct StridedDecodeCase {
  const char* name;
  KvLayout layout;
  int h_real, h_pad, b, s_q, topk, extra_topk;
};

class SparseDecodeStridedCpuVsCuda : public ::testing::TestWithParam<StridedDecodeCase> {};

TEST_P(SparseDecodeStridedCpuVsCuda, MatchesCpuAndDenseRun) {
  DSV4_SKIP_WITHOUT_GPU();
  const StridedDecodeCase c = GetParam();
  std::mt19937 rng(29);
  const dsv4::test::IndexMix mix{false, /*nan_rows_past_length=*/false};
  const int64_t stride = c.layout == KvLayout::v32_fp8 ? 65 * 656
                                                       : dsv4::test::spec_block_bytes(c.layout, 64) + 64;
  const int64_t extra_stride = (dsv4::test::spec_block_bytes(c.layout, 2) + 15) / 16 * 16 + 16;
  DecodeScope main(c.layout, 64, c.b, c.s_q, c.topk, true, rng, mix, stride);
  std::unique_ptr<DecodeScope> extra;
  if (c.extra_topk > 0)
    extra = std::make_unique<DecodeScope>(c.layout, 2, c.b, c.s_q, c.extra_topk, true, rng, mix,
                                          extra_stride);
  const int d_qk = dsv4::test::spec_dim(c.layout);
  HostTensor q(DType::bf16, {c.b, c.s_q, c.h_pad, d_qk});
  dsv4::test::fill_bf16_normal(q, rng);
  nan_pad_heads(q, c.h_pad, c.h_real);
  const HostTensor sink = sink_with_infinities(c.h_pad, rng);
  const StridedTensor q_s = StridedTensor::copy_of(q, {1, 2, 3, 8}, true);
  const StridedTensor idx_s = StridedTensor::copy_of(main.indices, {2, 1, 5}, true);
  const StridedTensor eidx_s = extra ? StridedTensor::copy_of(extra->indices, {1, 3, 7}, true)
                                     : StridedTensor(DType::int32, {1, 1, 1}, {0, 0, 0}, false);
  const std::vector<int64_t> out_shape{c.b, c.s_q, c.h_pad, 512}, lse_shape{c.b, c.s_q, c.h_pad};
  StridedTensor out_cpu(DType::bf16, out_shape, {1, 1, 2, 8}, true),
      lse_cpu(DType::fp32, lse_shape, {2, 1, 3}, true);
  StridedTensor out_gpu(DType::bf16, out_shape, {1, 1, 2, 8}, true),
      lse_gpu(DType::fp32, lse_shape, {2, 1, 3}, true);
  const HostTensor out_before = out_gpu.snapshot(), lse_before = lse_gpu.snapshot();

  const int topk_total = c.topk + c.extra_topk;
  const dsv4::DecodeSchedule sched = dsv4::make_decode_schedule(c.b, c.s_q, c.h_pad, topk_total);
  dsv4::SparseDecodeArgs a =
      dsv4::test::decode_args(q_s.view, main, extra.get(), sink, 0.0f, 512, out_cpu.view, lse_cpu.view);
  a.indices = idx_s.view;
  if (extra) a.extra_indices = eidx_s.view;
  HostTensor ws_host(DType::uint8, {sched.workspace_bytes});
  dsv4::sparse_decode(a, sched, ws_host);

  // The GPU on the same strided views.
  Uploads up;
  const DeviceCache cache_d(*main.cache);
  const std::unique_ptr<DeviceCache> extra_d = extra ? std::make_unique<DeviceCache>(*extra->cache) : nullptr;
  const DeviceStrided q_d(q_s), idx_d(idx_s), eidx_d(eidx_s), out_d(out_gpu), lse_d(lse_gpu);
  dsv4::SparseDecodeArgs g = a;
  g.q = q_d.view;
  g.k_cache = cache_d.view;
  g.indices = idx_d.view;
  g.topk_length = up(a.topk_length);
  if (extra) {
    g.extra_k_cache = extra_d->view;
    g.extra_indices = eidx_d.view;
    g.extra_topk_length = up(a.extra_topk_length);
  }
  g.attn_sink = up(a.attn_sink);
  g.out = out_d.view;
  g.lse = lse_d.view;
  DeviceTensor ws_d(DType::uint8, {sched.workspace_bytes});
  dsv4::sparse_decode(g, sched, ws_d);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out_d.download_into(out_gpu);
  lse_d.download_into(lse_gpu);
  out_gpu.expect_only_view_written(out_before);
  lse_gpu.expect_only_view_written(lse_before);
  const HostTensor gpu_out = real_heads(out_gpu.dense(), 2, c.h_real);
  const HostTensor gpu_lse = real_heads(lse_gpu.dense(), 2, c.h_real);
  expect_close(c.name, real_heads(out_cpu.dense(), 2, c.h_real), gpu_out,
               real_heads(lse_cpu.dense(), 2, c.h_real), gpu_lse);

  // The GPU on dense copies of q, indices, out and lse: the same bits.
  HostTensor dense_out(DType::bf16, out_shape), dense_lse(DType::fp32, lse_shape);
  dense_out.fill_bytes(0xFF);
  dense_lse.fill_bytes(0xFF);
  g.q = up(q);
  g.indices = up(main.indices);
  if (extra) g.extra_indices = up(extra->indices);
  g.out = up(dense_out);
  g.lse = up(dense_lse);
  dsv4::sparse_decode(g, sched, ws_d);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dsv4::copy_to_host(g.out, dense_out);
  dsv4::copy_to_host(g.lse, dense_lse);
  dsv4::test::expect_bytes_equal("out", real_heads(dense_out, 2, c.h_real), gpu_out);
  dsv4::test::expect_bytes_equal("lse", real_heads(dense_lse, 2, c.h_real), gpu_lse);
}

INSTANTIATE_TEST_SUITE_P(
    FlashMla, SparseDecodeStridedCpuVsCuda,
    ::testing::Values(
        //                name                    layout h   H    b  s_q topk extra
        StridedDecodeCase{"model1_h40_of_64_extra", M1,  40, 64,  3, 2,  256, 96},
        StridedDecodeCase{"model1_h100_of_128",     M1, 100, 128, 2, 1,  512, 64},
        StridedDecodeCase{"v32_h40_of_64",          V32, 40, 64,  2, 2,  512, 0},
        StridedDecodeCase{"v32_h100_of_128_42640B", V32, 100, 128, 3, 1, 2048, 0}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(SparsePrefillStridedCpuVsCuda, MatchesCpuAndDenseRun) {
  DSV4_SKIP_WITHOUT_GPU();
  for (const int d_qk : {512, 576}) {
    SCOPED_TRACE(d_qk);
    const int s_q = 7, h_real = 100, h_pad = 128, s_kv = 900, topk = 256;
    std::mt19937 rng(31);
    HostTensor q(DType::bf16, {s_q, h_pad, d_qk}), kv(DType::bf16, {s_kv, 1, d_qk});
    dsv4::test::fill_bf16_normal(q, rng);
    dsv4::test::fill_bf16_normal(kv, rng);
    nan_pad_heads(q, h_pad, h_real);
    HostTensor idx(DType::int32, {s_q, 1, topk});
    for (int64_t i = 0; i < idx.numel(); ++i) {
      const unsigned pick = rng() % 16;
      idx.data<int32_t>()[i] = pick == 0 ? -1 : pick == 1 ? INT_MIN : pick == 2 ? s_kv : int(rng() % s_kv);
    }
    const HostTensor lengths = dsv4::test::random_lengths(s_q, topk, rng);
    const HostTensor sink = sink_with_infinities(h_pad, rng);
    const StridedTensor q_s = StridedTensor::copy_of(q, {2, 3, 8}, false);
    const StridedTensor kv_s = StridedTensor::copy_of(kv, {3, 1, 16}, false);
    const StridedTensor idx_s = StridedTensor::copy_of(idx, {2, 1, 4}, true);
    StridedTensor out_cpu(DType::bf16, {s_q, h_pad, 512}, {1, 2, 8}, false),
        out_gpu(DType::bf16, {s_q, h_pad, 512}, {1, 2, 8}, false);
    StridedTensor ml_cpu(DType::fp32, {s_q, h_pad}, {2, 3}, false), ml_gpu(DType::fp32, {s_q, h_pad}, {2, 3}, false);
    StridedTensor lse_cpu(DType::fp32, {s_q, h_pad}, {1, 5}, false), lse_gpu(DType::fp32, {s_q, h_pad}, {1, 5}, false);
    const HostTensor out_before = out_gpu.snapshot(), ml_before = ml_gpu.snapshot(),
                     lse_before = lse_gpu.snapshot();

    dsv4::SparsePrefillArgs a{.q = q_s.view, .kv = kv_s.view, .indices = idx_s.view,
                              .topk_length = lengths, .attn_sink = sink, .out = out_cpu.view,
                              .max_logits = ml_cpu.view, .lse = lse_cpu.view};
    dsv4::sparse_prefill(a);

    Uploads up;
    const DeviceStrided q_d(q_s), kv_d(kv_s), idx_d(idx_s), out_d(out_gpu), ml_d(ml_gpu), lse_d(lse_gpu);
    dsv4::SparsePrefillArgs g{.q = q_d.view, .kv = kv_d.view, .indices = idx_d.view,
                              .topk_length = up(lengths), .attn_sink = up(sink), .out = out_d.view,
                              .max_logits = ml_d.view, .lse = lse_d.view};
    dsv4::sparse_prefill(g);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out_d.download_into(out_gpu);
    ml_d.download_into(ml_gpu);
    lse_d.download_into(lse_gpu);
    out_gpu.expect_only_view_written(out_before);
    ml_gpu.expect_only_view_written(ml_before);
    lse_gpu.expect_only_view_written(lse_before);
    const HostTensor gpu_out = real_heads(out_gpu.dense(), 1, h_real);
    const HostTensor gpu_ml = real_heads(ml_gpu.dense(), 1, h_real), gpu_lse = real_heads(lse_gpu.dense(), 1, h_real);
    expect_close("prefill", real_heads(out_cpu.dense(), 1, h_real), gpu_out,
                 real_heads(lse_cpu.dense(), 1, h_real), gpu_lse);
    expect_close("prefill max_logits", real_heads(out_cpu.dense(), 1, h_real), gpu_out,
                 real_heads(ml_cpu.dense(), 1, h_real), gpu_ml);

    HostTensor dense_out(DType::bf16, {s_q, h_pad, 512}), dense_ml(DType::fp32, {s_q, h_pad}),
        dense_lse(DType::fp32, {s_q, h_pad});
    for (HostTensor* t : {&dense_out, &dense_ml, &dense_lse}) t->fill_bytes(0xFF);
    g.q = up(q);
    g.kv = up(kv);
    g.indices = up(idx);
    g.out = up(dense_out);
    g.max_logits = up(dense_ml);
    g.lse = up(dense_lse);
    dsv4::sparse_prefill(g);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dsv4::copy_to_host(g.out, dense_out);
    dsv4::copy_to_host(g.max_logits, dense_ml);
    dsv4::copy_to_host(g.lse, dense_lse);
    dsv4::test::expect_bytes_equal("out", real_heads(dense_out, 1, h_real), gpu_out);
    dsv4::test::expect_bytes_equal("max_logits", real_heads(dense_ml, 1, h_real), gpu_ml);
    dsv4::test::expect_bytes_equal("lse", real_heads(dense_lse, 1, h_real), gpu_lse);
  }
}

// A q / out stride that breaks the 16-byte row rule is refused on CUDA, naming the stride, before
// anything is written (the CPU accepts the same views).
TEST(SparseAttentionCudaStrides, MisalignedRowStridesNameTheStride) {
  DSV4_SKIP_WITHOUT_GPU();
  std::mt19937 rng(37);
  DecodeScope main(KvLayout::model1_fp8, 64, 2, 1, 64, false, rng);
  HostTensor q(DType::bf16, {2, 1, 16, 512});
  dsv4::test::fill_bf16_normal(q, rng);
  const StridedTensor q_s = StridedTensor::copy_of(q, {0, 0, 0, 4}, false);  // rows 516 apart
  StridedTensor out(DType::bf16, {2, 1, 16, 512}, {0, 0, 0, 0}, false);
  HostTensor lse(DType::fp32, {2, 1, 16});
  const auto sched = dsv4::make_decode_schedule(2, 1, 16, 64);
  HostTensor ws_host(DType::uint8, {sched.workspace_bytes});
  dsv4::SparseDecodeArgs a = dsv4::test::decode_args(q_s.view, main, nullptr, {}, 0.0f, 512, out.view, lse);
  dsv4::sparse_decode(a, sched, ws_host);  // the CPU takes it

  Uploads up;
  const DeviceCache cache_d(*main.cache);
  const DeviceStrided q_d(q_s), out_d(out);
  dsv4::SparseDecodeArgs g = a;
  g.q = q_d.view;
  g.k_cache = cache_d.view;
  g.indices = up(main.indices);
  g.out = out_d.view;
  g.lse = up(lse);
  DeviceTensor ws_d(DType::uint8, {sched.workspace_bytes});
  dsv4::test::expect_error([&] { dsv4::sparse_decode(g, sched, ws_d); },
                           {"sparse_decode", "q.stride(2)", "multiple of 8 elements"});
}
}  // namespace
