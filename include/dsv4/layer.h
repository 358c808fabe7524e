// dsv4::Attention — one DeepSeek-V4 attention layer (docs/spec.md §2): weights, its paged caches and
// per-request state, and forward() over a mixed batch (decodes first, then prefill chunks that may
// continue earlier context). The layer only sequences ops (include/dsv4/ops.h, compressor.h,
// indexer.h); it never knows which backend runs them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/caller_step.h"
#include "dsv4/config.h"
#include "dsv4/ops.h"
#include "dsv4/paged_cache.h"
#include "dsv4/tensor.h"
#include "dsv4/tensor_parallel.h"
#include "dsv4/weights.h"

namespace dsv4 {

// Where a layer runs. cpu: the reference ops on host tensors. cuda: every op's CUDA twin on the
// GPU, with the caches, weights (FP8 GEMM weights kept FP8 for the FP8 tensor cores, others as
// bf16) and temporaries in device memory — on the device current when the layer is constructed,
// which must be current for its forwards too.
enum class Backend : uint8_t { cpu, cuda };

// Per-op timing of a forward (`dsv4 bench layer`): the layer calls begin(op) on its stream before
// the launches of each named op of a forward, and end() after the last; an implementation records
// CUDA events (or host clocks on the CPU backend). Op names are stable identifiers
// (see the op() marks in src/layer/attention.cpp and compressed_scope.cpp), so a cost model can be
// keyed by them. While a timer is active the layer runs serially and without CUDA graphs (each
// op's time is its own); an inactive timer costs nothing.
class OpTimer {
 public:
  virtual ~OpTimer() = default;
  virtual void begin(const char* op, Stream stream) = 0;
  virtual void end(Stream stream) = 0;
  virtual bool active() const { return true; }
  // CUDA decode graphs: called on `stream` right before (before = true) and right after each
  // launch of a captured step, whether or not active() (graph steps run only while it is not),
  // so a timer can bracket the replay's GPU time with events of its own.
  virtual void graph_launch(Stream stream, bool before) {
    (void)stream;
    (void)before;
  }
  // Called on the host as a forward leaves each stage of its host half, whether or not active():
  // "checked" (the step's inputs), "planned" (bookkeeping and the step's arrays), "uploaded" (the
  // arrays' copy enqueued). With graph_launch(), a timer can tell where the host's time before a
  // decode graph's launch goes.
  virtual void host_phase(const char* phase) { (void)phase; }
};

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
  OpTimer* op_timer = nullptr;  // optional per-op timing (not owned); nullptr = none
  // CUDA: decode-only steps of up to 512 tokens run as CUDA graphs, one per bucket of 1, 2, 4,
  // ..., 512 tokens (the step is padded with empty requests): the first step of a bucket runs
  // eagerly, the second is captured, later ones replay it. Off: every step runs eagerly.
  bool cuda_graphs = true;
  // Prefill requests are gathered into the bf16 workspace this many at a time, so the gather
  // workspace is bounded by the group, not the batch (the V4 wrapper's chunks of 4).
  int prefill_group_requests = 4;
  // Caller-owned caches (a serving engine's, as vLLM hands them to its attention wrapper): the
  // layer allocates no cache and keeps no per-request state. The caller binds its cache tensors
  // (bind_caches) and runs steps with forward(const CallerStep&, ...), which take the requests,
  // slots and block tables from the caller. Of `caches` only layout and swa_block_size apply (the
  // pool sizes are the caller's tensors'). Off (the default, `dsv4 run`): the layer owns its
  // caches and runs forward(const BatchPlan&, ...).
  bool caller_caches = false;
  // Tensor parallelism (include/dsv4/tensor_parallel.h): the layer is rank tp.rank of tp.size. It
  // is given the whole layer's weights and keeps its shard (weights() returns the shard), runs
  // n_heads / tp.size heads, and ends each forward with tp.communicator's all-reduce of y (on
  // `stream`; a CUDA layer's communicator must be a CUDA one, e.g. NCCL). Without a communicator
  // y is this rank's partial sum. Default: one rank, the whole layer.
  TensorParallel tp;
};

