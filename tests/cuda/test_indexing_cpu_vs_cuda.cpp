// The index planning utilities (dsv4/indexing.h) on CUDA against the CPU reference, both through
// the public functions on the same inputs. Tolerance: bit-exact everywhere — both paths do the
// same integer index math (math/index.h), there is no floating point.
//   - valid random plans (several requests, block sizes 64 and 16, window 128, released SWA
//     blocks, top-k lists with -1 padding): CUDA == CPU;
//   - data the CPU rejects: CUDA gives the documented -1 rows / left-out entries (expected values
//     from plain formulas here, or the CPU result on the cleaned-up data) and no CUDA error;
//   - mixed devices, and the validating slot conversion on CUDA: dsv4::Error, nothing written.
// Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/indexing.h"
#include "gpu_test_util.h"

namespace {

using dsv4::DeviceTensor;
using dsv4::DType;
using dsv4::HostTensor;
using dsv4::TensorView;

// Outputs are poisoned with 0x5A bytes: unlike 0xFF (int32 -1, the padding value) an unwritten
// element cannot pass for a written -1.
constexpr uint8_t kPoison = 0x5A;
constexpr int32_t kPoisonValue = 0x5A5A5A5A;
constexpr int kWindow = 128;

HostTensor i32(std::vector<int64_t> shape, const std::vector<int32_t>& v) {
  HostTensor t(DType::int32, std::move(shape));
  EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}
HostTensor i64(const std::vector<int64_t>& v) {
  HostTensor t(DType::int64, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}
std::vector<int32_t> values(const HostTensor& t) {
  return {t.data<int32_t>(), t.data<int32_t>() + t.numel()};
}
HostTensor host_out(std::vector<int64_t> shape) {
  HostTensor t(DType::int32, std::move(shape));
  t.fill_bytes(kPoison);
  return t;
}
DeviceTensor device_out(std::vector<int64_t> shape) {
  DeviceTensor t(DType::int32, std::move(shape));
  t.fill_bytes(kPoison);
  return t;
}
std::vector<int32_t> downloaded(const DeviceTensor& t) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "a kernel faulted";
  return values(t.to_host());
}

// Every element, the first few mismatches named by row and column.
void expect_equal(const std::string& what, const std::vector<int32_t>& want,
                  const std::vector<int32_t>& got, int64_t cols) {
  ASSERT_EQ(want.size(), got.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 8; ++i) {
    if (want[i] == got[i]) continue;
    ADD_FAILURE() << what << "[" << static_cast<int64_t>(i) / cols << "]["
                  << static_cast<int64_t>(i) % cols << "]: want " << want[i] << ", got " << got[i];
    ++bad;
  }
}

// Runs `call`, expects a dsv4::Error mentioning `needle`, and checks the device outputs still
// hold the poison.
void expect_rejected(const std::function<void()>& call, const std::string& needle,
                     const std::vector<const DeviceTensor*>& outputs) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (const DeviceTensor* o : outputs)
    for (int32_t v : downloaded(*o)) ASSERT_EQ(v, kPoisonValue) << "output written by a rejected call";
}

// ================================ random paged plans ========================================

// Requests of one paged cache: request r holds positions 0..seq[r]-1 in blocks drawn without
// replacement from a pool (so a slot's block id identifies it), its table row padded with -1.
// Its query tokens are its last q[r] positions; blocks wholly before the window of its first
// query token are released (-1), as the SWA cache does.
struct PagedPlan {
  int block_size = 0, max_blocks = 0, requests = 0;
  std::vector<int32_t> table;      // [requests, max_blocks]
  std::vector<int64_t> positions;  // [T], tokens of all requests interleaved
  std::vector<int32_t> token_to_req;
  std::vector<int32_t> seq;
  int64_t tokens() const { return static_cast<int64_t>(positions.size()); }
};

