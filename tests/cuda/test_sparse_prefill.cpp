// CUDA sparse prefill (docs/spec.md §6) against a float64 reference written here: gather the selected
// rows, softmax over the valid slots in double, sink applied as out · 1/(1 + exp(σ − lse)). Every
// case runs under both schedules of the kernel's math warpgroups (serial and pair,
// src/cuda/attention/sparse_prefill/config.h), whichever the launch would choose for its head count.
//
// Tolerances: q and kv are exact bf16 values, so the only rounding is the kernel's: P rounded to
// bf16 before P·V (relative 2^-9 per term, averaging out), fp32 accumulation and the final bf16
// output rounding (2^-9 relative). Hence out: |got − ref| ≤ 2e-3 + 1e-2·|ref| per element;
// lse / max_logits are fp32 with fast exp2/log: |got − ref| ≤ 1e-3·(1 + |ref|).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention/sparse_prefill.h"
#include "dsv4/status.h"
#include "gpu_test_util.h"
#include "output_digest.h"

namespace {

using dsv4::DType;
using dsv4::cuda::SparsePrefillSchedule;
using dsv4::test::bf16_value;
using dsv4::test::DeviceBuffer;

int sm_count() {
  int device = 0, sms = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  return sms;
}

// How a case is launched: the schedule of the math warpgroups, and whether the CTAs take their
// items from a work counter (dynamic) or round-robin. Every case runs under all four.
struct Launch {
  SparsePrefillSchedule schedule;
  bool work_counter;
};
constexpr Launch kLaunches[] = {{SparsePrefillSchedule::kSerial, false},
                                {SparsePrefillSchedule::kPair, false},
                                {SparsePrefillSchedule::kSerial, true},
                                {SparsePrefillSchedule::kPair, true}};

std::string launch_name(const Launch& l) {
  return std::string(l.schedule == SparsePrefillSchedule::kSerial ? "serial schedule" : "pair schedule") +
         (l.work_counter ? ", items from the work counter" : ", items round-robin");
}

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kDv = 512;

struct Problem {
  int s_q = 2, heads = 64, d_qk = 512, s_kv = 256, topk = 64;
  float scale = 0.f;  // 0 → d_qk^-0.5
  std::vector<uint16_t> q, kv;   // bf16 bits
  std::vector<int32_t> indices;  // [s_q, topk]
  std::vector<int32_t> topk_length;  // empty = none
  std::vector<float> sink;           // empty = none
  int out_row_pad = 0;  // > 0: out is a view with head rows of kDv + pad elements (pad poisoned)
};

struct Result {
  std::vector<uint16_t> out;
  std::vector<float> max_logits, lse;
};

struct Reference {
  std::vector<double> out, max_logits, lse;
};

Problem make_problem(int s_q, int heads, int d_qk, int s_kv, int topk, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.s_q = s_q; p.heads = heads; p.d_qk = d_qk; p.s_kv = s_kv; p.topk = topk;
  p.q = dsv4::test::random_bf16(static_cast<size_t>(s_q) * heads * d_qk, rng);
  p.kv = dsv4::test::random_bf16(static_cast<size_t>(s_kv) * d_qk, rng);
  p.indices.resize(static_cast<size_t>(s_q) * topk);
  std::vector<int32_t> perm(s_kv);
  std::iota(perm.begin(), perm.end(), 0);
  for (int s = 0; s < s_q; ++s) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < topk; ++j) p.indices[static_cast<size_t>(s) * topk + j] = perm[j % s_kv];
  }
  return p;
}

double dot_q_k(const Problem& p, int s, int h, int row) {
  const uint16_t* q = &p.q[(static_cast<size_t>(s) * p.heads + h) * p.d_qk];
  const uint16_t* k = &p.kv[static_cast<size_t>(row) * p.d_qk];
  double acc = 0;
  for (int d = 0; d < p.d_qk; ++d) acc += bf16_value(q[d]) * bf16_value(k[d]);
  return acc;
}

