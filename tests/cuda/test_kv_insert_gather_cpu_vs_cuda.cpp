// qnorm_rope_kv_insert and dequantize_and_gather: the CUDA kernels against the CPU reference
// through the public API, on identical inputs (host tensors and their device copies), for every
// cache layout (MODEL1_FP8, V32_FP8 at D 576, BF16, FP8_PER_TENSOR with a non-power-of-two scale).
//
// Tolerance: none — q, kv, the cache bytes, the FP8 query's codes (Fp8QueryOutput, q_scale 0.37)
// and the gathered workspace must be byte-identical.
// Both backends run the same DSV4_HD math: the q head norm and both RoPEs use the CPU's helpers
// (IEEE-rounded fp32 ops in one fixed order, dtype.h ieee_*, immune to --use_fast_math), and the
// kernels encode / decode with kv_layout.h's own kv_encode_scale_block / kv_encode_plain_value /
// kv_decode_value (the UE8M0 exponent's division is IEEE-rounded too). So the fp32 values that
// feed every fp8 / bf16 rounding are the same bits on both sides and no fp8 code can flip. The FP8
// query's codes: the same fp32 q times the same 1/q_scale (ieee_mul), encoded by the hardware's
// e4m3 conversion on the vector path and dtype.h's encoder otherwise, which fp8_convert.cuh
// states are bit-identical; q then holds fp8_decode_scaled of the code on both sides.
//
// Also: slot −1, T = 0, T = 1, int32 and int64 indices, block sizes 64 and 3; CUDA-only data
// behaviour (the host cannot read device indices): an out-of-range slot acts as −1, an
// out-of-table position skips its token, an unusable gather row (block −1, gather_lens >
// seq_lens) is left untouched; mixed devices throw dsv4::Error and write nothing.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/dense_test_support.h"
#include "cpu/rope_reference.h"
#include "cpu/sparse_attention_reference.h"
#include "cpu_vs_cuda_util.h"
#include "dsv4/ops.h"
#include "gpu_test_util.h"

namespace {

using dense_test::random_tensor;
using dsv4::DType;
using dsv4::HostTensor;
using dsv4::KvCacheView;
using dsv4::KvLayout;
using dsv4::TensorView;
using dsv4::test::expect_bytes_equal;
using dsv4::test::same_view_on_device;
using dsv4::test::TestCache;
using dsv4::test::Twin;

constexpr float kEps = 1e-6f;
constexpr int64_t kMaxPos = 70000;

HostTensor clone(const HostTensor& h) {
  HostTensor c(h.dtype(), h.shape());
  std::memcpy(c.data<uint8_t>(), h.data<uint8_t>(), h.nbytes());
  return c;
}

const HostTensor& rope_table(bool yarn) {
  static const HostTensor swa = dsv4::build_rope_cache(dense_test::swa_rope(), kMaxPos);
  static const HostTensor compressed = dsv4::build_rope_cache(dense_test::yarn_rope(), kMaxPos);
  return yarn ? compressed : swa;
}

void set_index(HostTensor& t, int64_t i, int64_t v) {
  if (t.dtype() == DType::int64) t.data<int64_t>()[i] = v;
  else t.data<int32_t>()[i] = static_cast<int32_t>(v);
}

// ---- qnorm_rope_kv_insert ---------------------------------------------------------------------
struct InsertCase {
  KvLayout layout;
  int64_t T, H;
  int block_size;
  DType index_dt;
  bool yarn;
  bool fp8_query = false;  // also write the FP8 query (q_scale kQScale)
};
constexpr float kQScale = 0.37f;  // not a power of two: the reciprocal and the product round

// One batch: q, kv (token magnitudes 2^-6 .. 2^6 so the UE8M0 scales differ), positions (0, the
// last table row, random), distinct random slots with token 3 at −1, a cache of random bytes.
struct InsertBatch {
  HostTensor q, kv, positions, slots, cache;
  HostTensor q_fp8;  // the FP8 query's codes, poisoned (0xFF: NaN) before the call; fp8_query only
  KvCacheView view;  // on the host

