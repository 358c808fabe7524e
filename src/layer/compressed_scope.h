// The compressed half of a C4A / C128A layer's step (docs/spec.md §4–§5): runs the compressor (and, for
// C4A, the indexer's compressor and the indexer) over a batch and returns, per token, the
// request-local compressed entries it attends to. Owned by dsv4::Attention.
//
// The step is planned on the host first (StepPlanner: cache bookkeeping, block tables into the
// step's upload) and launched after the upload: launch_compressors() and launch_indices() read
// nothing from the host plan but the shapes, so they can be captured in a CUDA graph and replayed
// with the next step's upload.
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
#include "layer/step_planner.h"
#include "layer/step_upload.h"
#include "runtime/branch_stream.h"

namespace dsv4 {

// The cuBLASLt workspace of a GEMM on a side branch of the step (CUDA): each compressor's
// projections (a C4A scope takes two, its compressors may run side by side) and the layer's wkv.
// Each branch has its own, taken whether or not the step branches, so that both orders pick the
// same algorithm and give the same bits.
inline constexpr int64_t kBranchGemmWorkspaceBytes = int64_t{4} << 20;

struct CompressedIndices {
  // [T, topk] int32 request-local entry numbers, -1 padded (scratch). C4A: the indexer's
  // selection in ascending entry order (TopkOrder::column); C128A: every entry, ascending.
  TensorView local;
  TensorView lens;   // [T] int32 valid entries per token (scratch)
  int topk = 0;
};

class CompressedScope {
 public:
  // `weights` and `caches` must outlive the scope (they are the layer's); both live on the
  // device every op of the scope runs on.
  CompressedScope(const ModelConfig& cfg, int layer, const LayerWeightViews& weights,
                  LayerCaches& caches);

  int ratio() const { return ratio_; }
  // A step runs in two parts (x [T, dim], qr_n [T, q_lora] the normed low-rank query in the
  // form(s) the indexer's wq_b takes, positions [T] int64, token_to_req [T] int32, cos_sin the
  // layer's RoPE table, all on the scratch's device), after upload.commit(); temporaries and
  // results live in `scratch`.
  //
  // 1. The compressors, which read only x and the plan: the main one on `side`; with `overlap`
  //    (CUDA only) a C4A scope runs the indexer's compressor on a stream of its own, forked from
  //    `side`. The caller may start this before its own projections.
  void launch_compressors(const CompressedPlan& plan, const StepUpload& upload, const TensorView& x,
                          const TensorView& positions, const TensorView& token_to_req,
                          const TensorView& cos_sin, Scratch& scratch, Stream side, bool overlap,
                          const std::function<void(const char*)>& mark_op = {});
  // 2. After launch_compressors, once qr_n is ready on `main`: the request-local entries each token
  //    attends. C128A: the visible prefix, on `side`. C4A: the indexer's query (on a stream of its
  //    own forked from `main` with `overlap`, else on `main`), then its scores over the keys and
  //    the top-k after the indexer's compressor. Ready on `side` when this returns (`main` must
  //    be `side` without `overlap`).
  CompressedIndices launch_indices(const CompressedPlan& plan, const StepUpload& upload,
                                   const TensorView& x, const GemmInput& qr_n,
                                   const TensorView& positions, const TensorView& token_to_req,
                                   const TensorView& cos_sin, Scratch& scratch, Stream main,
                                   Stream side, bool overlap,
                                   const std::function<void(const char*)>& mark_op = {});

 private:
  // One compressor (main or indexer): project, update rings and emit.
  void compress(const CompressorConfig& ccfg, const CompressorWeightViews& w, PagedCache& state,
                PagedCache& out_cache, const TensorView& state_table,
                const TensorView& out_table, const TensorView& x, const TensorView& positions,
                const TensorView& token_to_req, const TensorView& context_lens,
                const TensorView& cos_sin, const TensorView& gemm_workspace, Scratch& scratch,
                Stream stream);

  // C4A with `overlap`: the streams of the indexer's key branch (its compressor, then scores and
  // top-k) and query branch, and the events that fork them and join them back.
  rt::BranchStream key_branch_, query_branch_;
  bool keys_forked_ = false;  // launch_compressors put the key branch on key_branch_

  const ModelConfig& cfg_;
  const LayerWeightViews& w_;
  LayerCaches& caches_;
  int ratio_ = 0;
  CompressorConfig main_;
  CompressorConfig indexer_;
};

}  // namespace dsv4
