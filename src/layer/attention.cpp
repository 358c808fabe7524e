// dsv4::Attention: sequences the ops of one layer over a mixed batch (docs/spec.md §2).
//
//   x ─► wq_a, wkv ─► fused q/kv RMSNorm ─► wq_b ─► q head-norm + RoPE, kv RoPE + quant + insert
//     ─► [compressor ─► compressed cache; C4A: indexer top-k; C128A: all entries]
//     ─► decodes: sparse_decode over (SWA window | compressed entries) read from the FP8 caches
//        (with a per-tensor FP8 cache, of the FP8 queries the insert wrote, as the FlashInfer port)
//     ─► prefills: gather (compressed | SWA) into a bf16 workspace, sparse_prefill
//     ─► inverse RoPE + FP8 act quant (one pass) ─► grouped wo_a ─► wo_b ─► y
// Projections with FP8 weights take FP8 inputs (per token and 128 columns, UE8M0), as DeepSeek's
// Linear does: x is quantized once for wq_a and wkv, the q norm writes the FP8 q for wq_b.
#include "dsv4/layer.h"

#include <algorithm>
#include <cmath>

#include "dsv4/device_tensor.h"
#include "dsv4/indexer.h"
#include "dsv4/indexing.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#include "layer/compressed_scope.h"
#include "layer/decode_graphs.h"
#include "layer/gemm_input.h"
#include "layer/layer_weights.h"
#include "layer/scratch.h"
#include "layer/step_planner.h"
#include "layer/step_rows.h"
#include "layer/step_upload.h"
#include "runtime/branch_stream.h"
#include "runtime/device_runtime.h"

namespace dsv4 {

namespace {
constexpr const char* kWhere = "Attention::forward";

// Reinterprets a contiguous tensor with a new shape (same element count).
TensorView reshape(const TensorView& t, std::initializer_list<int64_t> dims) {
  TensorView v(t.data, t.dtype, dims, t.device);
  DSV4_CHECK(v.numel() == t.numel(), "reshape: ", t.shape_str(), " -> ", v.shape_str());
  return v;
}

// The CUDA GEMMs multiply FP8 weights on FP8 tensor cores, which take FP8 inputs only.
void check_cuda_fp8_inputs(const LayerWeightViews& wv, const AttentionOptions& opts) {
  const bool fp8_projection = wv.wq_a.fp8() || wv.wkv.fp8() || wv.wq_b.fp8() || wv.wo_b.fp8() ||
                              (wv.indexer && wv.indexer->wq_b.fp8());
  if (fp8_projection && !opts.fp8_gemm_activations)
    fail("Attention: fp8_gemm_activations: expected true on the CUDA backend for a checkpoint with FP8 "
         "projection weights (FP8 tensor cores take FP8 inputs), got false; use Backend::cpu");
  if (wv.wo_a.fp8() && !opts.fp8_activations)
    fail("Attention: fp8_activations: expected true on the CUDA backend for a checkpoint with an FP8 "
         "wo_a (FP8 tensor cores take FP8 inputs), got false; use Backend::cpu");
}

}  // namespace

struct Attention::Impl {
  ModelConfig model_cfg;  // the model's config
  ModelConfig cfg;        // this tensor-parallel rank's: its heads and wo_a groups (= model_cfg at tp 1)
  int layer = 0;
  LayerKind kind = LayerKind::swa;
  AttentionWeights w;
  AttentionOptions opts;
  Device device = Device::cpu;        // where caches, weights and temporaries live
  LayerCaches caches;
  std::unique_ptr<LayerWeightStore> weights;  // w as the ops take it, on `device`
  Scratch scratch{Device::cpu, nullptr};
  StepUpload upload{Device::cpu};
  RopeConfig rope;
  HostTensor cos_sin;                 // [rows, R] for positions [0, rows); grown on demand
  DeviceTensor cos_sin_device;        // its copy on the GPU (CUDA backend)
  uint64_t rope_generation = 0;       // changes when the table moves
  std::unique_ptr<StepPlanner> planner;         // the host half of every step
  std::unique_ptr<CompressedScope> compressed;  // ratio > 0 layers
  DecodeGraphs graphs;                // CUDA: captured decode steps per shape bucket
  rt::BranchStream side_branch;  // CUDA: the compressed half of a step, beside the projections
  rt::BranchStream kv_branch;    // CUDA: the wkv projection, beside wq_a