  InsertBatch(const InsertCase& c, uint32_t seed) {
    const int64_t D = dsv4::test::spec_dim(c.layout), num_blocks = 3;
    q = random_tensor(DType::bf16, {c.T, c.H, D}, seed);
    kv = random_tensor(DType::bf16, {c.T, D}, seed + 1);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t i = 0; i < D; ++i)
        kv.set(t * D + i, std::ldexp(kv.get(t * D + i), static_cast<int>((t * 5) % 13) - 6));
    std::mt19937 rng(seed + 2);
    const int64_t num_slots = num_blocks * c.block_size;
    std::vector<int64_t> perm(static_cast<size_t>(num_slots));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    positions = HostTensor(c.index_dt, {c.T});
    slots = HostTensor(c.index_dt, {c.T});
    for (int64_t t = 0; t < c.T; ++t) {
      set_index(positions, t, t == 0 ? 0 : t == 1 ? kMaxPos - 1 : static_cast<int64_t>(rng() % kMaxPos));
      set_index(slots, t, t == 3 || t >= num_slots ? -1 : perm[static_cast<size_t>(t)]);
    }
    cache = HostTensor(DType::uint8, {num_blocks, dsv4::test::spec_block_bytes(c.layout, c.block_size)});
    for (int64_t i = 0; i < cache.numel(); ++i) cache.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
    view = KvCacheView{cache.view(), c.layout, c.block_size,
                       c.layout == KvLayout::fp8_per_tensor ? 0.37f : 1.0f};
    if (c.fp8_query) {
      q_fp8 = HostTensor(DType::fp8_e4m3, {c.T, c.H, D});
      q_fp8.fill_bytes(0xFF);
    }
  }
  // The FP8 query output of the host call (none without one).
  dsv4::Fp8QueryOutput fp8_query() const {
    return q_fp8.view().defined() ? dsv4::Fp8QueryOutput{q_fp8, kQScale} : dsv4::Fp8QueryOutput{};
  }
  void run(const TensorView& table) {
    dsv4::qnorm_rope_kv_insert(q, kv, positions, table, kEps, view, slots, fp8_query());
  }
};

// Device copies of a batch; run() calls the CUDA op on them.
struct DeviceBatch {
  Twin q, kv, positions, slots, cache;
  std::optional<Twin> q_fp8;  // with an FP8 query
  KvCacheView view;
  explicit DeviceBatch(const InsertBatch& b)
      : q(Twin::of(clone(b.q))), kv(Twin::of(clone(b.kv))), positions(Twin::of(b.positions)),
        slots(Twin::of(b.slots)), cache(Twin::of(clone(b.cache))), view(b.view) {
    view.data = cache.dev.view();
    if (b.q_fp8.view().defined()) q_fp8 = Twin::of(clone(b.q_fp8));
  }
  void run(const TensorView& table) {
    const dsv4::Fp8QueryOutput fp8_query =
        q_fp8 ? dsv4::Fp8QueryOutput{q_fp8->dev, kQScale} : dsv4::Fp8QueryOutput{};
    dsv4::qnorm_rope_kv_insert(q.dev, kv.dev, positions.dev, table, kEps, view, slots.dev, fp8_query);
  }
};

void expect_batch_equal(const InsertBatch& want, const DeviceBatch& got) {
  expect_bytes_equal("q", want.q, got.q.dev_bytes());
  expect_bytes_equal("kv", want.kv, got.kv.dev_bytes());
  expect_bytes_equal("cache", want.cache, got.cache.dev_bytes());
  ASSERT_EQ(want.q_fp8.view().defined(), got.q_fp8.has_value());
  if (got.q_fp8) expect_bytes_equal("q_fp8", want.q_fp8, got.q_fp8->dev_bytes());
}

class QnormRopeKvInsertCpuVsCuda : public ::testing::TestWithParam<InsertCase> {};