PagedPlan make_paged_plan(std::mt19937& rng, int block_size, int requests, bool release_old) {
  PagedPlan plan;
  plan.block_size = block_size;
  plan.requests = requests;
  plan.max_blocks = 700 / block_size + 3;  // sequences up to 700 positions, some spare entries
  plan.table.assign(static_cast<size_t>(requests) * plan.max_blocks, -1);
  std::vector<int32_t> pool(static_cast<size_t>(requests) * plan.max_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  for (int r = 0; r < requests; ++r) {
    const int seq = 1 + static_cast<int>(rng() % 700);
    const int queries = r % 2 == 0 ? 1 : 1 + static_cast<int>(rng() % std::min(seq, 40));
    plan.seq.push_back(seq);
    const int64_t first_window = std::max(0, seq - queries - kWindow + 1);
    for (int b = 0; b * block_size < seq; ++b) {
      const bool released = release_old && int64_t{b + 1} * block_size <= first_window;
      plan.table[static_cast<size_t>(r) * plan.max_blocks + b] = released ? -1 : pool[next++];
    }
    for (int q = seq - queries; q < seq; ++q) {
      plan.positions.push_back(q);
      plan.token_to_req.push_back(r);
    }
  }
  // Interleave the requests' tokens (token order carries no meaning for these utilities).
  std::vector<size_t> order(plan.positions.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  PagedPlan shuffled = plan;
  for (size_t i = 0; i < order.size(); ++i) {
    shuffled.positions[i] = plan.positions[order[i]];
    shuffled.token_to_req[i] = plan.token_to_req[order[i]];
  }
  return shuffled;
}

// ================================ local → global ============================================

// The kernel-facing conversion checks no data on either device, so CUDA must equal the CPU for
// ANY input: valid top-k lists with -1 padding, and junk (< -1, past the table, released blocks,
// unknown requests, slots beyond int32).
TEST(IndexingCpuVsCuda, LocalToGlobalMatchesCpuOnValidAndJunkData) {
  DSV4_SKIP_WITHOUT_GPU();
  std::mt19937 rng(20261123);
  for (int block_size : {64, 16}) {
    for (int k : {512, 37, 0}) {
      PagedPlan plan = make_paged_plan(rng, block_size, 5, /*release_old=*/false);
      plan.table[1] = INT32_MAX / 8;  // request 0, block 1: its slots exceed int32 → -1
      const int64_t T = plan.tokens(), R = plan.requests;
      std::vector<int32_t> local(static_cast<size_t>(T * k), -1);
      for (int64_t t = 0; t < T; ++t) {
        const int seq = plan.seq[plan.token_to_req[t]];
        const int n = k == 0 ? 0 : static_cast<int>(rng() % (k + 1));  // packed, -1 padded
        for (int j = 0; j < n; ++j) local[t * k + j] = static_cast<int32_t>(rng() % seq);
      }
      std::vector<int32_t> t2r = plan.token_to_req;
      if (k > 0 && T > 3) {  // junk the CPU's checked variant would reject
        local[0] = -7;
        local[k - 1] = INT32_MAX;
        local[k] = INT32_MIN;
        local[2 * k] = plan.max_blocks * block_size;  // first entry past the table
        t2r[3] = static_cast<int32_t>(R);
        t2r[T - 1] = INT32_MIN;
      }
      const HostTensor h_local = i32({T, k}, local), h_t2r = i32({T}, t2r);
      const HostTensor h_table = i32({R, plan.max_blocks}, plan.table);
      HostTensor h_global = host_out({T, k}), h_lens = host_out({T});
      dsv4::local_to_global_slots(h_local, h_t2r, h_table, block_size, h_global, h_lens);

      const DeviceTensor d_local = DeviceTensor::from_host(h_local);
      const DeviceTensor d_t2r = DeviceTensor::from_host(h_t2r);
      const DeviceTensor d_table = DeviceTensor::from_host(h_table);
      DeviceTensor d_global = device_out({T, k}), d_lens = device_out({T});
      dsv4::local_to_global_slots(d_local, d_t2r, d_table, block_size, d_global, d_lens);
      const std::string what = "B " + std::to_string(block_size) + " K " + std::to_string(k);
      expect_equal(what + " global", values(h_global), downloaded(d_global), std::max(k, 1));
      expect_equal(what + " lens", values(h_lens), downloaded(d_lens), 1);

      // In place (global aliases local), without lens: the same slots.
      DeviceTensor d_inplace = DeviceTensor::from_host(h_local);
      dsv4::local_to_global_slots(d_inplace, d_t2r, d_table, block_size, d_inplace);
      expect_equal(what + " in place", values(h_global), downloaded(d_inplace), std::max(k, 1));
    }
  }
}

// Padded rows (row stride > K) are accepted by the validation (rows need only be contiguous):
// the kernel must honour the row strides of local, table and global and leave the padding alone.
TEST(IndexingCpuVsCuda, LocalToGlobalHonoursRowStrides) {
  DSV4_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const int block_size = 16, K = 40, pad = 3;
  const PagedPlan plan = make_paged_plan(rng, block_size, 4, false);
  const int64_t T = plan.tokens(), R = plan.requests, mb = plan.max_blocks;
  std::vector<int32_t> local(static_cast<size_t>(T * (K + pad)), -1);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j)
      local[t * (K + pad) + j] = static_cast<int32_t>(rng() % plan.seq[plan.token_to_req[t]]);
  std::vector<int32_t> table_padded(static_cast<size_t>(R * (mb + pad)), 7);  // junk padding
  for (int64_t r = 0; r < R; ++r)
    std::copy_n(plan.table.begin() + r * mb, mb, table_padded.begin() + r * (mb + pad));
  const HostTensor h_local = i32({T, K + pad}, local), h_t2r = i32({T}, plan.token_to_req);
  const HostTensor h_table = i32({R, mb + pad}, table_padded);
  TensorView hl = h_local.view(), htab = h_table.view();
  hl.shape[1] = K;
  htab.shape[1] = mb;
  HostTensor h_global = host_out({T, K}), h_lens = host_out({T});
  dsv4::local_to_global_slots(hl, h_t2r, htab, block_size, h_global, h_lens);

  const DeviceTensor d_local = DeviceTensor::from_host(h_local);
  const DeviceTensor d_t2r = DeviceTensor::from_host(h_t2r);
  const DeviceTensor d_table = DeviceTensor::from_host(h_table);
  DeviceTensor d_global = device_out({T, K + pad}), d_lens = device_out({T});
  TensorView dl = d_local.view(), dtab = d_table.view(), dg = d_global.view();
  dl.shape[1] = K;
  dtab.shape[1] = mb;
  dg.shape[1] = K;
  dsv4::local_to_global_slots(dl, d_t2r, dtab, block_size, dg, d_lens);
  const std::vector<int32_t> got = downloaded(d_global);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K + pad; ++j) {
      const int32_t want = j < K ? h_global.data<int32_t>()[t * K + j] : kPoisonValue;
      ASSERT_EQ(got[t * (K + pad) + j], want) << "t " << t << " j " << j;
    }
  expect_equal("lens", values(h_lens), downloaded(d_lens), 1);
}