  void check_inputs(const BatchPlan& plan, const TensorView& x, const TensorView& y) const;
  void check_io(int64_t T, const TensorView& x, const TensorView& y) const;
  // Which forward the layer's cache mode allows (`forward`: "caller" or "own").
  void require_mode(bool caller, const char* where) const;
  uint64_t cache_generation = 0;      // changes when caller caches are bound (graphs read them)
  // Grows the cos/sin table (doubling, up to max_position) to cover positions [0, len). A table
  // for all of max_position (1M for v4-flash) would cost 256 MB and seconds per layer.
  void ensure_rope(int64_t len) {
    const int64_t have = cos_sin.shape().empty() ? 0 : cos_sin.shape()[0];
    if (have >= len) return;
    int64_t rows = std::max<int64_t>(have, 1);
    while (rows < len) rows *= 2;
    cos_sin = build_rope_cache(rope, std::min<int64_t>(rows, cfg.max_position));
    if (device == Device::cuda) cos_sin_device = DeviceTensor::from_host(cos_sin);
    ++rope_generation;
  }
  TensorView rope_table() const {
    return device == Device::cuda ? cos_sin_device.view() : cos_sin.view();
  }
  // x as the layer's ops take it: the caller's tensor on the CPU; on CUDA a bf16 device tensor
  // (a host x is rounded to bf16 and uploaded, as a serving engine's hidden states are bf16).
  TensorView stage_input(const TensorView& x);
  // step: the caller's step on caller-owned caches (plan is then its check_caller plan); else
  // the layer books the step in its own caches.
  void forward(const BatchPlan& plan, const CallerStep* step, const TensorView& x,
               const TensorView& y);
  // Marks the start of the named op's launches for the optional per-op timer.
  void op(const char* name) const {
    if (timing()) opts.op_timer->begin(name, opts.stream);
  }
  bool timing() const { return opts.op_timer != nullptr && opts.op_timer->active(); }
  // Whether this step runs as a replayed CUDA graph: a decode-only step on CUDA, with graphs on,
  // nobody capturing the stream already (a caller's torch.cuda.graph captures the eager path)
  // and no per-op timer.
  bool graph_step(const BatchPlan& plan) const;
  // Upper bounds of the temporaries and the step upload of steps within reserve()'s limits.
  struct WorkspaceBound {
    int64_t scratch_bytes = 0, upload_bytes = 0;
  };
  WorkspaceBound workspace_bound(int64_t max_tokens, int max_requests, int64_t max_context) const;
  uint64_t memory_generation() const {
    return scratch.generation() + upload.generation() + rope_generation + cache_generation;
  }

  // ---- a step: planned on the host (StepPlanner), then launched ----------------------------
  // Enqueues every kernel of the step on `stream`: x [T, dim] (bf16 on CUDA), y [T, dim] fp32,
  // both on the layer's device. Reads only device views and shapes (graph-capturable).
  // `receive`: the step's plan was posted (StepUpload::post) and is taken by the launch's first
  // kernel.
  void launch(const StepPlan& sp, const TensorView& x, const TensorView& y, Stream stream, bool receive);

  // What the phases of one launch share.
  struct Step {
    const StepPlan& sp;
    Stream stream;
    TensorView q;             // [T, H, D] bf16: normed, roped queries
    // FP8_PER_TENSOR caches: [T, H, D] fp8_e4m3, the queries the decodes read (q = bf16(fp8 ·
    // q_scale)); undefined otherwise.
    TensorView q_fp8;
    float q_scale = 1.0f;
    TensorView o;             // [T, H, D] bf16: the attention output
    TensorView positions;     // [T] int64
    TensorView token_to_req;  // [T] int32
    CompressedIndices compressed;  // request-local compressed entries (topk 0: SWA layer)
    TensorView cos_sin;       // the RoPE table on the layer's device
    float softmax_scale = 0.0f;
  };
  struct Dims {
    int H, D, W;  // heads, head dim, SWA window
  };
  Dims dims() const { return {cfg.n_heads, cfg.head_dim, cfg.window_size}; }
  // 7a. Decodes read the caches directly through two scopes (SWA window | compressed entries).
  void attend_decodes(const Step& st);
  // 7b. Prefill chunks: gather (compressed | SWA) rows into a bf16 workspace, sparse prefill,
  // a group of requests at a time.
  void attend_prefills(const Step& st);
  // 8–9. Inverse RoPE, FP8 activation quant, grouped wo_a, wo_b → y.
  void project_output(const Step& st, const TensorView& y);