TEST_P(QnormRopeKvInsertCpuVsCuda, BitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  const InsertCase c = GetParam();
  InsertBatch cpu(c, 100 + static_cast<uint32_t>(c.H + c.block_size));
  DeviceBatch gpu(cpu);
  Twin table = Twin::of(rope_table(c.yarn));
  cpu.run(table.host);
  gpu.run(table.dev);
  expect_batch_equal(cpu, gpu);
}

// q rows that are not 16-byte aligned (q a window of rows 3 elements wider): the kernel's
// element-wise path for q, the same bytes as the CPU, the padding untouched.
TEST(QnormRopeKvInsertCuda, UnalignedQRows) {
  DSV4_SKIP_WITHOUT_GPU();
  const InsertCase c{KvLayout::model1_fp8, 7, 16, 64, DType::int64, true};
  InsertBatch cpu(c, 300);
  const int64_t D = cpu.q.shape()[2];
  HostTensor wide = dense_test::poisoned(DType::bf16, {c.T, c.H, D + 3});
  for (int64_t r = 0; r < c.T * c.H; ++r)
    std::memcpy(wide.data<uint16_t>() + r * (D + 3), cpu.q.data<uint16_t>() + r * D, D * sizeof(uint16_t));
  DeviceBatch gpu(cpu);
  Twin q = Twin::of(wide);
  TensorView q_host = q.host.view();
  q_host.shape[2] = D;
  Twin table = Twin::of(rope_table(c.yarn));
  dsv4::qnorm_rope_kv_insert(q_host, cpu.kv, cpu.positions, table.host, kEps, cpu.view, cpu.slots);
  dsv4::qnorm_rope_kv_insert(dsv4::test::same_view_on_device(q, q_host), gpu.kv.dev, gpu.positions.dev, table.dev, kEps,
                             gpu.view, gpu.slots.dev);
  expect_bytes_equal("q (and its padding)", q.host, q.dev_bytes());
  expect_bytes_equal("kv", cpu.kv, gpu.kv.dev_bytes());
  expect_bytes_equal("cache", cpu.cache, gpu.cache.dev_bytes());
}

// FP8 query rows that are not 8-byte aligned (codes in rows 3 bytes wider than D, heads padded by
// one row): the kernel's element-wise path for q and its codes, the same bytes as the CPU, the
// padding untouched (still the 0xFF poison).
TEST(QnormRopeKvInsertCuda, UnalignedFp8QueryRows) {
  DSV4_SKIP_WITHOUT_GPU();
  const InsertCase c{KvLayout::fp8_per_tensor, 7, 16, 64, DType::int64, false, false};
  InsertBatch cpu(c, 301);
  const int64_t D = cpu.q.shape()[2];
  Twin codes = Twin::poisoned(DType::fp8_e4m3, {c.T, c.H + 1, D + 3});
  TensorView codes_host = codes.host.view();
  codes_host.shape = {c.T, c.H, D};
  codes_host.strides = {(c.H + 1) * (D + 3), D + 3, 1};
  DeviceBatch gpu(cpu);
  Twin table = Twin::of(rope_table(c.yarn));
  dsv4::qnorm_rope_kv_insert(cpu.q, cpu.kv, cpu.positions, table.host, kEps, cpu.view, cpu.slots,
                             dsv4::Fp8QueryOutput{codes_host, kQScale});
  dsv4::qnorm_rope_kv_insert(gpu.q.dev, gpu.kv.dev, gpu.positions.dev, table.dev, kEps, gpu.view, gpu.slots.dev,
                             dsv4::Fp8QueryOutput{same_view_on_device(codes, codes_host), kQScale});
  expect_bytes_equal("q_fp8 (and its padding)", codes.host, codes.dev_bytes());
  expect_bytes_equal("q", cpu.q, gpu.q.dev_bytes());
  expect_bytes_equal("kv", cpu.kv, gpu.kv.dev_bytes());
  expect_bytes_equal("cache", cpu.cache, gpu.cache.dev_bytes());
}