Reference reference(const Problem& p) {
  const double scale = p.scale == 0.f ? 1.0 / std::sqrt(static_cast<double>(p.d_qk)) : p.scale;
  Reference r;
  r.out.assign(static_cast<size_t>(p.s_q) * p.heads * kDv, 0.0);
  r.max_logits.assign(static_cast<size_t>(p.s_q) * p.heads, -kInf);
  r.lse.assign(static_cast<size_t>(p.s_q) * p.heads, kInf);
  for (int s = 0; s < p.s_q; ++s) {
    int len = p.topk;
    if (!p.topk_length.empty()) len = std::clamp(p.topk_length[s], 0, p.topk);
    std::vector<int> rows;
    for (int j = 0; j < len; ++j) {
      const int idx = p.indices[static_cast<size_t>(s) * p.topk + j];
      if (idx >= 0 && idx < p.s_kv) rows.push_back(idx);
    }
    if (rows.empty()) continue;
    for (int h = 0; h < p.heads; ++h) {
      std::vector<double> logit(rows.size());
      double m = -kInf;
      for (size_t j = 0; j < rows.size(); ++j) {
        logit[j] = scale * dot_q_k(p, s, h, rows[j]);
        m = std::max(m, logit[j]);
      }
      double l = 0;
      for (double x : logit) l += std::exp(x - m);
      const double lse = m + std::log(l);
      double sink_factor = 1.0;
      if (!p.sink.empty()) sink_factor = 1.0 / (1.0 + std::exp(static_cast<double>(p.sink[h]) - lse));
      double* o = &r.out[(static_cast<size_t>(s) * p.heads + h) * kDv];
      for (size_t j = 0; j < rows.size(); ++j) {
        const double w = std::exp(logit[j] - lse) * sink_factor;
        const uint16_t* v = &p.kv[static_cast<size_t>(rows[j]) * p.d_qk];
        for (int d = 0; d < kDv; ++d) o[d] += w * bf16_value(v[d]);
      }
      r.max_logits[static_cast<size_t>(s) * p.heads + h] = m;
      r.lse[static_cast<size_t>(s) * p.heads + h] = lse;
    }
  }
  return r;
}

