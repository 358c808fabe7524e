// dequantize_and_gather: the last g entries of each request's paged cache, dequantized into a bf16
// workspace row range, against rows decoded by hand from the cache bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dsv4/ops.h"
#include "sparse_attention_reference.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;
using dsv4::KvLayout;
using dsv4::test::TestCache;

constexpr uint16_t kPoison = 0x7FC1;  // a bf16 NaN no conversion produces

struct GatherCase {
  const char* name;
  KvLayout layout;
  int block_size, requests, max_seq;
  bool with_gather_lens;  // SWA-style: only the last few entries, older blocks released (-1)
  int offset;
};
std::ostream& operator<<(std::ostream& os, const GatherCase& c) { return os << c.name; }

struct GatherProblem {
  GatherCase c;
  std::unique_ptr<TestCache> cache;
  HostTensor block_table, seq_lens, gather_lens, workspace;
  int64_t rows;  // workspace rows per request (M)

  GatherProblem(const GatherCase& cs, uint32_t seed) : c(cs) {
    std::mt19937 rng(seed);
    const int max_blocks = (c.max_seq + c.block_size - 1) / c.block_size;
    // Blocks are handed out in a shuffled order so that table order != storage order.
    const int num_blocks = c.requests * max_blocks + 3;
    cache = std::make_unique<TestCache>(c.layout, c.block_size, num_blocks,
                                        c.layout == KvLayout::fp8_per_tensor ? 0.21f : 1.0f);
    std::vector<int32_t> order(num_blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    block_table = HostTensor(DType::int32, {c.requests, max_blocks});
    seq_lens = HostTensor(DType::int32, {c.requests});
    if (c.with_gather_lens) gather_lens = HostTensor(DType::int32, {c.requests});
    int next = 0;
    for (int r = 0; r < c.requests; ++r) {
      const int len = r == 0 ? c.max_seq : r == 1 ? 0 : int(rng() % (c.max_seq + 1));
      seq_lens.data<int32_t>()[r] = len;
      const int g = !c.with_gather_lens ? len : std::min(len, 1 + int(rng() % 20));
      if (c.with_gather_lens) gather_lens.data<int32_t>()[r] = g;
      const int first_needed_block = (len - g) / c.block_size;
      for (int b = 0; b < max_blocks; ++b) {
        const bool used = b * c.block_size < len;
        // Blocks before the gathered range are released (-1) in SWA-style tables; their tokens
        // must not be read. Unused table tail: -1.
        const bool released = c.with_gather_lens && b < first_needed_block;
        int32_t block = -1;
        if (used) {
          block = order[next++];
          for (int o = 0; o < c.block_size && b * c.block_size + o < len; ++o)
            if (!released) cache->fill_token(int64_t{block} * c.block_size + o, rng);
        }
        block_table.data<int32_t>()[r * max_blocks + b] = released ? -1 : block;
      }
    }
    rows = c.offset + c.max_seq + 2;
    workspace = HostTensor(DType::bf16, {c.requests, rows, cache->dim()});
    std::fill_n(workspace.data<uint16_t>(), workspace.numel(), kPoison);
  }

  void run() {
    dsv4::dequantize_and_gather(cache->view(), block_table, seq_lens, gather_lens, c.offset, workspace);
  }

  void expect_matches_reference() const {
    const int dim = cache->dim();
    const int64_t max_blocks = block_table.shape()[1];
    for (int r = 0; r < c.requests; ++r) {
      const int len = seq_lens.data<int32_t>()[r];
      const int g = gather_lens.view().defined() ? gather_lens.data<int32_t>()[r] : len;
      for (int64_t j = 0; j < rows; ++j) {
        const uint16_t* got = workspace.data<uint16_t>() + (r * rows + j) * dim;
        if (j < c.offset || j >= c.offset + g) {  // untouched
          for (int d = 0; d < dim; ++d) ASSERT_EQ(got[d], kPoison) << "request " << r << " row " << j;
          continue;
        }
        const int64_t entry = len - g + (j - c.offset);
        const int32_t block = block_table.data<int32_t>()[r * max_blocks + entry / c.block_size];
        const std::vector<double> want = cache->decode(int64_t{block} * c.block_size + entry % c.block_size);
        for (int d = 0; d < dim; ++d) {
          // fp8 · power-of-two scale and bf16 values are exact in bf16: equal bits. A per-tensor
          // scale is arbitrary: the product is rounded (once in fp32, then to bf16), so allow
          // one bf16 ulp.
          const double tol = c.layout == KvLayout::fp8_per_tensor ? std::abs(want[d]) / 128 : 0.0;
          ASSERT_NEAR(dsv4::bf16_bits_to_float(got[d]), want[d], tol)
              << "request " << r << " row " << j << " dim " << d;
        }
      }
    }
  }
};

class GatherGrid : public ::testing::TestWithParam<GatherCase> {};

TEST_P(GatherGrid, MatchesHandDecodedRows) {
  GatherProblem p(GetParam(), 21);
  p.run();
  p.expect_matches_reference();
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GatherGrid,
    ::testing::Values(GatherCase{"model1_compressed", KvLayout::model1_fp8, 64, 3, 150, false, 0},
                      GatherCase{"model1_swa", KvLayout::model1_fp8, 64, 4, 300, true, 200},
                      GatherCase{"model1_tiny_blocks", KvLayout::model1_fp8, 2, 3, 21, false, 5},
                      GatherCase{"v32", KvLayout::v32_fp8, 64, 3, 130, false, 0},
                      GatherCase{"v32_swa", KvLayout::v32_fp8, 16, 3, 90, true, 7},
                      GatherCase{"bf16", KvLayout::bf16, 16, 2, 40, false, 3},
                      GatherCase{"fp8_per_tensor", KvLayout::fp8_per_tensor, 16, 2, 40, true, 1}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Gather, BadInputThrowsAndWritesNothing) {
  GatherProblem p(GatherCase{"bad", KvLayout::model1_fp8, 16, 3, 60, true, 4}, 5);
  // Request 0 has seq_len 60; find its first gathered block entry to break it.
  const int len0 = p.seq_lens.data<int32_t>()[0], g0 = p.gather_lens.data<int32_t>()[0];
  const int64_t needed_block = (len0 - g0) / 16;
  HostTensor ws_576(DType::bf16, {3, p.rows, 576}), table_bad(DType::int32, {2, 4});
  HostTensor wide_table(DType::int32, {3, p.rows * 256});
  struct Bad {
    const char* what;
    std::function<void(dsv4::TensorView& ws, dsv4::TensorView& table, int64_t& offset)> mutate;
  };
  const auto set = [](const HostTensor& t, int64_t i, int32_t v) { t.data<int32_t>()[i] = v; };
  const std::vector<Bad> cases = {
      {"workspace.shape", [&](auto& ws, auto&, auto&) { ws = ws_576; }},
      {"block_table.shape", [&](auto&, auto& t, auto&) { t = table_bad; }},
      {"offset", [&](auto&, auto&, auto& off) { off = -1; }},
      {"workspace.shape[1]", [&](auto&, auto&, auto& off) { off = p.rows; }},
      {"seq_lens[2]", [&](auto&, auto&, auto&) { set(p.seq_lens, 2, -4); }},
      {"gather_lens[0]", [&](auto&, auto&, auto&) { set(p.gather_lens, 0, len0 + 1); }},
      {"gather_lens[1]", [&](auto&, auto&, auto&) { set(p.gather_lens, 1, -1); }},
      {"block_table[0]", [&](auto&, auto&, auto&) { set(p.block_table, needed_block, -1); }},
      {"block_table[0]", [&](auto&, auto&, auto&) { set(p.block_table, needed_block, 1000); }},
      {"workspace: expected an output whose elements do not overlap",
       [&](auto& ws, auto&, auto&) { ws.strides[1] = 0; }},
      {"workspace: expected memory disjoint from block_table",
       [&](auto& ws, auto& t, auto&) {  // a table wide enough to hold the whole workspace view
         t = wide_table;
         ws = dsv4::TensorView(t.data, DType::bf16, {3, p.rows, 512});
       }},
      {"block_table[0]", [&](auto&, auto&, auto&) {  // entries beyond the table
         set(p.seq_lens, 0, 100);
         set(p.gather_lens, 0, 50);
       }},
  };
  const std::vector<int32_t> table(p.block_table.data<int32_t>(), p.block_table.data<int32_t>() + p.block_table.numel());
  const std::vector<int32_t> lens(p.seq_lens.data<int32_t>(), p.seq_lens.data<int32_t>() + 3);
  const std::vector<int32_t> glens(p.gather_lens.data<int32_t>(), p.gather_lens.data<int32_t>() + 3);
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.what);
    std::copy(table.begin(), table.end(), p.block_table.data<int32_t>());
    std::copy(lens.begin(), lens.end(), p.seq_lens.data<int32_t>());
    std::copy(glens.begin(), glens.end(), p.gather_lens.data<int32_t>());
    dsv4::TensorView ws = p.workspace, tv = p.block_table;
    int64_t offset = 4;
    bad.mutate(ws, tv, offset);
    try {
      dsv4::dequantize_and_gather(p.cache->view(), tv, p.seq_lens, p.gather_lens, offset, ws);
      ADD_FAILURE() << "no error";
    } catch (const dsv4::Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad.what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("dequantize_and_gather"), std::string::npos) << e.what();
    }
    for (int64_t i = 0; i < p.workspace.numel(); ++i)
      ASSERT_EQ(p.workspace.data<uint16_t>()[i], kPoison) << i;
  }
}

}  // namespace
