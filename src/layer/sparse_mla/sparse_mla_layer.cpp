// dsv4::SparseMlaAttention: sequences the ops of one V3.2 sparse-MLA layer over a mixed batch (see
// include/dsv4/sparse_mla_layer.h), on either backend: the ops pick the CPU reference or the CUDA
// kernels by where the tensors live, so one sequence serves both. Projections with FP8 weights take
// FP8 inputs (per token and 128 columns, UE8M0) when fp8_gemm_activations is set, as DeepSeek's
// Linear does.
//
// A step plans on the host first (new requests registered, cache slots booked, the metadata put
// into the StepUpload and sent in one copy), then launches. On CUDA the projections run over the
// step's tokens padded to a multiple of kFp8GemmRowMultiple rows (the FP8 GEMMs' rule; padding
// rows are zero and their outputs dropped); everything after them runs over the real tokens.
//
// CUDA decode-only steps (of up to DecodeGraphs::kMaxTokens tokens) are bucketed instead, as
// dsv4::Attention's: padded to their bucket (1, 2, 4, ... tokens, at least 4) with padding
// requests of one token each that own no cache blocks, and their data-dependent widths (block
// tables, indexer score columns) rounded up to powers of two, so every step of a bucket launches
// the same kernels with the same arguments — DecodeGraphs runs the bucket's first step eagerly,
// captures the second and replays the rest (SparseMlaOptions::cuda_graphs). Bucketing does not
// depend on cuda_graphs: a step's shapes, and so its bits, are the same with graphs on or off.
#include "dsv4/sparse_mla_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/indexer.h"
#include "dsv4/indexing.h"
#include "dsv4/kv_rope_insert.h"
#include "dsv4/ops.h"
#include "dsv4/sparse_mla_indexer.h"
#include "dsv4/status.h"
#include "layer/decode_graphs.h"
#include "layer/gemm_input.h"
#include "layer/scratch.h"
#include "layer/sparse_mla/sparse_mla_weight_store.h"
#include "layer/step_planner.h"
#include "layer/step_rows.h"
#include "layer/step_upload.h"
#include "runtime/device_runtime.h"

namespace dsv4 {

namespace {

constexpr const char* kWhere = "SparseMlaAttention::forward";
constexpr float kIndexerNormEps = 1e-6f;  // the indexer's LayerNorm (DeepSeek's default eps)

// A strided view of `base`'s memory with the given shape and element strides.
TensorView strided(const TensorView& base, std::initializer_list<int64_t> shape,
                   std::initializer_list<int64_t> strides, int64_t offset = 0) {
  TensorView v = base;
  v.ndim = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), v.shape.begin());
  std::copy(strides.begin(), strides.end(), v.strides.begin());
  v.data = static_cast<uint8_t*>(base.data) + offset * static_cast<int64_t>(dtype_size(base.dtype));
  return v;
}

// Zeroes a contiguous tensor where it lives (on `stream` on the GPU).
void zero_fill(const TensorView& t, Stream stream) {
  const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
  if (bytes == 0) return;
  if (t.device == Device::cpu)
    std::memset(t.data, 0, bytes);
  else
    rt::memset_device_async(t.data, 0, bytes, stream);
}

}  // namespace

struct SparseMlaAttention::Impl {
  ModelConfig cfg;
  int layer = 0;
  SparseMlaWeights w;
  SparseMlaOptions opts;
  int heads = 0, padded = 0;
  Device device = Device::cpu;                    // where caches, weights and temporaries live
  std::unique_ptr<SparseMlaWeightStore> weights;  // w as the ops take it, on `device`
  std::vector<DeviceTensor> cache_storage;        // CUDA: the caches' memory
  std::unique_ptr<PagedCache> kv, keys;
  Scratch scratch{Device::cpu, nullptr};
  StepUpload upload{Device::cpu};
  HostTensor cos_sin;           // [rows, R] for positions [0, rows); grown on demand
  DeviceTensor cos_sin_device;  // its copy on the GPU (CUDA backend)
  uint64_t rope_generation = 0;  // changes when the table moves
  std::map<int64_t, int64_t> cached;  // tokens cached per request
  DecodeGraphs graphs;          // CUDA: captured decode steps per bucket

  // Grows the cos/sin table (doubling, up to max_position) to cover positions [0, len).
  void ensure_rope(int64_t len) {
    const int64_t have = cos_sin.shape().empty() ? 0 : cos_sin.shape()[0];
    if (have >= len) return;
    int64_t rows = std::max<int64_t>(have, 1);
    while (rows < len) rows *= 2;
    cos_sin = build_rope_cache(cfg.rope_for_layer(layer), std::min<int64_t>(rows, cfg.max_position));
    if (device == Device::cuda) cos_sin_device = DeviceTensor::from_host(cos_sin);
    ++rope_generation;
  }
  TensorView rope_table() const {
    return device == Device::cuda ? cos_sin_device.view() : cos_sin.view();
  }
  // Whether a projection's input is quantized to FP8 (its weight is FP8 and the options say so).
  bool fp8_input(const WeightView& wt) const { return wt.fp8() && opts.fp8_gemm_activations; }