std::vector<InsertCase> insert_grid() {
  std::vector<InsertCase> grid;
  for (const KvLayout l : {KvLayout::model1_fp8, KvLayout::v32_fp8, KvLayout::bf16, KvLayout::fp8_per_tensor})
    for (const int64_t H : {16, 64})
      for (const int bs : {64, 3})
        for (const bool fp8_query : {false, true})
          grid.push_back({l, 9, H, bs, H == 64 ? DType::int64 : DType::int32, H == 64, fp8_query});
  grid.push_back({KvLayout::model1_fp8, 1, 64, 64, DType::int64, true});
  grid.push_back({KvLayout::model1_fp8, 37, 64, 64, DType::int64, true});
  grid.push_back({KvLayout::model1_fp8, 0, 64, 64, DType::int64, true});
  // 600 tokens: the kernel's one-block-per-token grid (steps of 512 tokens or more); the cases
  // above take its head-group grid.
  grid.push_back({KvLayout::model1_fp8, 600, 64, 64, DType::int64, true});
  grid.push_back({KvLayout::v32_fp8, 600, 16, 64, DType::int32, false});
  // The FP8 query on both grids, with the decode-sized T 1 and H 128 (16 head groups).
  grid.push_back({KvLayout::fp8_per_tensor, 600, 64, 64, DType::int64, true, true});
  grid.push_back({KvLayout::fp8_per_tensor, 1, 128, 64, DType::int64, false, true});
  return grid;
}
INSTANTIATE_TEST_SUITE_P(Grid, QnormRopeKvInsertCpuVsCuda, ::testing::ValuesIn(insert_grid()), [](const auto& info) {
  const InsertCase& c = info.param;
  std::ostringstream n;
  n << dsv4::kv_layout_name(c.layout) << "_T" << c.T << "_H" << c.H << "_B" << c.block_size << "_"
    << dsv4::dtype_name(c.index_dt) << (c.yarn ? "_yarn" : "") << (c.fp8_query ? "_fp8_query" : "");
  return n.str();
});

// A slot outside the cache cannot be rejected on the host: the kernel treats it as −1 (kv gets
// the quantize-dequantize, nothing is stored), exactly what the CPU does for −1.
TEST(QnormRopeKvInsertCuda, SlotOutsideTheCacheActsAsMinusOne) {
  DSV4_SKIP_WITHOUT_GPU();
  const InsertCase c{KvLayout::model1_fp8, 6, 16, 8, DType::int64, true};
  Twin table = Twin::of(rope_table(c.yarn));
  for (const int64_t bad : {int64_t{3} * 8, int64_t{-2}, int64_t{1} << 40}) {
    SCOPED_TRACE(bad);
    InsertBatch cpu(c, 7);
    InsertBatch bad_batch(c, 7);
    bad_batch.slots.data<int64_t>()[2] = bad;
    DeviceBatch gpu(bad_batch);
    cpu.slots.data<int64_t>()[2] = -1;
    dsv4::qnorm_rope_kv_insert(cpu.q, cpu.kv, cpu.positions, table.host, kEps, cpu.view, cpu.slots);
    gpu.run(table.dev);
    expect_batch_equal(cpu, gpu);
  }
}

// A position outside the table cannot be rejected on the host: the kernel skips the token (its
// q rows, FP8 query rows, kv row and slot keep their bytes); the other tokens match the CPU.
TEST(QnormRopeKvInsertCuda, PositionOutsideTheTableSkipsTheToken) {
  DSV4_SKIP_WITHOUT_GPU();
  for (const bool fp8_query : {false, true}) {
    for (const int64_t bad : {int64_t{-1}, kMaxPos}) {
      SCOPED_TRACE(::testing::Message() << "position " << bad << (fp8_query ? ", FP8 query" : ""));
      const InsertCase c{KvLayout::v32_fp8, 6, 16, 8, DType::int32, false, fp8_query};
      Twin table = Twin::of(rope_table(c.yarn));
      InsertBatch cpu(c, 8);
      InsertBatch bad_batch(c, 8);
      bad_batch.positions.data<int32_t>()[4] = static_cast<int32_t>(bad);
      DeviceBatch gpu(bad_batch);
      // CPU: token 4 not stored, then its q and kv rows restored (its FP8 query rows re-poisoned).
      const HostTensor q0 = clone(cpu.q), kv0 = clone(cpu.kv);
      cpu.slots.data<int32_t>()[4] = -1;
      cpu.run(table.host);
      const int64_t D = 576;
      std::memcpy(cpu.q.data<uint16_t>() + 4 * c.H * D, q0.data<uint16_t>() + 4 * c.H * D, c.H * D * 2);
      std::memcpy(cpu.kv.data<uint16_t>() + 4 * D, kv0.data<uint16_t>() + 4 * D, D * 2);
      if (fp8_query) std::memset(cpu.q_fp8.data<uint8_t>() + 4 * c.H * D, 0xFF, c.H * D);  // the poison
      gpu.run(table.dev);
      expect_batch_equal(cpu, gpu);
    }
  }
}