// ================================ SWA window ================================================

// The window of position p through one table row as indexing.h documents the CUDA version:
// positions whose block is missing (or whose slot exceeds int32) are left out, the rest packed.
std::vector<int32_t> expected_window(int64_t p, const int32_t* row, int64_t max_blocks,
                                     int block_size) {
  std::vector<int32_t> out;
  if (p < 0) return out;
  const int64_t first = std::max<int64_t>(0, p - kWindow + 1);
  for (int64_t k = 0; k <= p - first; ++k) {  // counted: p may be INT64_MAX
    const int64_t q = first + k, blk = q / block_size;
    if (blk >= max_blocks || row[blk] < 0) continue;
    const int64_t slot = int64_t{row[blk]} * block_size + q % block_size;
    if (slot <= INT32_MAX) out.push_back(static_cast<int32_t>(slot));
  }
  return out;
}

struct WindowResult {
  std::vector<int32_t> indices, lens;
};

// One call on the device / on the host, outputs poisoned first.
WindowResult run_window_cuda(const HostTensor& positions, const HostTensor& t2r,
                             const HostTensor& table, int block_size) {
  const int64_t T = positions.shape()[0];
  const DeviceTensor d_pos = DeviceTensor::from_host(positions);
  const DeviceTensor d_t2r = DeviceTensor::from_host(t2r);
  const DeviceTensor d_table = DeviceTensor::from_host(table);
  DeviceTensor d_idx = device_out({T, kWindow}), d_lens = device_out({T});
  dsv4::swa_window_indices(d_pos, d_t2r, d_table, block_size, kWindow, d_idx, d_lens);
  return {downloaded(d_idx), downloaded(d_lens)};
}
WindowResult run_window_cpu(const HostTensor& positions, const HostTensor& t2r,
                            const HostTensor& table, int block_size) {
  const int64_t T = positions.shape()[0];
  HostTensor idx = host_out({T, kWindow}), lens = host_out({T});
  dsv4::swa_window_indices(positions, t2r, table, block_size, kWindow, idx, lens);
  return {values(idx), values(lens)};
}