  void check(const BatchPlan& plan, const TensorView& x, const TensorView& y) const;
  void check_plan(const BatchPlan& plan) const;
  // Everything a captured decode graph replays at fixed addresses (the caches never move).
  uint64_t memory_generation() const {
    return scratch.generation() + upload.generation() + rope_generation;
  }

  // ---- a step: planned on the host, then launched ------------------------------------------
  struct Step {
    const BatchPlan& plan;
    int64_t T = 0;            // tokens the kernels after the projections run over: the plan's,
                              // or a bucketed step's rows (its padding tokens included)
    int64_t rows = 0;         // rows of the projections (step_rows): >= T
    int64_t nd = 0;           // decode tokens [0, nd) (a bucketed step's padding tokens included)
    int64_t score_cols = 0;   // the indexer's score columns: the longest sequence of the step
                              // (bucketed: rounded up to a power of two)
    int64_t max_prefill = 0;  // the longest prefill request's sequence (its gathered rows)
    std::vector<int64_t> key{};  // bucketed: everything the launch's shapes depend on (DecodeGraphs)
    // The step's metadata on the layer's device (StepUpload views):
    TensorView positions{};     // [T] int64
    TensorView token_to_req{};  // [T] int32
    TensorView kv_slots{};      // [T] int64: each token's slot in the latent cache
    TensorView key_slots{};     // [T] int64: ... and in the indexer key cache
    TensorView kv_tables{};     // [R, width] int32: the requests' latent-cache block tables
    TensorView key_tables{};    // [R, width] int32: ... and their key-cache block tables
    TensorView seq_lens{};      // [R] int32: context + num_new
  };
  // Registers the plan's new requests, books its tokens' cache slots and sends the metadata, for
  // a launch over `rows` rows (step_rows; `bucketed`: a decode step padded to its bucket). `post`:
  // a graph step's metadata is posted (StepUpload::post) for the launch to receive; else copied.
  Step plan_step(const BatchPlan& plan, int64_t rows, bool bucketed, bool post);
  void forward(const BatchPlan& plan, const TensorView& x, const TensorView& y);
  // Enqueues the step's kernels on `stream`: x [rows, dim] (bf16 on CUDA) → y [rows, dim] fp32.
  // Reads only device views and the Step's shapes (graph-capturable).
  // `receive`: the step's metadata was posted, and its first kernel takes it.
  void launch(const Step& st, const TensorView& x, const TensorView& y, Stream stream, bool receive);
  // The latent attention output o [T, Hp, 512] of every token from the queries q [T, Hp, 576].
  void attend(const Step& st, const TensorView& q, const TensorView& local, const TensorView& lens,
              const TensorView& o, Stream stream);
  // Upper bounds of the temporaries and of the step upload of steps within reserve()'s limits.
  struct WorkspaceBound {
    int64_t scratch_bytes = 0, upload_bytes = 0;
  };
  WorkspaceBound workspace_bound(int64_t max_tokens, int max_requests, int64_t max_context) const;
  // The cuBLASLt workspace of this forward's projections (CUDA; none on the CPU).
  TensorView gemm_workspace;
};