TEST(QnormRopeKvInsertCuda, MixedDevicesThrowAndWriteNothing) {
  DSV4_SKIP_WITHOUT_GPU();
  const InsertCase c{KvLayout::model1_fp8, 4, 16, 8, DType::int64, false};
  InsertBatch host(c, 9);
  Twin table = Twin::of(rope_table(false));
  DeviceBatch gpu(host);
  const InsertBatch untouched(c, 9);
  EXPECT_THROW(dsv4::qnorm_rope_kv_insert(gpu.q.dev, gpu.kv.dev, gpu.positions.host, table.dev, kEps,
                                          gpu.view, gpu.slots.dev), dsv4::Error);
  EXPECT_THROW(dsv4::qnorm_rope_kv_insert(gpu.q.dev, gpu.kv.dev, gpu.positions.dev, table.dev, kEps,
                                          host.view, gpu.slots.dev), dsv4::Error);
  EXPECT_THROW(dsv4::qnorm_rope_kv_insert(gpu.q.dev, gpu.kv.host, gpu.positions.dev, table.dev, kEps,
                                          gpu.view, gpu.slots.dev), dsv4::Error);
  // An FP8 query output in host memory beside device tensors: refused, naming it; no code written.
  HostTensor host_codes = dense_test::poisoned(DType::fp8_e4m3, {c.T, c.H, 512});
  try {
    dsv4::qnorm_rope_kv_insert(gpu.q.dev, gpu.kv.dev, gpu.positions.dev, table.dev, kEps, gpu.view,
                               gpu.slots.dev, dsv4::Fp8QueryOutput{host_codes, kQScale});
    ADD_FAILURE() << "a host q_fp8 with device tensors was accepted";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_fp8.device"), std::string::npos) << e.what();
  }
  expect_bytes_equal("host q_fp8", dense_test::poisoned(DType::fp8_e4m3, {c.T, c.H, 512}), host_codes);
  expect_batch_equal(untouched, gpu);
  expect_bytes_equal("host cache", untouched.cache, host.cache);
}

// ---- dequantize_and_gather --------------------------------------------------------------------
struct GatherCase {
  KvLayout layout;
  int block_size, requests, max_seq;
  bool with_gather_lens;  // SWA-style: only the last few entries, older blocks released (−1)
  int offset;
  int64_t block_stride = 0;  // bytes between cache blocks (0: the block bytes; more: padded)
};

// Requests' block tables over shuffled blocks of a cache whose every token is filled; request 0
// has max_seq entries, request 1 none, the others random. Workspace rows M = offset + max_seq + 3.
struct GatherSetup {
  std::unique_ptr<TestCache> cache;
  HostTensor table, seq_lens, gather_lens;
  int64_t rows = 0;

