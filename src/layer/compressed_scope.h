// The compressed half of a C4A / C128A layer's step (docs/spec.md §4–§5): runs the compressor (and, for
// C4A, the indexer's compressor and the indexer) over a batch and returns, per token, the
// request-local compressed entries it attends to. Owned by dsv4::Attention.
//
// The step is planned on the host first (StepPlanner: cache bookkeeping, block tables into the
// step's upload) and launched after the upload: launch() reads nothing from the host plan but the
// shapes, so it can be captured in a CUDA graph and replayed with the next step's upload.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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
#include "runtime/device_runtime.h"

namespace dsv4 {

// The GEMM workspace of one compressor's projections on CUDA (their own: the scope runs on a side
// stream beside the layer's projections, which use the layer's). A C4A scope takes two, one per
// compressor, since its two compressors may run side by side.
inline constexpr int64_t kCompressorGemmWorkspaceBytes = int64_t{4} << 20;

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
  // The kernels of the step (x [T, dim], qr_n [T, q_lora] the normed low-rank query in the
  // form(s) the indexer's wq_b takes, positions [T] int64, token_to_req [T] int32, cos_sin the
  // layer's RoPE table, all on the scratch's device), after upload.commit(). Temporaries and
  // results live in `scratch`. `overlap` (CUDA only): a C4A scope runs its independent branches
  // on streams of its own beside `stream` (see launch()); the results are ready on `stream` when it
  // returns either way.
  CompressedIndices launch(const CompressedPlan& plan, const StepUpload& upload,
                           const TensorView& x, const GemmInput& qr_n,
                           const TensorView& positions, const TensorView& token_to_req,
                           const TensorView& cos_sin, Scratch& scratch, Stream stream,
                           bool overlap = false,
                           const std::function<void(const char*)>& mark_op = {});

 private:
  // One compressor (main or indexer): project, update rings and emit.
  void compress(const CompressorConfig& ccfg, const CompressorWeightViews& w, PagedCache& state,
                PagedCache& out_cache, const TensorView& state_table,
                const TensorView& out_table, const TensorView& x, const TensorView& positions,
                const TensorView& token_to_req, const TensorView& context_lens,
                const TensorView& cos_sin, const TensorView& gemm_workspace, Scratch& scratch,
                Stream stream);

  // C4A with `overlap`: the streams of the indexer's key branch and query branch, and the events
  // that fork them from the caller's stream and join them back.
  std::unique_ptr<rt::OwnedStream> key_stream_, query_stream_;
  rt::Event fork_, query_done_, index_done_;

  const ModelConfig& cfg_;
  const LayerWeightViews& w_;
  LayerCaches& caches_;
  int ratio_ = 0;
  CompressorConfig main_;
  CompressorConfig indexer_;
};

}  // namespace dsv4
