// StepPlanner: the host half of one layer step. It checks a BatchPlan against what the layer has
// cached, books the step's new entries in the paged caches (SWA slots, compressed entries) and
// puts every array the step's kernels read — positions, slots, block tables, per-request lengths
// — into the step's StepUpload. The launch (dsv4::Attention, CompressedScope) reads nothing from
// the host but the StepPlan's shapes, so a decode step's launch can be a replayed CUDA graph.
//
// It needs no GPU and no weights (only the config and the layer's caches), so its cost per step
// is measured on any machine (`dsv4 bench layer --host-only`). For a replayed decode step it is
// the host time that stands between the caller and the graph launch, so a step copies nothing
// twice (arrays are written straight into the upload's packed bytes; plan()'s per-step lists are
// members, reused), looks each request up once per cache, and never rescans released blocks.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/caller_step.h"
#include "dsv4/compressor.h"
#include "dsv4/config.h"
#include "dsv4/paged_cache.h"
#include "core/nonneg_div.h"
#include "layer/step_upload.h"

namespace dsv4 {

// The compressed half of a step (C4A / C128A): shapes and the arrays CompressedScope::launch reads.
struct CompressedPlan {
  int topk = 0;             // compressed slots per token (C4A: index_topk; C128A: visible bound)
  int64_t score_cols = 0;   // C4A: indexer score columns (>= every token's visible entries)
  StepUpload::Array context;                       // [rows] int64: positions consumed so far
  StepUpload::Array state_table, out_table;        // main compressor: ring and entry tables
  StepUpload::Array index_state_table, index_key_table;  // C4A: the indexer's compressor
};

// A group of prefill requests gathered into one bounded workspace.
struct PrefillGroup {
  int r0 = 0, r1 = 0;            // requests [r0, r1) of the plan (all prefills)
  int64_t t0 = 0, t1 = 0;        // their tokens
  int64_t compressed_rows = 0;   // N: compressed entries gathered per request
  int64_t rows_per_request = 0;  // M = N + the longest SWA gather
  StepUpload::Array query_start, seq_lens, gather_lens, compressed_lens;
};

struct StepPlan {
  int64_t T = 0;   // token rows (a graph bucket pads decode rows with empty requests)
  int R = 0;       // request rows
  int nd = 0;      // rows [0, nd) attend token by token: the decode-like requests' tokens + padding
  StepUpload::Array positions, slot_mapping, token_to_req;  // [T]
  StepUpload::Array swa_table;                             // [R, width]
  CompressedPlan compressed;
  std::vector<PrefillGroup> prefill_groups;
  // Everything the launch's shapes depend on: equal keys → the same kernels and arguments.
  std::vector<int64_t> shape_key() const;
  // shape_key(), as the planner computed it once when it packed the plan (a patched step keeps
  // the plan, and with it the key a replayed graph is found by).
  std::vector<int64_t> key;
};

class StepPlanner {
 public:
  // `caches` must outlive the planner (they are the layer's). prefill_group_requests: prefill
  // requests per gather group (AttentionOptions::prefill_group_requests).
  StepPlanner(const ModelConfig& cfg, int layer, LayerCaches& caches, int prefill_group_requests);

  int ratio() const { return ratio_; }  // 0 for SWA layers
  // Contexts, sequence lengths and cache capacity of `plan`; throws before any state changes.
  void check(const BatchPlan& plan) const;
  // Registers the plan's new requests in every cache of the layer (their compressor rings too).
  void add_requests(const BatchPlan& plan);
  // Books the step in the caches and puts its arrays into `upload` (which it begins), for
  // `rows` >= the plan's token rows. Padding tokens of a graph bucket (`graph`) are one-token
  // decode requests of their own with no blocks; other padding tokens (rounding an eager step up
  // to a whole number of FP8 GEMM row groups) belong to no request. Either way nothing is read
  // or written for them but their own rows. `graph` also rounds data-dependent widths to 2^k.
  // Marks the plan's tokens as cached.
  //
  // A decode step of the same batch as the last step planned (the same requests in the same
  // order, as many new tokens each, each continuing where the last left off, the same rows and
  // widths) keeps the last step's arrays and rewrites only what moved: positions, slots,
  // contexts and the rows of tables that changed (StepUpload::resume; the upload then sends only
  // those bytes). Its StepPlan is the last one's, so a replayed graph's key matches at once.
  // The plan returned stays valid until the next plan() or plan_caller().
  const StepPlan& plan(const BatchPlan& plan, int64_t rows, bool graph, StepUpload& upload);
  // Forgets the request (its cache blocks are freed).
  void release(int64_t req);
  // Steps that patched the last step's arrays instead of packing them (see plan()).
  int64_t patched_steps() const { return patched_steps_; }