SparseMlaAttention::SparseMlaAttention(const ModelConfig& cfg, int layer, SparseMlaWeights weights,
                                       SparseMlaOptions opts)
    : impl_(std::make_unique<Impl>()) {
  const char* where = "SparseMlaAttention";
  cfg.validate();
  if (cfg.family != "v3.2")
    fail(where, ": config '", cfg.name, "' is family ", cfg.family,
         "; the sparse-MLA layer is DeepSeek-V3.2's (dsv4::Attention runs V4)");
  if (cfg.index_head_dim != indexer_keys::kDim)
    fail_expected(where, "index_head_dim", indexer_keys::kDim, cfg.index_head_dim);
  if (cfg.nope_dim() != v32::kNope || cfg.rope_head_dim != v32::kRope)
    fail_expected(where, "kv_lora_rank + rope_head_dim", "512 + 64 (the V32_FP8 cache's token)",
                  std::to_string(cfg.nope_dim()) + " + " + std::to_string(cfg.rope_head_dim));
  if (layer < 0 || layer >= cfg.n_layers())
    fail_expected(where, "layer", "0.." + std::to_string(cfg.n_layers() - 1), layer);
  if (weights.layer != layer) fail_expected(where, "weights.layer", layer, weights.layer);
  validate_sparse_mla_weights(weights, cfg, where);
  if (opts.block_size < 1) fail_expected(where, "opts.block_size", ">= 1", opts.block_size);
  if (opts.cache_blocks < 1) fail_expected(where, "opts.cache_blocks", ">= 1", opts.cache_blocks);
  if (opts.backend == Backend::cuda && !cuda_available())
    fail(where, ": backend cuda: ",
         cuda_built() ? "no CUDA device is visible" : "the library was built without CUDA",
         "; use Backend::cpu");
  // The CUDA GEMMs multiply FP8 weights on FP8 tensor cores, which take FP8 inputs only.
  if (opts.backend == Backend::cuda) {
    const auto fp8 = [](const Weight& wt) { return wt.quantized(); };
    if (!opts.fp8_gemm_activations && (fp8(weights.wq_a) || fp8(weights.wq_b) || fp8(weights.wkv_a) ||
                                       fp8(weights.indexer.wq_b) || fp8(weights.indexer.wk)))
      fail(where, ": SparseMlaOptions::fp8_gemm_activations: expected true on the CUDA backend for FP8 "
           "projection weights (FP8 tensor cores take FP8 inputs), got false; use Backend::cpu");
    if (!opts.fp8_activations && fp8(weights.wo))
      fail(where, ": SparseMlaOptions::fp8_activations: expected true on the CUDA backend for an FP8 wo "
           "(FP8 tensor cores take FP8 inputs), got false; use Backend::cpu");
  }

  Impl& m = *impl_;
  m.cfg = cfg;
  m.layer = layer;
  m.opts = opts;
  m.heads = cfg.n_heads;
  m.padded = sparse_mla_padded_heads(cfg.n_heads);
  m.device = opts.backend == Backend::cuda ? Device::cuda : Device::cpu;
  m.w = std::move(weights);
  m.weights = std::make_unique<SparseMlaWeightStore>(cfg, m.w, m.device);
  CacheSpec kv_spec{"kv", opts.block_size, kv_geometry(KvLayout::v32_fp8, opts.block_size).block_bytes,
                    opts.cache_blocks, 0, KvLayout::v32_fp8};
  CacheSpec key_spec{"indexer_keys", opts.block_size,
                     int64_t{opts.block_size} * indexer_keys::kEntryBytes, opts.cache_blocks, 0,
                     std::nullopt};
  m.kv = make_paged_cache(std::move(kv_spec), m.device, m.cache_storage);
  m.keys = make_paged_cache(std::move(key_spec), m.device, m.cache_storage);
  m.scratch = Scratch(m.device, opts.stream);
  m.upload = StepUpload(m.device);
}

SparseMlaAttention::~SparseMlaAttention() = default;
SparseMlaAttention::SparseMlaAttention(SparseMlaAttention&&) noexcept = default;
SparseMlaAttention& SparseMlaAttention::operator=(SparseMlaAttention&&) noexcept = default;

const ModelConfig& SparseMlaAttention::config() const { return impl_->cfg; }
const SparseMlaWeights& SparseMlaAttention::weights() const { return impl_->w; }
void SparseMlaAttention::check_plan(const BatchPlan& plan) const { impl_->check_plan(plan); }
int SparseMlaAttention::layer_index() const { return impl_->layer; }
Backend SparseMlaAttention::backend() const { return impl_->opts.backend; }
int SparseMlaAttention::padded_heads() const { return impl_->padded; }
const PagedCache& SparseMlaAttention::kv_cache() const { return *impl_->kv; }
const PagedCache& SparseMlaAttention::indexer_keys() const { return *impl_->keys; }

void SparseMlaAttention::set_stream(Stream stream) {
  impl_->opts.stream = stream;
  impl_->scratch.set_stream(stream);
}

int64_t SparseMlaAttention::graph_captures() const { return impl_->graphs.captures(); }
int64_t SparseMlaAttention::graph_replays() const { return impl_->graphs.replays(); }

void SparseMlaAttention::release(int64_t req_id) {
  Impl& m = *impl_;
  if (m.cached.count(req_id) == 0) fail("SparseMlaAttention::release: unknown request ", req_id);
  m.kv->remove_request(req_id);
  m.keys->remove_request(req_id);
  m.cached.erase(req_id);
}

LayerMemory SparseMlaAttention::memory() const {
  const Impl& m = *impl_;
  LayerMemory mem;
  mem.weights = m.weights->bytes();
  mem.caches = m.kv->storage_view().numel() + m.keys->storage_view().numel();
  mem.workspace = m.scratch.capacity();
  mem.workspace_used = m.scratch.high_water();
  mem.step_upload = m.upload.capacity();
  return mem;
}