// Runs the CUDA kernel (as `launch` says) on poisoned outputs and copies everything back. With a
// work counter (poisoned too: its contents on entry must not matter), every item past the
// round-robin ones must have been claimed once and each CTA's last claim must fall past the end,
// so the counter ends at items − round-robin items + CTAs. graph_replays > 0: the launch is captured in a CUDA graph
// on a stream of its own and the graph replayed that often, outputs and counter poisoned before
// each replay (the last one's results come back).
Result run_cuda(const Problem& p, const Launch& launch, int graph_replays = 0) {
  DeviceBuffer<uint16_t> q(p.q), kv(p.kv);
  DeviceBuffer<int32_t> indices(p.indices);
  DeviceBuffer<int32_t> topk_length(p.topk_length);
  DeviceBuffer<float> sink(p.sink);
  const int out_row = kDv + p.out_row_pad;
  DeviceBuffer<uint16_t> out(static_cast<size_t>(p.s_q) * p.heads * out_row);
  DeviceBuffer<float> max_logits(static_cast<size_t>(p.s_q) * p.heads), lse(max_logits.size());
  out.poison();
  max_logits.poison();
  lse.poison();
  dsv4::SparsePrefillArgs a;
  a.q = q.view(DType::bf16, {p.s_q, p.heads, p.d_qk});
  a.kv = kv.view(DType::bf16, {p.s_kv, 1, p.d_qk});
  a.indices = indices.view(DType::int32, {p.s_q, 1, p.topk});
  if (!p.topk_length.empty()) a.topk_length = topk_length.view(DType::int32, {p.s_q});
  if (!p.sink.empty()) a.attn_sink = sink.view(DType::fp32, {p.heads});
  a.softmax_scale = p.scale;
  a.out = out.view(DType::bf16, {p.s_q, p.heads, kDv});
  a.out.strides[0] = int64_t{p.heads} * out_row;
  a.out.strides[1] = out_row;
  a.max_logits = max_logits.view(DType::fp32, {p.s_q, p.heads});
  a.lse = lse.view(DType::fp32, {p.s_q, p.heads});
  DeviceBuffer<int32_t> work_counter(1);
  work_counter.poison();
  if (launch.work_counter) a.work_counter = work_counter.view(DType::int32, {1});
  if (graph_replays == 0) {
    dsv4::cuda::sparse_prefill_with_schedule(a, nullptr, launch.schedule);
  } else {
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    dsv4::cuda::sparse_prefill_with_schedule(a, stream, launch.schedule);
    EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int r = 0; r < graph_replays; ++r) {
      for (auto* b : {&max_logits, &lse}) b->poison();
      out.poison();
      work_counter.poison();
      EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (launch.work_counter) {
    // Every item past the round-robin ones claimed once, plus each CTA's last claim past the end;
    // a launch of fewer than eight rounds takes none and leaves the counter as poisoned.
    constexpr int kGroup = dsv4::cuda::kSparsePrefillHeadsPerItem;
    const int64_t items = int64_t{p.s_q} * ((p.heads + kGroup - 1) / kGroup), ctas = std::min<int64_t>(items, sm_count());
    const int64_t round_robin = dsv4::cuda::sparse_prefill_round_robin_items(items, ctas);
    EXPECT_EQ(work_counter.download()[0], round_robin < items ? items - round_robin + ctas : -1)
        << "claims on the work counter";
  }
  const std::vector<uint16_t> rows = out.download();
  std::vector<uint16_t> dense(static_cast<size_t>(p.s_q) * p.heads * kDv);
  for (size_t r = 0; r < static_cast<size_t>(p.s_q) * p.heads; ++r) {
    std::copy_n(rows.begin() + r * out_row, kDv, dense.begin() + r * kDv);
    for (int e = kDv; e < out_row; ++e)  // the pad between rows is not part of out
      if (rows[r * out_row + e] != 0xFFFF) {
        ADD_FAILURE() << "pad element " << e << " of out row " << r << " was written";
        break;
      }
  }
  Result r{dense, max_logits.download(), lse.download()};
  dsv4::test::check_output_digest({{r.out.data(), r.out.size() * 2}, {r.max_logits.data(), r.max_logits.size() * 4},
                                   {r.lse.data(), r.lse.size() * 4}});
  return r;
}

void expect_close_scalar(const char* what, float got, double want, size_t i) {
  if (std::isinf(want)) {
    EXPECT_EQ(static_cast<double>(got), want) << what << "[" << i << "]";
  } else {
    EXPECT_LE(std::abs(got - want), 1e-3 * (1 + std::abs(want))) << what << "[" << i << "] got " << got
                                                                 << " want " << want;
  }
}

void expect_matches(const Problem& p, const Result& got, const Reference& want) {
  size_t bad = 0;
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < want.out.size(); ++i) {
    const double g = bf16_value(got.out[i]);
    const double w = want.out[i];
    err2 += (g - w) * (g - w);
    ref2 += w * w;
    if (!(std::abs(g - w) <= 2e-3 + 1e-2 * std::abs(w))) {
      if (++bad <= 5) ADD_FAILURE() << "out[" << i << "] (token " << i / (p.heads * kDv) << ", head "
                                    << i / kDv % p.heads << ", dim " << i % kDv << "): got " << g
                                    << " want " << w;
    }
  }
  EXPECT_EQ(bad, 0u) << "mismatching out elements";
  if (ref2 > 0) EXPECT_LE(std::sqrt(err2 / ref2), 5e-3) << "relative Frobenius error of out";
  for (size_t i = 0; i < want.lse.size(); ++i) {
    expect_close_scalar("lse", got.lse[i], want.lse[i], i);
    expect_close_scalar("max_logits", got.max_logits[i], want.max_logits[i], i);
  }
}

void check(const Problem& p) {
  const Reference want = reference(p);
  for (const Launch& launch : kLaunches) {
    SCOPED_TRACE(launch_name(launch));
    expect_matches(p, run_cuda(p, launch), want);
  }
}

// ------------------------------------------------------------------ the shape grid
struct GridCase {
  int heads, d_qk, topk, s_kv, s_q;
  bool sink, topk_length;
};