  GatherSetup(const GatherCase& c, uint32_t seed) {
    std::mt19937 rng(seed);
    const int max_blocks = (c.max_seq + c.block_size - 1) / c.block_size;
    const int num_blocks = c.requests * max_blocks + 2;
    cache = std::make_unique<TestCache>(c.layout, c.block_size, num_blocks,
                                        c.layout == KvLayout::fp8_per_tensor ? 0.21f : 1.0f,
                                        c.block_stride);
    for (int64_t s = 0; s < cache->num_slots(); ++s) cache->fill_token(s, rng);
    std::vector<int32_t> order(static_cast<size_t>(num_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    table = HostTensor(DType::int32, {c.requests, max_blocks});
    seq_lens = HostTensor(DType::int32, {c.requests});
    if (c.with_gather_lens) gather_lens = HostTensor(DType::int32, {c.requests});
    int next = 0;
    for (int r = 0; r < c.requests; ++r) {
      const int len = r == 0 ? c.max_seq : r == 1 ? 0 : static_cast<int>(rng() % (c.max_seq + 1));
      seq_lens.data<int32_t>()[r] = len;
      const int g = c.with_gather_lens ? std::min(len, 1 + static_cast<int>(rng() % 20)) : len;
      if (c.with_gather_lens) gather_lens.data<int32_t>()[r] = g;
      const int first_needed = (len - g) / c.block_size;
      const int used = (len + c.block_size - 1) / c.block_size;
      for (int b = 0; b < max_blocks; ++b)
        table.data<int32_t>()[r * max_blocks + b] = b >= first_needed && b < used ? order[next++] : -1;
    }
    rows = c.offset + c.max_seq + 3;
  }
};

class DequantizeAndGatherCpuVsCuda : public ::testing::TestWithParam<GatherCase> {};

TEST_P(DequantizeAndGatherCpuVsCuda, BitIdentical) {
  DSV4_SKIP_WITHOUT_GPU();
  const GatherCase c = GetParam();
  GatherSetup s(c, 200 + static_cast<uint32_t>(c.block_size));
  const int dim = dsv4::test::spec_dim(c.layout);
  Twin cache = Twin::of(s.cache->bytes());
  Twin table = Twin::of(s.table), seq_lens = Twin::of(s.seq_lens);
  Twin gather_lens = c.with_gather_lens ? Twin::of(s.gather_lens) : Twin{};
  Twin ws = Twin::poisoned(DType::bf16, {c.requests, s.rows, dim});
  KvCacheView dev_view = s.cache->view();
  dev_view.data = same_view_on_device(cache, dev_view.data);  // padded blocks stay padded

  dsv4::dequantize_and_gather(s.cache->view(), s.table, s.seq_lens, s.gather_lens, c.offset, ws.host);
  dsv4::dequantize_and_gather(dev_view, table.dev, seq_lens.dev, gather_lens.dev,
                              c.offset, ws.dev);
  expect_bytes_equal("workspace", ws.host, ws.dev_bytes());
  expect_bytes_equal("cache (unchanged)", s.cache->bytes(), cache.dev_bytes());
}

std::vector<GatherCase> gather_grid() {
  std::vector<GatherCase> grid;
  for (const KvLayout l : {KvLayout::model1_fp8, KvLayout::v32_fp8, KvLayout::bf16, KvLayout::fp8_per_tensor}) {
    grid.push_back({l, 64, 4, 150, false, 0});
    grid.push_back({l, 3, 3, 40, true, 5});
  }
  grid.push_back({KvLayout::model1_fp8, 64, 5, 300, true, 0});
  grid.push_back({KvLayout::model1_fp8, 64, 1, 1, false, 0});
  // Padded block strides (FlashMLA / vLLM caches): V3.2 64 x 656 B every 42640 B, MODEL1 past 576 B.
  grid.push_back({KvLayout::v32_fp8, 64, 3, 150, true, 2, 65 * 656});
  grid.push_back({KvLayout::model1_fp8, 64, 3, 150, false, 0, dsv4::test::spec_block_bytes(KvLayout::model1_fp8, 64) + 64});
  return grid;
}
INSTANTIATE_TEST_SUITE_P(Grid, DequantizeAndGatherCpuVsCuda, ::testing::ValuesIn(gather_grid()), [](const auto& info) {
  const GatherCase& c = info.param;
  std::ostringstream n;
  n << dsv4::kv_layout_name(c.layout) << "_B" << c.block_size << "_R" << c.requests << "_S" << c.max_seq
    << (c.with_gather_lens ? "_gather_lens" : "") << "_off" << c.offset;
  if (c.block_stride) n << "_stride" << c.block_stride;
  return n.str();
});

// Device data the host cannot validate: rows whose block is −1 (or outside the cache), and a
// request whose gather_lens exceeds its seq_lens, are left untouched; every other row matches the
// CPU on the valid problem.
TEST(DequantizeAndGatherCuda, UnusableRowsAreLeftUntouched) {
  DSV4_SKIP_WITHOUT_GPU();
  const GatherCase c{KvLayout::model1_fp8, 16, 4, 100, false, 2};
  GatherSetup s(c, 301);
  const int dim = 512;
  const int64_t max_blocks = s.table.shape()[1];
  Twin ws = Twin::poisoned(DType::bf16, {c.requests, s.rows, dim});
  dsv4::dequantize_and_gather(s.cache->view(), s.table, s.seq_lens, {}, c.offset, ws.host);

  // Request 0 (100 entries): block column 2 (entries 32..47) → −1; request 2: block column 0
  // → beyond the cache. Request 3: gather_lens can't exceed seq_lens — given through gather_lens.
  HostTensor bad_table = clone(s.table);
  bad_table.data<int32_t>()[0 * max_blocks + 2] = -1;
  bad_table.data<int32_t>()[2 * max_blocks + 0] = 1 << 30;
  HostTensor glens(DType::int32, {c.requests});
  for (int r = 0; r < c.requests; ++r) glens.data<int32_t>()[r] = s.seq_lens.data<int32_t>()[r];
  glens.data<int32_t>()[3] = s.seq_lens.data<int32_t>()[3] + 1;
  HostTensor want = clone(ws.host);
  uint16_t* w = want.data<uint16_t>();
  auto poison_row = [&](int64_t r, int64_t j) {
    std::memset(w + (r * s.rows + c.offset + j) * dim, 0xFF, dim * sizeof(uint16_t));
  };
  for (int64_t j = 32; j < 48; ++j) poison_row(0, j);
  for (int64_t j = 0; j < std::min<int64_t>(16, s.seq_lens.data<int32_t>()[2]); ++j) poison_row(2, j);
  for (int64_t j = 0; j < s.seq_lens.data<int32_t>()[3]; ++j) poison_row(3, j);

  Twin cache = Twin::of(s.cache->bytes());
  Twin table = Twin::of(bad_table), seq_lens = Twin::of(s.seq_lens), gather_lens = Twin::of(glens);
  Twin ws_dev = Twin::poisoned(DType::bf16, {c.requests, s.rows, dim});
  KvCacheView dev_view = s.cache->view();
  dev_view.data = cache.dev.view();
  dsv4::dequantize_and_gather(dev_view, table.dev, seq_lens.dev, gather_lens.dev, c.offset, ws_dev.dev);
  expect_bytes_equal("workspace", want, ws_dev.dev_bytes());
}

TEST(DequantizeAndGatherCuda, MixedDevicesThrowAndWriteNothing) {
  DSV4_SKIP_WITHOUT_GPU();
  const GatherCase c{KvLayout::model1_fp8, 64, 2, 70, false, 0};
  GatherSetup s(c, 302);
  Twin cache = Twin::of(s.cache->bytes());
  Twin table = Twin::of(s.table), seq_lens = Twin::of(s.seq_lens);
  Twin ws = Twin::poisoned(DType::bf16, {c.requests, s.rows, 512});
  KvCacheView dev_view = s.cache->view();
  dev_view.data = cache.dev.view();
  EXPECT_THROW(dsv4::dequantize_and_gather(dev_view, table.host, seq_lens.dev, {}, 0, ws.dev), dsv4::Error);
  EXPECT_THROW(dsv4::dequantize_and_gather(s.cache->view(), table.dev, seq_lens.dev, {}, 0, ws.dev), dsv4::Error);
  EXPECT_THROW(dsv4::dequantize_and_gather(dev_view, table.dev, seq_lens.dev, {}, 0, ws.host), dsv4::Error);
  expect_bytes_equal("workspace (device)", Twin::poisoned(DType::bf16, {c.requests, s.rows, 512}).host,
                     ws.dev_bytes());
}

}  // namespace