  // Whether a projection's input is quantized to FP8 (its weight is FP8 and the options say so).
  bool fp8_input(const WeightView& w) const { return w.fp8() && opts.fp8_gemm_activations; }
  // The cuBLASLt workspace of this forward's projections (CUDA; none on the CPU).
  TensorView gemm_workspace;
};

Attention::Attention(const ModelConfig& cfg, int layer, AttentionWeights weights,
                     AttentionOptions opts)
    : impl_(std::make_unique<Impl>()) {
  cfg.validate();
  DSV4_CHECK(cfg.family == "v4", "Attention: the layer is DeepSeek-V4's; config family is ",
             cfg.family);
  if (opts.backend == Backend::cuda && !cuda_available())
    fail("Attention: backend cuda: ",
         cuda_built() ? "no CUDA device is visible" : "the library was built without CUDA",
         "; use Backend::cpu");
  Impl& m = *impl_;
  m.model_cfg = cfg;
  m.layer = layer;
  m.kind = cfg.layer_kind(layer);
  validate_attention_weights(weights, cfg, "Attention");
  check_tensor_parallel(cfg, opts.tp, "Attention: AttentionOptions");
  if (opts.tp.communicator && opts.tp.communicator->device() != (opts.backend == Backend::cuda ? Device::cuda : Device::cpu))
    fail("Attention: AttentionOptions: tp.communicator: expected one for the layer's backend's memory, got ",
         opts.tp.communicator->device() == Device::cuda ? "a CUDA one" : "a host one");
  m.cfg = tensor_parallel_config(cfg, opts.tp.size);
  m.w = opts.tp.size == 1 ? std::move(weights) : shard_attention_weights(weights, cfg, opts.tp);
  m.opts = opts;
  m.device = opts.backend == Backend::cuda ? Device::cuda : Device::cpu;
  LayerCacheOptions cache_opts = opts.caches;
  cache_opts.device = m.device;
  // Caller-owned caches arrive with bind_caches (until then the layer has none).
  m.caches.kind = m.kind;
  if (!opts.caller_caches) m.caches = make_layer_caches(cfg, m.kind, cache_opts);
  m.weights = std::make_unique<LayerWeightStore>(m.w, m.device);
  if (m.device == Device::cuda) check_cuda_fp8_inputs(m.weights->views(), opts);
  m.scratch = Scratch(m.device, opts.stream);
  m.upload = StepUpload(m.device);
  m.planner = std::make_unique<StepPlanner>(m.cfg, layer, m.caches, opts.prefill_group_requests);
  m.rope = cfg.rope_for_layer(layer);
  m.ensure_rope(4096);
  if (m.kind != LayerKind::swa)
    m.compressed = std::make_unique<CompressedScope>(m.cfg, layer, m.weights->views(), m.caches);
}

Attention::~Attention() = default;
Attention::Attention(Attention&&) noexcept = default;
Attention& Attention::operator=(Attention&&) noexcept = default;

const ModelConfig& Attention::config() const { return impl_->model_cfg; }
int Attention::layer_index() const { return impl_->layer; }
LayerKind Attention::kind() const { return impl_->kind; }
Backend Attention::backend() const { return impl_->opts.backend; }
const AttentionWeights& Attention::weights() const { return impl_->w; }
const LayerCaches& Attention::caches() const { return impl_->caches; }

void Attention::set_stream(Stream stream) {
  impl_->opts.stream = stream;
  impl_->scratch.set_stream(stream);
}

int64_t Attention::graph_captures() const { return impl_->graphs.captures(); }
int64_t Attention::graph_replays() const { return impl_->graphs.replays(); }

LayerMemory Attention::memory() const {
  const Impl& m = *impl_;
  LayerMemory mem;
  mem.weights = m.weights->bytes();
  for (const PagedCache* c : {m.caches.swa.get(), m.caches.compressed.get(),
                              m.caches.compressor_state.get(), m.caches.indexer_keys.get(),
                              m.caches.indexer_state.get()})
    if (c && !c->caller_owned()) mem.caches += c->storage_view().numel();
  mem.workspace = m.scratch.capacity();
  mem.workspace_used = m.scratch.high_water();
  mem.step_upload = m.upload.capacity();
  return mem;
}

LayerMemory Attention::reserve(int64_t max_tokens, int max_requests, int64_t max_context) {
  check_reserve_bounds("Attention::reserve", max_tokens, max_requests, max_context, impl_->cfg.max_position);
  Impl& m = *impl_;
  m.ensure_rope(max_context);
  const Impl::WorkspaceBound b = m.workspace_bound(max_tokens, max_requests, max_context);
  m.scratch.reserve(b.scratch_bytes);
  m.upload.reserve(b.upload_bytes);
  return memory();
}

void Attention::release(int64_t req_id) {
  impl_->require_mode(false, "Attention::release");
  impl_->planner->release(req_id);
}

void Attention::check_plan(const BatchPlan& plan) const {
  impl_->require_mode(false, "Attention::check_plan");
  impl_->planner->check(plan);
}

void Attention::forward(const BatchPlan& plan, const TensorView& x, const TensorView& y) {
  impl_->require_mode(false, kWhere);
  impl_->check_inputs(plan, x, y);
  if (impl_->opts.op_timer) impl_->opts.op_timer->host_phase("checked");
  if (plan.num_tokens() == 0) return;  // an empty step (x, y [0, dim] may have no data)
  impl_->forward(plan, nullptr, x, y);
}

bool Attention::caller_caches() const { return impl_->opts.caller_caches; }

void Attention::bind_caches(const CallerCaches& caches) {
  Impl& m = *impl_;
  m.require_mode(true, "Attention::bind_caches");
  LayerCaches bound = make_caller_layer_caches(m.cfg, m.kind, m.opts.caches, caches, m.device);
  m.caches = std::move(bound);  // the planner and the compressed scope see them through m.caches
  ++m.cache_generation;
}

void Attention::forward(const CallerStep& step, const TensorView& x, const TensorView& y) {
  constexpr const char* where = "Attention::forward(CallerStep)";
  Impl& m = *impl_;
  m.require_mode(true, where);
  if (!m.caches.swa) fail(where, ": no caches are bound (call bind_caches first)");
  check_ndim(where, "x", x, 2);
  m.check_io(x.size(0), x, y);
  const BatchPlan plan = m.planner->check_caller(step, x.size(0));
  if (m.opts.op_timer) m.opts.op_timer->host_phase("checked");
  if (plan.num_tokens() == 0) return;
  m.forward(plan, &step, x, y);
}

void Attention::Impl::require_mode(bool caller, const char* where) const {
  if (caller && !opts.caller_caches)
    fail(where, ": the layer owns its caches (AttentionOptions::caller_caches is off); use "
         "forward(const BatchPlan&, ...)");
  if (!caller && opts.caller_caches)
    fail(where, ": the layer runs on caller-owned caches (AttentionOptions::caller_caches); use "
         "bind_caches and forward(const CallerStep&, ...)");
}

void Attention::Impl::check_inputs(const BatchPlan& plan, const TensorView& x,
                                   const TensorView& y) const {
  check_io(plan.num_tokens(), x, y);
  planner->check(plan);
}

void Attention::Impl::check_io(int64_t T, const TensorView& x, const TensorView& y) const {
  const char* host_or_layer =
      device == Device::cuda ? "cpu or cuda (the layer's backend)" : "cpu";
  if (x.device != Device::cpu && x.device != device)
    fail_expected(kWhere, "x.device", host_or_layer, "cuda");
  check_shape(kWhere, "x", x, {T, cfg.dim});
  check_contiguous(kWhere, "x", x);
  if (x.device == Device::cuda)
    check_dtype(kWhere, "x (on the GPU; the CUDA GEMMs take bf16 activations)", x, DType::bf16);
  else if (x.dtype != DType::bf16 && x.dtype != DType::fp32)
    fail_expected(kWhere, "x.dtype", "bf16 or fp32", dtype_name(x.dtype));
  if (y.device != Device::cpu && y.device != device)
    fail_expected(kWhere, "y.device", host_or_layer, "cuda");
  check_shape(kWhere, "y", y, {T, cfg.dim});
  check_dtype(kWhere, "y", y, DType::fp32);
  check_contiguous(kWhere, "y", y);
}

TensorView Attention::Impl::stage_input(const TensorView& x) {
  if (device == Device::cpu || x.device == Device::cuda) return x;
  return scratch.upload(HostTensor::copy_of(x, DType::bf16));
}

Attention::Impl::WorkspaceBound Attention::Impl::workspace_bound(int64_t max_tokens,
                                                                 int max_requests,
                                                                 int64_t max_context) const {
  // Every temporary launch() takes (and padding of graph buckets, and power-of-two rounding of
  // the data-dependent widths), counted generously: a test checks it covers what steps use.
  const int64_t T4 = (max_tokens + kFp8GemmRowMultiple - 1) / kFp8GemmRowMultiple * kFp8GemmRowMultiple;
  const int64_t T = std::max(T4, DecodeGraphs::rows(std::min(max_tokens, DecodeGraphs::kMaxTokens)));
  const int64_t R = std::max<int64_t>(
      max_requests, DecodeGraphs::rows(std::min<int64_t>(max_requests, DecodeGraphs::kMaxTokens)));
  const int64_t H = cfg.n_heads, D = cfg.head_dim, HD = H * D, W = cfg.window_size;
  const int ratio = compressed ? compressed->ratio() : 0;
  const int64_t visible = ratio ? 2 * (max_context / ratio) + 1 : 0;  // rounded up to 2^k
  const int64_t K = ratio == 4 ? cfg.index_topk : visible;
  const int64_t HI = cfg.index_n_heads, DI = cfg.index_head_dim;
  int64_t bytes = 0, tensors = 0;
  auto add = [&](int64_t b) { bytes += b; ++tensors; };
  add(4 * T * cfg.q_lora_rank);  // qr
  add(4 * T * D);                // kv_raw
  add(2 * T * cfg.q_lora_rank);  // qr_n
  add(2 * T * D);                // kv
  add(2 * T * HD);               // q
  if (opts.caches.layout == KvLayout::fp8_per_tensor) add(T * HD);  // q_fp8
  add(2 * T * HD);               // o
  if (ratio) {
    const int64_t coff = ratio == 4 ? 2 : 1;
    add(2 * 4 * T * coff * D);  // compressor kv / score rows
    if (device == Device::cuda) add(kBranchGemmWorkspaceBytes);
    if (device == Device::cuda && ratio == 4) add(kBranchGemmWorkspaceBytes);  // the indexer's
    add(4 * T * K);             // local entries
    add(4 * T);                 // lens
  }
  if (ratio == 4) {
    add(2 * 4 * T * 2 * DI);    // indexer compressor rows
    add(T * HI * DI);           // q_fp8
    add(2 * 4 * T * HI);        // q_scale, weights
    add(indexer_query_workspace_bytes(T, static_cast<int>(HI), static_cast<int>(DI)));
    add(4 * T * visible);       // scores
  }
  // Decodes.
  add(4 * T * (W + 1));  // swa indices, lens
  add(4 * T * (K + 1));  // extra indices, lens
  add(4 * T * H);        // lse
  add(make_decode_schedule(static_cast<int>(T), 1, static_cast<int>(H), static_cast<int>(W + K),
                           opts.num_sms).workspace_bytes);
  // Prefills: one gather workspace for the largest group and the kernel's work counter, then per
  // group indices and stats.
  const int64_t group = std::min<int64_t>(std::max(1, opts.prefill_group_requests), R);
  add(2 * group * ((ratio ? max_context / ratio : 0) + max_tokens + W) * D);
  add(4);
  const int64_t groups = (R + group - 1) / group;
  bytes += 4 * T * (K + W + 1 + 2 * H) + 4 * groups * 256;
  tensors += 4 * groups;
  // FP8 GEMM inputs (x, the normed q, z: codes + 1x128 scales) and the GEMMs' workspace.
  add(T * cfg.dim + 4 * T * (cfg.dim / 128 + 1));
  add(T * cfg.q_lora_rank + 4 * T * (cfg.q_lora_rank / 128 + 1));
  add(T * cfg.o_groups * cfg.o_lora_rank + 4 * T * (cfg.o_groups * cfg.o_lora_rank / 128 + 1));
  if (device == Device::cuda) add(kGemmWorkspaceBytes);
  if (device == Device::cuda) add(kBranchGemmWorkspaceBytes);  // wkv's
  // Output path.
  add(4 * T * cfg.o_groups * cfg.o_lora_rank);  // z
  add(T * HD);                                  // o fp8
  add(4 * T * (HD / 64));                       // o scales
  add(2 * T * HD);                              // o dequantized (bf16 GEMM path)
  add(4 * T * cfg.dim);                         // y on the device for a host y
  add(2 * T * cfg.dim);                         // x staged from the host
  add(6 * T * cfg.dim);                         // x / y rows of a padded step
  WorkspaceBound b;
  b.scratch_bytes = bytes + 256 * (tensors + 8);
  // The upload: per token positions, slots, token_to_req; per request context, lengths and the
  // block tables of every cache (widths rounded up to 2^k).
  // (Block sizes from the options: caller-owned caches may not be bound yet.)
  const int64_t swa_block = opts.caches.swa_block_size;
  const int64_t swa_blocks = round_up_pow2((max_context + swa_block - 1) / swa_block);
  int64_t tables = swa_blocks;
  if (ratio) {
    const int64_t entries = max_context / ratio + 1;
    tables += 2 * round_up_pow2(entries / CacheDefaults::compressed_block(ratio) + 1);
    tables += 2 * round_up_pow2(CacheDefaults::state_retain(ratio) + 1);
  }
  b.upload_bytes = 20 * T + R * (4 * tables + 40) + 64 * 32;
  return b;
}

bool Attention::Impl::graph_step(const BatchPlan& plan) const {
  const Communicator* comm = opts.tp.communicator;
  return device == Device::cuda && opts.cuda_graphs && !timing() && (!comm || comm->graph_capturable()) &&
         plan.num_decode_like == plan.num_requests() && plan.num_tokens() <= DecodeGraphs::kMaxTokens &&
         !rt::is_capturing(opts.stream);
}

void Attention::Impl::forward(const BatchPlan& plan, const CallerStep* step, const TensorView& x_in,
                              const TensorView& y) {
  const int64_t T = plan.num_tokens();
  const Stream stream = opts.stream;
  const ScratchStep scratch_step(scratch);

  int64_t longest = 0;
  for (int r = 0; r < plan.num_requests(); ++r) longest = std::max(longest, plan.seq_len(r));
  ensure_rope(longest);

  // Register new requests (check_inputs verified the others' context). Caller-owned caches keep
  // no requests in the layer.
  if (step == nullptr) planner->add_requests(plan);

  // CUDA steps run over a multiple of kFp8GemmRowMultiple token rows (the FP8 GEMMs' rule); a
  // decode graph's bucket is one already.
  const bool graph = graph_step(plan);
  const int64_t rows = step_rows(device, T, graph);
  const StepPlan& sp = step ? planner->plan_caller(plan, *step, rows, graph, upload)
                            : planner->plan(plan, rows, graph, upload);
  if (opts.op_timer) opts.op_timer->host_phase("planned");
  // A graph step's plan is posted (no CUDA call) and taken by the step's first kernel, inside its
  // graph; an eager step's is copied.
  if (graph) upload.post(stream);
  else upload.commit(stream);
  if (opts.op_timer) opts.op_timer->host_phase("uploaded");

  const TensorView x = stage_input(x_in);
  const StepLaunch run = [&](const TensorView& x_rows, const TensorView& y_rows, Stream s) {
    launch(sp, x_rows, y_rows, s, graph);
  };
  if (!graph) {
    run_eager_step(rows, x, y, scratch, stream, run);
    return;
  }
  Communicator* const comm = opts.tp.communicator;
  OpTimer* const timer = opts.op_timer;
  graphs.run(sp.key, memory_generation(), rows, x, y, scratch, stream, run, [comm, timer, stream](bool before) {
    if (before && comm) comm->launch_barrier();  // the graph holds its allreduce
    if (timer) timer->graph_launch(stream, before);
  });
  upload.received();
}

void Attention::Impl::launch(const StepPlan& sp, const TensorView& x, const TensorView& y,
                             Stream stream, bool receive) {
  const int64_t T = sp.T;
  const int H = cfg.n_heads, D = cfg.head_dim;
  const float eps = static_cast<float>(cfg.norm_eps);
  const LayerWeightViews& wv = weights->views();
  Scratch& ws = scratch;
  const TensorView cos_sin_v = rope_table();
  gemm_workspace = device == Device::cuda ? ws.tensor(DType::uint8, {kGemmWorkspaceBytes}) : TensorView{};

  // 6a. The compressed half begins with the compressors, which read only x and the plan: on CUDA
  // (no op timer) they start at once, on a side stream beside the projections, as the V4 wrapper
  // overlaps them; the indices (6b) follow the q norm there, and attention waits for the side
  // stream. Serial when an op timer attributes time per op.
  const TensorView positions = upload.view(sp.positions);
  const TensorView token_to_req = upload.view(sp.token_to_req);
  const bool branches = device == Device::cuda && !timing();
  const bool overlap = compressed && branches;
  auto mark = [this](const char* name) { op(name); };
  // A posted plan is taken first, on the step's stream. (Taking it on a branch of its own, joined
  // only where the plan is first read, so that the projections start at once, made the C4A decode
  // graph 8 µs slower on the H200 and the others no faster.)
  if (receive) upload.receive(stream);
  Stream cs = stream;
  if (compressed) {
    if (overlap) cs = side_branch.fork(stream);
    compressed->launch_compressors(sp.compressed, upload, x, positions, token_to_req, cos_sin_v, ws, cs,
                                   overlap, mark);
  }

  // 1–3. Projections and norms. x is quantized once for both projections that read it; the q
  // norm writes the FP8 q (for FP8 wq_b / indexer wq_b) and the bf16 one only if a reader needs it.
  op("wq_a");  // (x's FP8 quantization counts to wq_a, the first projection reading it)
  const GemmInput xin = make_gemm_input(x, fp8_input(wv.wq_a) || fp8_input(wv.wkv), ws, stream);
  TensorView qr = ws.tensor(DType::fp32, {T, cfg.q_lora_rank});
  TensorView kv_raw = ws.tensor(DType::fp32, {T, D});
  const TensorView kv_workspace =
      device == Device::cuda ? ws.tensor(DType::uint8, {kBranchGemmWorkspaceBytes}) : TensorView{};
  // wq_a and wkv read the same x and nothing of each other: on CUDA (no op timer) wkv runs on a
  // stream of its own beside wq_a. At decode each is a GEMM of a few CTAs.
  const Stream kvs = branches ? kv_branch.fork(stream) : stream;
  const auto [xa, xa_scale] = xin.for_weight(wv.wq_a);
  linear(xa, xa_scale, wv.wq_a.value, wv.wq_a.scale, qr, gemm_workspace, stream);
  op("wkv");
  const auto [xkv, xkv_scale] = xin.for_weight(wv.wkv);
  linear(xkv, xkv_scale, wv.wkv.value, wv.wkv.scale, kv_raw, kv_workspace, kvs);
  if (branches) kv_branch.join_into(stream);
  const WeightView* iwq_b = wv.indexer ? &wv.indexer->wq_b : nullptr;
  const bool qr_fp8 = fp8_input(wv.wq_b) || (iwq_b && fp8_input(*iwq_b));
  const bool qr_dense = !fp8_input(wv.wq_b) || (iwq_b && !fp8_input(*iwq_b));
  GemmInput qr_n;
  if (qr_dense) qr_n.dense = ws.tensor(DType::bf16, {T, cfg.q_lora_rank});
  if (qr_fp8) {
    qr_n.fp8 = ws.tensor(DType::fp8_e4m3, {T, cfg.q_lora_rank});
    qr_n.scale = act_scale_tensor(ws, T, cfg.q_lora_rank / 128);
  }
  TensorView kv = ws.tensor(DType::bf16, {T, D});
  op("qkv_norm");
  fused_qkv_rms_norm(qr, wv.q_norm, kv_raw, wv.kv_norm, eps, qr_n.dense, kv, qr_n.fp8, qr_n.scale, stream);
  // 6b. The compressed half's indices (C4A: the indexer's query reads qr_n), beside wq_b and the
  // insert.
  CompressedIndices cidx;
  if (compressed) {
    cidx = compressed->launch_indices(sp.compressed, upload, x, qr_n, positions, token_to_req, cos_sin_v, ws,
                                      stream, cs, overlap, mark);
  }

  TensorView q = ws.tensor(DType::bf16, {T, H, D});
  op("wq_b");
  const auto [qa, qa_scale] = qr_n.for_weight(wv.wq_b);
  linear(qa, qa_scale, wv.wq_b.value, wv.wq_b.scale, reshape(q, {T, int64_t{H} * D}), gemm_workspace, stream);

  // 4–5. q head-norm + RoPE, kv RoPE + quant + insert into the SWA slots. Over per-tensor FP8
  // caches the queries are FP8 too (the FlashInfer port's path: the decodes read them), and q
  // keeps what they mean, bf16(fp8 · q_scale), the query the prefills and the decodes attend with.
  Fp8QueryOutput fp8_query;
  if (opts.caches.layout == KvLayout::fp8_per_tensor) {
    fp8_query.q_fp8 = ws.tensor(DType::fp8_e4m3, {T, H, D});
    fp8_query.q_scale = opts.caches.q_scale;
  }
  op("qnorm_rope_kv_insert");
  qnorm_rope_kv_insert(q, kv, positions, cos_sin_v, eps, caches.swa->kv_view(),
                       upload.view(sp.slot_mapping), fp8_query, stream);
  if (overlap) side_branch.join_into(stream);

  Step st{sp, stream, q, fp8_query.q_fp8, fp8_query.q_scale, ws.tensor(DType::bf16, {T, H, D}),
          positions, token_to_req, std::move(cidx), cos_sin_v,
          1.0f / std::sqrt(static_cast<float>(D))};
  if (sp.nd > 0) attend_decodes(st);
  if (!sp.prefill_groups.empty()) attend_prefills(st);
  project_output(st, y);
  if (timing()) opts.op_timer->end(stream);
}

void Attention::Impl::attend_decodes(const Step& st) {
  const StepPlan& sp = st.sp;
  const auto [H, D, W] = dims();
  const int K = st.compressed.topk;  // compressed slots per token (0 for SWA layers)
  const LayerWeightViews& wv = weights->views();
  Scratch& ws = scratch;
  const int nd = sp.nd;
  op("decode_indices");
  TensorView swa_idx = ws.tensor(DType::int32, {nd, W});
  TensorView swa_len = ws.tensor(DType::int32, {nd});
  swa_window_indices(st.positions.slice0(0, nd), st.token_to_req.slice0(0, nd),
                     upload.view(sp.swa_table), caches.swa->spec().block_size, W, swa_idx,
                     swa_len, st.stream);
  SparseDecodeArgs a;
  if (st.q_fp8.defined()) {
    a.q = reshape(st.q_fp8.slice0(0, nd), {nd, 1, H, D});
    a.q_scale = st.q_scale;
  } else {
    a.q = reshape(st.q.slice0(0, nd), {nd, 1, H, D});
  }
  a.k_cache = caches.swa->kv_view();
  a.indices = reshape(swa_idx, {nd, 1, W});
  a.topk_length = swa_len;
  if (K > 0) {
    TensorView ext_idx = ws.tensor(DType::int32, {nd, K});
    TensorView ext_len = ws.tensor(DType::int32, {nd});
    local_to_global_slots(st.compressed.local.slice0(0, nd), st.token_to_req.slice0(0, nd),
                          upload.view(sp.compressed.out_table),
                          caches.compressed->spec().block_size, ext_idx, ext_len, st.stream);
    a.extra_k_cache = caches.compressed->kv_view();
    a.extra_indices = reshape(ext_idx, {nd, 1, K});
    a.extra_topk_length = ext_len;
  }
  a.attn_sink = wv.attn_sink;
  a.softmax_scale = st.softmax_scale;
  a.d_v = D;
  a.out = reshape(st.o.slice0(0, nd), {nd, 1, H, D});
  a.lse = ws.tensor(DType::fp32, {nd, 1, H});
  const DecodeSchedule sched = make_decode_schedule(nd, 1, H, W + K, opts.num_sms);
  const TensorView workspace =
      ws.tensor(DType::uint8, {std::max<int64_t>(sched.workspace_bytes, 1)});
  op("sparse_decode");
  sparse_decode(a, sched, workspace, st.stream);
}

void Attention::Impl::attend_prefills(const Step& st) {
  const StepPlan& sp = st.sp;
  const auto [H, D, W] = dims();
  const int K = st.compressed.topk;  // compressed slots per token (0 for SWA layers)
  const LayerWeightViews& wv = weights->views();
  Scratch& ws = scratch;
  // One workspace for the largest group (groups run in order on one stream).
  int64_t workspace_rows = 0;
  for (const PrefillGroup& g : sp.prefill_groups)
    workspace_rows = std::max<int64_t>(workspace_rows, (g.r1 - g.r0) * g.rows_per_request);
  const TensorView kv_rows_all = ws.tensor(DType::bf16, {workspace_rows, D});
  const TensorView work_counter = ws.tensor(DType::int32, {1});  // the groups' launches, in stream order
  const TensorView swa_table = upload.view(sp.swa_table);
  for (const PrefillGroup& g : sp.prefill_groups) {
    const int n = g.r1 - g.r0;
    const int64_t M = g.rows_per_request, N = g.compressed_rows, Tg = g.t1 - g.t0;
    const TensorView kv_rows(kv_rows_all.data, DType::bf16, {n, M, D}, device);
    const TensorView seq_lens = upload.view(g.seq_lens);
    const TensorView gather_lens = upload.view(g.gather_lens);
    op("prefill_gather");
    if (compressed && N > 0)
      dequantize_and_gather(caches.compressed->kv_view(),
                            upload.view(sp.compressed.out_table).slice0(g.r0, g.r1),
                            upload.view(g.compressed_lens), {}, 0, kv_rows, st.stream);
    dequantize_and_gather(caches.swa->kv_view(), swa_table.slice0(g.r0, g.r1), seq_lens,
                          gather_lens, N, kv_rows, st.stream);

    const TensorView topk_view = K > 0 ? st.compressed.local.slice0(g.t0, g.t1)
                                       : ws.tensor(DType::int32, {Tg, 0});
    TensorView idx = ws.tensor(DType::int32, {Tg, K + W});
    TensorView len = ws.tensor(DType::int32, {Tg});
    op("prefill_indices");
    combine_topk_swa_indices(topk_view, upload.view(g.query_start), seq_lens, gather_lens, W,
                             static_cast<int>(N), M, compressed ? compressed->ratio() : 0, idx,
                             len, st.stream);

    SparsePrefillArgs a;
    a.q = st.q.slice0(g.t0, g.t1);
    a.kv = reshape(kv_rows, {n * M, 1, D});
    a.indices = reshape(idx, {Tg, 1, K + W});
    a.topk_length = len;
    a.attn_sink = wv.attn_sink;
    a.softmax_scale = st.softmax_scale;
    a.d_v = D;
    a.out = st.o.slice0(g.t0, g.t1);
    a.max_logits = ws.tensor(DType::fp32, {Tg, H});
    a.lse = ws.tensor(DType::fp32, {Tg, H});
    a.work_counter = work_counter;
    op("sparse_prefill");
    sparse_prefill(a, st.stream);
  }
}

void Attention::Impl::project_output(const Step& st, const TensorView& y) {
  const int64_t T = st.sp.T;
  const int H = cfg.n_heads, D = cfg.head_dim;
  const Stream stream = st.stream;
  const LayerWeightViews& wv = weights->views();
  Scratch& ws = scratch;
  const TensorView& o = st.o;

  const int64_t HD = int64_t{H} * D;
  // z is bf16 where the GEMMs need it (CUDA's bf16 GEMMs; an FP8 wo_b's input is quantized from
  // the bf16 z, as DeepSeek's inference code stores it); the CPU keeps it in fp32 otherwise.
  const bool z_fp8 = fp8_input(wv.wo_b);
  const DType z_dtype = device == Device::cuda || z_fp8 ? DType::bf16 : DType::fp32;
  TensorView z = ws.tensor(z_dtype, {T, int64_t{cfg.o_groups} * cfg.o_lora_rank});
  if (opts.fp8_activations) {
    // Inverse RoPE and the FP8 quantization of o in one pass. The scales take the FP8 GEMMs'
    // layout when wo_a is FP8; a bf16 wo_a on CUDA gets o dequantized back to bf16 (exact), which
    // reads row-major scales.
    const bool wo_a_fp8 = wv.wo_a.fp8();
    TensorView oq = ws.tensor(DType::fp8_e4m3, {T, HD});
    TensorView oscale = wo_a_fp8 || device == Device::cpu ? act_scale_tensor(ws, T, HD / 128)
                                                          : ws.tensor(DType::fp32, {T, HD / 128});
    op("inv_rope_fp8_quant");
    inv_rope_fp8_quant(o, st.positions, st.cos_sin, 128, oq, oscale, stream);
    if (device == Device::cuda && !wo_a_fp8) {
      TensorView o_deq = ws.tensor(DType::bf16, {T, HD});
      op("act_dequant");
      dequantize_fp8_blocks(oq, oscale, 1, 128, o_deq, stream);
      op("wo_a");
      grouped_wo_a(o_deq, {}, wv.wo_a.value, wv.wo_a.scale, z, gemm_workspace, stream);
    } else {
      op("wo_a");
      grouped_wo_a(oq, oscale, wv.wo_a.value, wv.wo_a.scale, z, gemm_workspace, stream);
    }
  } else {
    op("inverse_rope");
    apply_rope(o, st.positions, st.cos_sin, /*inverse=*/true, o, stream);
    op("wo_a");
    grouped_wo_a(reshape(o, {T, HD}), {}, wv.wo_a.value, wv.wo_a.scale, z, gemm_workspace, stream);
  }
  op("wo_b");
  const GemmInput zin = make_gemm_input(z, z_fp8, ws, stream);
  const auto [zb, zb_scale] = zin.for_weight(wv.wo_b);
  linear(zb, zb_scale, wv.wo_b.value, wv.wo_b.scale, y, gemm_workspace, stream);
  // Tensor parallelism: wo_b was row-parallel, so y is this rank's partial sum until reduced.
  if (opts.tp.communicator) {
    op("tp_allreduce");
    opts.tp.communicator->allreduce_sum(y, stream);
  }
}

}  // namespace dsv4