// What one layer holds in memory on its device (bytes).
struct LayerMemory {
  int64_t weights = 0;    // GEMM weights (+ scales), norms, sink
  int64_t caches = 0;     // every paged cache's storage
  int64_t workspace = 0;  // the temporaries' arena (as reserved or grown so far)
  int64_t workspace_used = 0;  // the most any forward so far took of it
  int64_t step_upload = 0;  // the step metadata buffer
};

class Attention {
 public:
  Attention(const ModelConfig& cfg, int layer, AttentionWeights weights,
            AttentionOptions opts = {});
  ~Attention();
  Attention(Attention&&) noexcept;
  Attention& operator=(Attention&&) noexcept;

  // Self-managed caches (AttentionOptions::caller_caches off; refused otherwise):
  // x [T, dim] → y [T, dim] fp32. T = plan.num_tokens(). Each request's `context` must equal the
  // tokens this layer has cached for it (new requests: 0 and registered automatically). Throws
  // dsv4::Error on bad input, before changing any state.
  //   CPU backend: x bf16 or fp32, x and y on the host.
  //   CUDA backend: x and y each on the GPU or the host. A GPU x must be bf16 (a host x is rounded
  //   to bf16 and uploaded); a host y waits for the result. With x and y on the GPU a forward
  //   neither synchronizes nor copies from pageable memory: the step's plan (positions, slots,
  //   block tables, lengths) goes up in one asynchronous copy from pinned memory, and decode-only
  //   steps replay CUDA graphs (AttentionOptions::cuda_graphs). A forward may also be captured by
  //   the caller (torch.cuda.graph): a replay then re-runs the captured step, plan included.
  void forward(const BatchPlan& plan, const TensorView& x, const TensorView& y);

  // The checks forward() makes of a plan before it changes anything — every request's context,
  // sequence length and the cache blocks the step needs — without running it (a stack checks
  // every layer before the first runs). Throws dsv4::Error.
  void check_plan(const BatchPlan& plan) const;

  // CUDA: the stream later forwards run on (a serving engine's current stream; CPU: ignored).
  void set_stream(Stream stream);

  // Sizes every workspace for steps of up to `max_tokens` tokens over `max_requests` requests
  // with sequences of up to `max_context` tokens (the RoPE table, the temporaries' arena, the
  // step upload), so that such steps allocate nothing. Returns the layer's memory after it.
  LayerMemory reserve(int64_t max_tokens, int max_requests, int64_t max_context);
  LayerMemory memory() const;
  // CUDA graphs of decode steps: captured so far, and steps replayed from them.
  int64_t graph_captures() const;
  int64_t graph_replays() const;

  // Forgets a finished request and returns its cache blocks.
  void release(int64_t req_id);

  // ---- caller-owned caches (AttentionOptions::caller_caches) ---------------------------------
  // Binds the caller's cache tensors (include/dsv4/paged_cache.h CallerCaches: on the layer's
  // device, any block stride >= the block's bytes); later steps read and write them. Rebinding
  // (new tensors) is allowed between steps. Throws dsv4::Error naming the field that does not
  // fit, before changing anything; also when the layer owns its caches.
  void bind_caches(const CallerCaches& caches);
  // One step on the bound caches: x [T, dim] → y [T, dim] fp32 as forward(BatchPlan) (same
  // devices, dtypes and CUDA behaviour), with the requests, positions, SWA slots and block tables
  // of `step` (include/dsv4/caller_step.h, host arrays). Every argument is checked before
  // anything is written (Error names it); the caches' contents are the caller's contract (each
  // request's entries and compressor rings as the earlier steps of that request left them).
  void forward(const CallerStep& step, const TensorView& x, const TensorView& y);
  bool caller_caches() const;

  const ModelConfig& config() const;  // the model's (all heads, whatever AttentionOptions::tp)
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