HostTensor positions_tensor(const std::vector<int64_t>& pos, bool int32_positions) {
  if (!int32_positions) return i64(pos);
  std::vector<int32_t> p32(pos.begin(), pos.end());
  return i32({static_cast<int64_t>(p32.size())}, p32);
}

TEST(IndexingCpuVsCuda, SwaWindowMatchesCpuOnValidPlans) {
  DSV4_SKIP_WITHOUT_GPU();
  std::mt19937 rng(77);
  for (int block_size : {64, 16}) {
    for (bool int32_positions : {false, true}) {
      for (int requests : {6, 1}) {
        const PagedPlan plan = make_paged_plan(rng, block_size, requests, /*release_old=*/true);
        // All tokens, the first token alone (T = 1) and none (T = 0).
        for (int64_t T : {plan.tokens(), int64_t{1}, int64_t{0}}) {
          const std::vector<int64_t> pos(plan.positions.begin(), plan.positions.begin() + T);
          const std::vector<int32_t> req(plan.token_to_req.begin(),
                                         plan.token_to_req.begin() + T);
          const HostTensor h_pos = positions_tensor(pos, int32_positions);
          const HostTensor h_t2r = i32({T}, req);
          const HostTensor h_table = i32({plan.requests, plan.max_blocks}, plan.table);
          const WindowResult cpu = run_window_cpu(h_pos, h_t2r, h_table, block_size);
          const WindowResult gpu = run_window_cuda(h_pos, h_t2r, h_table, block_size);
          const std::string what = "B " + std::to_string(block_size) + " T " + std::to_string(T) +
                                   (int32_positions ? " int32" : " int64");
          expect_equal(what + " indices", cpu.indices, gpu.indices, kWindow);
          expect_equal(what + " lens", cpu.lens, gpu.lens, 1);
        }
      }
    }
  }
}