  // ---- caller-owned caches (AttentionOptions::caller_caches) -------------------------------
  // Checks every array of `step` (include/dsv4/caller_step.h) against the step's `T` tokens and
  // the caches (block ids in range wherever the step reads or writes) and returns the step as a
  // BatchPlan whose request ids are the step's rows. Throws dsv4::Error naming the argument.
  BatchPlan check_caller(const CallerStep& step, int64_t T) const;
  // plan() for a step checked by check_caller: the caller's slots and block tables (blocks the
  // step does not touch are sent as -1) instead of the layer's bookkeeping, which it never
  // touches (the caller's caches hold no per-request state in the layer).
  const StepPlan& plan_caller(const BatchPlan& plan, const CallerStep& step, int64_t rows, bool graph,
                              StepUpload& upload);

 private:
  enum class CacheRole { swa, compressed, compressor_state, indexer_keys, indexer_state };
  PagedCache& cache(CacheRole role) const;
  // The blocks [first, end) of a request's table in `role` that a step over positions
  // [context, seq_len) reads or writes (the rest may be anything in a caller's table).
  std::pair<int64_t, int64_t> used_blocks(CacheRole role, int64_t context, int64_t seq_len) const;
  // The step's table of `role`: the layer's (step == nullptr) or the caller's.
  StepUpload::Array table(CacheRole role, const BatchPlan& plan, const CallerStep* step,
                          int64_t rows, bool round, StepUpload& upload);
  // plan() (step == nullptr: books the step's entries in the layer's caches) and plan_caller().
  const StepPlan& plan_step(const BatchPlan& plan, const CallerStep* step, int64_t rows, bool graph,
                            StepUpload& upload);
  void plan_prefill_groups(const BatchPlan& plan, StepPlan& sp, StepUpload& upload) const;
  // `growth`: scratch of one pair per request (overwritten).
  void check_compressed_capacity(const BatchPlan& plan, bool new_requests,
                                 std::vector<std::pair<int64_t, int64_t>>& growth) const;
  // The compressed half's widths and block tables (its context array is put with the per-step
  // arrays).
  void plan_compressed_tables(const BatchPlan& plan, const CallerStep* step, int64_t rows, StepUpload& upload,
                              bool round, CompressedPlan& out);
  // The compressed half's data-dependent widths: topk and the indexer's score columns.
  std::pair<int, int64_t> compressed_widths(const BatchPlan& plan, bool round) const;
  // Books the step's new entries in the layer's caches: SWA slots into slots_, compressed entries;
  // notes per request whose block tables changed.
  void book(const BatchPlan& plan);
  // Whether the step may patch the last step's arrays (see plan()), after book().
  bool patchable(const BatchPlan& plan, int64_t rows, bool round) const;
  void patch(const BatchPlan& plan, StepUpload& upload);  // (of current_)
  // Every array of the step afresh (upload.begin()).
  StepPlan pack(const BatchPlan& plan, const CallerStep* step, int64_t rows, bool graph, StepUpload& upload);
  // The block tables of this step's requests in `cache` as int32 [rows, width] (width: the
  // longest table, rounded up to 2^k when `round`).
  StepUpload::Array put_tables(const PagedCache& cache, int64_t rows, bool round, StepUpload& upload);

  const ModelConfig& cfg_;
  LayerCaches& caches_;
  int ratio_ = 0;
  int prefill_group_requests_ = 4;
  CompressorConfig main_, indexer_;   // the compressors' configs (ratio > 0)
  std::unordered_map<int64_t, int64_t> cached_;  // tokens cached per request
  // Per-step lists of plan(), kept to reuse their storage.
  std::vector<int64_t> req_ids_;
  std::vector<const std::vector<int32_t>*> tables_;
  std::vector<int64_t> slots_;  // [T] the step's SWA slots
  mutable std::vector<std::pair<int64_t, int64_t>> growth_;  // check()'s per-request scratch
  std::vector<uint8_t> swa_changed_, entries_changed_, keys_changed_;  // per request: table changed
  StepPlan current_;  // the last plan() / plan_caller()'s
  // The last step planned, when a decode-like step on the layer's caches (patch()'s base; its
  // plan is current_).
  struct LastStep {
    bool valid = false;
    std::vector<RequestStep> requests;
    int64_t rows = 0;
    bool round = false;
    // Per request row: its count in cached_ and its entries in the caches, so that a step of the
    // same requests in the same order (same_batch()) looks nothing up. Invalidated with `valid`
    // whenever a request is added or released.
    std::vector<int64_t*> cached;
    std::vector<PagedCache::Handle> swa, compressed, keys;
  } last_;
  // compressor_entries_after(ratio_, positions), by a shift: the ratio is a power of two, and a
  // decode step divides a few times per request (core/nonneg_div.h).
  int64_t entries_after(int64_t positions) const { return div_nonneg(positions, ratio_); }
  // Whether `plan` has the last step's requests in the same order (its handles apply).
  bool same_batch(const BatchPlan& plan) const;
  // Records `plan`'s step as last_ (after pack() into current_).
  void remember(const BatchPlan& plan, int64_t rows, bool round);
  int64_t patched_steps_ = 0;
};

// The smallest power of two >= v (v <= 0 → v): the rounding of graph-bucketed widths.
int64_t round_up_pow2(int64_t v);

}  // namespace dsv4
