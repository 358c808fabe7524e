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
// GPU, with the caches, weights (GEMM weights as bf16) and temporaries in device memory — on the
// device current when the layer is constructed, which must be current for its forwards too.
enum class Backend : uint8_t { cpu, cuda };

// Per-op timing of a forward (`dsv4 bench layer`): the layer calls begin(op) on its stream before
// the launches of each named op of a forward, and end() after the last; an implementation records
// CUDA events (or host clocks on the CPU backend). Op names are stable identifiers
// (layer_op_names() lists them), so a cost model can be keyed by them.
class OpTimer {
 public:
  virtual ~OpTimer() = default;
  virtual void begin(const char* op, Stream stream) = 0;
  virtual void end(Stream stream) = 0;
};

struct AttentionOptions {
  Backend backend = Backend::cpu;
  Stream stream = nullptr;      // CUDA: the stream every kernel of the layer runs on
  LayerCacheOptions caches;     // layout and pool sizes
  bool fp8_activations = true;  // quantize o to FP8 (UE8M0 1x128) before wo_a, as production does
  int num_sms = 132;            // decode split plan
  OpTimer* op_timer = nullptr;  // optional per-op timing (not owned); nullptr = none
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
