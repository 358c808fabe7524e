// Fuzzed compressor (compressor.h) and indexer (indexer.h) ops.
#include <algorithm>

#include "dsv4/compressor.h"
#include "dsv4/indexer.h"
#include "op_table.h"

namespace dsv4::fuzz {

namespace {

DType float_dtype(Rng& rng) { return draw_of(rng, {DType::bf16, DType::fp32}); }
Arg positions(DType t, int64_t T, int64_t lo, int64_t hi) { return ints("positions", t, {T}, lo, hi); }

// ---- compressor config as scalars ----------------------------------------------------------------
// The three configurations the model uses: C4A indexer keys (D 128, r 4), C4A (D 512, r 4) and
// C128A (D 512, r 128) KV entries.
CompressorConfig draw_config(Rng& rng) {
  CompressorConfig cfg;
  switch (draw(rng, 0, 2)) {
    case 0: cfg.head_dim = 128, cfg.ratio = 4, cfg.target = CompressorTarget::indexer_keys; break;
    case 1: cfg.head_dim = 512, cfg.ratio = 4; break;
    default: cfg.head_dim = 512, cfg.ratio = 128; break;
  }
  return cfg;
}
void add_config(Case& c, const CompressorConfig& cfg) {
  c.scalars.push_back({"cfg.head_dim", static_cast<double>(cfg.head_dim), true});
  c.scalars.push_back({"cfg.ratio", static_cast<double>(cfg.ratio), true});
  c.scalars.push_back({"cfg.rope_dims", static_cast<double>(cfg.rope_dims), true});
  c.scalars.push_back({"cfg.eps", cfg.eps, false});
  c.scalars.push_back({"cfg.target", static_cast<double>(cfg.target), true});
}
CompressorConfig config(const Bound& b) {
  CompressorConfig cfg;
  cfg.head_dim = static_cast<int>(b.i("cfg.head_dim"));
  cfg.ratio = static_cast<int>(b.i("cfg.ratio"));
  cfg.rope_dims = static_cast<int>(b.i("cfg.rope_dims"));
  cfg.eps = b.f("cfg.eps");
  cfg.target = static_cast<CompressorTarget>(static_cast<uint8_t>(b.i("cfg.target")));
  return cfg;
}

Case make_compressor_project(Rng& rng) {
  Case c;
  const CompressorConfig cfg = draw_config(rng);
  const int64_t T = draw(rng, 1, 4), dim = draw_of<int64_t>(rng, {32, 64}), W = cfg.proj_width();
  const DType t = float_dtype(rng);
  c.args.push_back(real("x", t, {T, dim}));
  c.args.push_back(real("wkv", t, {W, dim}));
  c.args.push_back(real("wgate", t, {W, dim}));
  c.args.push_back(real("ape", DType::fp32, {cfg.ratio, W}));
  c.args.push_back(positions(draw_of(rng, {DType::int32, DType::int64}), T, 0, 1000));
  c.args.push_back(output("kv_rows", DType::fp32, {T, W}));
  c.args.push_back(output("score_rows", DType::fp32, {T, W}));
  add_config(c, cfg);
  return c;
}
void call_compressor_project(const Bound& b) {
  compressor_project(config(b), b.t("x"), b.t("wkv"), b.t("wgate"), b.t("ape"), b.t("positions"),
                     b.t("kv_rows"), b.t("score_rows"));
}

// One call of 1–2 requests, each a run of consecutive positions continuing its context, with
// every ring row and every emitted entry mapped.
Case make_compressor_update(Rng& rng) {
  Case c;
  const CompressorConfig cfg = draw_config(rng);
  const int64_t R = draw(rng, 1, 2), W = cfg.proj_width(), r = cfg.ratio;
  std::vector<int64_t> pos, req, ctx;
  int64_t most_entries = 0, end_max = 0;
  for (int64_t q = 0; q < R; ++q) {
    const int64_t start = draw(rng, 0, 2 * r), n = draw(rng, 0, 5);
    ctx.push_back(start);
    for (int64_t k = 0; k < n; ++k) pos.push_back(start + k), req.push_back(q);
    most_entries = std::max(most_entries, compressor_entries_after(static_cast<int>(r), start + n));
    end_max = std::max(end_max, start + n);
  }
  const int64_t T = static_cast<int64_t>(pos.size());
  const DType pos_t = draw_of(rng, {DType::int32, DType::int64});
  c.args.push_back(real("kv_rows", DType::fp32, {T, W}));
  c.args.push_back(real("score_rows", DType::fp32, {T, W}));
  c.args.push_back(list("positions", pos_t, {T}, pos));
  c.args.push_back(list("token_to_req", DType::int32, {T}, req));
  c.args.push_back(list("context_lens", pos_t, {R}, ctx));
  c.args.push_back(real("norm_weight", float_dtype(rng), {cfg.head_dim}));
  c.args.push_back(rope_table(end_max + r, cfg.rope_dims));
  // Ring: coff·r rows per request in blocks of state_block rows.
  const int64_t state_block = draw_of<int64_t>(rng, {4, 8, 64}),
                ring_blocks = (cfg.ring_rows() + state_block - 1) / state_block;
  c.args.push_back(real("state.rows", DType::fp32, {R * ring_blocks * state_block, cfg.state_width()}, Role::inout));
  Arg state_table = list("state.block_table", DType::int32, {R, ring_blocks},
                         distinct(rng, R * ring_blocks, R * ring_blocks));
  c.args.push_back(state_table);
  c.scalars.push_back({"state.block_size", static_cast<double>(state_block), true});
  // Output: a paged cache with a distinct block for every entry the requests hold.
  const int bs = static_cast<int>(draw_of<int64_t>(rng, {1, 2, 64}));
  const int64_t max_blocks = std::max<int64_t>(1, (most_entries + bs - 1) / bs), blocks = R * max_blocks;
  if (cfg.target == CompressorTarget::kv_cache) {
    add_kv_cache(c, "kv_cache", draw_of(rng, {KvLayout::model1_fp8, KvLayout::bf16, KvLayout::fp8_per_tensor}),
                 bs, blocks, Role::inout);
  } else {
    c.args.push_back(bytes("indexer_keys", {blocks, bs * indexer_keys::kEntryBytes}, Role::inout));
    c.scalars.push_back({"kv_cache.layout", 0, true});
    c.scalars.push_back({"kv_cache.block_size", 64, true});
    c.scalars.push_back({"kv_cache.tensor_scale", 1.0, false});
  }
  c.scalars.push_back({"indexer_keys.block_size", static_cast<double>(bs), true});
  c.args.push_back(list("out.block_table", DType::int32, {R, max_blocks}, distinct(rng, blocks, blocks)));
  if (coin(rng)) c.args.push_back(output("entries", DType::fp32, {T, cfg.head_dim}));
  add_config(c, cfg);
  return c;
}
void call_compressor_update(const Bound& b) {
  const CompressorStateView state{b.t("state.rows"), b.t("state.block_table"),
                                  static_cast<int>(b.i("state.block_size"))};
  const CompressorOutputView out{
      b.kv("kv_cache"), {b.t("indexer_keys"), static_cast<int>(b.i("indexer_keys.block_size"))},
      b.t("out.block_table")};
  compressor_update_and_emit(config(b), b.t("kv_rows"), b.t("score_rows"),
                             {b.t("positions"), b.t("token_to_req"), b.t("context_lens")},
                             b.t("norm_weight"), b.t("cos_sin"), state, out, b.t("entries"));
}

// ---- indexer ----------------------------------------------------------------------------------------
Case make_indexer_query(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 3), QL = 128 * draw(rng, 1, 2), HI = draw_of<int64_t>(rng, {1, 2, 4}),
                dim = draw_of<int64_t>(rng, {32, 64}), P = draw(rng, 1, 40);
  const DType qt = float_dtype(rng), xt = float_dtype(rng);
  c.args.push_back(real("qr", qt, {T, QL}));
  c.args.push_back(real("wq_b", qt, {HI * 128, QL}));
  c.args.push_back(real("x", xt, {T, dim}));
  c.args.push_back(real("weights_proj", xt, {HI, dim}));
  c.args.push_back(positions(draw_of(rng, {DType::int32, DType::int64}), T, 0, P - 1));
  c.args.push_back(rope_table(P));
  c.args.push_back(output("q_fp8", DType::fp8_e4m3, {T, HI, 128}));
  c.args.push_back(output("q_scale", DType::fp32, {T, HI}));
  c.args.push_back(output("weights", DType::fp32, {T, HI}));
  c.args.push_back(bytes("workspace", {indexer_query_workspace_bytes(T, static_cast<int>(HI))}, Role::output));
  return c;
}
void call_indexer_query(const Bound& b) {
  indexer_query(b.t("qr"), b.t("qr_scale"), b.t("wq_b"), b.t("wq_b_scale"), b.t("x"),
                b.t("weights_proj"), b.t("positions"), b.t("cos_sin"), b.t("q_fp8"), b.t("q_scale"),
                b.t("weights"), b.t("workspace"));
}

Case make_indexer_scores(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 3), HI = draw(rng, 1, 4), R = draw(rng, 1, 2), ratio = 4,
                max_pos = 40, visible = max_pos / ratio;
  const int bs = static_cast<int>(draw_of<int64_t>(rng, {1, 4, 64}));
  const int64_t max_blocks = (visible + bs - 1) / bs, blocks = R * max_blocks;
  c.args.push_back(real("q_fp8", DType::fp8_e4m3, {T, HI, 128}));
  c.args.push_back(real("q_scale", DType::fp32, {T, HI}));
  c.args.push_back(real("weights", DType::fp32, {T, HI}));
  c.args.push_back(positions(draw_of(rng, {DType::int32, DType::int64}), T, 0, max_pos - 1));
  c.args.push_back(ints("token_to_req", DType::int32, {T}, 0, R - 1));
  c.args.push_back(bytes("keys", {blocks, bs * indexer_keys::kEntryBytes}));
  c.args.push_back(list("key_block_table", DType::int32, {R, max_blocks}, distinct(rng, blocks, blocks)));
  c.args.push_back(output("scores", DType::fp32, {T, visible + draw(rng, 0, 3)}));
  c.scalars.push_back({"keys.block_size", static_cast<double>(bs), true});
  c.scalars.push_back({"ratio", static_cast<double>(ratio), true});
  return c;
}
void call_indexer_scores(const Bound& b) {
  indexer_scores(b.t("q_fp8"), b.t("q_scale"), b.t("weights"), b.t("positions"), b.t("token_to_req"),
                 {b.t("keys"), static_cast<int>(b.i("keys.block_size"))}, b.t("key_block_table"),
                 static_cast<int>(b.i("ratio")), b.t("scores"));
}

