// AttentionStack: the attention layers of one model config (all of them, or a chosen subset),
// each with its own weights and caches, run in sequence over a batch. It is the unit `dsv4 run`
// drives. DeepSeek-V4 configs build dsv4::Attention layers; V3.2 configs build
// dsv4::SparseMlaAttention layers, on either backend. Between layers the hidden state is carried residually,
//   h ← h + Attention_l(RMSNorm(h))   (unweighted RMSNorm),
// standing in for the rest of the transformer block so activations stay O(1) through the stack.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/communicator.h"
#include "dsv4/config.h"
#include "dsv4/device_tensor.h"
#include "dsv4/layer.h"
#include "dsv4/sparse_mla_layer.h"
#include "dsv4/tensor.h"

namespace dsv4 {

struct StackOptions {
  std::vector<int> layers;      // layer indices to build; empty = all layers of the config
  std::string weights_dir;      // checkpoint directory; empty = seeded random weights
  uint64_t seed = 1;
  bool fp8_weights = true;      // random weights: FP8 e4m3 with 128x128 UE8M0 scales (as shipped)
  AttentionOptions attention;   // V3.2 layers take its backend, stream, fp8 flags, num_sms,
                                // cuda_graphs, and caches.swa_blocks / swa_block_size for their
                                // caches
  // Tensor-parallel ranks per V4 layer (docs/design.md "Tensor parallelism"). > 1: the stack is
  // built tp times, rank r with every layer's shard r, its own caches (replicated, as on real
  // ranks) and its own residual stream, and each step runs the ranks at once, one host thread
  // each (rank 0 on the caller's), every layer's y summed over the ranks; rank 0's output is the
  // stack's. CPU backend: the ranks sum through an in-process group. CUDA: rank r runs on GPU r
  // (GPUs 0..tp-1 must be visible; the library built with NCCL, one NCCL group), and x, y and
  // attention.stream are GPU 0's.
  int tp = 1;
};

class RankThreads;

class AttentionStack {
 public:
  AttentionStack(const ModelConfig& cfg, const StackOptions& opts);
  ~AttentionStack();
  AttentionStack(const AttentionStack&) = delete;  // owns caches (and device memory)
  AttentionStack& operator=(const AttentionStack&) = delete;
  AttentionStack(AttentionStack&&) noexcept;
  AttentionStack& operator=(AttentionStack&&) noexcept;

  // x [T, dim] fp32 → y [T, dim] fp32 (contiguous; may alias x), on every layer's backend. On the
  // CUDA backend x and y may be on the GPU or the host: the residual stream stays on the GPU
  // (residual_add_rms_norm between layers), so a step with x and y on the GPU neither synchronizes
  // nor copies from pageable memory.
  // If `layer_io` is given, it receives each layer's input (normed h) and output per token:
  // layer_io[l] = {in [T, dim], out [T, dim]}. Bad input (tensors, or a plan any layer rejects)
  // throws dsv4::Error before any layer changes state.
  struct LayerIO { HostTensor in, out; };
  void forward(const BatchPlan& plan, const TensorView& x, const TensorView& y,
               std::vector<LayerIO>* layer_io = nullptr);
  void release(int64_t req_id);
  // The warm-up of a serving run: every layer (of every rank) reserves its workspaces for steps of
  // at most max_tokens tokens of max_requests requests at contexts up to max_context
  // (Attention::reserve), and the residual stream's buffers grow to max_tokens, so such steps
  // allocate nothing. Returns each layer's memory (rank 0's). Throws dsv4::Error on bounds
  // Attention::reserve refuses.
  std::vector<LayerMemory> reserve(int64_t max_tokens, int max_requests, int64_t max_context);
  // CUDA: the stream every layer and the residual ops run on.
  void set_stream(Stream stream);

  int num_layers() const;
  // Tensor-parallel ranks (StackOptions::tp).
  int tp() const { return static_cast<int>(ranks_.size()); }
  // The i-th layer of a V4 stack (a V3.2 stack: dsv4::Error; see sparse_mla_layer); with tp > 1
  // its rank 0.
  Attention& layer(int i);
  // The i-th V4 layer's whole weights (with tp > 1 each rank holds a shard of them).
  const AttentionWeights& layer_weights(int i) const;
  // The i-th layer of a V3.2 stack (a V4 stack: dsv4::Error).
  SparseMlaAttention& sparse_mla_layer(int i);
  bool sparse_mla() const { return cfg_.family == "v3.2"; }
  // Either family: the model layer index and kind of the i-th layer, and its backend.
  int layer_index(int i) const;
  LayerKind layer_kind(int i) const;
  Backend backend() const;
  const ModelConfig& config() const { return cfg_; }

 private:
  struct Rank;  // one tensor-parallel rank's layers and residual stream (model.cpp)
  // Rank `rank`'s whole step (on its thread, its GPU current): x into its residual stream, every
  // layer, and (rank 0) the output into y and the layers' inputs / outputs into layer_io.
  void forward_rank(int rank, const BatchPlan& plan, const TensorView& x, const TensorView& y,
                    std::vector<LayerIO>* layer_io);
  ModelConfig cfg_;
  // tp > 1: the group summing y (before the ranks: a layer holds its communicator) and every
  // layer's whole weights (each rank holds its shard).
  std::vector<std::unique_ptr<Communicator>> tp_group_;
  std::vector<AttentionWeights> whole_weights_;
  std::vector<std::unique_ptr<Rank>> ranks_;    // rank 0 first; one without tensor parallelism
  std::unique_ptr<RankThreads> rank_threads_;   // tp > 1
  std::vector<SparseMlaAttention> mla_layers_;  // V3.2
};

// Parses "0,2,5-7" into layer indices (each < n_layers); throws dsv4::Error on bad syntax.
std::vector<int> parse_layer_list(const std::string& spec, int n_layers);

}  // namespace dsv4
