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
#include "dsv4/ops.h"
#include "dsv4/paged_cache.h"
#include "dsv4/tensor.h"
#include "dsv4/weights.h"

namespace dsv4 {

// Where a layer runs. cpu: the reference ops on host tensors. cuda: every op's CUDA twin on the
// GPU, with the caches, weights (FP8 GEMM weights kept FP8 for the FP8 tensor cores, others as
// bf16) and temporaries in device memory — on the device current when the layer is constructed,
// which must be current for its forwards too.
enum class Backend : uint8_t { cpu, cuda };

struct AttentionOptions {
  Backend backend = Backend::cpu;
  Stream stream = nullptr;      // CUDA: the stream every kernel of the layer runs on
  LayerCacheOptions caches;     // layout and pool sizes
  bool fp8_activations = true;  // quantize o to FP8 (UE8M0 1x128) before wo_a, as production does
  // Quantize the input of every other projection whose weight is FP8 (wq_a, wkv, wq_b, the
  // indexer's wq_b, wo_b) the same way, as DeepSeek's Linear and vLLM do. The CUDA backend runs
  // FP8 weights on FP8 tensor cores, which need FP8 inputs: there both flags must stay on for a
  // checkpoint with FP8 weights (the constructor throws otherwise).
  bool fp8_gemm_activations = true;
  int num_sms = 132;            // decode split plan
};

class Attention {
 public:
  Attention(const ModelConfig& cfg, int layer, AttentionWeights weights,
            AttentionOptions opts = {});
  ~Attention();
  Attention(Attention&&) noexcept;
  Attention& operator=(Attention&&) noexcept;

  // x [T, dim] → y [T, dim] fp32. T = plan.num_tokens(). Each request's `context` must equal the
  // tokens this layer has cached for it (new requests: 0 and registered automatically). Throws
  // dsv4::Error on bad input, before changing any state.
  //   CPU backend: x bf16 or fp32, x and y on the host.
  //   CUDA backend: x and y each on the GPU or the host. A GPU x must be bf16 (a host x is rounded
  //   to bf16 and uploaded); a host y waits for the result (the forward is otherwise
  //   asynchronous on `AttentionOptions::stream`). Per step the layer uploads its plan (positions,
  //   slots, block tables, index lists), so a forward is not graph-capturable as a whole; its ops
  //   are.
  void forward(const BatchPlan& plan, const TensorView& x, const TensorView& y);

  // The checks forward() makes of a plan before it changes anything — every request's context,
  // sequence length and the cache blocks the step needs — without running it (a stack checks
  // every layer before the first runs). Throws dsv4::Error.
  void check_plan(const BatchPlan& plan) const;

  // CUDA: the stream later forwards run on (a serving engine's current stream; CPU: ignored).
  void set_stream(Stream stream);

  // Forgets a finished request and returns its cache blocks.
  void release(int64_t req_id);

  const ModelConfig& config() const;
  int layer_index() const;
  LayerKind kind() const;
  Backend backend() const;
  const AttentionWeights& weights() const;
  const LayerCaches& caches() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4