LayerMemory SparseMlaAttention::reserve(int64_t max_tokens, int max_requests, int64_t max_context) {
  Impl& m = *impl_;
  check_reserve_bounds("SparseMlaAttention::reserve", max_tokens, max_requests, max_context, m.cfg.max_position);
  m.ensure_rope(max_context);
  const Impl::WorkspaceBound b = m.workspace_bound(max_tokens, max_requests, max_context);
  m.scratch.reserve(b.scratch_bytes);
  m.upload.reserve(b.upload_bytes);
  return memory();
}

void SparseMlaAttention::forward(const BatchPlan& plan, const TensorView& x, const TensorView& y) {
  impl_->check(plan, x, y);
  if (plan.num_tokens() == 0) return;
  impl_->forward(plan, x, y);
}

void SparseMlaAttention::Impl::check(const BatchPlan& plan, const TensorView& x,
                                     const TensorView& y) const {
  const int64_t T = plan.num_tokens();
  const char* layer_device = device == Device::cuda ? "cuda (the layer's backend)" : "cpu (the layer's backend)";
  for (const auto& [name, t] : {std::pair<const char*, const TensorView&>{"x", x}, {"y", y}}) {
    if (t.device != device)
      fail_expected(kWhere, std::string(name) + ".device", layer_device,
                    t.device == Device::cuda ? "cuda" : "cpu");
    check_shape(kWhere, name, t, {T, cfg.dim});
    check_contiguous(kWhere, name, t);
  }
  if (device == Device::cuda)
    check_dtype(kWhere, "x (on the GPU; the CUDA GEMMs take bf16 activations)", x, DType::bf16);
  else if (x.dtype != DType::bf16 && x.dtype != DType::fp32)
    fail_expected(kWhere, "x.dtype", "bf16 or fp32", dtype_name(x.dtype));
  check_dtype(kWhere, "y", y, DType::fp32);
  check_plan(plan);
}

void SparseMlaAttention::Impl::check_plan(const BatchPlan& plan) const {
  std::vector<std::pair<int64_t, int64_t>> growth;
  for (const RequestStep& r : plan.requests) {
    const auto it = cached.find(r.req_id);
    const int64_t have = it == cached.end() ? 0 : it->second;
    if (r.context != have)
      fail(kWhere, ": request ", r.req_id, ": context ", r.context, " but the layer has ", have,
           " of its tokens cached");
    if (r.context + r.num_new > cfg.max_position)
      fail_expected(kWhere, detail::concat("request ", r.req_id, " length"),
                    detail::concat("<= max_position (", cfg.max_position, ")"),
                    r.context + r.num_new);
    growth.emplace_back(r.context, r.context + r.num_new);
  }
  require_blocks_for_growth(kWhere, *kv, growth);
  require_blocks_for_growth(kWhere, *keys, growth);
}