// Data the CPU rejects (released or missing window blocks, negative or huge positions, unknown
// requests): the CPU throws, CUDA leaves the missing positions out / writes -1 rows.
TEST(IndexingCpuVsCuda, SwaWindowInvalidDataGivesMinusOneOnCuda) {
  DSV4_SKIP_WITHOUT_GPU();
  std::mt19937 rng(91);
  for (int block_size : {64, 16}) {
    PagedPlan plan = make_paged_plan(rng, block_size, 6, /*release_old=*/true);
    const int64_t R = plan.requests;
    std::vector<int64_t> pos = plan.positions;
    std::vector<int32_t> t2r = plan.token_to_req;
    auto formula = [&](int64_t t) {
      return expected_window(pos[t], plan.table.data() + int64_t{t2r[t]} * plan.max_blocks,
                             plan.max_blocks, block_size);
    };
    {  // The formula is the CPU's window on the valid plan.
      const WindowResult cpu = run_window_cpu(i64(pos), i32({plan.tokens()}, t2r),
                                              i32({R, plan.max_blocks}, plan.table), block_size);
      for (int64_t t = 0; t < plan.tokens(); ++t) {
        std::vector<int32_t> w = formula(t);
        ASSERT_EQ(cpu.lens[t], static_cast<int32_t>(w.size())) << t;
        w.resize(kWindow, -1);
        ASSERT_TRUE(std::equal(w.begin(), w.end(), cpu.indices.begin() + t * kWindow)) << t;
      }
    }
    // Request 1 loses the block of the oldest window position of its last token, which every
    // one of its tokens' windows holds (a release too early).
    const int64_t lost_blk = std::max<int64_t>(0, plan.seq[1] - kWindow) / block_size;
    plan.table[plan.max_blocks + lost_blk] = -1;
    // A slot beyond int32 in request 2's newest block.
    plan.table[2 * plan.max_blocks + (plan.seq[2] - 1) / block_size] = INT32_MAX / 4;
    // Extra tokens: negative / huge positions, a window past the table, unknown requests.
    const std::vector<std::pair<int64_t, int32_t>> extra = {
        {-1, 0}, {INT64_MIN, 0}, {INT64_MAX, 0}, {int64_t{plan.max_blocks} * block_size + 5, 3},
        {5, static_cast<int32_t>(R)}, {5, -1}, {5, INT32_MIN}, {INT32_MAX, 4}};
    for (const auto& [p, r] : extra) {
      pos.push_back(p);
      t2r.push_back(r);
    }
    const int64_t T = static_cast<int64_t>(pos.size());
    const HostTensor h_pos = i64(pos), h_t2r = i32({T}, t2r);
    const HostTensor h_table = i32({R, plan.max_blocks}, plan.table);
    HostTensor cpu_idx = host_out({T, kWindow}), cpu_lens = host_out({T});
    EXPECT_THROW(dsv4::swa_window_indices(h_pos, h_t2r, h_table, block_size, kWindow, cpu_idx,
                                          cpu_lens),
                 dsv4::Error);

    const WindowResult gpu = run_window_cuda(h_pos, h_t2r, h_table, block_size);
    std::vector<int32_t> want(static_cast<size_t>(T * kWindow), -1), want_lens(T, 0);
    for (int64_t t = 0; t < T; ++t) {
      if (t2r[t] < 0 || t2r[t] >= R) continue;
      const std::vector<int32_t> w = formula(t);
      std::copy(w.begin(), w.end(), want.begin() + t * kWindow);
      want_lens[t] = static_cast<int32_t>(w.size());
    }
    const std::string what = "B " + std::to_string(block_size);
    expect_equal(what + " indices", want, gpu.indices, kWindow);
    expect_equal(what + " lens", want_lens, gpu.lens, 1);
  }
}

// ================================ prefill gather rewrite ====================================

// R prefill requests (some with no query token) of a batch slice starting at `base`: request r
// has q[r] query tokens at the end of seq[r] positions, gathers min(seq, q + W - 1) SWA rows
// after N compressed rows (N = the largest compressed count), M = N + the largest gather.
// Top-k lists: distinct causal entries with -1 padding interleaved.
struct GatherPlan {
  int ratio = 0, n = 0, k = 0;
  int64_t m = 0, tokens = 0;
  std::vector<int32_t> qsl, seq, gather, topk;
  std::vector<int64_t> token_pos;
};

