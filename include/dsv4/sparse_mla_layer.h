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
// ModelConfig::mla_softmax_scale(). No attention sink.
//
// CPU backend only so far (host tensors, the ops' CPU reference).
#pragma once

#include <cstdint>
#include <memory>

#include "dsv4/batch.h"
#include "dsv4/config.h"
#include "dsv4/paged_cache.h"
#include "dsv4/sparse_mla_weights.h"
#include "dsv4/tensor.h"

namespace dsv4 {

struct SparseMlaOptions {
  bool fp8_activations = true;       // FP8 (UE8M0 1x128) the W_UV output before an FP8 wo
  bool fp8_gemm_activations = true;  // the same for x and the normed q before FP8 projections
  int32_t cache_blocks = 256;        // blocks of the latent cache and of the indexer key cache
  int block_size = 64;               // tokens per block of both caches
  int num_sms = 132;                 // decode split plan
};

class SparseMlaAttention {
 public:
  // Throws dsv4::Error for a config that is not V3.2, index_head_dim != 128, a layer out of
  // range, or weights that do not match the config.
  SparseMlaAttention(const ModelConfig& cfg, int layer, SparseMlaWeights weights,
                     SparseMlaOptions opts = {});
  ~SparseMlaAttention();
  SparseMlaAttention(SparseMlaAttention&&) noexcept;
  SparseMlaAttention& operator=(SparseMlaAttention&&) noexcept;

  // x [T, dim] bf16/fp32 (host, contiguous) → y [T, dim] fp32 (host, contiguous), T =
  // plan.num_tokens(). Each request's `context` must equal the tokens this layer has cached for
  // it (new requests: 0, registered automatically). Throws dsv4::Error on bad input, before
  // changing any state.
  void forward(const BatchPlan& plan, const TensorView& x, const TensorView& y);
  // The checks forward() makes of a plan (contexts, lengths, cache blocks) without running it.
  void check_plan(const BatchPlan& plan) const;
  // Forgets a finished request and returns its cache blocks (unknown ids: dsv4::Error).
  void release(int64_t req_id);

  const ModelConfig& config() const;
  const SparseMlaWeights& weights() const;
  int layer_index() const;
  int padded_heads() const;  // Hp: 64 for H <= 64, else 128
  const PagedCache& kv_cache() const;       // V32_FP8, one latent + rope row per token
  const PagedCache& indexer_keys() const;   // one FP8 key per token (indexer_key_cache.h)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The head count the sparse kernels run for H query heads (vLLM pads to 64 on Hopper).
inline int sparse_mla_padded_heads(int heads) { return heads <= 64 ? 64 : 128; }

}  // namespace dsv4