SparseMlaAttention::Impl::Step SparseMlaAttention::Impl::plan_step(const BatchPlan& plan, int64_t rows,
                                                                   bool bucketed, bool post) {
  const int64_t T = plan.num_tokens();
  const int R = plan.num_requests();
  // A bucketed step's padding tokens are one-token decodes of padding requests of their own, at
  // position 0 with no cache blocks (slot -1, all -1 table rows): nothing is read or written for
  // them but their own rows (their one visible key is unmapped: they attend to nothing).
  const int64_t pad = bucketed ? rows - T : 0;
  Step st{plan};
  st.T = T + pad;
  st.rows = rows;
  st.nd = plan.num_decodes + pad;
  const int64_t launch_requests = R + pad;
  int64_t max_len = 1;
  for (int r = 0; r < R; ++r) {
    max_len = std::max(max_len, plan.seq_len(r));
    if (r >= plan.num_decodes) st.max_prefill = std::max(st.max_prefill, plan.seq_len(r));
  }
  st.score_cols = bucketed ? round_up_pow2(max_len) : max_len;

  upload.begin();
  const StepUpload::Array positions = upload.put_uninit(DType::int64, {st.T});
  const StepUpload::Array token_to_req = upload.put_uninit(DType::int32, {st.T});
  const StepUpload::Array kv_slots = upload.put_uninit(DType::int64, {st.T});
  const StepUpload::Array key_slots = upload.put_uninit(DType::int64, {st.T});
  int64_t* const pos = upload.host_data<int64_t>(positions);
  std::copy(plan.positions.begin(), plan.positions.end(), pos);
  std::fill(pos + T, pos + st.T, 0);
  int32_t* const req = upload.host_data<int32_t>(token_to_req);
  std::copy(plan.token_to_req.begin(), plan.token_to_req.end(), req);
  for (int64_t t = T; t < st.T; ++t) req[t] = static_cast<int32_t>(R + (t - T));
  // Book the step's cache entries (requests in plan order; check_plan made sure they fit).
  for (int r = 0; r < R; ++r) {
    const RequestStep& s = plan.requests[r];
    if (cached.emplace(s.req_id, 0).second) {
      kv->add_request(s.req_id);
      keys->add_request(s.req_id);
    }
    kv->append(s.req_id, s.num_new, upload.host_data<int64_t>(kv_slots) + plan.query_start_loc[r]);
    keys->append(s.req_id, s.num_new, upload.host_data<int64_t>(key_slots) + plan.query_start_loc[r]);
    cached[s.req_id] += s.num_new;
  }
  for (const StepUpload::Array& slots : {kv_slots, key_slots})
    std::fill(upload.host_data<int64_t>(slots) + T, upload.host_data<int64_t>(slots) + st.T, -1);
  std::vector<const std::vector<int32_t>*> kv_t, key_t;
  int64_t kv_width = 1, key_width = 1;
  std::vector<int32_t> seq_lens(static_cast<size_t>(launch_requests), 0);
  for (int r = 0; r < R; ++r) {
    kv_t.push_back(&kv->block_table(plan.requests[r].req_id));
    key_t.push_back(&keys->block_table(plan.requests[r].req_id));
    kv_width = std::max<int64_t>(kv_width, static_cast<int64_t>(kv_t.back()->size()));
    key_width = std::max<int64_t>(key_width, static_cast<int64_t>(key_t.back()->size()));
    seq_lens[static_cast<size_t>(r)] = static_cast<int32_t>(plan.seq_len(r));
  }
  if (bucketed) {
    kv_width = round_up_pow2(kv_width);
    key_width = round_up_pow2(key_width);
  }
  const StepUpload::Array kv_tables = upload.tables(kv_t, launch_requests, kv_width, "kv");
  const StepUpload::Array key_tables = upload.tables(key_t, launch_requests, key_width, "indexer_keys");
  const StepUpload::Array lens = upload.put({launch_requests}, seq_lens);
  if (post) upload.post(opts.stream);
  else upload.commit(opts.stream);

  if (bucketed) {
    st.key = {st.T, st.rows, st.nd, launch_requests, st.score_cols};
    for (const StepUpload::Array* a : {&positions, &token_to_req, &kv_slots, &key_slots, &kv_tables,
                                       &key_tables, &lens})
      a->append_to_key(st.key);
  }
  st.positions = upload.view(positions);
  st.token_to_req = upload.view(token_to_req);
  st.kv_slots = upload.view(kv_slots);
  st.key_slots = upload.view(key_slots);
  st.kv_tables = upload.view(kv_tables);
  st.key_tables = upload.view(key_tables);
  st.seq_lens = upload.view(lens);
  return st;
}

void SparseMlaAttention::Impl::forward(const BatchPlan& plan, const TensorView& x, const TensorView& y) {
  const int64_t T = plan.num_tokens();
  const Stream stream = opts.stream;
  const ScratchStep scratch_step(scratch);
  int64_t longest = 0;
  for (int r = 0; r < plan.num_requests(); ++r) longest = std::max(longest, plan.seq_len(r));
  ensure_rope(longest);
  // Decode-only CUDA steps run at their bucket's shape (see the top of the file); as a graph when
  // graphs are on and no caller is capturing the stream already (a caller's torch.cuda.graph
  // captures the eager step).
  const bool bucketed = device == Device::cuda && plan.num_decodes == plan.num_requests() &&
                        T <= DecodeGraphs::kMaxTokens;
  const bool graph = bucketed && opts.cuda_graphs && !rt::is_capturing(stream);
  const Step st = plan_step(plan, step_rows(device, T, bucketed), bucketed, graph);
  const StepLaunch run = [&](const TensorView& x_rows, const TensorView& y_rows, Stream s) {
    launch(st, x_rows, y_rows, s, graph);
  };
  if (graph) {
    graphs.run(st.key, memory_generation(), st.rows, x, y, scratch, stream, run);
    upload.received();
  } else {
    run_eager_step(st.rows, x, y, scratch, stream, run);
  }
}

