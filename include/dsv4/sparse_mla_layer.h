// dsv4::SparseMlaAttention — one DeepSeek-V3.2 sparse-MLA attention layer (vLLM's
// FlashMLASparseBackend with the V3.2 model's MLA): weights, its paged caches and per-request
// state, and forward() over a mixed batch (decodes first, then prefill chunks that may continue
// earlier context). Like dsv4::Attention it only sequences ops.
//
//   x ─► wq_a ─► RMSNorm ─► wq_b ─► RoPE(q_pe) ─► q_nope · W_UK (absorbed into the latent)
//     │                                          └► q [Hp, 576] = latent 512 | rope 64
//     ├► wkv_a ─► RMSNorm(latent) + RoPE(k_pe) ─► V32_FP8 cache (656 B per token)
//     ├► lightning indexer: its FP8 key cache, scores over every earlier token, top-index_topk
//     ├► decodes: sparse_decode on the FP8 cache; prefills: gather bf16 rows, sparse_prefill
//     └► latent output [Hp, 512] ─► W_UV per head ─► [H, v] ─► wo ─► y
// Heads are padded to 64 or 128 (Hp) for the sparse kernels, as the backend seed pads them; the
// padded query rows are zero and their outputs are dropped. Softmax scale:
// ModelConfig::mla_softmax_scale(). No attention sink. The per-head absorptions (q_nope · W_UK,
// o_latent · W_UVᵀ) are one batched_linear each over all heads.
//
// Backends (SparseMlaOptions::backend): the CPU reference ops, or CUDA — weights copied to the GPU
// once (FP8 projections stay FP8 with their scales), both caches in GPU memory, every temporary
// from one grow-only arena (reserve() sizes it ahead), and the step's metadata (positions, slots,
// block tables, lengths) sent up in one asynchronous copy from pinned memory. A CUDA forward with
// x and y on the GPU runs on the layer's stream and neither synchronizes nor copies from pageable
// memory (once the RoPE table and the arena cover the step). Decode-only steps replay CUDA graphs
// as dsv4::Attention's do (SparseMlaOptions::cuda_graphs), and a forward may be captured by the
// caller (torch.cuda.graph): a replay then re-runs the captured step, plan included.
#pragma once

#include <cstdint>
#include <memory>

#include "dsv4/batch.h"
#include "dsv4/config.h"
#include "dsv4/layer.h"
#include "dsv4/paged_cache.h"
#include "dsv4/sparse_mla_weights.h"
#include "dsv4/tensor.h"

namespace dsv4 {

struct SparseMlaOptions {
  Backend backend = Backend::cpu;
  Stream stream = nullptr;           // CUDA: the stream every kernel of the layer runs on
  bool fp8_activations = true;       // FP8 (UE8M0 1x128) the W_UV output before an FP8 wo
  bool fp8_gemm_activations = true;  // the same for x and the normed q before FP8 projections
  // (CUDA runs FP8 weights on FP8 tensor cores, which take FP8 inputs only: there both must stay
  // on for FP8 weights; the constructor throws otherwise.)
  int32_t cache_blocks = 256;        // blocks of the latent cache and of the indexer key cache
  int block_size = 64;               // tokens per block of both caches
  int num_sms = 132;                 // decode split plan
  // CUDA: decode-only steps of up to 512 tokens run as CUDA graphs, one per bucket of 1, 2, 4,
  // ..., 512 tokens: the first step of a bucket runs eagerly, the second is captured, later ones
  // replay it. Such steps are padded to their bucket (with empty requests) either way, so graphs
  // on and off give the same bits. Off: every step runs eagerly.
  bool cuda_graphs = true;
};

class SparseMlaAttention {
 public:
  // Throws dsv4::Error for a config that is not V3.2, index_head_dim != 128, a layer out of
  // range, weights that do not match the config, or the CUDA backend where it cannot run (no
  // device, or FP8 weights with an FP8 option off).
  SparseMlaAttention(const ModelConfig& cfg, int layer, SparseMlaWeights weights,
                     SparseMlaOptions opts = {});
  ~SparseMlaAttention();
  SparseMlaAttention(SparseMlaAttention&&) noexcept;
  SparseMlaAttention& operator=(SparseMlaAttention&&) noexcept;

  // x [T, dim] → y [T, dim] fp32, both contiguous, T = plan.num_tokens(). CPU backend: x bf16 or
  // fp32, x and y on the host. CUDA backend: x bf16, x and y on the GPU. Each request's `context`
  // must equal the tokens this layer has cached for it (new requests: 0, registered
  // automatically). Throws dsv4::Error on bad input, naming the argument, before changing any
  // state.
  void forward(const BatchPlan& plan, const TensorView& x, const TensorView& y);
  // The checks forward() makes of a plan (contexts, lengths, cache blocks) without running it.
  void check_plan(const BatchPlan& plan) const;
  // Forgets a finished request and returns its cache blocks (unknown ids: dsv4::Error).
  void release(int64_t req_id);
  // CUDA: the stream later forwards run on (CPU: ignored).
  void set_stream(Stream stream);
  // Sizes the RoPE table, the temporaries' arena and the step upload for steps of up to
  // `max_tokens` tokens over `max_requests` requests with sequences of up to `max_context`
  // tokens, so that such steps allocate nothing. Returns the layer's memory after it.
  LayerMemory reserve(int64_t max_tokens, int max_requests, int64_t max_context);
  LayerMemory memory() const;
  // CUDA graphs of decode steps: captured so far, and steps replayed from them.
  int64_t graph_captures() const;
  int64_t graph_replays() const;

  const ModelConfig& config() const;
  const SparseMlaWeights& weights() const;
  int layer_index() const;
  Backend backend() const;
  int padded_heads() const;  // Hp: 64 for H <= 64, else 128
  // On the layer's device (CPU: host memory).
  const PagedCache& kv_cache() const;       // V32_FP8, one latent + rope row per token
  const PagedCache& indexer_keys() const;   // one FP8 key per token (indexer_key_cache.h)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The head count the sparse kernels run for H query heads (vLLM pads to 64 on Hopper).
inline int sparse_mla_padded_heads(int heads) { return heads <= 64 ? 64 : 128; }

}  // namespace dsv4