GatherPlan make_gather_plan(std::mt19937& rng, int ratio, int requests, int k, int base) {
  GatherPlan g;
  g.ratio = ratio;
  g.k = k;
  g.qsl.push_back(base);
  int max_gather = 0;
  for (int r = 0; r < requests; ++r) {
    const int q = r == 1 ? 0 : 1 + static_cast<int>(rng() % 60);
    const int seq = q + static_cast<int>(rng() % 600);
    const int gather = std::min(seq, q + kWindow - 1);
    g.qsl.push_back(g.qsl.back() + q);
    g.seq.push_back(seq);
    g.gather.push_back(gather);
    max_gather = std::max(max_gather, gather);
    if (ratio > 0) g.n = std::max(g.n, seq / ratio);
    for (int i = 0; i < q; ++i) g.token_pos.push_back(seq - q + i);
  }
  g.tokens = g.qsl.back() - base;
  g.m = g.n + max_gather;
  g.topk.assign(static_cast<size_t>(g.tokens * k), -1);
  for (int64_t t = 0; t < g.tokens; ++t) {
    const int64_t visible = ratio > 0 ? (g.token_pos[t] + 1) / ratio : 0;
    std::vector<int32_t> entries(static_cast<size_t>(visible));
    std::iota(entries.begin(), entries.end(), 0);
    std::shuffle(entries.begin(), entries.end(), rng);
    for (int j = 0; j < k; ++j)  // about a third -1, anywhere in the row
      if (!entries.empty() && rng() % 3 != 0) {
        g.topk[t * k + j] = entries.back();
        entries.pop_back();
      }
  }
  return g;
}

struct CombineResult {
  std::vector<int32_t> out, lens;
};

CombineResult run_combine(const GatherPlan& g, bool on_cuda, bool with_topk = true) {
  const int64_t T = g.tokens, R = static_cast<int64_t>(g.seq.size()), width = g.k + kWindow;
  const HostTensor topk = i32({T, g.k}, g.topk), qsl = i32({R + 1}, g.qsl);
  const HostTensor seq = i32({R}, g.seq), gather = i32({R}, g.gather);
  if (!on_cuda) {
    HostTensor out = host_out({T, width}), lens = host_out({T});
    dsv4::combine_topk_swa_indices(with_topk ? topk.view() : TensorView{}, qsl, seq, gather,
                                   kWindow, g.n, g.m, g.ratio, out, lens);
    return {values(out), values(lens)};
  }
  const DeviceTensor d_topk = DeviceTensor::from_host(topk), d_qsl = DeviceTensor::from_host(qsl);
  const DeviceTensor d_seq = DeviceTensor::from_host(seq), d_gather = DeviceTensor::from_host(gather);
  DeviceTensor out = device_out({T, width}), lens = device_out({T});
  dsv4::combine_topk_swa_indices(with_topk ? d_topk.view() : TensorView{}, d_qsl, d_seq, d_gather,
                                 kWindow, g.n, g.m, g.ratio, out, lens);
  return {downloaded(out), downloaded(lens)};
}

TEST(IndexingCpuVsCuda, CombineTopkSwaMatchesCpuOnValidPlans) {
  DSV4_SKIP_WITHOUT_GPU();
  std::mt19937 rng(4242);
  struct Case {
    int ratio, requests, k, base;
    bool with_topk;
  };
  // ratio 4 with the layer's index top-k 512 and a width off the 32-entry rounds; ratio 128;
  // an SWA-only layer (ratio 0, K 0, with and without a topk tensor); one request.
  for (const Case c : {Case{4, 5, 512, 0, true}, Case{4, 4, 45, 17, true}, Case{128, 5, 64, 3, true},
                       Case{0, 3, 0, 9, true}, Case{0, 3, 0, 0, false}, Case{4, 1, 96, 0, true}}) {
    const GatherPlan g = make_gather_plan(rng, c.ratio, c.requests, c.k, c.base);
    const CombineResult cpu = run_combine(g, false, c.with_topk);
    const CombineResult gpu = run_combine(g, true, c.with_topk);
    const std::string what = "ratio " + std::to_string(c.ratio) + " K " + std::to_string(c.k);
    expect_equal(what + " out", cpu.out, gpu.out, c.k + kWindow);
    expect_equal(what + " lens", cpu.lens, gpu.lens, 1);
  }
}