void SparseMlaAttention::Impl::launch(const Step& st, const TensorView& x, const TensorView& y,
                                      Stream stream, bool receive) {
  if (receive) upload.receive(stream);  // first: every kernel below may read the metadata
  const int64_t T = st.T, rows = st.rows;
  const int64_t H = heads, Hp = padded, n = cfg.qk_nope_head_dim, R = cfg.rope_head_dim;
  const int64_t c = cfg.nope_dim(), d_qk = cfg.head_dim, v = cfg.mla_v_head_dim;
  const int64_t I = cfg.index_n_heads, d_i = cfg.index_head_dim, K = cfg.index_topk;
  const float eps = static_cast<float>(cfg.norm_eps);
  const SparseMlaWeightViews& wv = weights->views();
  Scratch& ws = scratch;
  const TensorView cos_sin_v = rope_table();
  gemm_workspace = device == Device::cuda ? ws.tensor(DType::uint8, {kGemmWorkspaceBytes}) : TensorView{};
  // out = input · wᵀ in the form the weight takes (FP8 input for an FP8 weight when quantized).
  const auto project = [&](const GemmInput& in, const WeightView& wt, const TensorView& out) {
    const auto [a, a_scale] = in.for_weight(wt);
    linear(a, a_scale, wt.value, wt.scale, out, gemm_workspace, stream);
  };

  // 1. Low-rank projections and their norms. x is quantized once for the three projections that
  // read it (wq_a, wkv_a, the indexer's wk), the normed q once for wq_b and the indexer's wq_b.
  const GemmInput x_in = make_gemm_input(
      x, fp8_input(wv.wq_a) || fp8_input(wv.wkv_a) || fp8_input(wv.indexer.wk), ws, stream);
  const TensorView qr = ws.tensor(DType::bf16, {rows, cfg.q_lora_rank});
  const TensorView kv_row = ws.tensor(DType::bf16, {rows, d_qk});  // latent | k_pe
  project(x_in, wv.wq_a, qr);
  project(x_in, wv.wkv_a, kv_row);
  rms_norm(qr, wv.q_norm, eps, qr, stream);
  const TensorView latent = strided(kv_row, {rows, c}, {d_qk, 1});
  rms_norm(latent, wv.kv_norm, eps, latent, stream);
  const GemmInput qr_in = make_gemm_input(qr, fp8_input(wv.wq_b) || fp8_input(wv.indexer.wq_b), ws, stream);
  const TensorView q = ws.tensor(DType::bf16, {rows, H, n + R});  // per head q_nope | q_pe
  project(qr_in, wv.wq_b, strided(q, {rows, H * (n + R)}, {H * (n + R), 1}));

  // 2. The 576-wide query q_mqa [T, Hp, c | R]: q_nope · W_UK per head (one batched GEMM over the
  // heads) into the latent dims, RoPE'd q_pe after it (apply_rope writes the rotated q_pe there
  // straight from q); padded heads zero.
  const TensorView q_mqa = ws.tensor(DType::bf16, {T, Hp, d_qk});
  if (Hp > H) zero_fill(q_mqa, stream);
  batched_linear(strided(q, {H, T, n}, {n + R, H * (n + R), 1}), wv.w_uk_t,
                 strided(q_mqa, {H, T, c}, {d_qk, Hp * d_qk, 1}), gemm_workspace, stream);
  apply_rope(strided(q, {T, H, R}, {H * (n + R), n + R, 1}, n), st.positions, cos_sin_v, false,
             strided(q_mqa, {T, H, R}, {Hp * d_qk, d_qk, 1}, c), stream);

  // 3. RoPE on k_pe, then the token's latent + k_pe into the V32_FP8 cache.
  kv_rope_insert(kv_row.slice0(0, T), st.positions, cos_sin_v, kv->kv_view(), st.kv_slots, stream);

  // 4. The lightning indexer: FP8 queries and scaled head weights, the token's key into the key
  // cache, scores over the request's tokens up to itself, top-k (request-local token numbers).
  const TensorView qi = ws.tensor(DType::fp32, {rows, I, d_i});
  project(qr_in, wv.indexer.wq_b, strided(qi, {rows, I * d_i}, {I * d_i, 1}));
  const TensorView ki = ws.tensor(DType::fp32, {rows, d_i});
  project(x_in, wv.indexer.wk, ki);
  const TensorView head_weights = ws.tensor(DType::fp32, {rows, I});
  linear(x, {}, wv.indexer.weights_proj.value, wv.indexer.weights_proj.scale, head_weights,
         gemm_workspace, stream);
  const TensorView q_codes = ws.tensor(DType::fp8_e4m3, {T, I, d_i});
  const TensorView q_scales = ws.tensor(DType::fp32, {T, I});
  sparse_mla_indexer_quantize(qi.slice0(0, T), st.positions, cos_sin_v, q_codes, q_scales,
                              head_weights.slice0(0, T), stream);
  const IndexerKeyCacheView key_view{keys->storage_view(), keys->spec().block_size};
  sparse_mla_indexer_key_insert(ki.slice0(0, T), wv.indexer.k_norm, wv.indexer.k_norm_bias,
                                kIndexerNormEps, st.positions, cos_sin_v, key_view, st.key_slots,
                                stream);
  const TensorView scores = ws.tensor(DType::fp32, {T, st.score_cols});
  indexer_scores(q_codes, q_scales, head_weights.slice0(0, T), st.positions, st.token_to_req,
                 key_view, st.key_tables, 1, scores, stream);
  const TensorView local = ws.tensor(DType::int32, {T, K});
  const TensorView lens = ws.tensor(DType::int32, {T});
  // Column order: the attention below needs the selected set, not its ranking (no sort on CUDA).
  indexer_topk(scores, st.positions, 1, local, lens, stream, TopkOrder::column);

  // 5. Sparse attention into the latent output.
  const TensorView o_latent = ws.tensor(DType::bf16, {T, Hp, c});
  attend(st, q_mqa, local, lens, o_latent, stream);

  // 6. W_UV per head (one batched GEMM) into o [rows, H·v] (padding rows zero), then wo.
  const TensorView o = ws.tensor(DType::bf16, {rows, H * v});
  if (rows > T) zero_fill(o.slice0(T, rows), stream);
  batched_linear(strided(o_latent, {H, T, c}, {c, Hp * c, 1}), wv.w_uv,
                 strided(o, {H, T, v}, {v, H * v, 1}), gemm_workspace, stream);
  const GemmInput o_in = make_gemm_input(o, opts.fp8_activations && wv.wo.fp8(), ws, stream);
  project(o_in, wv.wo, y);
}

