// The compressed half of a C4A / C128A layer's step (docs/spec.md §4–§5): runs the compressor (and, for
// C4A, the indexer's compressor and the indexer) over a batch and returns, per token, the
// request-local compressed entries it attends to. Owned by dsv4::Attention.
//
// Like the layer, a step is planned on the host first (cache bookkeeping, block tables into the
// step's upload) and launched after the upload: launch() reads nothing from the host plan but the
// shapes, so it can be captured in a CUDA graph and replayed with the next step's upload.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/compressor.h"
#include "dsv4/config.h"
#include "dsv4/paged_cache.h"
#include "dsv4/tensor.h"
#include "layer/gemm_input.h"
#include "layer/layer_weights.h"
#include "layer/scratch.h"
#include "layer/step_upload.h"

namespace dsv4 {

struct CompressedIndices {
  TensorView local;  // [T, topk] int32 request-local entry numbers, -1 padded (scratch)
  TensorView lens;   // [T] int32 valid entries per token (scratch)
  int topk = 0;
};

// The host half of one step: shapes and the arrays the launch reads.
struct CompressedPlan {
  int topk = 0;             // compressed slots per token (C4A: index_topk; C128A: visible bound)
  int64_t score_cols = 0;   // C4A: indexer score columns (>= every token's visible entries)
  StepUpload::Array context;                       // [rows] int64: positions consumed so far
  StepUpload::Array state_table, out_table;        // main compressor: ring and entry tables
  StepUpload::Array index_state_table, index_key_table;  // C4A: the indexer's compressor
};

class CompressedScope {
 public:
  // `weights` and `caches` must outlive the scope (they are the layer's); both live on the
  // device every op of the scope runs on.
  CompressedScope(const ModelConfig& cfg, int layer, const LayerWeightViews& weights,
                  LayerCaches& caches);

  int ratio() const { return ratio_; }
  // Reserves the request's compressor rings (after LayerCaches::add_request registered it).
  void add_request(int64_t req);
  void release(int64_t req) { (void)req; }  // LayerCaches::remove_request frees everything
  // Throws (before any state changes) if the compressed / indexer-key caches lack the blocks
  // this step's emitted entries need.
  void check_capacity(const BatchPlan& plan) const;

  // Appends the entries this step emits to the caches and puts the step's arrays into `upload`,
  // for `rows` request rows (>= the plan's requests; the extra rows are padding requests with no
  // blocks). `round` rounds every data-dependent width (table columns, visible bounds) up to a
  // power of two, so that steps of one graph bucket share shapes.
  CompressedPlan plan(const BatchPlan& plan, const std::vector<int64_t>& req_ids, int64_t rows,
                      StepUpload& upload, bool round);

  // The kernels of the step (x [T, dim], qr_n [T, q_lora] the normed low-rank query in the
  // form(s) the indexer's wq_b takes, positions [T] int64, token_to_req [T] int32, cos_sin the
  // layer's RoPE table, all on the scratch's device), after upload.commit(). Temporaries and
  // results live in `scratch`.
  CompressedIndices launch(const CompressedPlan& plan, const StepUpload& upload,
                           const TensorView& x, const GemmInput& qr_n,
                           const TensorView& positions, const TensorView& token_to_req,
                           const TensorView& cos_sin, Scratch& scratch, Stream stream,
                           const std::function<void(const char*)>& mark_op = {});

 private:
  // One compressor (main or indexer): project, update rings and emit.
  void compress(const CompressorConfig& ccfg, const CompressorWeightViews& w, PagedCache& state,
                PagedCache& out_cache, const TensorView& state_table,
                const TensorView& out_table, const TensorView& x, const TensorView& positions,
                const TensorView& token_to_req, const TensorView& context_lens,
                const TensorView& cos_sin, Scratch& scratch, Stream stream);

  const ModelConfig& cfg_;
  const LayerWeightViews& w_;
  LayerCaches& caches_;
  int ratio_ = 0;
  CompressorConfig main_;
  CompressorConfig indexer_;
};

// The smallest power of two >= v (v <= 0 → v): the rounding of graph-bucketed widths.
int64_t round_up_pow2(int64_t v);

}  // namespace dsv4
