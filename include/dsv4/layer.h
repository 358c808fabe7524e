// dsv4::Attention — one DeepSeek-V4 attention layer (SPEC §2): weights, its paged caches and
// per-request state, and forward() over a mixed batch (decodes first, then prefill chunks that may
// continue earlier context). The layer only sequences ops (include/dsv4/ops.h, compressor.h,
// indexer.h); it never knows which backend runs them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/config.h"
#include "dsv4/paged_cache.h"
#include "dsv4/tensor.h"
#include "dsv4/weights.h"

namespace dsv4 {

enum class Backend : uint8_t { cpu, cuda };

struct AttentionOptions {
  Backend backend = Backend::cpu;
  LayerCacheOptions caches;     // layout and pool sizes
  bool fp8_activations = true;  // quantize o to FP8 (UE8M0 1x128) before wo_a, as production does
  int num_sms = 132;            // decode split plan
};

class Attention {
 public:
  Attention(const ModelConfig& cfg, int layer, AttentionWeights weights,
            AttentionOptions opts = {});
  ~Attention();
  Attention(Attention&&) noexcept;
  Attention& operator=(Attention&&) noexcept;

  // x [T, dim] (bf16 or fp32, host) → y [T, dim] fp32 (host). T = plan.num_tokens(). Each
  // request's `context` must equal the tokens this layer has cached for it (new requests: 0 and
  // registered automatically). Throws dsv4::Error on bad input, before changing any state.
  void forward(const BatchPlan& plan, const TensorView& x, const TensorView& y);

  // Forgets a finished request and returns its cache blocks.
  void release(int64_t req_id);

  const ModelConfig& config() const;
  int layer_index() const;
  LayerKind kind() const;
  const AttentionWeights& weights() const;
  const LayerCaches& caches() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4