void SparseMlaAttention::Impl::attend(const Step& st, const TensorView& q, const TensorView& local,
                                      const TensorView& lens, const TensorView& o, Stream stream) {
  const BatchPlan& plan = st.plan;
  const int64_t Hp = padded, d_qk = cfg.head_dim, c = cfg.nope_dim(), K = cfg.index_topk;
  const float scale = static_cast<float>(cfg.mla_softmax_scale());
  const KvCacheView kv_view = kv->kv_view();
  Scratch& ws = scratch;

  // Decodes: one query token each, straight from the FP8 cache through global slots (decodes come
  // first, so their tokens' token_to_req index the first rows of the tables).
  const int64_t nd = st.nd;
  if (nd > 0) {
    const TensorView global = ws.tensor(DType::int32, {nd, K});
    local_to_global_slots(local.slice0(0, nd), st.token_to_req.slice0(0, nd), st.kv_tables.slice0(0, nd),
                          kv->spec().block_size, global, {}, stream);
    SparseDecodeArgs a;
    a.q = strided(q, {nd, 1, Hp, d_qk}, {Hp * d_qk, Hp * d_qk, d_qk, 1});
    a.k_cache = kv_view;
    a.indices = strided(global, {nd, 1, K}, {K, K, 1});
    a.topk_length = lens.slice0(0, nd);
    a.softmax_scale = scale;
    a.d_v = static_cast<int>(c);
    a.out = strided(o, {nd, 1, Hp, c}, {Hp * c, Hp * c, c, 1});
    a.lse = ws.tensor(DType::fp32, {nd, 1, Hp});
    const DecodeSchedule schedule = make_decode_schedule(static_cast<int>(nd), 1, static_cast<int>(Hp),
                                                         static_cast<int>(K), opts.num_sms,
                                                         static_cast<int>(c));
    const TensorView workspace = ws.tensor(DType::uint8, {std::max<int64_t>(schedule.workspace_bytes, 16)});
    sparse_decode(a, schedule, workspace, stream);
  }

  // Prefill chunks (never in a bucketed step), one request at a time: its cached rows (this
  // chunk's included) dequantized into one bf16 workspace (reused: the requests run in order on one
  // stream), which request-local indices address directly.
  if (nd == st.T) return;
  const TensorView rows_all = ws.tensor(DType::bf16, {st.max_prefill, d_qk});
  const TensorView max_logits = ws.tensor(DType::fp32, {st.T - nd, Hp});
  const TensorView lse = ws.tensor(DType::fp32, {st.T - nd, Hp});
  const TensorView work_counter = ws.tensor(DType::int32, {1});  // the requests' launches, in stream order
  for (int r = plan.num_decodes; r < plan.num_requests(); ++r) {
    const int64_t t0 = plan.query_start_loc[r], t1 = plan.query_start_loc[r + 1];
    const int64_t len = plan.seq_len(r);
    const TensorView rows(rows_all.data, DType::bf16, {1, len, d_qk}, device);
    dequantize_and_gather(kv_view, st.kv_tables.slice0(r, r + 1), st.seq_lens.slice0(r, r + 1), {}, 0,
                          rows, stream);
    SparsePrefillArgs a;
    a.q = q.slice0(t0, t1);
    a.kv = strided(rows, {len, 1, d_qk}, {d_qk, d_qk, 1});
    a.indices = strided(local.slice0(t0, t1), {t1 - t0, 1, K}, {K, K, 1});
    a.topk_length = lens.slice0(t0, t1);
    a.softmax_scale = scale;
    a.d_v = static_cast<int>(c);
    a.out = o.slice0(t0, t1);
    a.max_logits = max_logits.slice0(t0 - nd, t1 - nd);
    a.lse = lse.slice0(t0 - nd, t1 - nd);
    a.work_counter = work_counter;
    sparse_prefill(a, stream);
  }
}

