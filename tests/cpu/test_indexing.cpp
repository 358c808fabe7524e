// Index utilities (docs/spec.md §8): request-local → global slots (kernel-facing and validating),
// SWA window indices and the prefill gather-workspace rewrite. Expected values are written out
// by hand for the edge cases and computed by a plain formula here for the random grids.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda_dispatch_support.h"
#include "dsv4/indexing.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;

HostTensor i32(std::vector<int64_t> shape, const std::vector<int32_t>& v) {
  HostTensor t(DType::int32, std::move(shape));
  EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}
std::vector<int32_t> values(const HostTensor& t) {
  return {t.data<int32_t>(), t.data<int32_t>() + t.numel()};
}
HostTensor poisoned(std::vector<int64_t> shape) {
  HostTensor t(DType::int32, std::move(shape));
  std::fill(t.data<int32_t>(), t.data<int32_t>() + t.numel(), 12345);
  return t;
}

// Runs `call`, expects a dsv4::Error containing `needle`, and checks `outputs` are unchanged.
void expect_rejected(const std::function<void()>& call, const std::string& needle,
                     const std::vector<const HostTensor*>& outputs) {
  std::vector<std::vector<int32_t>> before;
  for (const auto* o : outputs) before.push_back(values(*o));
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (size_t i = 0; i < outputs.size(); ++i)
    EXPECT_EQ(values(*outputs[i]), before[i]) << "output " << i << " written by a rejected call";
}

// ================================ local → global ============================================

// Two requests, block size 4. Request 0 owns blocks [5, 2, -1 (released)], request 1 [7, -1, -1]
// (padding). Hand-computed: entry 0 of r0 → 5*4+0 = 20; entry 5 → block 2, offset 1 → 9;
// entry 8 → released block → -1; entry 12 → beyond the 3-block table → -1; entry 3 of r1 → 31.
struct SmallTable {
  HostTensor table = i32({2, 3}, {5, 2, -1, 7, -1, -1});
  HostTensor token_to_req = i32({3}, {0, 0, 1});
};

TEST(LocalToGlobal, KernelFacingEdgeCases) {
  SmallTable s;
  HostTensor local = i32({3, 4}, {0, 5, 8, 12,    // r0: valid, valid, released, past the table
                                  3, -1, 7, -1,   // r0: entry 3 → 23, -1, entry 7 → 11
                                  3, 4, -1, 0});  // r1: 31, block 1 is -1 → -1, -1, 28
  HostTensor global = poisoned({3, 4});
  HostTensor lens = poisoned({3});
  dsv4::local_to_global_slots(local, s.token_to_req, s.table, 4, global, lens);
  EXPECT_EQ(values(global), (std::vector<int32_t>{20, 9, -1, -1, 23, -1, 11, -1, 31, -1, -1, 28}));
  EXPECT_EQ(values(lens), (std::vector<int32_t>{2, 2, 2}));
}

TEST(LocalToGlobal, InPlaceAliasAndUnknownRequestGivesMinusOne) {
  SmallTable s;
  HostTensor idx = i32({3, 2}, {1, 4, 2, 6, 0, 1});
  HostTensor bad_req = i32({3}, {0, 5, -1});  // kernel-facing: never throws on data
  dsv4::local_to_global_slots(idx, bad_req, s.table, 4, idx);
  EXPECT_EQ(values(idx), (std::vector<int32_t>{21, 8, -1, -1, -1, -1}));
}