TEST(IndexingCpuVsCuda, CombineTopkSwaEdgeSizes) {
  DSV4_SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  // T = 0 (all requests without query tokens) and T = 1.
  GatherPlan empty = make_gather_plan(rng, 4, 2, 8, 5);
  empty.qsl = {5, 5, 5};
  empty.tokens = 0;
  empty.topk.clear();
  const CombineResult cpu0 = run_combine(empty, false), gpu0 = run_combine(empty, true);
  EXPECT_TRUE(cpu0.out.empty() && gpu0.out.empty() && gpu0.lens.empty());
  // The first query token of a one-request plan, kept alone: the last position of its sequence
  // (its top-k row was drawn for an earlier position, so it stays causal).
  GatherPlan one = make_gather_plan(rng, 4, 1, 8, 0);
  one.qsl = {0, 1};
  one.tokens = 1;
  one.token_pos = {one.seq[0] - 1};
  one.gather = {std::min(one.seq[0], kWindow)};
  one.topk.resize(8);
  const CombineResult cpu1 = run_combine(one, false), gpu1 = run_combine(one, true);
  expect_equal("T 1 out", cpu1.out, gpu1.out, 8 + kWindow);
  expect_equal("T 1 lens", cpu1.lens, gpu1.lens, 1);
}

// Data the CPU rejects: invalid top-k entries are left out like -1 (the expected rows are the
// CPU's on the same lists with those entries set to -1); a request with bad metadata gets -1
// rows and length 0, the other requests' rows are unchanged; a query_start_loc that does not
// cover out's rows invalidates every row.
TEST(IndexingCpuVsCuda, CombineTopkSwaInvalidDataGivesMinusOneOnCuda) {
  DSV4_SKIP_WITHOUT_GPU();
  std::mt19937 rng(31337);
  const GatherPlan valid = make_gather_plan(rng, 4, 4, 64, 11);
  const CombineResult cpu = run_combine(valid, false);
  const int64_t width = valid.k + kWindow;

  // (1) Entries the CPU rejects in the first rows of request 0 (q >= 1 always).
  GatherPlan junk = valid;
  const int64_t visible0 = (valid.token_pos[0] + 1) / valid.ratio;
  const std::vector<int32_t> bad = {-2, INT32_MIN, INT32_MAX, valid.n,
                                    static_cast<int32_t>(visible0)};
  for (size_t i = 0; i < bad.size(); ++i) junk.topk[3 * i] = bad[i];
  GatherPlan cleaned = junk;
  for (size_t i = 0; i < bad.size(); ++i) cleaned.topk[3 * i] = -1;
  EXPECT_THROW(run_combine(junk, false), dsv4::Error);
  const CombineResult want1 = run_combine(cleaned, false), got1 = run_combine(junk, true);
  expect_equal("junk entries out", want1.out, got1.out, width);
  expect_equal("junk entries lens", want1.lens, got1.lens, 1);

  // (2) Request metadata the CPU rejects, one request at a time: its rows only become -1.
  auto rows_of = [&](int r) {
    return std::make_pair(valid.qsl[r] - valid.qsl[0], valid.qsl[r + 1] - valid.qsl[0]);
  };
  const int r = 2;
  const auto [t0, t1] = rows_of(r);
  ASSERT_GT(t1, t0);
  for (int variant = 0; variant < 4; ++variant) {
    GatherPlan g = valid;
    if (variant == 0) g.gather[r] = g.seq[r] + 1;                  // more than the sequence
    if (variant == 1) g.gather[r] = -1;                            // negative
    if (variant == 2) g.seq[r] = (t1 - t0) - 1;                    // shorter than its queries
    if (variant == 3) g.gather[r] -= 1;  // its first token's window starts before the range
    EXPECT_THROW(run_combine(g, false), dsv4::Error) << "variant " << variant;
    std::vector<int32_t> want = cpu.out, want_lens = cpu.lens;
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(want.begin() + t * width, want.begin() + (t + 1) * width, -1);
      want_lens[t] = 0;
    }
    const CombineResult got = run_combine(g, true);
    expect_equal("variant " + std::to_string(variant) + " out", want, got.out, width);
    expect_equal("variant " + std::to_string(variant) + " lens", want_lens, got.lens, 1);
  }

  // (3) query_start_loc covering one token more than out's rows: every row -1.
  GatherPlan g = valid;
  g.qsl.back() += 1;
  EXPECT_THROW(run_combine(g, false), dsv4::Error);
  const CombineResult got3 = run_combine(g, true);
  expect_equal("qsl total out", std::vector<int32_t>(cpu.out.size(), -1), got3.out, width);
  expect_equal("qsl total lens", std::vector<int32_t>(cpu.lens.size(), 0), got3.lens, 1);
}