SparseMlaAttention::Impl::WorkspaceBound SparseMlaAttention::Impl::workspace_bound(
    int64_t max_tokens, int max_requests, int64_t max_context) const {
  // Every temporary launch() and the step's padded rows take, each at its largest over the steps
  // the limits allow, summed (the arena hands a step's tensors out one after another). Steps come
  // in two shapes: any step, of up to max_tokens tokens (CUDA: rows rounded up to
  // kFp8GemmRowMultiple) of which up to max_requests are decodes (one token each); and on CUDA a
  // bucketed decode step, all of whose DecodeGraphs::rows tokens are decodes, with its score
  // columns rounded up to a power of two. Each term below takes the larger of the two. (Sizing
  // a term by what a step never holds at once, as the decode partials once were — max_tokens
  // tokens times every split the top-k allows — reserved 2.2 GB for V3.2's 256-token steps that
  // use 140 MB; a test keeps the bound within 2x of the largest step's use.)
  const bool cuda = device == Device::cuda;
  const int64_t decodes = std::min<int64_t>(max_requests, max_tokens);
  const int64_t bucket_rows = cuda ? DecodeGraphs::rows(std::min(decodes, DecodeGraphs::kMaxTokens)) : 0;
  const int64_t T = std::max(step_rows(device, max_tokens, false), bucket_rows);  // tokens and rows
  const int64_t nd = std::max(decodes, bucket_rows);                               // decode tokens
  const int64_t H = heads, Hp = padded, n = cfg.qk_nope_head_dim, R = cfg.rope_head_dim;
  const int64_t c = cfg.nope_dim(), d_qk = cfg.head_dim, v = cfg.mla_v_head_dim;
  const int64_t I = cfg.index_n_heads, d_i = cfg.index_head_dim, K = cfg.index_topk;
  int64_t bytes = 0, tensors = 0;
  const auto add = [&](int64_t b) {
    bytes += b;
    ++tensors;
  };
  // FP8 codes + 1x128 scales of a projection input of `cols` columns.
  const auto fp8_input_bytes = [&](int64_t cols) {
    add(T * cols);
    add(4 * T * (cols / 128));
  };
  if (cuda) add(kGemmWorkspaceBytes);
  fp8_input_bytes(cfg.dim);                  // x
  add(2 * T * cfg.q_lora_rank);              // qr
  add(2 * T * d_qk);                         // kv_row
  fp8_input_bytes(cfg.q_lora_rank);          // the normed q
  add(2 * T * H * (n + R));                  // q
  add(2 * T * Hp * d_qk);                    // q_mqa
  add(4 * T * I * d_i);                      // qi
  add(4 * T * d_i);                          // ki
  add(4 * T * I);                            // head weights
  add(T * I * d_i);                          // q codes
  add(4 * T * I);                            // q scales
  add(4 * std::max(max_tokens * max_context, bucket_rows * round_up_pow2(max_context)));  // scores
  add(4 * T * K);                            // local
  add(4 * T);                                // lens
  add(2 * T * Hp * c);                       // o_latent
  // Decodes: global slots, lse, and the split-KV partials of the schedule of nd tokens — whose
  // splits shrink as tokens grow (they fill the GPU), so the largest over 1..nd tokens counts.
  add(4 * nd * K);
  add(4 * nd * Hp);
  int64_t partials = 16;
  for (int64_t b = 1; b <= nd; ++b)
    partials = std::max(partials, make_decode_schedule(static_cast<int>(b), 1, static_cast<int>(Hp),
                                                       static_cast<int>(K), opts.num_sms,
                                                       static_cast<int>(c)).workspace_bytes);
  add(partials);
  // Prefills: the gathered rows of the longest request, max logits, lse and the kernel's work
  // counter.
  add(2 * max_context * d_qk);
  add(4 * T * Hp);
  add(4 * T * Hp);
  add(4);
  add(2 * T * H * v);                        // o
  fp8_input_bytes(H * v);                    // its FP8 form
  if (cuda) {                                // a padded step's x and y rows
    add(2 * T * cfg.dim);
    add(4 * T * cfg.dim);
  }
  WorkspaceBound b;
  b.scratch_bytes = bytes + 256 * (tensors + 1);  // each tensor 256-byte aligned
  // The upload: per token positions, token_to_req and two slots; per request two block tables and
  // the length (a bucketed step: its padding tokens and requests too, table widths rounded up to a
  // power of two); each array 64-byte aligned.
  const int64_t blocks = std::max<int64_t>((max_context + opts.block_size - 1) / opts.block_size, 1);
  const int64_t table_width = cuda ? round_up_pow2(blocks) : blocks;
  const int64_t requests = std::max<int64_t>(max_requests, bucket_rows);
  b.upload_bytes = 28 * T + requests * (8 * table_width + 4) + 64 * 8;
  return b;
}

}  // namespace dsv4
