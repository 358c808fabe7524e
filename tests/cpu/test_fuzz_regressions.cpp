// Regressions of the bugs the op fuzzer (tests/fuzz, `dsv4_fuzz`) found, one test each, written
// as the fuzzer drew them: the call must throw dsv4::Error naming the argument, and no byte of any
// buffer the call could write may change.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dsv4/compressor.h"
#include "dsv4/indexer.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#include "dsv4/synthetic.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;
using dsv4::TensorView;

// Runs `call`, which must throw dsv4::Error containing `part`, and checks that every buffer in
// `written` kept its bytes.
void expect_rejected(const std::function<void()>& call, const std::string& part,
                     const std::vector<const HostTensor*>& written) {
  std::vector<std::vector<uint8_t>> before;
  for (const HostTensor* b : written)
    before.emplace_back(b->data<uint8_t>(), b->data<uint8_t>() + b->nbytes());
  try {
    call();
    ADD_FAILURE() << "expected dsv4::Error containing '" << part << "'";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  for (size_t k = 0; k < written.size(); ++k)
    EXPECT_EQ(0, std::memcmp(written[k]->data<uint8_t>(), before[k].data(), before[k].size()))
        << "buffer " << k << " changed although the call was rejected";
}

HostTensor poisoned(DType t, std::vector<int64_t> dims) {
  HostTensor h(t, std::move(dims));
  h.fill_bytes(0x5A);
  return h;
}

// inv_rope_fp8_quant checked its outputs against o only: an o_scale lying over `positions` was
// accepted, and the scales it wrote became positions that indexed far outside cos_sin (SIGSEGV).
TEST(FuzzRegressions, InvRopeFp8QuantScaleOverPositions) {
  const int64_t T = 4, H = 2, D = 512, block = 64;
  const HostTensor o = HostTensor::zeros(DType::bf16, {T, H, D});
  const HostTensor cos_sin = dsv4::build_rope_cache(dsv4::RopeConfig{}, 34);
  HostTensor fp8 = poisoned(DType::fp8_e4m3, {T, H * D});
  // One buffer: positions (int64 [T]) at its start, o_scale (ue8m0 [T, H*D/block]) over it.
  HostTensor shared = HostTensor::zeros(DType::uint8, {T * H * D / block});
  TensorView positions(shared.data<uint8_t>(), DType::int64, {T});
  TensorView o_scale(shared.data<uint8_t>(), DType::ue8m0, {T, H * D / block});
  expect_rejected(
      [&] { dsv4::inv_rope_fp8_quant(o, positions, cos_sin, block, fp8, o_scale); },
      "inv_rope_fp8_quant: o_scale: expected memory disjoint from positions", {&fp8, &shared});
}

// A negative dim passed the ops' wildcard shape checks: indexer_topk looped over indices [T, -1]
// (SIGSEGV), synthetic_hidden sized a row buffer from out [T, -1] (std::length_error inside an
// OpenMP region: std::terminate). Every shape check now refuses a negative size.
TEST(FuzzRegressions, NegativeDimIndexerTopk) {
  const HostTensor scores = HostTensor::zeros(DType::fp32, {3, 1});
  const HostTensor positions = HostTensor::zeros(DType::int32, {3});
  HostTensor indices = poisoned(DType::int32, {3, 4});
  TensorView bad = indices.view();
  bad.shape[1] = -1;
  expect_rejected([&] { dsv4::indexer_topk(scores, positions, 7, bad); },
                  "indexer_topk: indices.shape[1]: expected a size >= 0, got -1", {&indices});
}

TEST(FuzzRegressions, NegativeDimSyntheticHidden) {
  const HostTensor req = HostTensor::zeros(DType::int64, {3});
  const HostTensor pos = HostTensor::zeros(DType::int64, {3});
  HostTensor out = poisoned(DType::bf16, {3, 64});
  TensorView bad = out.view();
  bad.shape[1] = -1;
  expect_rejected([&] { dsv4::synthetic_hidden(req, pos, 771, bad); },
                  "synthetic_hidden: out.shape[1]: expected a size >= 0, got -1", {&out});
}

// The arguments of an indexer_scores call over zero queries (2 tokens, 1 head, ratio 4) but the
// keys and the key block table, which each test sets.
struct ScoresCall {
  static constexpr int64_t T = 2, HI = 1, bs = 4;
  HostTensor q = HostTensor::zeros(DType::fp8_e4m3, {T, HI, 128});
  HostTensor q_scale = HostTensor::zeros(DType::fp32, {T, HI});
  HostTensor weights = HostTensor::zeros(DType::fp32, {T, HI});
  HostTensor positions = HostTensor::zeros(DType::int32, {T});
  HostTensor token_to_req = HostTensor::zeros(DType::int32, {T});
  HostTensor scores = poisoned(DType::fp32, {T, 2});
  void run(const TensorView& keys, const TensorView& table) {
    dsv4::indexer_scores(q, q_scale, weights, positions, token_to_req, {keys, bs}, table, 4, scores);
  }
};

// check_indexer_key_cache accepted any base address and block stride, but the scores read (and
// the compressor writes) each entry's fp32 scale in place: a key cache one byte off its
// allocation was read through misaligned float loads (UBSan: undefined behaviour).
TEST(FuzzRegressions, IndexerKeyCacheMisaligned) {
  ScoresCall c;
  const int64_t block_bytes = ScoresCall::bs * 132;
  const HostTensor table = HostTensor::zeros(DType::int32, {1, 1});
  const HostTensor keys = HostTensor::zeros(DType::uint8, {2 * block_bytes + 1});
  const TensorView shifted(keys.data<uint8_t>() + 1, DType::uint8, {1, block_bytes});
  expect_rejected([&] { c.run(shifted, table); },
                  "indexer_scores: keys.data pointer: expected 4-byte aligned", {&c.scores});
  // Blocks closer than a block's bytes overlap: refused too.
  TensorView overlapping(keys.data<uint8_t>(), DType::uint8, {2, block_bytes});
  overlapping.strides[0] = 4;
  expect_rejected([&] { c.run(overlapping, table); },
                  "indexer_scores: keys.data.stride(0) (block stride, bytes): expected >= 528",
                  {&c.scores});
}

// indexer_scores sized per-request buffers by key_block_table's rows: a broadcast table
// [2^40, max_blocks] (stride 0, a few bytes of memory) made it allocate 2^40 vectors
// (std::bad_alloc, not dsv4::Error). It now sizes them by the requests the batch's tokens name,
// and the call succeeds.
TEST(FuzzRegressions, IndexerScoresBroadcastTable) {
  ScoresCall c;
  c.positions.data<int32_t>()[1] = 7;  // sees entries 0 and 1
  c.token_to_req.data<int32_t>()[1] = 1;
  const HostTensor row = HostTensor::zeros(DType::int32, {1});  // every request: block 0
  TensorView table(row.data<int32_t>(), DType::int32, {int64_t{1} << 40, 1});
  table.strides[0] = 0;
  const HostTensor keys = HostTensor::zeros(DType::uint8, {1, ScoresCall::bs * 132});
  c.run(keys, table);
  EXPECT_EQ(c.scores.get(0), -INFINITY);  // token 0 (position 0) sees nothing
  EXPECT_EQ(c.scores.get(2), 0.0f);       // token 1: zero keys score 0
  EXPECT_EQ(c.scores.get(3), 0.0f);
}

// compressor_update_and_emit sized the ring's block table as (ring_rows + state.block_size - 1)
// in int: state.block_size = INT32_MAX overflowed (UBSan), the minimum went negative and a table
// with no columns passed, to be read past its end.
TEST(FuzzRegressions, CompressorStateBlockSizeOverflow) {
  const dsv4::CompressorConfig cfg{128, 4, 64, 1e-6f, dsv4::CompressorTarget::indexer_keys};
  const int64_t W = cfg.proj_width();
  const HostTensor kv_rows = HostTensor::zeros(DType::fp32, {1, W});
  const HostTensor score_rows = HostTensor::zeros(DType::fp32, {1, W});
  const HostTensor zero64 = HostTensor::zeros(DType::int64, {1});
  const HostTensor req = HostTensor::zeros(DType::int32, {1});
  const HostTensor norm = HostTensor::zeros(DType::fp32, {cfg.head_dim});
  const HostTensor cos_sin = dsv4::build_rope_cache(dsv4::RopeConfig{}, 8);
  HostTensor state = poisoned(DType::fp32, {8, cfg.state_width()});
  const HostTensor state_table = HostTensor::zeros(DType::int32, {1, 0});
  HostTensor keys = poisoned(DType::uint8, {1, dsv4::indexer_keys::kEntryBytes});
  const HostTensor key_table = HostTensor::zeros(DType::int32, {1, 1});
  expect_rejected(
      [&] {
        dsv4::compressor_update_and_emit(cfg, kv_rows, score_rows, {zero64, req, zero64}, norm,
                                         cos_sin, {state, state_table, INT32_MAX},
                                         {{}, {keys, 1}, key_table});
      },
      "compressor_update_and_emit: state.block_table.shape[1]: expected >= 1", {&state, &keys});
}

}  // namespace
