// The compressor's CPU reference against its CUDA twin, both through the public API
// (dsv4::compressor_update_and_emit, dsv4::compressor_project) on the same inputs: ratios 4 and
// 128, KV-cache layouts and indexer keys, several requests per batch, chunk splits inside
// windows, prompts shorter than a window, decode steps and empty calls; rings, output caches and
// `entries` compared after every call; plus what only the CUDA path does (skipping unmapped
// slots, its own rejections) and mixed devices. Skipped without a GPU.
//
// Tolerances (why):
//   - ring rows: bit-exact (both sides copy the same fp32 rows).
//   - entries: bit-exact. Both sides run the same fp32 operations in the same order through the
//     shared helpers (src/math/compressor.h: softmax_exp instead of std::exp / expf; dtype.h
//     ieee_* on the GPU, never fused or flushed; sequential sums).
//   - cache bytes: bit-exact (the shared encoders fed bit-identical entries; their UE8M0
//     division is IEEE on the device too), except FP8_PER_TENSOR: its encoder's 1 / tensor_scale
//     is rcp.approx under --use_fast_math (<= 1 ulp off), so a value on an fp8 rounding midpoint
//     may take the neighbouring code. There, a differing slot must decode within one fp8 step
//     (2^-3 relative, plus 1e-4 · the slot's max for subnormal codes) of the CPU's, and at most
//     1 + 1% of the emitted slots may differ at all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "cpu/compressor_test_support.h"
#include "dsv4/compressor.h"
#include "dsv4/device_tensor.h"
#include "dsv4/ops.h"
#include "gpu_test_util.h"

