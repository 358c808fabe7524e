// Fuzzed index planning utilities (indexing.h).
#include "dsv4/indexing.h"
#include "op_table.h"

namespace dsv4::fuzz {

namespace {

// Tokens of R requests with block tables [R, max_blocks] of block size B.
struct Requests {
  int64_t T, R, max_blocks, B;
};
Requests draw_requests(Rng& rng) {
  return {draw(rng, 1, 4), draw(rng, 1, 2), draw(rng, 1, 3), draw(rng, 1, 4)};
}
// A table of distinct blocks (a pool of R · max_blocks blocks), all mapped or with holes (-1).
Arg block_table(Rng& rng, const Requests& q, bool holes) {
  return list("block_table", DType::int32, {q.R, q.max_blocks},
              distinct(rng, q.R * q.max_blocks, q.R * q.max_blocks, holes));
}
// An optional lens output [T]: present half the time.
void maybe_lens(Case& c, Rng& rng, const std::string& name, int64_t T) {
  if (coin(rng)) c.args.push_back(output(name, DType::int32, {T}));
}

// ---- local → global slots -------------------------------------------------------------------------
Case make_local_to_global(Rng& rng, bool checked) {
  Case c;
  const Requests q = draw_requests(rng);
  const int64_t K = draw(rng, 1, 4);
  c.args.push_back(ints("local", DType::int32, {q.T, K}, -1, q.max_blocks * q.B - 1));
  c.args.push_back(ints("token_to_req", DType::int32, {q.T}, 0, q.R - 1));
  c.args.push_back(block_table(rng, q, !checked));
  Arg global = output("global", DType::int32, {q.T, K});
  if (!checked && draw(rng, 0, 3) == 0) global.alias_of = 0;  // in place over local
  c.args.push_back(global);
  maybe_lens(c, rng, "lens", q.T);
  c.scalars.push_back({"block_size", static_cast<double>(q.B), true});
  return c;
}
Case make_local_to_global_fast(Rng& rng) { return make_local_to_global(rng, false); }
Case make_local_to_global_checked(Rng& rng) { return make_local_to_global(rng, true); }
void call_local_to_global(const Bound& b) {
  local_to_global_slots(b.t("local"), b.t("token_to_req"), b.t("block_table"),
                        static_cast<int>(b.i("block_size")), b.t("global"), b.t("lens"));
}
void call_local_to_global_checked(const Bound& b) {
  local_to_global_slots_checked(b.t("local"), b.t("token_to_req"), b.t("block_table"),
                                static_cast<int>(b.i("block_size")), b.t("global"), b.t("lens"));
}

// ---- SWA window ---------------------------------------------------------------------------------------
Case make_swa_window(Rng& rng) {
  Case c;
  const Requests q = draw_requests(rng);
  const int64_t W = draw(rng, 1, 8);
  c.args.push_back(ints("positions", draw_of(rng, {DType::int32, DType::int64}), {q.T}, 0,
                        q.max_blocks * q.B - 1));
  c.args.push_back(ints("token_to_req", DType::int32, {q.T}, 0, q.R - 1));
  c.args.push_back(block_table(rng, q, false));
  c.args.push_back(output("indices", DType::int32, {q.T, W}));
  c.args.push_back(output("lens", DType::int32, {q.T}));
  c.scalars.push_back({"block_size", static_cast<double>(q.B), true});
  c.scalars.push_back({"window", static_cast<double>(W), true});
  return c;
}
void call_swa_window(const Bound& b) {
  swa_window_indices(b.t("positions"), b.t("token_to_req"), b.t("block_table"),
                     static_cast<int>(b.i("block_size")), static_cast<int>(b.i("window")),
                     b.t("indices"), b.t("lens"));
}

// ---- prefill top-k + SWA combination --------------------------------------------------------------
Case make_combine_topk_swa(Rng& rng) {
  Case c;
  const int64_t R = draw(rng, 1, 2), N = draw(rng, 0, 8), K = draw(rng, 0, 4), W = draw(rng, 1, 8);
  const int64_t ratio = draw_of<int64_t>(rng, {0, 4});
  std::vector<int64_t> qsl = {0}, seq, gather, topk;
  int64_t most = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t qlen = draw(rng, 1, 3), s = qlen + draw(rng, 0, 5);
    qsl.push_back(qsl.back() + qlen);
    seq.push_back(s);
    gather.push_back(s);  // the whole sequence: every window lies inside the gathered range
    most = std::max(most, s);
    for (int64_t t = 0; t < qlen; ++t) {
      const int64_t p = s - qlen + t;
      // ratio 0 (no compressed entries visible): -1 only.
      const int64_t limit = ratio > 0 ? std::min(N, (p + 1) / ratio) : 0;
      for (int64_t k = 0; k < K; ++k) topk.push_back(limit > 0 && coin(rng) ? draw(rng, 0, limit - 1) : -1);
    }
  }
  const int64_t T = qsl.back();
  c.args.push_back(list("topk", DType::int32, {T, K}, topk));
  c.args.push_back(list("query_start_loc", DType::int32, {R + 1}, qsl));
  c.args.push_back(list("seq_lens", DType::int32, {R}, seq));
  c.args.push_back(list("gather_lens", DType::int32, {R}, gather));
  c.args.push_back(output("out", DType::int32, {T, K + W}));
  c.args.push_back(output("out_lens", DType::int32, {T}));
  c.scalars.push_back({"window", static_cast<double>(W), true});
  c.scalars.push_back({"compressed_region", static_cast<double>(N), true});
  c.scalars.push_back({"rows_per_request", static_cast<double>(N + most + draw(rng, 0, 3)), true});
  c.scalars.push_back({"ratio", static_cast<double>(ratio), true});
  return c;
}
void call_combine_topk_swa(const Bound& b) {
  combine_topk_swa_indices(b.t("topk"), b.t("query_start_loc"), b.t("seq_lens"), b.t("gather_lens"),
                           static_cast<int>(b.i("window")), static_cast<int>(b.i("compressed_region")),
                           b.i("rows_per_request"), static_cast<int>(b.i("ratio")), b.t("out"),
                           b.t("out_lens"));
}

}  // namespace

void add_indexing_ops(std::vector<OpSpec>& ops) {
  ops.push_back({"local_to_global_slots", make_local_to_global_fast, call_local_to_global});
  ops.push_back({"local_to_global_slots_checked", make_local_to_global_checked, call_local_to_global_checked});
  ops.push_back({"swa_window_indices", make_swa_window, call_swa_window});
  ops.push_back({"combine_topk_swa_indices", make_combine_topk_swa, call_combine_topk_swa});
}

}  // namespace dsv4::fuzz