void PrintTo(const GridCase& c, std::ostream* os) {
  *os << "H " << c.heads << ", d_qk " << c.d_qk << ", topk " << c.topk << ", s_kv " << c.s_kv << ", s_q " << c.s_q
      << (c.sink ? ", sink" : "") << (c.topk_length ? ", topk_length" : "");
}

class SparsePrefillGrid : public ::testing::TestWithParam<GridCase> {};

TEST_P(SparsePrefillGrid, MatchesFloat64Reference) {
  DSV4_SKIP_WITHOUT_GPU();
  const GridCase c = GetParam();
  Problem p = make_problem(c.s_q, c.heads, c.d_qk, c.s_kv, c.topk,
                           1000u + c.heads + c.d_qk + c.topk + c.s_kv);
  std::mt19937 rng(7);
  if (c.sink) p.sink = dsv4::test::random_f32(c.heads, rng, -2.f, 2.f);
  if (c.topk_length) {
    std::uniform_int_distribution<int> len(1, c.topk);
    for (int s = 0; s < c.s_q; ++s) p.topk_length.push_back(len(rng));
  }
  check(p);
}

std::vector<GridCase> grid() {
  std::vector<GridCase> cases;
  const int topk_skv[][2] = {{64, 300}, {512, 4096}, {2048, 4096}};
  for (int heads : {64, 128})
    for (int d : {512, 576})
      for (const auto& ts : topk_skv) {
        const int s_q = ts[0] == 2048 ? 2 : 4;
        const bool flag = ((heads / 64 + d / 576 + ts[0] / 512) % 2) == 1;
        cases.push_back({heads, d, ts[0], ts[1], s_q, flag, !flag});
      }
  cases.push_back({64, 512, 1024, 2048, 3, true, true});
  return cases;
}