namespace dsv4 {
namespace {

using test::Rng;

constexpr uint8_t kCachePoison = 0xAB;
const RopeConfig kRope = dense_test::yarn_rope(64);

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

HostTensor shuffled_table(int rows, int64_t cols, int64_t num_blocks, Rng& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng.gen);
  HostTensor t(DType::int32, {rows, cols});
  for (int64_t i = 0; i < rows * cols; ++i) t.data<int32_t>()[i] = ids[static_cast<size_t>(i)];
  return t;
}

// A device buffer of `guard` extra bytes around a contiguous [rows, cols] view of `host`'s
// contents, so writes outside the view show up in the guard (filled with 0x5A).
struct Guarded {
  static constexpr int64_t kGuard = 256;
  DeviceTensor buf;
  TensorView view;
  explicit Guarded(const HostTensor& host) {
    const int64_t bytes = static_cast<int64_t>(host.nbytes());
    buf = DeviceTensor(DType::uint8, {bytes + 2 * kGuard});
    buf.fill_bytes(0x5A);
    view = host.view();
    view.data = buf.data<uint8_t>() + kGuard;
    view.device = Device::cuda;
    copy_to_device(host.view(), view);
  }
  HostTensor to_host(const HostTensor& like) const {
    HostTensor h(like.dtype(), like.shape());
    copy_to_host(view, h.view());
    return h;
  }
  bool guard_intact() const {
    const HostTensor all = buf.to_host();
    const uint8_t* b = all.data<uint8_t>();
    const int64_t n = all.numel();
    for (int64_t i = 0; i < kGuard; ++i)
      if (b[i] != 0x5A || b[n - 1 - i] != 0x5A) return false;
    return true;
  }
};

// ================================ the two sides ==============================================

struct Case {
  const char* name;
  CompressorTarget target;
  KvLayout layout;
  int ratio;
  std::vector<int64_t> lengths;  // tokens per request
  int64_t max_chunk;             // 0: one call with everything; else chunks of 1..max_chunk
  int out_block, state_block;
  bool bf16_norm;
  float tensor_scale;  // FP8_PER_TENSOR
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct Rig {
  CompressorConfig cfg;
  Case c;
  int R = 0;
  // Host side (the CPU reference runs on these) and their device twins.
  HostTensor out_data, out_table, state_rows, state_table, cos_sin, norm;
  std::unique_ptr<Guarded> d_out, d_state;
  DeviceTensor d_out_table, d_state_table, d_cos_sin, d_norm;
  std::vector<HostTensor> kv, score;  // per request [n, W]
  std::vector<int64_t> context;

  explicit Rig(const Case& cs) : c(cs), R(static_cast<int>(cs.lengths.size())) {
    cfg.target = c.target;
    cfg.head_dim = c.target == CompressorTarget::kv_cache ? 512 : 128;
    cfg.ratio = c.ratio;
    cfg.rope_dims = 64;
    Rng rng(4242 + c.ratio + 7 * R);
    const int64_t W = cfg.proj_width(), D = cfg.head_dim;
    const int64_t max_len = *std::max_element(c.lengths.begin(), c.lengths.end());
    for (int64_t n : c.lengths) {
      HostTensor k(DType::fp32, {n, W}), s(DType::fp32, {n, W});
      const std::vector<float> kv_v = rng.floats(static_cast<size_t>(n * W), 0.1, 1.0);
      const std::vector<float> s_v = rng.floats(static_cast<size_t>(n * W), 0.05, 2.0);
      std::copy(kv_v.begin(), kv_v.end(), k.data<float>());
      std::copy(s_v.begin(), s_v.end(), s.data<float>());
      kv.push_back(k);
      score.push_back(s);
    }
    context.assign(static_cast<size_t>(R), 0);
    // Output cache: shuffled blocks plus spares nobody owns; poisoned.
    const int64_t per_req = std::max<int64_t>(1, ceil_div(max_len / c.ratio, c.out_block));
    const int64_t out_blocks = R * per_req + 2;
    const int64_t block_bytes = c.target == CompressorTarget::kv_cache
                                    ? kv_geometry(c.layout, c.out_block).block_bytes
                                    : int64_t{c.out_block} * indexer_keys::kEntryBytes;
    out_data = HostTensor(DType::uint8, {out_blocks, block_bytes});
    out_data.fill_bytes(kCachePoison);
    out_table = shuffled_table(R, per_req, out_blocks, rng);
    // Rings: NaN-poisoned rows, shuffled blocks.
    const int64_t ring_blocks = ceil_div(cfg.ring_rows(), c.state_block);
    const int64_t state_blocks = R * ring_blocks + 1;
    state_rows = HostTensor(DType::fp32, {state_blocks * c.state_block, int64_t{cfg.state_width()}});
    state_rows.fill_bytes(0xFF);
    state_table = shuffled_table(R, ring_blocks, state_blocks, rng);
    cos_sin = build_rope_cache(kRope, std::max<int64_t>(1, max_len));
    norm = HostTensor(c.bf16_norm ? DType::bf16 : DType::fp32, {D});
    for (int64_t d = 0; d < D; ++d) norm.set(d, static_cast<float>(rng.uniform(0.5, 1.5)));

    d_out = std::make_unique<Guarded>(out_data);
    d_state = std::make_unique<Guarded>(state_rows);
    d_out_table = DeviceTensor::from_host(out_table);
    d_state_table = DeviceTensor::from_host(state_table);
    d_cos_sin = DeviceTensor::from_host(cos_sin);
    d_norm = DeviceTensor::from_host(norm);
  }

  CompressorOutputView out_view(const TensorView& data, const TensorView& table) const {
    CompressorOutputView v;
    if (cfg.target == CompressorTarget::kv_cache) {
      v.kv_cache.data = data;
      v.kv_cache.layout = c.layout;
      v.kv_cache.block_size = c.out_block;
      v.kv_cache.tensor_scale = c.tensor_scale;
    } else {
      v.indexer_keys.data = data;
      v.indexer_keys.block_size = c.out_block;
    }
    v.block_table = table;
    return v;
  }
  int64_t num_slots() const { return out_data.shape()[0] * c.out_block; }
};

// The host tensors of one call: `chunks` = (request, tokens) in batch order.
struct Call {
  HostTensor kv, score, pos, req, ctx, entries;
  int64_t T = 0, emitted = 0;
};

Call make_call(const Rig& s, const std::vector<std::pair<int, int64_t>>& chunks, bool idx64) {
  const int64_t W = s.cfg.proj_width(), D = s.cfg.head_dim;
  Call call;
  for (auto [q, n] : chunks) call.T += n;
  const int64_t T = call.T;
  const DType it = idx64 ? DType::int64 : DType::int32;
  call.kv = HostTensor(DType::fp32, {T, W});
  call.score = HostTensor(DType::fp32, {T, W});
  call.pos = HostTensor(it, {T});
  call.req = HostTensor(DType::int32, {T});
  call.ctx = HostTensor(it, {s.R});
  call.entries = HostTensor(DType::fp32, {T, D});
  call.entries.fill_bytes(0xFF);
  for (int q = 0; q < s.R; ++q) call.ctx.set(q, static_cast<float>(s.context[q]));
  int64_t t = 0;
  for (auto [q, n] : chunks)
    for (int64_t i = 0; i < n; ++i, ++t) {
      const int64_t p = s.context[q] + i;
      std::copy_n(s.kv[q].data<float>() + p * W, W, call.kv.data<float>() + t * W);
      std::copy_n(s.score[q].data<float>() + p * W, W, call.score.data<float>() + t * W);
      call.pos.set(t, static_cast<float>(p));
      call.req.set(t, static_cast<float>(q));
      if ((p + 1) % s.cfg.ratio == 0) ++call.emitted;
    }
  return call;
}

// Device copies of one call's tensors (T = 0 ones too: DeviceTensor allocates for them, so their
// views are defined like the host's).
struct DeviceCall {
  DeviceTensor kv, score, pos, req, ctx, entries;
  explicit DeviceCall(const Call& c)
      : kv(DeviceTensor::from_host(c.kv)),
        score(DeviceTensor::from_host(c.score)),
        pos(DeviceTensor::from_host(c.pos)),
        req(DeviceTensor::from_host(c.req)),
        ctx(DeviceTensor::from_host(c.ctx)),
        entries(DeviceTensor::from_host(c.entries)) {}
};

// ================================ comparisons ================================================

// Byte ranges [begin, end) of one slot in the output cache buffer.
std::vector<std::pair<int64_t, int64_t>> slot_ranges(const Rig& s, int64_t slot) {
  const int B = s.c.out_block;
  const int64_t base = (slot / B) * s.out_data.shape()[1];
  const int off = static_cast<int>(slot % B);
  if (s.cfg.target == CompressorTarget::indexer_keys)
    return {{base + indexer_key_data_offset(off), base + indexer_key_data_offset(off) + 128},
            {base + indexer_key_scale_offset(B, off), base + indexer_key_scale_offset(B, off) + 4}};
  const KvGeometry g = kv_geometry(s.c.layout, B);
  if (s.c.layout == KvLayout::model1_fp8)
    return {{base + g.data_offset(off), base + g.data_offset(off) + model1::kDataBytes},
            {base + g.scale_offset(off), base + g.scale_offset(off) + model1::kScaleBytes}};
  return {{base + g.data_offset(off), base + g.data_offset(off) + g.token_bytes}};
}

std::vector<float> decode_slot(const Rig& s, const uint8_t* cache, int64_t slot) {
  const int B = s.c.out_block;
  const uint8_t* block = cache + (slot / B) * s.out_data.shape()[1];
  const int off = static_cast<int>(slot % B);
  std::vector<float> v(static_cast<size_t>(s.cfg.head_dim));
  if (s.cfg.target == CompressorTarget::indexer_keys) {
    const float scale = indexer_key_scale(block, B, off);
    for (int i = 0; i < 128; ++i) v[i] = fp8_e4m3_to_float(indexer_key_codes(block, off)[i]) * scale;
  } else {
    kv_decode_token(kv_geometry(s.c.layout, B), block, off, v.data(), s.c.tensor_scale);
  }
  return v;
}

// Output cache bytes: identical, except (FP8_PER_TENSOR only) up to 1 + emitted/100 slots that
// decode within one fp8 step (the file comment says why). Differing slots are always decoded and
// reported, so a failure shows how far apart the two sides are.
void expect_cache_matches(const Rig& s, const HostTensor& cpu, const HostTensor& gpu,
                          int64_t emitted, const std::string& what) {
  const uint8_t* a = cpu.data<uint8_t>();
  const uint8_t* b = gpu.data<uint8_t>();
  const int64_t n = static_cast<int64_t>(cpu.nbytes());
  if (std::memcmp(a, b, static_cast<size_t>(n)) == 0) return;
  std::vector<uint8_t> accepted(static_cast<size_t>(n), 0);
  int64_t differing = 0;
  int reported = 0;
  for (int64_t slot = 0; slot < s.num_slots(); ++slot) {
    const auto ranges = slot_ranges(s, slot);
    bool differs = false;
    for (auto [lo, hi] : ranges)
      differs = differs || std::memcmp(a + lo, b + lo, static_cast<size_t>(hi - lo)) != 0;
    if (!differs) continue;
    ++differing;
    const std::vector<float> va = decode_slot(s, a, slot), vb = decode_slot(s, b, slot);
    double amax = 0.0;
    for (float f : va) amax = std::max(amax, std::fabs(double{f}));
    for (size_t i = 0; i < va.size(); ++i) {
      const double tol = std::ldexp(std::max(std::fabs(double{va[i]}), std::fabs(double{vb[i]})), -3) +
                         1e-4 * amax;
      if (!(std::fabs(double{va[i]} - double{vb[i]}) <= tol) && reported++ < 10)
        ADD_FAILURE() << what << ": slot " << slot << " value " << i << ": cpu " << va[i]
                      << ", gpu " << vb[i] << " (beyond one fp8 step)";
    }
    for (auto [lo, hi] : ranges) std::fill(accepted.begin() + lo, accepted.begin() + hi, 1);
  }
  const bool per_tensor =
      s.cfg.target == CompressorTarget::kv_cache && s.c.layout == KvLayout::fp8_per_tensor;
  const int64_t allowed = per_tensor ? 1 + emitted / 100 : 0;
  EXPECT_LE(differing, allowed) << what << ": slots whose bytes differ";
  for (int64_t i = 0; i < n; ++i)
    if (a[i] != b[i] && !accepted[static_cast<size_t>(i)]) {
      ADD_FAILURE() << what << ": byte " << i << " outside any differing slot: cpu "
                    << int{a[i]} << ", gpu " << int{b[i]};
      break;
    }
}

void expect_bytes_equal(const HostTensor& cpu, const HostTensor& gpu, const std::string& what) {
  ASSERT_EQ(cpu.nbytes(), gpu.nbytes()) << what;
  const uint8_t* a = cpu.data<uint8_t>();
  const uint8_t* b = gpu.data<uint8_t>();
  for (size_t i = 0; i < cpu.nbytes(); ++i)
    if (a[i] != b[i]) {
      ADD_FAILURE() << what << ": first differing byte " << i << " of " << cpu.nbytes()
                    << " (cpu " << int{a[i]} << ", gpu " << int{b[i]} << ")";
      return;
    }
}

// ================================ schedules ==================================================

std::vector<std::vector<std::pair<int, int64_t>>> make_schedule(const Case& c, Rng& rng) {
  std::vector<int64_t> left = c.lengths;
  std::vector<std::vector<std::pair<int, int64_t>>> calls;
  calls.push_back({});  // an empty call first: T = 0 launches nothing
  while (std::any_of(left.begin(), left.end(), [](int64_t n) { return n > 0; })) {
    std::vector<std::pair<int, int64_t>> call;
    for (int q = 0; q < static_cast<int>(left.size()); ++q) {
      if (left[q] == 0) continue;
      int64_t n = left[q];
      if (c.max_chunk > 0) {
        n = std::min(left[q], rng.integer(1, c.max_chunk));
        if (rng.integer(0, 3) == 0) continue;  // sit this call out
      }
      call.push_back({q, n});
      left[q] -= n;
    }
    if (!call.empty()) calls.push_back(call);
  }
  return calls;
}

class CompressorCpuVsCuda : public ::testing::TestWithParam<Case> {};

TEST_P(CompressorCpuVsCuda, SameRingsEntriesAndCacheAfterEveryCall) {
  DSV4_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  Rig s(c);
  Rng rng(77 + c.ratio);
  int call_no = 0;
  for (const auto& chunks : make_schedule(c, rng)) {
    const std::string what = std::string(c.name) + " call " + std::to_string(call_no);
    Call call = make_call(s, chunks, call_no % 2 == 1);
    DeviceCall dev(call);
    // CPU reference on the host tensors.
    compressor_update_and_emit(s.cfg, call.kv, call.score, {call.pos, call.req, call.ctx}, s.norm,
                               s.cos_sin, {s.state_rows, s.state_table, c.state_block},
                               s.out_view(s.out_data, s.out_table), call.entries);
    // CUDA on their device copies.
    ASSERT_NO_THROW(compressor_update_and_emit(
        s.cfg, dev.kv, dev.score, {dev.pos, dev.req, dev.ctx}, s.d_norm, s.d_cos_sin,
        {s.d_state->view, s.d_state_table, c.state_block},
        s.out_view(s.d_out->view, s.d_out_table), dev.entries))
        << what;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    expect_bytes_equal(s.state_rows, s.d_state->to_host(s.state_rows), what + " rings");
    if (call.T > 0)
      expect_bytes_equal(call.entries, dev.entries.to_host(), what + " entries");
    expect_cache_matches(s, s.out_data, s.d_out->to_host(s.out_data), call.emitted,
                         what + " output cache");
    EXPECT_TRUE(s.d_out->guard_intact()) << what << ": write outside the output cache";
    EXPECT_TRUE(s.d_state->guard_intact()) << what << ": write outside the rings";
    for (auto [q, n] : chunks) s.context[q] += n;
    ++call_no;
  }
}

const CompressorTarget kKv = CompressorTarget::kv_cache;
const CompressorTarget kIdx = CompressorTarget::indexer_keys;
const KvLayout kM1 = KvLayout::model1_fp8;

INSTANTIATE_TEST_SUITE_P(
    Compressor, CompressorCpuVsCuda,
    ::testing::Values(
        // ratio 4: prompts shorter than a window, exactly one, many; one shot, decode, chunks.
        Case{"r4_model1_oneshot", kKv, kM1, 4, {3, 4, 13, 37}, 0, 4, 4, false, 1.0f},
        Case{"r4_model1_decode", kKv, kM1, 4, {3, 13, 22}, 1, 4, 4, true, 1.0f},
        Case{"r4_model1_chunks", kKv, kM1, 4, {5, 17, 40, 64}, 7, 3, 3, false, 1.0f},
        Case{"r4_bf16_chunks", kKv, KvLayout::bf16, 4, {9, 21}, 6, 64, 8, true, 1.0f},
        Case{"r4_fp8_tensor_chunks", kKv, KvLayout::fp8_per_tensor, 4, {12, 30}, 5, 2, 5, false,
             0.0371f},
        // ratio 128: shorter than a window, one window, several split in chunks.
        Case{"r128_model1_oneshot", kKv, kM1, 128, {100, 128, 300}, 0, 2, 128, false, 1.0f},
        Case{"r128_model1_chunks", kKv, kM1, 128, {130, 260, 40}, 131, 2, 64, true, 1.0f},
        Case{"r128_bf16_chunks", kKv, KvLayout::bf16, 128, {256, 129}, 97, 1, 100, false, 1.0f},
        // the indexer's compressor: D 128, Hadamard, FP8 with one scale per entry.
        Case{"indexer_oneshot", kIdx, kM1, 4, {2, 4, 29}, 0, 64, 4, false, 1.0f},
        Case{"indexer_decode", kIdx, kM1, 4, {11, 6}, 1, 4, 4, true, 1.0f},
        Case{"indexer_chunks", kIdx, kM1, 4, {33, 8, 50}, 6, 5, 3, false, 1.0f}),
    [](const auto& info) { return std::string(info.param.name); });

// ================================ CUDA-only behaviour ========================================

// On CUDA the host does not read the block tables: an entry whose block is unmapped (-1) or lies
// beyond the cache is skipped (its slot bytes and its `entries` row stay as they were), and
// nothing is written outside the views.
TEST(CompressorCuda, SkipsEntriesWithUnmappedOrOutOfRangeSlots) {
  DSV4_SKIP_WITHOUT_GPU();
  const Case c{"skip", kKv, kM1, 4, {24}, 0, 2, 4, false, 1.0f};
  Rig s(c);
  const Call call = make_call(s, {{0, 24}}, true);  // entries 0..5 in blocks 0..2 of 2
  DeviceCall dev(call);
  compressor_update_and_emit(s.cfg, call.kv, call.score, {call.pos, call.req, call.ctx}, s.norm,
                             s.cos_sin, {s.state_rows, s.state_table, c.state_block},
                             s.out_view(s.out_data, s.out_table), call.entries);
  // The table with block 1 unmapped and block 2 beyond the cache.
  HostTensor broken(DType::int32, s.out_table.shape());
  std::copy_n(s.out_table.data<int32_t>(), s.out_table.numel(), broken.data<int32_t>());
  const int32_t skipped_block1 = broken.data<int32_t>()[1], skipped_block2 = broken.data<int32_t>()[2];
  broken.data<int32_t>()[1] = -1;
  broken.data<int32_t>()[2] = 1 << 20;
  DeviceTensor d_broken = DeviceTensor::from_host(broken);
  ASSERT_NO_THROW(compressor_update_and_emit(
      s.cfg, dev.kv, dev.score, {dev.pos, dev.req, dev.ctx}, s.d_norm, s.d_cos_sin,
      {s.d_state->view, s.d_state_table, c.state_block}, s.out_view(s.d_out->view, d_broken),
      dev.entries));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // Expected: the CPU result with the skipped blocks' slots back to poison and the entries rows
  // of entries 2..5 (tokens 11, 15, 19, 23) unwritten.
  HostTensor want_copy(DType::uint8, s.out_data.shape());
  std::memcpy(want_copy.data<uint8_t>(), s.out_data.data<uint8_t>(), s.out_data.nbytes());
  const int64_t row_bytes = s.out_data.shape()[1];
  for (int32_t blk : {skipped_block1, skipped_block2})
    std::memset(want_copy.data<uint8_t>() + blk * row_bytes, kCachePoison,
                static_cast<size_t>(row_bytes));
  expect_cache_matches(s, want_copy, s.d_out->to_host(s.out_data), 6, "skip: output cache");
  const HostTensor got_entries = dev.entries.to_host();
  for (int64_t t = 0; t < 24; ++t) {
    const bool emitted = (t + 1) % 4 == 0 && t < 8;
    const float* g = got_entries.data<float>() + t * 512;
    const float* w = call.entries.data<float>() + t * 512;
    if (emitted)
      EXPECT_EQ(0, std::memcmp(g, w, 512 * 4)) << "entries row " << t;
    else
      for (int d = 0; d < 512; ++d) ASSERT_TRUE(std::isnan(g[d])) << "entries row " << t << " written";
  }
  expect_bytes_equal(s.state_rows, s.d_state->to_host(s.state_rows), "skip: rings");
  EXPECT_TRUE(s.d_out->guard_intact());
  EXPECT_TRUE(s.d_state->guard_intact());
}

// Mixed devices and the CUDA-only rejection (misaligned indexer key blocks) throw dsv4::Error
// before anything is written.
TEST(CompressorCuda, RejectsMixedDevicesAndMisalignedIndexerKeys) {
  DSV4_SKIP_WITHOUT_GPU();
  for (const Case& c : {Case{"mixed", kKv, kM1, 4, {8}, 0, 4, 4, false, 1.0f},
                        Case{"mixed_idx", kIdx, kM1, 4, {8}, 0, 4, 4, false, 1.0f}}) {
    Rig s(c);
    const Call call = make_call(s, {{0, 8}}, false);
    DeviceCall dev(call);
    dev.entries.fill_bytes(0xFF);
    // kv_rows on the host, everything else on the device.
    dense_test::expect_error(
        [&] {
          compressor_update_and_emit(s.cfg, call.kv, dev.score,
                                     {dev.pos, dev.req, dev.ctx}, s.d_norm, s.d_cos_sin,
                                     {s.d_state->view, s.d_state_table, c.state_block},
                                     s.out_view(s.d_out->view, s.d_out_table), dev.entries);
        },
        {"score_rows.device"});
    if (c.target == kIdx) {
      // The same key cache one byte off its 4-byte aligned start.
      TensorView shifted = s.d_out->view;
      shifted.data = static_cast<uint8_t*>(shifted.data) + 1;
      dense_test::expect_error(
          [&] {
            compressor_update_and_emit(s.cfg, dev.kv, dev.score,
                                       {dev.pos, dev.req, dev.ctx}, s.d_norm, s.d_cos_sin,
                                       {s.d_state->view, s.d_state_table, c.state_block},
                                       s.out_view(shifted, s.d_out_table), dev.entries);
          },
          {"4-byte aligned"});
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_bytes_equal(s.state_rows, s.d_state->to_host(s.state_rows), "rings untouched");
    expect_bytes_equal(s.out_data, s.d_out->to_host(s.out_data), "cache untouched");
    const HostTensor e = dev.entries.to_host();
    for (int64_t i = 0; i < e.numel(); ++i) ASSERT_TRUE(std::isnan(e.data<float>()[i]));
    EXPECT_TRUE(s.d_out->guard_intact());
  }
}

// ================================ projection =================================================

// kv_rows / score_rows of the CUDA path (dsv4::linear's cuBLASLt GEMMs + the ape kernel) vs the
// CPU op. Tolerance: fp32 accumulation of K = 64 products in another order: |Δ| <= 1e-5 ·
// Σ_k |x_k w_k| (+ 1e-6 for the ape add's rounding), for bf16 and fp32 operands alike (bf16
// products are exact in fp32).
TEST(CompressorCuda, ProjectMatchesCpu) {
  DSV4_SKIP_WITHOUT_GPU();
  constexpr int64_t kHidden = 64, T = 9;
  for (int ratio : {4, 128})
    for (DType dt : {DType::fp32, DType::bf16}) {
      CompressorConfig cfg;
      cfg.ratio = ratio;
      const int64_t W = cfg.proj_width();
      Rng rng(31 + ratio);
      HostTensor x(dt, {T, kHidden}), wkv(dt, {W, kHidden}), wgate(dt, {W, kHidden}),
          ape(DType::fp32, {ratio, W}), pos(DType::int32, {T}), kv(DType::fp32, {T, W}),
          score(DType::fp32, {T, W});
      for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<float>(rng.nonzero()));
      for (int64_t i = 0; i < wkv.numel(); ++i) wkv.set(i, static_cast<float>(rng.nonzero()));
      for (int64_t i = 0; i < wgate.numel(); ++i)
        wgate.set(i, static_cast<float>(rng.nonzero(0.02, 0.25)));
      for (int64_t i = 0; i < ape.numel(); ++i) ape.set(i, static_cast<float>(rng.nonzero(0.1, 0.5)));
      for (int64_t t = 0; t < T; ++t) pos.set(t, static_cast<float>(1000 + 37 * t));
      kv.fill_bytes(0xFF);
      score.fill_bytes(0xFF);
      DeviceTensor dx = DeviceTensor::from_host(x), dwkv = DeviceTensor::from_host(wkv),
                   dwgate = DeviceTensor::from_host(wgate), dape = DeviceTensor::from_host(ape),
                   dpos = DeviceTensor::from_host(pos), dkv(DType::fp32, {T, W}),
                   dscore(DType::fp32, {T, W});
      dkv.fill_bytes(0xFF);
      dscore.fill_bytes(0xFF);
      compressor_project(cfg, x, wkv, wgate, ape, pos, kv, score);
      ASSERT_NO_THROW(compressor_project(cfg, dx, dwkv, dwgate, dape, dpos, dkv, dscore))
          << "ratio " << ratio << " " << dtype_name(dt);
      const HostTensor gkv = dkv.to_host(), gscore = dscore.to_host();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t col = 0; col < W; ++col) {
          double mag_kv = 0.0, mag_s = 0.0;
          for (int64_t k = 0; k < kHidden; ++k) {
            mag_kv += std::fabs(double{x.get(t * kHidden + k)} * wkv.get(col * kHidden + k));
            mag_s += std::fabs(double{x.get(t * kHidden + k)} * wgate.get(col * kHidden + k));
          }
          const int64_t i = t * W + col;
          ASSERT_NEAR(gkv.get(i), kv.get(i), 1e-5 * mag_kv)
              << "kv ratio " << ratio << " " << dtype_name(dt) << " [" << t << ", " << col << "]";
          ASSERT_NEAR(gscore.get(i), score.get(i), 1e-5 * mag_s + 1e-6)
              << "score ratio " << ratio << " " << dtype_name(dt) << " [" << t << ", " << col
              << "]";
        }
    }
}

// What the CUDA GEMMs cannot take (x and a weight of different dtypes; overlapping rows, here in
// the second weight only) and mixed devices throw before either output is written.
TEST(CompressorCuda, ProjectRejectsMixedDtypesAndDevices) {
  DSV4_SKIP_WITHOUT_GPU();
  CompressorConfig cfg;
  const int64_t T = 3, H = 64, W = cfg.proj_width();
  HostTensor x(DType::bf16, {T, H}), w32(DType::fp32, {W, H}), ape(DType::fp32, {4, W}),
      pos(DType::int64, {T});
  x.fill_bytes(0x3C);
  w32.fill_bytes(0x3C);
  ape.fill_bytes(0x3C);
  for (int64_t t = 0; t < T; ++t) pos.set(t, static_cast<float>(t));
  DeviceTensor dx = DeviceTensor::from_host(x), dw = DeviceTensor::from_host(w32),
               dape = DeviceTensor::from_host(ape), dpos = DeviceTensor::from_host(pos),
               dkv(DType::fp32, {T, W}), dscore(DType::fp32, {T, W});
  dkv.fill_bytes(0xFF);
  dscore.fill_bytes(0xFF);
  dense_test::expect_error(
      [&] { compressor_project(cfg, dx, dw, dw, dape, dpos, dkv, dscore); }, {"wkv.dtype"});
  dense_test::expect_error(
      [&] { compressor_project(cfg, dx, dw, dw, ape, dpos, dkv, dscore); }, {"ape.device"});
  HostTensor w16(DType::bf16, {W, H});
  w16.fill_bytes(0x3C);
  DeviceTensor dw16 = DeviceTensor::from_host(w16);
  TensorView overlapping = dw16.view();  // rows 32 elements apart, 64 long
  overlapping.strides[0] = 32;
  dense_test::expect_error(
      [&] { compressor_project(cfg, dx, dw16, overlapping, dape, dpos, dkv, dscore); },
      {"wgate.stride(0)"});
  for (const DeviceTensor* out : {&dkv, &dscore}) {
    const HostTensor h = out->to_host();
    for (int64_t i = 0; i < h.numel(); ++i) ASSERT_TRUE(std::isnan(h.data<float>()[i]));
  }
}

}  // namespace
}  // namespace dsv4
