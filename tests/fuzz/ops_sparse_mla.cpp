// Fuzzed DeepSeek-V3.2 ops: the indexer's row steps (sparse_mla_indexer.h) and the MLA cache write
// (kv_rope_insert.h).
#include "dsv4/indexer_key_cache.h"
#include "dsv4/kv_layout.h"
#include "dsv4/kv_rope_insert.h"
#include "dsv4/sparse_mla_indexer.h"
#include "op_table.h"

namespace dsv4::fuzz {

namespace {

constexpr int64_t kDim = indexer_keys::kDim;

DType index_dtype(Rng& rng) { return draw_of(rng, {DType::int32, DType::int64}); }

Case make_indexer_quantize(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 4), n = draw(rng, 1, 3), P = draw(rng, 1, 40);
  c.args.push_back(real("x", draw_of(rng, {DType::bf16, DType::fp32}), {T, n, kDim}));
  c.args.push_back(ints("positions", index_dtype(rng), {T}, 0, P - 1));
  c.args.push_back(rope_table(P, draw_of<int64_t>(rng, {64, 128})));
  c.args.push_back(output("codes", DType::fp8_e4m3, {T, n, kDim}));
  c.args.push_back(output("scales", DType::fp32, {T, n}));
  if (coin(rng)) c.args.push_back(real("weights", DType::fp32, {T, n}, Role::inout));
  return c;
}
void call_indexer_quantize(const Bound& b) {
  sparse_mla_indexer_quantize(b.t("x"), b.t("positions"), b.t("cos_sin"), b.t("codes"), b.t("scales"),
                              b.t("weights"), nullptr);
}

// Keys into a paged FP8 key cache at distinct slots (some -1).
Case make_indexer_key_insert(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 4), P = draw(rng, 1, 40);
  const int bs = static_cast<int>(draw_of<int64_t>(rng, {1, 4, 64}));
  const int64_t blocks = (T + bs - 1) / bs + draw(rng, 0, 1);
  const DType t = draw_of(rng, {DType::bf16, DType::fp32});
  c.args.push_back(real("k", t, {T, kDim}));
  c.args.push_back(real("norm_weight", t, {kDim}));
  c.args.push_back(real("norm_bias", t, {kDim}));
  c.args.push_back(ints("positions", index_dtype(rng), {T}, 0, P - 1));
  c.args.push_back(rope_table(P));
  c.args.push_back(bytes("keys", {blocks, bs * indexer_keys::kEntryBytes}, Role::inout));
  c.args.push_back(list("slot_mapping", index_dtype(rng), {T}, distinct(rng, T, blocks * bs, true)));
  c.scalars.push_back({"keys.block_size", static_cast<double>(bs), true});
  c.scalars.push_back({"eps", 1e-6, false});
  return c;
}
void call_indexer_key_insert(const Bound& b) {
  sparse_mla_indexer_key_insert(b.t("k"), b.t("norm_weight"), b.t("norm_bias"), b.f("eps"),
                                b.t("positions"), b.t("cos_sin"),
                                {b.t("keys"), static_cast<int>(b.i("keys.block_size"))},
                                b.t("slot_mapping"));
}

// The MLA cache write: RoPE on kv's rope dims, then the layout's encoding at distinct slots.
Case make_kv_rope_insert(Rng& rng) {
  Case c;
  const KvLayout layout = any_layout(rng);
  const int64_t D = kv_geometry(layout, 1).dim, T = draw(rng, 1, 4), P = draw(rng, 1, 40);
  const int bs = static_cast<int>(draw_of<int64_t>(rng, {1, 2, 64}));
  const int64_t blocks = (T + bs - 1) / bs + draw(rng, 0, 1);
  c.args.push_back(real("kv", DType::bf16, {T, D}, Role::inout));
  c.args.push_back(ints("positions", index_dtype(rng), {T}, 0, P - 1));
  c.args.push_back(rope_table(P));
  add_kv_cache(c, "cache", layout, bs, blocks, Role::inout);
  c.args.push_back(list("slot_mapping", index_dtype(rng), {T}, distinct(rng, T, blocks * bs, true)));
  return c;
}
void call_kv_rope_insert(const Bound& b) {
  kv_rope_insert(b.t("kv"), b.t("positions"), b.t("cos_sin"), b.kv("cache"), b.t("slot_mapping"));
}

}  // namespace

void add_sparse_mla_ops(std::vector<OpSpec>& ops) {
  ops.push_back({"sparse_mla_indexer_quantize", make_indexer_quantize, call_indexer_quantize});
  ops.push_back({"sparse_mla_indexer_key_insert", make_indexer_key_insert, call_indexer_key_insert});
  ops.push_back({"kv_rope_insert", make_kv_rope_insert, call_kv_rope_insert});
}

}  // namespace dsv4::fuzz
