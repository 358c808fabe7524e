// Fuzzed attention-side ops (ops.h, kv_layout.h): the fused KV insert, sparse decode / combine /
// prefill, the prefill gather, the bulk KV (de)quantizers, and the decode schedule.
#include "dsv4/ops.h"
#include "op_table.h"

namespace dsv4::fuzz {

namespace {

int cache_dim(KvLayout l) { return kv_geometry(l, 1).dim; }
int64_t slots_of(const Case& c, const std::string& cache) {
  return c.find(cache)->shape[0] * c.i(cache + ".block_size");
}

// ---- fused q norm + RoPE + KV insert ------------------------------------------------------------
Case make_qnorm_rope_kv_insert(Rng& rng) {
  Case c;
  const KvLayout layout = any_layout(rng);
  const int64_t D = cache_dim(layout), T = draw(rng, 1, 4), H = draw(rng, 1, 2), P = draw(rng, 1, 40);
  const int bs = static_cast<int>(draw_of<int64_t>(rng, {1, 2, 64}));
  const int64_t blocks = (T + bs - 1) / bs + draw(rng, 0, 1);
  c.args.push_back(real("q", DType::bf16, {T, H, D}, Role::inout));
  c.args.push_back(real("kv", DType::bf16, {T, D}, Role::inout));
  c.args.push_back(ints("positions", draw_of(rng, {DType::int32, DType::int64}), {T}, 0, P - 1));
  c.args.push_back(rope_table(P));
  add_kv_cache(c, "cache", layout, bs, blocks, Role::inout);
  c.args.push_back(list("slot_mapping", draw_of(rng, {DType::int32, DType::int64}), {T},
                        distinct(rng, T, blocks * bs, true)));
  c.scalars.push_back({"eps", 1e-6, false});
  return c;
}
void call_qnorm_rope_kv_insert(const Bound& b) {
  qnorm_rope_kv_insert(b.t("q"), b.t("kv"), b.t("positions"), b.t("cos_sin"), b.f("eps"),
                       b.kv("cache"), b.t("slot_mapping"));
}

// ---- sparse decode ---------------------------------------------------------------------------------
KvLayout attention_layout(Rng& rng) {
  return draw_of(rng, {KvLayout::model1_fp8, KvLayout::v32_fp8, KvLayout::bf16});
}

Case make_sparse_decode(Rng& rng) {
  Case c;
  const KvLayout layout = attention_layout(rng);
  const int64_t D = cache_dim(layout), B = draw(rng, 1, 2), S = draw(rng, 1, 2), H = draw(rng, 1, 3);
  const int bs = static_cast<int>(draw_of<int64_t>(rng, {1, 2, 64}));
  const int64_t blocks = draw(rng, 1, 3), topk = draw(rng, 1, 8);
  c.args.push_back(real("q", DType::bf16, {B, S, H, D}));
  add_kv_cache(c, "k_cache", layout, bs, blocks, Role::input);
  c.args.push_back(ints("indices", DType::int32, {B, S, topk}, -1, blocks * bs - 1));
  if (coin(rng)) c.args.push_back(ints("topk_length", DType::int32, {B}, 0, topk));
  int64_t extra_topk = 0;
  if (coin(rng)) {
    const int64_t extra_blocks = draw(rng, 1, 2);
    extra_topk = draw(rng, 1, 4);
    add_kv_cache(c, "extra_k_cache", layout, bs, extra_blocks, Role::input);
    c.args.push_back(ints("extra_indices", DType::int32, {B, S, extra_topk}, -1, extra_blocks * bs - 1));
    if (coin(rng)) c.args.push_back(ints("extra_topk_length", DType::int32, {B}, 0, extra_topk));
  } else {
    // The scalars exist either way; the cache bytes do not.
    c.scalars.push_back({"extra_k_cache.layout", static_cast<double>(layout), true});
    c.scalars.push_back({"extra_k_cache.block_size", static_cast<double>(bs), true});
    c.scalars.push_back({"extra_k_cache.tensor_scale", 1.0, false});
  }
  if (coin(rng)) c.args.push_back(real("attn_sink", DType::fp32, {H}));
  const DecodeSchedule s = make_decode_schedule(static_cast<int>(B), static_cast<int>(S),
                                                static_cast<int>(H), static_cast<int>(topk + extra_topk),
                                                static_cast<int>(draw(rng, 1, 132)), 512);
  c.args.push_back(output("out", DType::bf16, {B, S, H, 512}));
  c.args.push_back(output("lse", DType::fp32, {B, S, H}));
  c.args.push_back(bytes("workspace", {s.workspace_bytes}, Role::output));
  c.scalars.push_back({"num_splits", static_cast<double>(s.num_splits), true});
  c.scalars.push_back({"split_len", static_cast<double>(s.split_len), true});
  c.scalars.push_back({"workspace_bytes", static_cast<double>(s.workspace_bytes), true});
  c.scalars.push_back({"softmax_scale", coin(rng) ? 0.0 : 0.05, false});
  c.scalars.push_back({"d_v", 512, true});
  return c;
}
void call_sparse_decode(const Bound& b) {
  SparseDecodeArgs a;
  a.q = b.t("q");
  a.k_cache = b.kv("k_cache");
  a.indices = b.t("indices");
  a.topk_length = b.t("topk_length");
  a.extra_k_cache = b.kv("extra_k_cache");
  a.extra_indices = b.t("extra_indices");
  a.extra_topk_length = b.t("extra_topk_length");
  a.attn_sink = b.t("attn_sink");
  a.softmax_scale = b.f("softmax_scale");
  a.d_v = static_cast<int>(b.i("d_v"));
  a.out = b.t("out");
  a.lse = b.t("lse");
  DecodeSchedule s;
  s.num_splits = static_cast<int>(b.i("num_splits"));
  s.split_len = static_cast<int>(b.i("split_len"));
  s.workspace_bytes = b.i("workspace_bytes");
  sparse_decode(a, s, b.t("workspace"));
}

Case make_sparse_combine(Rng& rng) {
  Case c;
  const int64_t B = draw(rng, 1, 2), S = draw(rng, 1, 2), H = draw(rng, 1, 3), splits = draw(rng, 1, 3);
  const int64_t dv = 512;
  c.args.push_back(real("partial_o", DType::fp32, {B, S, H, splits, dv}));
  c.args.push_back(real("partial_lse", DType::fp32, {B, S, H, splits}));
  if (coin(rng)) c.args.push_back(real("attn_sink", DType::fp32, {H}));
  c.args.push_back(output("out", DType::bf16, {B, S, H, dv}));
  c.args.push_back(output("lse", DType::fp32, {B, S, H}));
  return c;
}
void call_sparse_combine(const Bound& b) {
  sparse_attention_combine(b.t("partial_o"), b.t("partial_lse"), b.t("attn_sink"), b.t("out"),
                           b.t("lse"));
}

// Decode schedules are pure arithmetic: no tensors, only the scalars. The result's invariants are
// checked (ops.h): the splits cover every index slot in whole tiles.
Case make_decode_schedule_case(Rng& rng) {
  Case c;
  for (const char* name : {"b", "s_q", "h"}) c.scalars.push_back({name, static_cast<double>(draw(rng, 1, 64)), true});
  c.scalars.push_back({"topk_total", static_cast<double>(draw(rng, 0, 4096)), true});
  c.scalars.push_back({"num_sms", static_cast<double>(draw(rng, 1, 132)), true});
  c.scalars.push_back({"d_v", 512, true});
  return c;
}
void call_decode_schedule(const Bound& b) {
  auto arg = [&](const char* n) { return static_cast<int>(b.i(n)); };
  const DecodeSchedule s = make_decode_schedule(arg("b"), arg("s_q"), arg("h"), arg("topk_total"),
                                                arg("num_sms"), arg("d_v"));
  if (s.num_splits < 1 || s.split_len < kDecodeTile || s.split_len % kDecodeTile != 0 ||
      int64_t{s.num_splits} * s.split_len < b.i("topk_total") || s.workspace_bytes < 0)
    throw SanityFailure("make_decode_schedule: splits do not cover topk_total in whole tiles");
}

// ---- sparse prefill ----------------------------------------------------------------------------------
Case make_sparse_prefill(Rng& rng) {
  Case c;
  const int64_t D = draw_of<int64_t>(rng, {512, 576}), S = draw(rng, 1, 3), H = draw(rng, 1, 2),
                KV = draw(rng, 1, 8), topk = draw(rng, 1, 8);
  c.args.push_back(real("q", DType::bf16, {S, H, D}));
  c.args.push_back(real("kv", DType::bf16, {KV, 1, D}));
  // Index values are masked, never errors: out-of-range ones are valid input.
  c.args.push_back(ints("indices", DType::int32, {S, 1, topk}, -1, KV + 2));
  if (coin(rng)) c.args.push_back(ints("topk_length", DType::int32, {S}, 0, topk));
  if (coin(rng)) c.args.push_back(real("attn_sink", DType::fp32, {H}));
  c.args.push_back(output("out", DType::bf16, {S, H, 512}));
  c.args.push_back(output("max_logits", DType::fp32, {S, H}));
  c.args.push_back(output("lse", DType::fp32, {S, H}));
  c.scalars.push_back({"softmax_scale", coin(rng) ? 0.0 : 0.05, false});
  c.scalars.push_back({"d_v", 512, true});
  return c;
}
void call_sparse_prefill(const Bound& b) {
  SparsePrefillArgs a;
  a.q = b.t("q");
  a.kv = b.t("kv");
  a.indices = b.t("indices");
  a.topk_length = b.t("topk_length");
  a.attn_sink = b.t("attn_sink");
  a.softmax_scale = b.f("softmax_scale");
  a.d_v = static_cast<int>(b.i("d_v"));
  a.out = b.t("out");
  a.max_logits = b.t("max_logits");
  a.lse = b.t("lse");
  sparse_prefill(a);
}

// ---- prefill gather ----------------------------------------------------------------------------------
Case make_gather(Rng& rng) {
  Case c;
  const KvLayout layout = any_layout(rng);
  const int bs = static_cast<int>(draw(rng, 1, 4));
  const int64_t R = draw(rng, 1, 2), max_blocks = draw(rng, 1, 3), blocks = R * max_blocks;
  add_kv_cache(c, "cache", layout, bs, blocks, Role::input);
  c.args.push_back(list("block_table", DType::int32, {R, max_blocks}, distinct(rng, R * max_blocks, blocks)));
  std::vector<int64_t> seq(static_cast<size_t>(R)), gather(static_cast<size_t>(R));
  int64_t most = 0;
  for (int64_t r = 0; r < R; ++r) {
    seq[r] = draw(rng, 0, max_blocks * bs);
    gather[r] = draw(rng, 0, seq[r]);
  }
  const bool with_gather = coin(rng);
  for (int64_t r = 0; r < R; ++r) most = std::max(most, with_gather ? gather[r] : seq[r]);
  c.args.push_back(list("seq_lens", DType::int32, {R}, seq));
  if (with_gather) c.args.push_back(list("gather_lens", DType::int32, {R}, gather));
  const int64_t offset = draw(rng, 0, 2);
  c.args.push_back(output("workspace", DType::bf16, {R, offset + most + draw(rng, 0, 2), cache_dim(layout)}));
  c.scalars.push_back({"offset", static_cast<double>(offset), true});
  return c;
}
void call_gather(const Bound& b) {
  dequantize_and_gather(b.kv("cache"), b.t("block_table"), b.t("seq_lens"), b.t("gather_lens"),
                        b.i("offset"), b.t("workspace"));
}

// ---- bulk KV quantize / dequantize ------------------------------------------------------------------
Case make_kv_quantize(Rng& rng) {
  Case c;
  const KvLayout layout = any_layout(rng);
  const int bs = static_cast<int>(draw(rng, 1, 4));
  const int64_t blocks = draw(rng, 1, 3), n = draw(rng, 0, std::min<int64_t>(4, blocks * bs));
  add_kv_cache(c, "cache", layout, bs, blocks, Role::inout);
  c.args.push_back(real("values", draw_of(rng, {DType::bf16, DType::fp32}), {n, cache_dim(layout)}));
  c.args.push_back(list("slots", draw_of(rng, {DType::int32, DType::int64}), {n},
                        distinct(rng, n, slots_of(c, "cache"), true)));
  return c;
}
void call_kv_quantize(const Bound& b) { kv_quantize(b.kv("cache"), b.t("values"), b.t("slots")); }

Case make_kv_dequantize(Rng& rng) {
  Case c;
  const KvLayout layout = any_layout(rng);
  const int bs = static_cast<int>(draw(rng, 1, 4));
  const int64_t blocks = draw(rng, 1, 3), n = draw(rng, 0, 4);
  add_kv_cache(c, "cache", layout, bs, blocks, Role::input);
  c.args.push_back(ints("slots", draw_of(rng, {DType::int32, DType::int64}), {n}, -1, blocks * bs - 1));
  c.args.push_back(output("out", draw_of(rng, {DType::bf16, DType::fp32}), {n, cache_dim(layout)}));
  return c;
}
void call_kv_dequantize(const Bound& b) { kv_dequantize(b.kv("cache"), b.t("slots"), b.t("out")); }

}  // namespace

void add_attention_ops(std::vector<OpSpec>& ops) {
  ops.push_back({"qnorm_rope_kv_insert", make_qnorm_rope_kv_insert, call_qnorm_rope_kv_insert});
  ops.push_back({"sparse_decode", make_sparse_decode, call_sparse_decode});
  ops.push_back({"sparse_attention_combine", make_sparse_combine, call_sparse_combine});
  ops.push_back({"make_decode_schedule", make_decode_schedule_case, call_decode_schedule});
  ops.push_back({"sparse_prefill", make_sparse_prefill, call_sparse_prefill});
  ops.push_back({"dequantize_and_gather", make_gather, call_gather});
  ops.push_back({"kv_quantize", make_kv_quantize, call_kv_quantize});
  ops.push_back({"kv_dequantize", make_kv_dequantize, call_kv_dequantize});
}

}  // namespace dsv4::fuzz