std::string grid_name(const ::testing::TestParamInfo<GridCase>& info) {
  const GridCase& c = info.param;
  return "H" + std::to_string(c.heads) + "_d" + std::to_string(c.d_qk) + "_topk" +
         std::to_string(c.topk) + "_skv" + std::to_string(c.s_kv) + (c.sink ? "_sink" : "") +
         (c.topk_length ? "_len" : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparsePrefillGrid, ::testing::ValuesIn(grid()), grid_name);

// ------------------------------------------------------------------ edge cases
TEST(SparsePrefillEdge, AllInvalidIndicesGiveZeroOutAndInfLse) {
  DSV4_SKIP_WITHOUT_GPU();
  Problem p = make_problem(3, 64, 576, 128, 128, 11);
  for (size_t i = 0; i < p.indices.size(); ++i) p.indices[i] = (i % 3 == 0) ? -1 : (i % 3 == 1 ? 128 : INT_MAX);
  p.sink.assign(64, 0.5f);
  const Reference want = reference(p);
  for (const Launch& launch : kLaunches) {
    SCOPED_TRACE(launch_name(launch));
    const Result got = run_cuda(p, launch);
    for (uint16_t o : got.out) ASSERT_EQ(bf16_value(o), 0.0);
    for (float x : got.lse) ASSERT_EQ(x, std::numeric_limits<float>::infinity());
    for (float x : got.max_logits) ASSERT_EQ(x, -std::numeric_limits<float>::infinity());
    expect_matches(p, got, want);
  }
}

TEST(SparsePrefillEdge, TopkLengthZeroShortAndUnaligned) {
  DSV4_SKIP_WITHOUT_GPU();
  for (int d : {512, 576}) {
    Problem p = make_problem(7, 64, d, 1000, 256, 12 + d);
    p.topk_length = {0, 1, 63, 64, 65, 200, 256};
    check(p);
  }
}

TEST(SparsePrefillEdge, TopkNotAMultipleOfTile) {
  DSV4_SKIP_WITHOUT_GPU();
  Problem p = make_problem(3, 128, 512, 500, 100, 13);
  p.sink = std::vector<float>(128, -0.5f);
  check(p);
}

TEST(SparsePrefillEdge, NaNInUnselectedRowsIsNeverRead) {
  DSV4_SKIP_WITHOUT_GPU();
  // Tokens select rows 0..299 only (plus -1 / out-of-range / past-topk_length slots that point at
  // NaN rows); rows 300.. are NaN.
  Problem p = make_problem(4, 64, 576, 600, 192, 14);
  std::mt19937 rng(5);
  for (size_t i = 0; i < p.indices.size(); ++i) p.indices[i] = static_cast<int32_t>(rng() % 300);
  const uint16_t nan_bits = 0x7FC0;
  for (size_t i = 300 * 576; i < p.kv.size(); ++i) p.kv[i] = nan_bits;
  p.topk_length = {192, 100, 7, 150};
  for (int s = 0; s < 4; ++s)
    for (int j = p.topk_length[s]; j < 192; ++j) p.indices[s * 192 + j] = 300 + j;  // NaN rows, ignored
  p.indices[5] = -1;
  p.indices[192 + 3] = 600;  // ≥ s_kv: invalid
  check(p);
}

TEST(SparsePrefillEdge, SinkPlusAndMinusInfinity) {
  DSV4_SKIP_WITHOUT_GPU();
  Problem p = make_problem(2, 64, 512, 300, 128, 15);
  const float inf = std::numeric_limits<float>::infinity();
  p.sink.assign(64, 0.f);
  for (int h = 0; h < 64; ++h) p.sink[h] = h % 2 ? inf : -inf;
  const Reference want = reference(p);
  for (const Launch& launch : kLaunches) {
    SCOPED_TRACE(launch_name(launch));
    const Result got = run_cuda(p, launch);
    for (int s = 0; s < 2; ++s)
      for (int h = 1; h < 64; h += 2)
        for (int d = 0; d < kDv; ++d) ASSERT_EQ(bf16_value(got.out[(s * 64 + h) * kDv + d]), 0.0);
    expect_matches(p, got, want);
  }
}

TEST(SparsePrefillEdge, DuplicateIndicesCountPerSlot) {
  DSV4_SKIP_WITHOUT_GPU();
  Problem p = make_problem(2, 128, 576, 50, 256, 16);  // topk > s_kv: every row repeats
  std::mt19937 rng(3);
  for (auto& i : p.indices) i = static_cast<int32_t>(rng() % 5);  // heavy duplication
  p.scale = 0.2f;
  check(p);
}

TEST(SparsePrefillEdge, HeadCountsPaddedTo64) {
  DSV4_SKIP_WITHOUT_GPU();
  for (int heads : {16, 100}) {
    Problem p = make_problem(3, heads, 512, 400, 128, 17 + heads);
    std::mt19937 rng(9);
    p.sink = dsv4::test::random_f32(heads, rng);
    check(p);
  }
}

// A negative softmax scale: the kernel computes S negated (MmaSNegated) and runs the softmax with
// |scale|, so the logits, their max (max_logits) and lse must still be those of scale · q·k.
TEST(SparsePrefillEdge, NegativeSoftmaxScale) {
  DSV4_SKIP_WITHOUT_GPU();
  for (int d_qk : {512, 576}) {
    Problem p = make_problem(3, 64, d_qk, 700, 384, 31 + d_qk);
    p.scale = -0.07f;
    std::mt19937 rng(5);
    p.sink = dsv4::test::random_f32(64, rng);
    check(p);
  }
}

TEST(SparsePrefillEdge, PeakedSoftmaxLargeScale) {
  DSV4_SKIP_WITHOUT_GPU();
  Problem p = make_problem(3, 64, 576, 2000, 512, 18);
  p.scale = 0.5f;  // logits spread ±30: tests the running-max rescaling across tiles
  check(p);
}

// Logits that grow tile after tile (kv rows scaled up along the top-k order, q aligned with
// them): the kernel's reference max (kLazyRescaleSlack in attention_tile.cuh: P and the row sums
// are relative to a max that moves only when a tile exceeds it by more than the slack) lags the
// true max and moves every few tiles, so both the skipped and the applied O rescale are checked,
// and max_logits must still be the true max.
TEST(SparsePrefillEdge, LogitsGrowAcrossTiles) {
  DSV4_SKIP_WITHOUT_GPU();
  for (int d_qk : {512, 576}) {
    Problem p = make_problem(2, 128, d_qk, 1024, 1024, 22);
    std::mt19937 rng(23);
    std::uniform_real_distribution<float> jitter(0.9f, 1.1f);
    std::vector<float> u(d_qk);
    for (auto& x : u) x = (rng() & 1) ? 1.f : -1.f;
    for (size_t i = 0; i < p.q.size(); ++i) p.q[i] = dsv4::float_to_bf16_bits(u[i % d_qk] * jitter(rng));
    // Row r scaled by 0.002·(r + 1): a 64-row tile raises the max by ~4 (base 2) at d 512.
    for (int r = 0; r < p.s_kv; ++r)
      for (int d = 0; d < d_qk; ++d)
        p.kv[static_cast<size_t>(r) * d_qk + d] = dsv4::float_to_bf16_bits(u[d] * 0.002f * (r + 1));
    for (int s = 0; s < p.s_q; ++s)
      for (int j = 0; j < p.topk; ++j) p.indices[static_cast<size_t>(s) * p.topk + j] = j;
    check(p);
  }
}

// More (token, head group) items than SMs: persistent CTAs walk several items each, with empty and
// short items mixed in (the Q / K buffer rings and barrier phases must carry across items).
// out as a strided view (head rows padded by 64 elements, 16-byte aligned): O leaves through a
// TMA map built from the view's strides, so the pad must stay poisoned; H 96 makes the second
// head group's 64-row box cross the end of the heads (clipped, never written into the pad or
// the next token).
TEST(SparsePrefillEdge, StridedOutWritesOnlyItsView) {
  DSV4_SKIP_WITHOUT_GPU();
  for (int d_qk : {512, 576}) {
    Problem p = make_problem(3, 96, d_qk, 300, 128, 31);
    p.out_row_pad = 64;
    check(p);
  }
}

// Several items a CTA, with varying lengths (zero among them); the last two shapes have 8+ rounds
// of items (1100 and 1200 on 132 SMs), so with a work counter their last rounds come from it.
TEST(SparsePrefillEdge, ManyItemsPerCta) {
  DSV4_SKIP_WITHOUT_GPU();
  const int shapes[][4] = {{400, 64, 512, 64}, {300, 128, 576, 128}, {1100, 64, 512, 64}, {600, 128, 576, 64}};
  // (s_q, H, d_qk, topk)
  for (const auto& sh : shapes) {
    Problem p = make_problem(sh[0], sh[1], sh[2], 700, sh[3], 20 + sh[2]);
    std::mt19937 rng(21);
    std::uniform_int_distribution<int> len(-20, sh[3]);  // ~1/6 of the tokens get length 0
    for (int s = 0; s < p.s_q; ++s) p.topk_length.push_back(std::max(0, len(rng)));
    p.sink = dsv4::test::random_f32(sh[1], rng);
    check(p);
  }
}

constexpr SparsePrefillSchedule kBothSchedules[] = {SparsePrefillSchedule::kSerial, SparsePrefillSchedule::kPair};

// `p` with a random attn_sink per head (seeded).
Problem with_random_sink(Problem p, uint32_t seed) {
  std::mt19937 rng(seed);
  p.sink = dsv4::test::random_f32(p.heads, rng);
  return p;
}

void expect_bit_identical(const Result& a, const Result& b) {
  EXPECT_TRUE(dsv4::test::bitwise_equal(a.out.data(), b.out.data(), a.out.size() * 2)) << "out";
  EXPECT_TRUE(dsv4::test::bitwise_equal(a.lse.data(), b.lse.data(), a.lse.size() * 4)) << "lse";
  EXPECT_TRUE(dsv4::test::bitwise_equal(a.max_logits.data(), b.max_logits.data(), a.lse.size() * 4)) << "max_logits";
}

// An item's arithmetic does not depend on the CTA that runs it, so under one schedule two runs
// agree bit for bit, and so do the round-robin and work-counter walks (whose item-to-CTA maps
// differ from run to run).
TEST(SparsePrefillEdge, BitIdenticalAcrossRunsAndItemWalks) {
  DSV4_SKIP_WITHOUT_GPU();
  const Problem p = with_random_sink(make_problem(300, 128, 512, 3000, 256, 19), 1);
  for (const SparsePrefillSchedule schedule : kBothSchedules) {
    const Result a = run_cuda(p, {schedule, false});
    for (const Launch& launch : {Launch{schedule, false}, Launch{schedule, true}, Launch{schedule, true}}) {
      SCOPED_TRACE(launch_name(launch));
      expect_bit_identical(a, run_cuda(p, launch));
    }
  }
}

// A launch with a work counter, captured in a CUDA graph, replays: the counter's zeroing is part
// of the graph (a memset node), so every replay hands out every item again and matches a direct
// launch bit for bit. 1200 items: 10 rounds on 132 SMs (8 on up to 150), the last from the counter.
TEST(SparsePrefillEdge, WorkCounterLaunchReplaysFromACudaGraph) {
  DSV4_SKIP_WITHOUT_GPU();
  const Problem p = with_random_sink(make_problem(600, 128, 576, 2000, 192, 23), 2);
  for (const SparsePrefillSchedule schedule : kBothSchedules) {
    const Launch launch{schedule, true};
    SCOPED_TRACE(launch_name(launch));
    expect_bit_identical(run_cuda(p, launch), run_cuda(p, launch, /*graph_replays=*/3));
  }
}

TEST(SparsePrefillEdge, RejectsBadArguments) {
  DSV4_SKIP_WITHOUT_GPU();
  DeviceBuffer<uint16_t> q(2 * 64 * 256), kv(10 * 256), out(2 * 64 * kDv);
  DeviceBuffer<int32_t> idx(2 * 64);
  DeviceBuffer<float> ml(2 * 64), lse(2 * 64);
  out.poison();
  dsv4::SparsePrefillArgs a;
  a.q = q.view(DType::bf16, {2, 64, 256});  // d_qk 256 is not supported
  a.kv = kv.view(DType::bf16, {10, 1, 256});
  a.indices = idx.view(DType::int32, {2, 1, 64});
  a.out = out.view(DType::bf16, {2, 64, kDv});
  a.max_logits = ml.view(DType::fp32, {2, 64});
  a.lse = lse.view(DType::fp32, {2, 64});
  EXPECT_THROW(dsv4::cuda::sparse_prefill(a, nullptr), dsv4::Error);
  // Valid otherwise, but out is not 16-byte aligned (the kernel stores 16-byte row chunks).
  DeviceBuffer<uint16_t> q512(2 * 64 * 512), kv512(10 * 512), out_shifted(2 * 64 * kDv + 1);
  out_shifted.poison();
  a.q = q512.view(DType::bf16, {2, 64, 512});
  a.kv = kv512.view(DType::bf16, {10, 1, 512});
  a.out = dsv4::TensorView(out_shifted.data() + 1, DType::bf16, {2, 64, kDv}, dsv4::Device::cuda);
  EXPECT_THROW(dsv4::cuda::sparse_prefill(a, nullptr), dsv4::Error);
  // Valid otherwise, but softmax_scale · log2 e is not a normal float: this entry applies the
  // front doors' rule too, naming the argument.
  a.out = out.view(DType::bf16, {2, 64, kDv});
  for (const float bad : {1e-39f, -1e-39f, 3e38f, INFINITY, NAN}) {
    a.softmax_scale = bad;
    try {
      dsv4::cuda::sparse_prefill(a, nullptr);
      ADD_FAILURE() << "softmax_scale " << bad << " accepted";
    } catch (const dsv4::Error& e) {
      EXPECT_NE(std::string(e.what()).find("softmax_scale: expected 0 (d_qk^-0.5) or a magnitude from 8.2e-39"),
                std::string::npos)
          << e.what();
    }
  }
  // Valid otherwise, but the work counter is not int32.
  a.softmax_scale = 0.f;
  a.work_counter = ml.view(DType::fp32, {1});
  try {
    dsv4::cuda::sparse_prefill(a, nullptr);
    ADD_FAILURE() << "an fp32 work_counter accepted";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("work_counter"), std::string::npos) << e.what();
  }
  for (uint16_t o : out.download()) ASSERT_EQ(o, 0xFFFF);  // nothing written
  for (uint16_t o : out_shifted.download()) ASSERT_EQ(o, 0xFFFF);
}

}  // namespace