// Top-k and C128A prefix indices: positions whose visible count fits the N (or K) columns.
Case make_indexer_topk(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 4), N = draw(rng, 1, 12), K = draw(rng, 1, 8), ratio = draw(rng, 1, 8);
  c.args.push_back(real("scores", DType::fp32, {T, N}));
  c.args.push_back(positions(draw_of(rng, {DType::int32, DType::int64}), T, 0, ratio * N - 1));
  c.args.push_back(output("indices", DType::int32, {T, K}));
  if (coin(rng)) c.args.push_back(output("lens", DType::int32, {T}));
  c.scalars.push_back({"ratio", static_cast<double>(ratio), true});
  c.scalars.push_back({"order", coin(rng) ? 1.0 : 0.0, true});  // TopkOrder: 0 score, 1 column
  return c;
}
void call_indexer_topk(const Bound& b) {
  indexer_topk(b.t("scores"), b.t("positions"), static_cast<int>(b.i("ratio")), b.t("indices"),
               b.t("lens"), nullptr, static_cast<TopkOrder>(static_cast<int>(b.i("order"))));
}

Case make_compressed_prefix(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 4), K = draw(rng, 1, 8), ratio = draw_of<int64_t>(rng, {4, 128});
  c.args.push_back(positions(draw_of(rng, {DType::int32, DType::int64}), T, 0, ratio * K - 1));
  c.args.push_back(output("indices", DType::int32, {T, K}));
  if (coin(rng)) c.args.push_back(output("lens", DType::int32, {T}));
  c.scalars.push_back({"ratio", static_cast<double>(ratio), true});
  return c;
}
void call_compressed_prefix(const Bound& b) {
  compressed_prefix_indices(b.t("positions"), static_cast<int>(b.i("ratio")), b.t("indices"), b.t("lens"));
}

}  // namespace

void add_compressor_indexer_ops(std::vector<OpSpec>& ops) {
  ops.push_back({"compressor_project", make_compressor_project, call_compressor_project});
  ops.push_back({"compressor_update_and_emit", make_compressor_update, call_compressor_update});
  ops.push_back({"indexer_query", make_indexer_query, call_indexer_query});
  ops.push_back({"indexer_scores", make_indexer_scores, call_indexer_scores});
  ops.push_back({"indexer_topk", make_indexer_topk, call_indexer_topk});
  ops.push_back({"compressed_prefix_indices", make_compressed_prefix, call_compressed_prefix});
}

}  // namespace dsv4::fuzz