// ================================ API errors ================================================

TEST(IndexingCpuVsCuda, MixedDevicesAndCheckedOnCudaAreErrors) {
  DSV4_SKIP_WITHOUT_GPU();
  const HostTensor local = i32({2, 2}, {0, 1, 2, -1}), t2r = i32({2}, {0, 0});
  const HostTensor table = i32({1, 2}, {3, 4});
  const DeviceTensor d_local = DeviceTensor::from_host(local), d_t2r = DeviceTensor::from_host(t2r);
  const DeviceTensor d_table = DeviceTensor::from_host(table);
  DeviceTensor d_global = device_out({2, 2}), d_lens = device_out({2});
  HostTensor h_global = host_out({2, 2});
  // local_to_global_slots: a host table with device indices; a host output.
  expect_rejected([&] { dsv4::local_to_global_slots(d_local, d_t2r, table, 4, d_global, d_lens); },
                  "block_table", {&d_global, &d_lens});
  expect_rejected([&] { dsv4::local_to_global_slots(d_local, d_t2r, d_table, 4, h_global); },
                  "global", {});
  for (int32_t v : values(h_global)) ASSERT_EQ(v, kPoisonValue);
  // The validating variant cannot read device values: it points to the kernel-facing one.
  expect_rejected(
      [&] { dsv4::local_to_global_slots_checked(d_local, d_t2r, d_table, 4, d_global, d_lens); },
      "use local_to_global_slots", {&d_global, &d_lens});

  // swa_window_indices: host positions with device tables and outputs.
  const HostTensor pos = i64({0, 1});
  DeviceTensor d_idx = device_out({2, kWindow}), d_wlens = device_out({2});
  expect_rejected(
      [&] { dsv4::swa_window_indices(pos, d_t2r, d_table, 4, kWindow, d_idx, d_wlens); },
      "swa_window_indices", {&d_idx, &d_wlens});

  // combine_topk_swa_indices: a host topk with device metadata.
  const HostTensor qsl = i32({2}, {0, 2}), seq = i32({1}, {2}), gather = i32({1}, {2});
  const DeviceTensor d_qsl = DeviceTensor::from_host(qsl), d_seq = DeviceTensor::from_host(seq);
  const DeviceTensor d_gather = DeviceTensor::from_host(gather);
  DeviceTensor d_out = device_out({2, 2 + kWindow}), d_out_lens = device_out({2});
  expect_rejected(
      [&] {
        dsv4::combine_topk_swa_indices(local, d_qsl, d_seq, d_gather, kWindow, 1, 3, 4, d_out,
                                       d_out_lens);
      },
      "combine_topk_swa_indices", {&d_out, &d_out_lens});
}

}  // namespace
