// The cost model of `dsv4 bench layer` (tools/dsv4/layer_cost_model.h): its per-op FLOPs and bytes
// against hand-derived values of the real V4-Flash shapes, the step reductions (attended rows,
// compressor rings, emitted entries), the floor arithmetic, and that every op the layer marks
// through its OpTimer has an entry (a new op must get one, or its floor would silently be 0).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "dsv4/communicator.h"
#include "dsv4/layer.h"
#include "dsv4/weights.h"
#include "layer_cost_model.h"
#include "layer_test_support.h"

namespace {

using dsv4::BatchPlan;
using dsv4::LayerKind;
using dsv4::ModelConfig;
using dsv4::RequestStep;
using dsv4::bench::Ceilings;
using dsv4::bench::OpCost;
using dsv4::bench::StepShape;
using dsv4::bench::op_cost;

StepShape shape(const char* model, LayerKind kind, const std::vector<RequestStep>& steps, bool fp8 = true) {
  return StepShape::make(ModelConfig::builtin(model), kind, BatchPlan::make(steps), fp8);
}

OpCost cost(const char* op, const StepShape& s) {
  const auto c = op_cost(op, s);
  EXPECT_TRUE(c.has_value()) << op;
  return c.value_or(OpCost{});
}

std::vector<RequestStep> decodes(int n, int64_t context) {
  std::vector<RequestStep> steps;
  for (int i = 0; i < n; ++i) steps.push_back({i, context, 1});
  return steps;
}

// V4-Flash: dim 4096, q_lora 1024, H 64 x D 512, G 8 x o_lora 1024.
TEST(LayerCostModel, GemmsCountWeightsAtTheirStoredBytes) {
  const double T = 128;
  const StepShape fp8 = shape("v4-flash", LayerKind::swa, decodes(128, 4096));
  const OpCost wq_a = cost("wq_a", fp8);
  EXPECT_DOUBLE_EQ(wq_a.flop_fp8, 2 * T * 4096 * 1024);
  EXPECT_DOUBLE_EQ(wq_a.flop_bf16, 0);
  // FP8 weight + one UE8M0 scale per 128x128 block, bf16 x in, fp32 out.
  EXPECT_DOUBLE_EQ(wq_a.bytes, 4096.0 * 1024 + 8 * 32 + T * 4096 * 2 + T * 1024 * 4);
  const OpCost wo_a = cost("wo_a", fp8);
  EXPECT_DOUBLE_EQ(wo_a.flop_fp8, 2 * T * 64 * 512 * 1024);
  EXPECT_DOUBLE_EQ(wo_a.bytes, 8 * (1024.0 * 4096 + 8 * 32) + T * 64 * 512 * 2 + T * 8 * 1024 * 2);

  const StepShape bf16 = shape("v4-flash", LayerKind::swa, decodes(128, 4096), /*fp8=*/false);
  const OpCost wq_a16 = cost("wq_a", bf16);
  EXPECT_DOUBLE_EQ(wq_a16.flop_bf16, 2 * T * 4096 * 1024);
  EXPECT_DOUBLE_EQ(wq_a16.flop_fp8, 0);
  EXPECT_DOUBLE_EQ(wq_a16.bytes, 2 * 4096.0 * 1024 + T * 4096 * 2 + T * 1024 * 4);
}

// docs/performance.md / issue 14: a 16384-token V4-Flash C4A prefill is ~4.1 TFLOP of GEMMs.
TEST(LayerCostModel, FlashC4aPrefillGemmsAreAbout4Point1Tflop) {
  std::vector<RequestStep> steps;
  for (int i = 0; i < 8; ++i) steps.push_back({i, 0, 2048});
  const StepShape s = shape("v4-flash", LayerKind::c4a, steps);
  double flop = 0;
  for (const char* op : {"wq_a", "wkv", "wq_b", "compressor", "indexer_compressor", "indexer_query", "wo_a", "wo_b"})
    flop += cost(op, s).flop();
  const double T = 16384;
  const double expected = 2 * T *
                          (4096.0 * 1024 + 4096.0 * 512 + 1024.0 * 32768  // wq_a, wkv, wq_b
                           + 2 * 4096.0 * 1024 + 2 * 4096.0 * 256        // compressors (2 x coff*D rows)
                           + 1024.0 * 8192 + 4096.0 * 64                  // indexer q, weights
                           + 32768.0 * 1024 + 8192.0 * 4096);             // wo_a, wo_b
  EXPECT_NEAR(flop, expected, 1e-12 * expected);
  EXPECT_NEAR(flop, 4.13e12, 0.01e12);
  // The compressors' weights are bf16 in the checkpoint: bf16 rate even with FP8 weights.
  EXPECT_GT(cost("compressor", s).flop_bf16, 0);
  EXPECT_EQ(cost("compressor", s).flop_fp8, 0);
}

// Issue 14: a V4-Flash C4A decode of 128 requests at context 4096 moves ~126 MB of FP8 weights
// (~137 MB here: the compressors' weights are bf16 in the checkpoint), ~48 MB of KV and ~17 MB of
// indexer keys. The op-by-op floor adds what passes between the ops: q / o [128, 64, 512] bf16 is
// 8.4 MB per pass, and several ops read or write it.
TEST(LayerCostModel, FlashC4aDecodeMatchesTheIssuesFloor) {
  const StepShape s = shape("v4-flash", LayerKind::c4a, decodes(128, 4096));
  // 128 + min(512, 4097 / 4) rows per token, 584 B each; q and o once; 640 int32 slots, a length
  // and H lse values per token; the sink.
  EXPECT_DOUBLE_EQ(s.decode_rows, 128.0 * 640);
  const OpCost attn = cost("sparse_decode", s);
  EXPECT_DOUBLE_EQ(attn.flop_bf16, 2.0 * 64 * 128 * 640 * 1024);
  EXPECT_DOUBLE_EQ(attn.bytes, 128.0 * 640 * 584 + 2 * 128.0 * 64 * 512 * 2 + 128.0 * (640 * 4 + 4 + 64 * 4) + 64 * 4);
  const OpCost scores = cost("indexer_scores", s);
  EXPECT_GE(scores.bytes, 128.0 * 1024 * 132);
  EXPECT_LT(scores.bytes, 1.1 * 128.0 * 1024 * 132);
  EXPECT_DOUBLE_EQ(scores.flop_fp8, 2.0 * 64 * 128 * 128 * 1024);

  const Ceilings ceil{1396, 780, 2960};
  double floor = 0, bytes = 0, weights = 0;
  for (const char* op : {"wq_a", "wkv", "qkv_norm", "wq_b", "qnorm_rope_kv_insert", "compressor",
                         "indexer_compressor", "indexer_query", "indexer_scores", "indexer_topk", "decode_indices",
                         "sparse_decode", "inverse_rope", "act_quant", "act_dequant", "wo_a", "wo_b"}) {
    floor += cost(op, s).floor_us(ceil);
    bytes += cost(op, s).bytes;
  }
  using dsv4::bench::weight_bytes;
  weights = weight_bytes(1024, 4096, true) + weight_bytes(512, 4096, true) + weight_bytes(32768, 1024, true) +
            8 * weight_bytes(1024, 4096, true) + weight_bytes(4096, 8192, true)  // wq_a wkv wq_b wo_a wo_b
            + 2 * weight_bytes(1024, 4096, false) + 2 * weight_bytes(256, 4096, false)  // compressors
            + weight_bytes(8192, 1024, true) + weight_bytes(64, 4096, false);          // indexer
  EXPECT_NEAR(weights, 137e6, 1e6);
  const double kv_and_keys = 128.0 * 640 * 584 + 128.0 * 1024 * 132;
  EXPECT_GT(bytes, weights + kv_and_keys);
  EXPECT_LT(bytes, weights + kv_and_keys + 120e6);  // activations between ops
  EXPECT_NEAR(floor, 1e-3 * bytes / 2960, 1.0);     // every op memory-bound at 128 tokens
}

TEST(LayerCostModel, StepShapeCountsRowsRingsAndEntries) {
  // C128A (ratio 128, one ring window): a chunk continuing context 4000 by 200 tokens emits entry
  // 31 (positions 3968..4095), whose rows 3968..3999 come from the ring; a decode at 300 emits none.
  const StepShape c128 = shape("v4-flash", LayerKind::c128a, {{1, 300, 1}, {2, 4000, 200}});
  EXPECT_EQ(c128.decodes, 1);
  EXPECT_EQ(c128.prefill_tokens, 200);
  EXPECT_DOUBLE_EQ(c128.emitted, 1);
  EXPECT_DOUBLE_EQ(c128.ring_writes, 1 + 128);
  EXPECT_DOUBLE_EQ(c128.ring_reads, 4000 - 31 * 128);
  EXPECT_DOUBLE_EQ(c128.decode_rows, 128 + 301 / 128);
  EXPECT_DOUBLE_EQ(c128.gathered_rows, (200 + 127) + 4200 / 128);
  EXPECT_DOUBLE_EQ(c128.topk_width, 4200 / 128);
  EXPECT_DOUBLE_EQ(c128.decode_slots, 128 + 4200 / 128);

  // C4A from context 0: Σ_{k=1}^{2048} floor(k / 4) keys scored, 512 entries, no ring reads.
  const StepShape c4 = shape("v4-flash", LayerKind::c4a, {{0, 0, 2048}});
  EXPECT_DOUBLE_EQ(c4.visible, 4.0 * 511 * 512 / 2 + 512);
  EXPECT_DOUBLE_EQ(c4.topk_scores_read, 0);  // nobody sees more than the top-512
  EXPECT_DOUBLE_EQ(c4.emitted, 512);
  EXPECT_DOUBLE_EQ(c4.key_rows, 512);
  EXPECT_DOUBLE_EQ(c4.ring_reads, 0);
  EXPECT_DOUBLE_EQ(c4.ring_writes, 8);
  EXPECT_DOUBLE_EQ(c4.gathered_rows, 2048 + 512);
  EXPECT_DOUBLE_EQ(c4.topk_width, 512);
  // A chunk at positions 2040..2055 sees 510..514 entries: the top-k reads the scores of the five
  // tokens that see more than 512 (positions 2051..2054 see 513, 2055 sees 514).
  const StepShape c4_edge = shape("v4-flash", LayerKind::c4a, {{0, 2040, 16}});
  EXPECT_DOUBLE_EQ(c4_edge.topk_scores_read, 4 * 513 + 514);

  // MTP: two tokens per request are decode-like, attended token by token: four decode tokens,
  // each with its own 128-row window, nothing gathered.
  const StepShape mtp = shape("v4-flash", LayerKind::swa, {{0, 4096, 2}, {1, 4096, 2}});
  EXPECT_EQ(mtp.decodes, 4);
  EXPECT_EQ(mtp.prefill_tokens, 0);
  EXPECT_DOUBLE_EQ(mtp.decode_rows, 4 * 128);
  EXPECT_DOUBLE_EQ(mtp.gathered_rows, 0);
  // Past BatchPlan::kMaxDecodeLikeTokens new tokens, or from context 0, a request is a prefill
  // chunk: its rows are gathered once.
  const StepShape chunk = shape("v4-flash", LayerKind::swa, {{0, 4096, 9}, {1, 0, 2}});
  EXPECT_EQ(chunk.decodes, 0);
  EXPECT_EQ(chunk.prefill_tokens, 11);
  EXPECT_DOUBLE_EQ(chunk.gathered_rows, (9 + 127) + 2);
}

TEST(LayerCostModel, FloorIsTheSlowerOfComputeAndMemory) {
  const Ceilings ceil{1000, 500, 2000};  // TFLOP/s, TFLOP/s, GB/s
  const OpCost compute{1e12, 5e11, 1e9};  // 1 ms fp8 + 1 ms bf16 vs 0.5 ms of bytes
  EXPECT_DOUBLE_EQ(compute.floor_us(ceil), 2000);
  EXPECT_EQ(compute.bound(ceil), "fp8");
  const OpCost memory{1e9, 0, 4e9};  // 1 µs of FLOPs vs 2 ms of bytes
  EXPECT_DOUBLE_EQ(memory.floor_us(ceil), 2000);
  EXPECT_EQ(memory.bound(ceil), "memory");
  EXPECT_THROW((void)compute.floor_us(Ceilings{0, 500, 2000}), dsv4::Error);
  EXPECT_THROW((void)memory.floor_us(Ceilings{1000, 500, 0}), dsv4::Error);
  EXPECT_DOUBLE_EQ(dsv4::bench::weight_bytes(200, 300, true), 200.0 * 300 + 2 * 3);
  EXPECT_DOUBLE_EQ(dsv4::bench::weight_bytes(200, 300, false), 2 * 200.0 * 300);
}

TEST(LayerCostModel, UnknownOpsHaveNoCost) {
  const StepShape s = shape("v4-flash", LayerKind::swa, decodes(1, 10));
  EXPECT_FALSE(op_cost("fused_inv_rope_fp8_quant_not_yet_modeled", s).has_value());
  EXPECT_FALSE(op_cost("", s).has_value());
  const std::vector<std::string> names = dsv4::bench::modeled_ops();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (const std::string& n : names) EXPECT_TRUE(op_cost(n, s).has_value()) << n;
}

// Records the op names a forward marks.
class NameRecorder : public dsv4::OpTimer {
 public:
  void begin(const char* op, dsv4::Stream) override { names.insert(op); }
  void end(dsv4::Stream) override { ++ends; }
  std::set<std::string> names;
  int ends = 0;
};

// Every op the CPU layer marks, for every kind and on both paths (decode, prefill), has a cost
// model entry. (The CUDA layer's extra act_dequant is checked by the GPU suite's bench run.)
TEST(LayerCostModel, EveryOpTheLayerMarksIsModeled) {
  const ModelConfig cfg = ModelConfig::builtin("tiny");  // ratios 0, 4, 128
  NameRecorder rec;
  for (int layer = 0; layer < 3; ++layer) {
    dsv4::AttentionOptions opts;
    opts.op_timer = &rec;
    dsv4::Attention a(cfg, layer, dsv4::random_attention_weights(cfg, layer, 3, true), opts);
    for (const std::vector<RequestStep>& steps :
         {std::vector<RequestStep>{{0, 0, 140}}, std::vector<RequestStep>{{0, 140, 1}, {1, 0, 20}}}) {
      const BatchPlan plan = BatchPlan::make(steps);
      dsv4_test::StepIo io = dsv4_test::step_io(plan, cfg.dim, 5);
      a.forward(plan, io.x, io.y);
    }
  }
  // A tensor-parallel rank also marks its all-reduce of y (a group of one: the sum is y itself).
  auto group = dsv4::make_in_process_group(1);
  dsv4::AttentionOptions rank_opts;
  rank_opts.op_timer = &rec;
  rank_opts.tp = {0, 1, group[0].get()};
  dsv4::Attention rank(cfg, 0, dsv4::random_attention_weights(cfg, 0, 3, true), rank_opts);
  const BatchPlan rank_plan = BatchPlan::make({{0, 0, 4}});
  dsv4_test::StepIo rank_io = dsv4_test::step_io(rank_plan, cfg.dim, 5);
  rank.forward(rank_plan, rank_io.x, rank_io.y);
  EXPECT_EQ(rec.ends, 7);
  for (const char* core : {"wq_a", "sparse_decode", "sparse_prefill", "compressor", "indexer_topk",
                           "compressed_indices", "wo_b", "tp_allreduce"})
    EXPECT_TRUE(rec.names.count(core)) << core;
  const StepShape s = shape("tiny", LayerKind::c4a, {{0, 140, 1}, {1, 0, 20}});
  for (const std::string& n : rec.names)
    EXPECT_TRUE(op_cost(n, s).has_value()) << "the layer marks op '" << n
                                           << "' but tools/dsv4/layer_cost_model.cpp has no entry for it";
}

}  // namespace
