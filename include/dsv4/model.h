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
                                // and caches.swa_blocks / swa_block_size for their caches
  // Tensor-parallel ranks per V4 layer (docs/design.md "Tensor parallelism"). > 1: CPU backend
  // only, the ranks emulated in this process — each layer's tp shards run on tp threads and sum
  // y through an in-process group (caches replicated per rank, as on real ranks).
  int tp = 1;
};

class AttentionStack {
 public:
  AttentionStack(const ModelConfig& cfg, const StackOptions& opts);
  AttentionStack(const AttentionStack&) = delete;  // owns caches (and device memory)
  AttentionStack& operator=(const AttentionStack&) = delete;
  AttentionStack(AttentionStack&&) noexcept = default;
  AttentionStack& operator=(AttentionStack&&) noexcept = default;

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
  // CUDA: the stream every layer and the residual ops run on.
  void set_stream(Stream stream);

  int num_layers() const { return static_cast<int>(sparse_mla() ? mla_layers_.size() : layers_.size()); }
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
  // Layer l's tp ranks on their threads (tp > 1), rank 0's y into `y`.
  void forward_ranks(size_t l, const BatchPlan& plan, const TensorView& x, const TensorView& y);
  ModelConfig cfg_;
  std::vector<Attention> layers_;               // V4
  std::vector<SparseMlaAttention> mla_layers_;  // V3.2
  // tp > 1: the in-process group, ranks 1.. of every layer (peers_[r - 1][i]), their outputs, and
  // every layer's whole weights.
  std::vector<std::unique_ptr<Communicator>> tp_group_;
  std::vector<std::vector<Attention>> peers_;
  std::vector<HostTensor> peer_out_;
  std::vector<AttentionWeights> whole_weights_;
  Stream stream_ = nullptr;
  // The residual stream's buffers (grown on demand): on the host for the CPU backend, on the GPU
  // for CUDA.
  int64_t capacity_rows_ = 0;
  HostTensor residual_, normed_, out_;
  DeviceTensor residual_dev_, normed_dev_, out_dev_;
};

// Parses "0,2,5-7" into layer indices (each < n_layers); throws dsv4::Error on bad syntax.
std::vector<int> parse_layer_list(const std::string& spec, int n_layers);

}  // namespace dsv4