// K = 0 (no compressed entries): [T, 0] views have row-major stride 0 and no elements, so they
// are valid outputs (not "overlapping"); every row counts 0.
TEST(LocalToGlobal, EmptyRowsAreAcceptedAndCountZero) {
  SmallTable s;
  HostTensor local_buf = poisoned({1}), global_buf = poisoned({1}), lens = poisoned({3});
  const dsv4::TensorView local(local_buf.data<int32_t>(), DType::int32, {3, 0});
  const dsv4::TensorView global(global_buf.data<int32_t>(), DType::int32, {3, 0});
  ASSERT_EQ(global.strides[0], 0);
  dsv4::local_to_global_slots(local, s.token_to_req, s.table, 4, global, lens);
  EXPECT_EQ(values(lens), (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(values(global_buf), (std::vector<int32_t>{12345}));
}

TEST(LocalToGlobal, RandomGridMatchesFormula) {
  std::mt19937 rng(3);
  for (int block_size : {1, 4, 64}) {
    const int T = 37, K = 9, R = 3, max_blocks = 5;
    std::vector<int32_t> table(R * max_blocks), t2r(T), local(T * K);
    for (auto& b : table) b = static_cast<int32_t>(rng() % 50) - 5;  // some -1..-5 → -1 entries
    for (auto& b : table) b = b < 0 ? -1 : b;
    for (auto& r : t2r) r = static_cast<int32_t>(rng() % R);
    for (auto& i : local) i = static_cast<int32_t>(rng() % (max_blocks * block_size + 8)) - 1;
    HostTensor tt = i32({R, max_blocks}, table), tr = i32({T}, t2r), lt = i32({T, K}, local);
    HostTensor global = poisoned({T, K}), lens = poisoned({T});
    dsv4::local_to_global_slots(lt, tr, tt, block_size, global, lens);
    for (int t = 0; t < T; ++t) {
      int count = 0;
      for (int k = 0; k < K; ++k) {
        const int i = local[t * K + k];
        int want = -1;
        if (i >= 0 && i / block_size < max_blocks) {
          const int b = table[t2r[t] * max_blocks + i / block_size];
          if (b >= 0) want = b * block_size + i % block_size;
        }
        count += want >= 0;
        ASSERT_EQ(global.data<int32_t>()[t * K + k], want) << "B " << block_size << " t " << t;
      }
      ASSERT_EQ(lens.data<int32_t>()[t], count);
    }
  }
}

TEST(LocalToGlobalChecked, AcceptsValidAndRejectsEachBadIndexWithoutWriting) {
  SmallTable s;
  HostTensor ok = i32({3, 2}, {0, 5, -1, 7, 3, -1});
  HostTensor global = poisoned({3, 2}), lens = poisoned({3});
  dsv4::local_to_global_slots_checked(ok, s.token_to_req, s.table, 4, global, lens);
  EXPECT_EQ(values(global), (std::vector<int32_t>{20, 9, -1, 11, 31, -1}));
  EXPECT_EQ(values(lens), (std::vector<int32_t>{2, 1, 1}));

  HostTensor out = poisoned({3, 2}), out_lens = poisoned({3});
  auto run = [&](const HostTensor& local, const HostTensor& t2r) {
    return [&, local, t2r] {
      dsv4::local_to_global_slots_checked(local, t2r, s.table, 4, out, out_lens);
    };
  };
  // Index 12 is past request 0's 3-block table (the last token is fine: nothing is written).
  expect_rejected(run(i32({3, 2}, {0, 12, 0, 0, 0, 0}), s.token_to_req), "local[0][1] = 12",
                  {&out, &out_lens});
  expect_rejected(run(i32({3, 2}, {0, 0, 8, 0, 0, 0}), s.token_to_req), "not allocated",
                  {&out, &out_lens});
  expect_rejected(run(i32({3, 2}, {0, 0, 0, 0, 4, 0}), s.token_to_req), "local[2][0] = 4",
                  {&out, &out_lens});
  expect_rejected(run(i32({3, 2}, {0, 0, 0, -2, 0, 0}), s.token_to_req), "local[1][1]",
                  {&out, &out_lens});
  expect_rejected(run(i32({3, 2}, {0, 0, 0, 0, 0, 0}), i32({3}, {0, 2, 1})), "token_to_req[1]",
                  {&out, &out_lens});
}

TEST(LocalToGlobal, RejectsWrongDtypeShapeAndStride) {
  SmallTable s;
  HostTensor local = i32({3, 2}, {0, 1, 2, 3, 0, 1});
  HostTensor out = poisoned({3, 2});
  HostTensor local64(DType::int64, {3, 2});
  expect_rejected([&] { dsv4::local_to_global_slots(local64, s.token_to_req, s.table, 4, out); },
                  "local.dtype", {&out});
  HostTensor out_wrong = poisoned({3, 3});
  expect_rejected(
      [&] { dsv4::local_to_global_slots(local, s.token_to_req, s.table, 4, out_wrong); },
      "global", {&out_wrong});
  expect_rejected([&] { dsv4::local_to_global_slots(local, i32({2}, {0, 0}), s.table, 4, out); },
                  "token_to_req", {&out});
  expect_rejected([&] { dsv4::local_to_global_slots(local, s.token_to_req, s.table, 0, out); },
                  "block_size", {&out});
  HostTensor wide = i32({3, 4}, {0, 9, 1, 9, 2, 9, 3, 9, 0, 9, 1, 9});
  dsv4::TensorView strided = wide.view();  // [3, 2] with inner stride 2
  strided.shape[1] = 2;
  strided.strides[1] = 2;
  expect_rejected([&] { dsv4::local_to_global_slots(strided, s.token_to_req, s.table, 4, out); },
                  "local", {&out});
  HostTensor lens_wrong = poisoned({2});
  expect_rejected(
      [&] { dsv4::local_to_global_slots(local, s.token_to_req, s.table, 4, out, lens_wrong); },
      "lens", {&out, &lens_wrong});
  // Outputs: in place (the very view of local) is allowed, any other overlap is not.
  HostTensor local_copy = i32({3, 2}, {0, 1, 2, 3, 0, 1});
  dsv4::TensorView shifted(local_copy.data<int32_t>() + 1, DType::int32, {2, 2});
  expect_rejected(
      [&] {
        dsv4::local_to_global_slots(local_copy.view().slice0(0, 2), i32({2}, {0, 0}), s.table, 4,
                                    shifted);
      },
      "global: expected the same view as local (in place) or memory disjoint from it",
      {&local_copy});
  expect_rejected(
      [&] {
        dsv4::local_to_global_slots(local, s.token_to_req, s.table, 4, out,
                                    dsv4::TensorView(local.data<int32_t>(), DType::int32, {3}));
      },
      "lens: expected memory disjoint from local", {&out, &local});
  dsv4::TensorView rows_at_one_address = out.view();
  rows_at_one_address.strides[0] = 0;
  expect_rejected(
      [&] { dsv4::local_to_global_slots(local, s.token_to_req, s.table, 4, rows_at_one_address); },
      "global: expected an output whose elements do not overlap", {&out});
  expect_rejected(
      [&] {
        dsv4::local_to_global_slots(local, s.token_to_req, s.table, 4, out,
                                    dsv4::TensorView(s.token_to_req.data<int32_t>(), DType::int32, {3}));
      },
      "lens: expected memory disjoint from token_to_req", {&out, &s.token_to_req});
}

// ================================ SWA window ================================================

// W = 4, block size 4. Request 0 holds positions 0..11 in blocks [3, 0, 6]; request 1 has
// released its first block: [-1, 2] (positions 4..7 live).
struct WindowFixture {
  HostTensor table = i32({2, 3}, {3, 0, 6, -1, 2, -1});
};

TEST(SwaWindow, EdgePositionsByHand) {
  WindowFixture f;
  // positions: 0 (first token), 3 (= W-1), 4 (= W, crosses into block 1), 8 (block boundary),
  // 11 (last of the table); request 1 at 7 (window 4..7 inside its live block).
  HostTensor pos(DType::int64, {6});
  const int64_t p[6] = {0, 3, 4, 8, 11, 7};
  std::copy(p, p + 6, pos.data<int64_t>());
  HostTensor t2r = i32({6}, {0, 0, 0, 0, 0, 1});
  HostTensor idx = poisoned({6, 4}), lens = poisoned({6});
  dsv4::swa_window_indices(pos, t2r, f.table, 4, 4, idx, lens);
  // Slots: position q of r0 → table[q/4]*4 + q%4: 0..3 → 12..15, 4..7 → 0..3, 8..11 → 24..27.
  EXPECT_EQ(values(idx), (std::vector<int32_t>{12, -1, -1, -1,    // p 0
                                               12, 13, 14, 15,    // p 3: positions 0..3
                                               13, 14, 15, 0,     // p 4: positions 1..4
                                               1, 2, 3, 24,       // p 8: positions 5..8
                                               24, 25, 26, 27,    // p 11: positions 8..11
                                               8, 9, 10, 11}));   // r1 p 7: block 2
  EXPECT_EQ(values(lens), (std::vector<int32_t>{1, 4, 4, 4, 4, 4}));
}

TEST(SwaWindow, Int32PositionsAndWindowLargerThanHistory) {
  WindowFixture f;
  HostTensor pos = i32({2}, {1, 2});
  HostTensor t2r = i32({2}, {0, 0});
  HostTensor idx = poisoned({2, 8}), lens = poisoned({2});
  dsv4::swa_window_indices(pos, t2r, f.table, 4, 8, idx, lens);
  EXPECT_EQ(values(idx), (std::vector<int32_t>{12, 13, -1, -1, -1, -1, -1, -1,  //
                                               12, 13, 14, -1, -1, -1, -1, -1}));
  EXPECT_EQ(values(lens), (std::vector<int32_t>{2, 3}));
}

TEST(SwaWindow, RandomGridMatchesFormula) {
  std::mt19937 rng(11);
  for (int block_size : {1, 16, 64}) {
    for (int window : {1, 16, 128}) {
      const int R = 3, max_blocks = 300 / block_size + 2, T = 41;
      std::vector<int32_t> table(R * max_blocks), t2r(T), pos(T);
      for (int i = 0; i < R * max_blocks; ++i) table[i] = (i * 37 + 5) % 1000;  // all distinct
      for (int t = 0; t < T; ++t) {
        t2r[t] = static_cast<int32_t>(rng() % R);
        pos[t] = static_cast<int32_t>(rng() % 300);
      }
      HostTensor idx = poisoned({T, window}), lens = poisoned({T});
      dsv4::swa_window_indices(i32({T}, pos), i32({T}, t2r), i32({R, max_blocks}, table),
                               block_size, window, idx, lens);
      for (int t = 0; t < T; ++t) {
        const int first = std::max(0, pos[t] - window + 1);
        ASSERT_EQ(lens.data<int32_t>()[t], pos[t] - first + 1);
        for (int k = 0; k < window; ++k) {
          const int q = first + k;
          const int want =
              q <= pos[t] ? table[t2r[t] * max_blocks + q / block_size] * block_size + q % block_size
                          : -1;
          ASSERT_EQ(idx.data<int32_t>()[t * window + k], want)
              << "B " << block_size << " W " << window << " t " << t << " k " << k;
        }
      }
    }
  }
}

TEST(SwaWindow, RejectsMissingBlocksAndBadInputWithoutWriting) {
  WindowFixture f;
  HostTensor idx = poisoned({2, 4}), lens = poisoned({2});
  auto run = [&](std::vector<int32_t> pos, std::vector<int32_t> req) {
    return [&, pos, req] {
      dsv4::swa_window_indices(i32({2}, pos), i32({2}, req), f.table, 4, 4, idx, lens);
    };
  };
  // Request 1 at position 5: window 2..5 needs its released block 0. Token 0 is valid.
  expect_rejected(run({3, 5}, {0, 1}), "released", {&idx, &lens});
  // Position 12 of request 0: block 3 is beyond its 3-block table.
  expect_rejected(run({3, 12}, {0, 0}), "beyond the block table", {&idx, &lens});
  expect_rejected(run({3, -1}, {0, 0}), "positions[1]", {&idx, &lens});
  expect_rejected(run({3, 3}, {0, 2}), "token_to_req[1]", {&idx, &lens});
  HostTensor pos = i32({2}, {0, 1}), t2r = i32({2}, {0, 0});
  HostTensor idx_w5 = poisoned({2, 5});
  expect_rejected([&] { dsv4::swa_window_indices(pos, t2r, f.table, 4, 4, idx_w5, lens); },
                  "indices", {&idx_w5, &lens});
  expect_rejected([&] { dsv4::swa_window_indices(pos, t2r, f.table, 4, 0, idx, lens); }, "window",
                  {&idx, &lens});
  HostTensor pos_f(DType::fp32, {2});
  expect_rejected([&] { dsv4::swa_window_indices(pos_f, t2r, f.table, 4, 4, idx, lens); },
                  "positions.dtype", {&idx, &lens});
  const dsv4::TensorView lens_in_idx(idx.data<int32_t>() + 1, DType::int32, {2});
  expect_rejected([&] { dsv4::swa_window_indices(pos, t2r, f.table, 4, 4, idx, lens_in_idx); },
                  "lens: expected memory disjoint from indices", {&idx});
  dsv4::TensorView idx_rows_overlap = idx.view();
  idx_rows_overlap.strides[0] = 3;  // rows of 4 entries, 3 apart
  expect_rejected(
      [&] { dsv4::swa_window_indices(pos, t2r, f.table, 4, 4, idx_rows_overlap, lens); },
      "indices: expected an output whose elements do not overlap", {&idx, &lens});
  expect_rejected(
      [&] { dsv4::swa_window_indices(pos, t2r, f.table, 4, 4, idx, t2r); },
      "lens: expected memory disjoint from token_to_req", {&idx, &t2r});
}

// A slot beyond int32 is an error in any block of the window, not only the newest one.
TEST(SwaWindow, RejectsSlotBeyondInt32InAnOlderWindowBlock) {
  HostTensor table = i32({1, 2}, {(1 << 30) + 1, 1});  // block 0's slots exceed int32 (B = 4)
  HostTensor idx = poisoned({1, 4}), lens = poisoned({1});
  // Position 5: window 2..5 spans block 0 (positions 2, 3) and block 1.
  expect_rejected(
      [&] { dsv4::swa_window_indices(i32({1}, {5}), i32({1}, {0}), table, 4, 4, idx, lens); },
      "exceeds int32", {&idx, &lens});
}

// ================================ prefill gather rewrite ====================================

// Two prefill requests, W = 4, ratio 4, compressed region N = 3, M = 12 rows per request.
//   r0: seq_len 10, 3 query tokens (positions 7, 8, 9), gather_len min(10, 3 + 3) = 6:
//       gathered SWA positions 4..9 at rows N + 0..5 = 3..8.
//   r1: seq_len 5, 2 query tokens (positions 3, 4), gather_len min(5, 2 + 3) = 5: positions
//       0..4 at rows 12 + 3 + 0..4 = 15..19.
// Visible compressed entries: (p + 1) / 4 → p 7: 2, p 8: 2, p 9: 2, p 3: 1, p 4: 1.
struct GatherFixture {
  HostTensor qsl = i32({3}, {0, 3, 5});
  HostTensor seq = i32({2}, {10, 5});
  HostTensor gather = i32({2}, {6, 5});
  HostTensor topk = i32({5, 2}, {1, 0,     // p 7
                                 -1, 1,    // p 8: -1 first, packed away
                                 -1, -1,   // p 9: no compressed entry
                                 0, -1,    // r1 p 3
                                 -1, -1}); // r1 p 4
};

TEST(CombineTopkSwa, HandComputedRows) {
  GatherFixture f;
  HostTensor out = poisoned({5, 6}), lens = poisoned({5});
  dsv4::combine_topk_swa_indices(f.topk, f.qsl, f.seq, f.gather, 4, 3, 12, 4, out, lens);
  EXPECT_EQ(values(out), (std::vector<int32_t>{
                             1, 0, 3, 4, 5, 6,         // p 7: entries 1, 0; positions 4..7
                             1, 4, 5, 6, 7, -1,        // p 8: entry 1; positions 5..8
                             5, 6, 7, 8, -1, -1,       // p 9: positions 6..9
                             12, 15, 16, 17, 18, -1,   // r1 p 3: entry 0 → 12; positions 0..3
                             16, 17, 18, 19, -1, -1})); // r1 p 4: positions 1..4
  EXPECT_EQ(values(lens), (std::vector<int32_t>{6, 5, 4, 5, 4}));
}

TEST(CombineTopkSwa, SwaOnlyWithoutTopkAndOffsetQueryStart) {
  // query_start_loc sliced from a larger batch (starts at 7); K = 0 (SWA-only layer, N = 0).
  HostTensor qsl = i32({2}, {7, 9});
  HostTensor seq = i32({1}, {2});
  HostTensor gather = i32({1}, {2});
  HostTensor out = poisoned({2, 4}), lens = poisoned({2});
  dsv4::combine_topk_swa_indices({}, qsl, seq, gather, 4, 0, 6, 0, out, lens);
  EXPECT_EQ(values(out), (std::vector<int32_t>{0, -1, -1, -1, 0, 1, -1, -1}));  // first token
  EXPECT_EQ(values(lens), (std::vector<int32_t>{1, 2}));
}

TEST(CombineTopkSwa, RejectsBadIndicesAndMetadataWithoutWriting) {
  GatherFixture f;
  HostTensor out = poisoned({5, 6}), lens = poisoned({5});
  auto call = [&](const HostTensor& topk, const HostTensor& qsl, const HostTensor& seq,
                  const HostTensor& gather, int n, int64_t m) {
    return [&, topk, qsl, seq, gather, n, m] {
      dsv4::combine_topk_swa_indices(topk, qsl, seq, gather, 4, n, m, 4, out, lens);
    };
  };
  const std::vector<const HostTensor*> outs = {&out, &lens};
  // Entry 2 at position 7 is not causal: only entries < (7 + 1) / 4 = 2 are emitted.
  HostTensor future = i32({5, 2}, {2, 0, -1, -1, -1, -1, -1, -1, -1, -1});
  expect_rejected(call(future, f.qsl, f.seq, f.gather, 3, 12), "topk[0][0] = 2", outs);
  // Entry 3 is outside the compressed region N = 3 (checked before causality).
  HostTensor outside = i32({5, 2}, {-1, -1, -1, -1, -1, -1, -1, -1, -1, 3});
  expect_rejected(call(outside, f.qsl, f.seq, f.gather, 3, 12), "topk[4][1]", outs);
  HostTensor negative = i32({5, 2}, {-1, -1, -1, -1, -3, -1, -1, -1, -1, -1});
  expect_rejected(call(negative, f.qsl, f.seq, f.gather, 3, 12), "topk[2][0]", outs);
  // gather_len 5 for r0 gathers positions 5..9, but position 7's window starts at 4.
  expect_rejected(call(f.topk, f.qsl, f.seq, i32({2}, {5, 5}), 3, 12), "before the gathered",
                  outs);
  expect_rejected(call(f.topk, f.qsl, f.seq, i32({2}, {11, 5}), 3, 12), "gather_lens[0]", outs);
  // N + gather_len = 3 + 6 > M = 8.
  expect_rejected(call(f.topk, f.qsl, f.seq, f.gather, 3, 8), "rows_per_request", outs);
  // Token count from query_start_loc (6) does not match out's 5 rows.
  expect_rejected(call(f.topk, i32({3}, {0, 3, 6}), f.seq, f.gather, 3, 12), "query_start_loc",
                  outs);
  expect_rejected(call(f.topk, f.qsl, i32({2}, {10, 1}), f.gather, 3, 12), "seq_lens[1]", outs);
  HostTensor out_narrow = poisoned({5, 5});
  expect_rejected(
      [&] {
        dsv4::combine_topk_swa_indices(f.topk, f.qsl, f.seq, f.gather, 4, 3, 12, 4, out_narrow,
                                       lens);
      },
      "out", {&out_narrow, &lens});
  expect_rejected(
      [&] { dsv4::combine_topk_swa_indices(f.topk, f.qsl, f.seq, f.gather, 4, 3, 12, 8, out, lens); },
      "ratio", outs);
  // Outputs must not overlap themselves, each other or an input.
  dsv4::TensorView out_rows_overlap = out.view();
  out_rows_overlap.strides[0] = 5;  // rows of 6 entries, 5 apart
  expect_rejected(
      [&] {
        dsv4::combine_topk_swa_indices(f.topk, f.qsl, f.seq, f.gather, 4, 3, 12, 4,
                                       out_rows_overlap, lens);
      },
      "out: expected an output whose elements do not overlap", outs);
  expect_rejected(
      [&] {
        dsv4::combine_topk_swa_indices(f.topk, f.qsl, f.seq, f.gather, 4, 3, 12, 4, out,
                                       dsv4::TensorView(out.data<int32_t>(), DType::int32, {5}));
      },
      "out_lens: expected memory disjoint from out", outs);
  HostTensor shared = poisoned({5, 6});  // topk's values in its first 10 entries, out over all
  std::copy_n(f.topk.data<int32_t>(), f.topk.numel(), shared.data<int32_t>());
  expect_rejected(
      [&] {
        dsv4::combine_topk_swa_indices(dsv4::TensorView(shared.data<int32_t>(), DType::int32, {5, 2}),
                                       f.qsl, f.seq, f.gather, 4, 3, 12, 4, shared, lens);
      },
      "out: expected memory disjoint from topk", {&shared, &lens});
}

// ================================ devices ===================================================

// A view of host memory labelled as CUDA: these calls must fail on the device check before
// anything is read or launched.
dsv4::TensorView as_cuda(const HostTensor& t) {
  dsv4::TensorView v = t.view();
  v.device = dsv4::Device::cuda;
  return v;
}

TEST(IndexingDevices, MixedDevicesAreRejectedWithoutWriting) {
  SmallTable s;
  HostTensor local = i32({3, 2}, {0, 1, 2, 3, 0, 1});
  HostTensor global = poisoned({3, 2}), lens = poisoned({3});
  expect_rejected(
      [&] { dsv4::local_to_global_slots(local, s.token_to_req, as_cuda(s.table), 4, global, lens); },
      "block_table.device", {&global, &lens});
  HostTensor idx = poisoned({3, 4});
  expect_rejected(
      [&] {
        dsv4::swa_window_indices(i32({3}, {0, 1, 2}), s.token_to_req, s.table, 4, 4, idx,
                                 as_cuda(lens));
      },
      "lens.device", {&idx, &lens});
  GatherFixture f;
  HostTensor out = poisoned({5, 6}), out_lens = poisoned({5});
  expect_rejected(
      [&] {
        dsv4::combine_topk_swa_indices(f.topk, f.qsl, as_cuda(f.seq), f.gather, 4, 3, 12, 4, out,
                                       out_lens);
      },
      "seq_lens.device", {&out, &out_lens});
}

TEST(IndexingDevices, CheckedConversionPointsCudaCallersToTheKernelFacingOne) {
  SmallTable s;
  HostTensor local = i32({3, 2}, {0, 1, 2, 3, 0, 1});
  HostTensor global = poisoned({3, 2});
  expect_rejected(
      [&] {
        dsv4::local_to_global_slots_checked(as_cuda(local), as_cuda(s.token_to_req),
                                            as_cuda(s.table), 4, as_cuda(global));
      },
      "use local_to_global_slots", {&global});
}

TEST(IndexingDevices, CudaTensorsReachTheCudaKernelOrNameTheMissingBackend) {
  SmallTable s;
  HostTensor local = i32({3, 2}, {0, 1, 2, 3, 0, 1});
  HostTensor global = poisoned({3, 2});
  const std::vector<int32_t> before = values(global);
  dsv4::test::expect_cuda_dispatch("local_to_global_slots", dsv4::ops::kLocalToGlobalSlots, [&] {
    dsv4::local_to_global_slots(as_cuda(local), as_cuda(s.token_to_req), as_cuda(s.table), 4, as_cuda(global));
  });
  EXPECT_EQ(values(global), before);
}

}  // namespace
