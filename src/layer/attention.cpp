// dsv4::Attention: sequences the ops of one layer over a mixed batch (SPEC §2).
//
//   x ─► wq_a, wkv ─► fused q/kv RMSNorm ─► wq_b ─► q head-norm + RoPE, kv RoPE + quant + insert
//     ─► [compressor ─► compressed cache; C4A: indexer top-k; C128A: all entries]
//     ─► decodes: sparse_decode over (SWA window | compressed entries) read from the FP8 caches
//     ─► prefills: gather (compressed | SWA) into a bf16 workspace, sparse_prefill
//     ─► inverse RoPE + FP8 act quant (one pass) ─► grouped wo_a ─► wo_b ─► y
// Projections with FP8 weights take FP8 inputs (per token and 128 columns, UE8M0), as DeepSeek's
// Linear does: x is quantized once for wq_a and wkv, the q norm writes the FP8 q for wq_b.
#include "dsv4/layer.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "dsv4/device_tensor.h"
#include "dsv4/indexing.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#include "layer/compressed_scope.h"
#include "layer/gemm_input.h"
#include "layer/layer_weights.h"
#include "layer/scratch.h"

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
  ModelConfig cfg;
  int layer = 0;
  LayerKind kind = LayerKind::swa;
  AttentionWeights w;
  AttentionOptions opts;
  Device device = Device::cpu;        // where caches, weights and temporaries live
  LayerCaches caches;
  std::unique_ptr<LayerWeightStore> weights;  // w as the ops take it, on `device`
  Scratch scratch{Device::cpu, nullptr};
  RopeConfig rope;
  HostTensor cos_sin;                 // [rows, R] for positions [0, rows); grown on demand
  DeviceTensor cos_sin_device;        // its copy on the GPU (CUDA backend)
  std::map<int64_t, int64_t> cached;  // tokens cached per request
  std::unique_ptr<CompressedScope> compressed;  // ratio > 0 layers

  void check_inputs(const BatchPlan& plan, const TensorView& x, const TensorView& y) const;
  void check_plan(const BatchPlan& plan) const;  // contexts, lengths, cache capacity
  // Grows the cos/sin table (doubling, up to max_position) to cover positions [0, len). A table
  // for all of max_position (1M for v4-flash) would cost 256 MB and seconds per layer.
  void ensure_rope(int64_t len) {
    const int64_t have = cos_sin.shape().empty() ? 0 : cos_sin.shape()[0];
    if (have >= len) return;
    int64_t rows = std::max<int64_t>(have, 1);
    while (rows < len) rows *= 2;
    cos_sin = build_rope_cache(rope, std::min<int64_t>(rows, cfg.max_position));
    if (device == Device::cuda) cos_sin_device = DeviceTensor::from_host(cos_sin);
  }
  TensorView rope_table() const {
    return device == Device::cuda ? cos_sin_device.view() : cos_sin.view();
  }
  // x as the layer's ops take it: the caller's tensor on the CPU; on CUDA a bf16 device tensor
  // (a host x is rounded to bf16 and uploaded, as a serving engine's hidden states are bf16).
  TensorView stage_input(const TensorView& x);
  void forward(const BatchPlan& plan, const TensorView& x, const TensorView& y);

  // What the phases of one forward share.
  struct Step {
    const BatchPlan& plan;
    TensorView q;                   // [T, H, D] bf16: normed, roped queries
    TensorView o;                   // [T, H, D] bf16: the attention output
    TensorView positions;           // [T] int64, on the layer's device
    HostTensor positions_h;         // the same on the host (host planning)
    HostTensor token_to_req_h;      // [T] int32, host
    TensorView token_to_req;        // the same on the layer's device
    std::vector<int64_t> req_ids;   // in plan order
    CompressedIndices compressed;   // request-local compressed entries (topk 0: SWA layer)
    TensorView cos_sin;             // the RoPE table on the layer's device
    float softmax_scale = 0.0f;     // D^-0.5
  };
  struct Dims {
    int H, D, W;  // heads, head dim, SWA window
  };
  Dims dims() const { return {cfg.n_heads, cfg.head_dim, cfg.window_size}; }
  // 7a. Decodes read the caches directly through two scopes (SWA window | compressed entries).
  void attend_decodes(const Step& st);
  // 7b. Prefill chunks: gather (compressed | SWA) rows into a bf16 workspace, sparse prefill.
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
  m.cfg = cfg;
  m.layer = layer;
  m.kind = cfg.layer_kind(layer);
  m.w = std::move(weights);
  validate_attention_weights(m.w, cfg, "Attention");
  m.opts = opts;
  m.device = opts.backend == Backend::cuda ? Device::cuda : Device::cpu;
  LayerCacheOptions cache_opts = opts.caches;
  cache_opts.device = m.device;
  m.caches = make_layer_caches(cfg, m.kind, cache_opts);
  m.weights = std::make_unique<LayerWeightStore>(m.w, m.device);
  if (m.device == Device::cuda) check_cuda_fp8_inputs(m.weights->views(), opts);
  m.scratch = Scratch(m.device, opts.stream);
  m.rope = cfg.rope_for_layer(layer);
  m.ensure_rope(4096);
  if (m.kind != LayerKind::swa)
    m.compressed = std::make_unique<CompressedScope>(cfg, layer, m.weights->views(), m.caches);
}

Attention::~Attention() = default;
Attention::Attention(Attention&&) noexcept = default;
Attention& Attention::operator=(Attention&&) noexcept = default;

const ModelConfig& Attention::config() const { return impl_->cfg; }
int Attention::layer_index() const { return impl_->layer; }
LayerKind Attention::kind() const { return impl_->kind; }
Backend Attention::backend() const { return impl_->opts.backend; }
const AttentionWeights& Attention::weights() const { return impl_->w; }
const LayerCaches& Attention::caches() const { return impl_->caches; }

void Attention::set_stream(Stream stream) {
  impl_->opts.stream = stream;
  impl_->scratch.set_stream(stream);
}

void Attention::release(int64_t req_id) {
  auto it = impl_->cached.find(req_id);
  if (it == impl_->cached.end()) fail("Attention::release: unknown request ", req_id);
  impl_->caches.remove_request(req_id);
  if (impl_->compressed) impl_->compressed->release(req_id);
  impl_->cached.erase(it);
}

void Attention::check_plan(const BatchPlan& plan) const { impl_->check_plan(plan); }

void Attention::forward(const BatchPlan& plan, const TensorView& x, const TensorView& y) {
  impl_->check_inputs(plan, x, y);
  if (plan.num_tokens() == 0) return;  // an empty step (x, y [0, dim] may have no data)
  impl_->forward(plan, x, y);
}

void Attention::Impl::check_inputs(const BatchPlan& plan, const TensorView& x,
                                   const TensorView& y) const {
  const int64_t T = plan.num_tokens();
  const std::string host_or_layer =
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
  check_plan(plan);
}

void Attention::Impl::check_plan(const BatchPlan& plan) const {
  for (const RequestStep& s : plan.requests) {
    auto it = cached.find(s.req_id);
    const int64_t have = it == cached.end() ? 0 : it->second;
    if (s.context != have)
      fail_expected(kWhere, "context of request " + std::to_string(s.req_id),
                    std::to_string(have) + " (tokens this layer has cached)", s.context);
    if (s.context + s.num_new > cfg.max_position)
      fail_expected(kWhere, "sequence length of request " + std::to_string(s.req_id),
                    "<= max_position " + std::to_string(cfg.max_position), s.context + s.num_new);
  }
  // Capacity: exhaustion is reported before any state changes.
  std::vector<std::pair<int64_t, int64_t>> growth;
  for (const RequestStep& s : plan.requests) growth.push_back({s.context, s.context + s.num_new});
  require_blocks_for_growth(kWhere, *caches.swa, growth);
  if (compressed) compressed->check_capacity(plan);
}

TensorView Attention::Impl::stage_input(const TensorView& x) {
  if (device == Device::cpu || x.device == Device::cuda) return x;
  return scratch.upload(HostTensor::copy_of(x, DType::bf16));
}

void Attention::Impl::forward(const BatchPlan& plan, const TensorView& x_in, const TensorView& y) {
  const int64_t T = plan.num_tokens();
  const int H = cfg.n_heads, D = cfg.head_dim;
  const float eps = static_cast<float>(cfg.norm_eps);
  const int R = plan.num_requests();
  const Stream stream = opts.stream;
  const LayerWeightViews& wv = weights->views();
  Scratch& ws = scratch;
  ws.reset();

  int64_t longest = 0;
  for (int r = 0; r < R; ++r) longest = std::max(longest, plan.seq_len(r));
  ensure_rope(longest);
  const TensorView cos_sin_v = rope_table();

  // Register new requests (check_inputs verified the others' context).
  for (const RequestStep& s : plan.requests)
    if (!cached.count(s.req_id)) {
      caches.add_request(s.req_id);  // every cache of the layer
      if (compressed) compressed->add_request(s.req_id);
      cached[s.req_id] = 0;
    }
  const TensorView x = stage_input(x_in);
  gemm_workspace = device == Device::cuda ? ws.tensor(DType::uint8, {kGemmWorkspaceBytes}) : TensorView{};

  // 1–3. Projections and norms. x is quantized once for both projections that read it; the q
  // norm writes the FP8 q (for FP8 wq_b / indexer wq_b) and the bf16 one only if a reader needs it.
  const GemmInput xin = make_gemm_input(x, fp8_input(wv.wq_a) || fp8_input(wv.wkv), ws);
  TensorView qr = ws.tensor(DType::fp32, {T, cfg.q_lora_rank});
  TensorView kv_raw = ws.tensor(DType::fp32, {T, D});
  const auto [xa, xa_scale] = xin.for_weight(wv.wq_a);
  linear(xa, xa_scale, wv.wq_a.value, wv.wq_a.scale, qr, gemm_workspace, stream);
  const auto [xkv, xkv_scale] = xin.for_weight(wv.wkv);
  linear(xkv, xkv_scale, wv.wkv.value, wv.wkv.scale, kv_raw, gemm_workspace, stream);
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
  fused_qkv_rms_norm(qr, wv.q_norm, kv_raw, wv.kv_norm, eps, qr_n.dense, kv, qr_n.fp8, qr_n.scale, stream);
  TensorView q = ws.tensor(DType::bf16, {T, H, D});
  const auto [qa, qa_scale] = qr_n.for_weight(wv.wq_b);
  linear(qa, qa_scale, wv.wq_b.value, wv.wq_b.scale, reshape(q, {T, int64_t{H} * D}), gemm_workspace, stream);

  // 4–5. SWA slots, q head-norm + RoPE, kv RoPE + quant + insert.
  HostTensor positions_h(DType::int64, {T});
  std::copy(plan.positions.begin(), plan.positions.end(), positions_h.data<int64_t>());
  HostTensor slot_mapping_h(DType::int64, {T});
  for (int r = 0; r < R; ++r) {
    const RequestStep& s = plan.requests[r];
    const std::vector<int64_t> slots = caches.swa->append(s.req_id, s.num_new);
    std::copy(slots.begin(), slots.end(), slot_mapping_h.data<int64_t>() + plan.query_start_loc[r]);
  }
  const TensorView positions = ws.upload(positions_h);
  qnorm_rope_kv_insert(q, kv, positions, cos_sin_v, eps, caches.swa->kv_view(),
                       ws.upload(slot_mapping_h), stream);

  // 6. Compressor (and indexer) for compressed layers: request-local entry lists per token.
  HostTensor token_to_req_h = HostTensor::from_int32(plan.token_to_req);
  const TensorView token_to_req = ws.upload(token_to_req_h);
  CompressedIndices cidx;
  if (compressed) cidx = compressed->step(plan, x, qr_n, positions, token_to_req, cos_sin_v, ws);

  Step st{plan, q, ws.tensor(DType::bf16, {T, H, D}), positions, std::move(positions_h),
          std::move(token_to_req_h), token_to_req, {}, std::move(cidx), cos_sin_v,
          1.0f / std::sqrt(static_cast<float>(D))};
  for (const RequestStep& s : plan.requests) st.req_ids.push_back(s.req_id);
  if (plan.num_decodes > 0) attend_decodes(st);
  if (plan.num_decodes < R) attend_prefills(st);
  project_output(st, y);

  for (const RequestStep& s : plan.requests) cached[s.req_id] = s.context + s.num_new;
}

void Attention::Impl::attend_decodes(const Step& st) {
  const BatchPlan& plan = st.plan;
  const auto [H, D, W] = dims();
  const int K = st.compressed.topk;  // compressed slots per token (0 for SWA layers)
  const LayerWeightViews& wv = weights->views();
  Scratch& ws = scratch;
  const int nd = plan.num_decodes;
  const std::vector<int64_t>& req_ids = st.req_ids;
  const HostTensor &positions_h = st.positions_h, &token_to_req_h = st.token_to_req_h;
  const TensorView &q = st.q, &o = st.o;
  const CompressedIndices& cidx = st.compressed;
  // The SWA window depends only on the plan and the block tables: planned on the host.
  HostTensor swa_table = pack_block_tables(*caches.swa, req_ids);
  HostTensor swa_idx(DType::int32, {nd, W}), swa_len(DType::int32, {nd});
  swa_window_indices(positions_h.view().slice0(0, nd), token_to_req_h.view().slice0(0, nd),
                     swa_table, caches.swa->spec().block_size, W, swa_idx, swa_len);
  SparseDecodeArgs a;
  a.q = reshape(q.slice0(0, nd), {nd, 1, H, D});
  a.k_cache = caches.swa->kv_view();
  a.indices = reshape(ws.upload(swa_idx), {nd, 1, W});
  a.topk_length = ws.upload(swa_len);
  if (K > 0) {
    // The compressed entries come from the indexer / plan on the layer's device.
    TensorView ext_idx = ws.tensor(DType::int32, {nd, K});
    TensorView ext_len = ws.tensor(DType::int32, {nd});
    const TensorView table = ws.upload(pack_block_tables(*caches.compressed, req_ids));
    local_to_global_slots(cidx.local.slice0(0, nd), st.token_to_req.slice0(0, nd),
                          table, caches.compressed->spec().block_size, ext_idx, ext_len,
                          opts.stream);
    a.extra_k_cache = caches.compressed->kv_view();
    a.extra_indices = reshape(ext_idx, {nd, 1, K});
    a.extra_topk_length = ext_len;
  }
  a.attn_sink = wv.attn_sink;
  a.softmax_scale = st.softmax_scale;
  a.d_v = D;
  a.out = reshape(o.slice0(0, nd), {nd, 1, H, D});
  a.lse = ws.tensor(DType::fp32, {nd, 1, H});
  const DecodeSchedule sched = make_decode_schedule(nd, 1, H, W + K, opts.num_sms);
  const TensorView workspace =
      ws.tensor(DType::uint8, {std::max<int64_t>(sched.workspace_bytes, 1)});
  sparse_decode(a, sched, workspace, opts.stream);
}

void Attention::Impl::attend_prefills(const Step& st) {
  const BatchPlan& plan = st.plan;
  const auto [H, D, W] = dims();
  const int K = st.compressed.topk;  // compressed slots per token (0 for SWA layers)
  const LayerWeightViews& wv = weights->views();
  Scratch& ws = scratch;
  const int nd = plan.num_decodes, R = plan.num_requests();
  const int64_t T = plan.num_tokens();
  const std::vector<int64_t>& req_ids = st.req_ids;
  const TensorView &q = st.q, &o = st.o;
  const CompressedIndices& cidx = st.compressed;
  const int Rp = R - nd;
  const int64_t Tp = T - plan.query_start_loc[nd];
  const int32_t t0 = plan.query_start_loc[nd];
  std::vector<int32_t> qsl(Rp + 1), seq(Rp), gather(Rp), cseq(Rp);
  int64_t max_gather = 0;
  for (int i = 0; i < Rp; ++i) {
    const RequestStep& s = plan.requests[nd + i];
    qsl[i] = plan.query_start_loc[nd + i] - t0;
    seq[i] = static_cast<int32_t>(s.context + s.num_new);
    gather[i] = static_cast<int32_t>(std::min<int64_t>(seq[i], s.num_new + W - 1));
    max_gather = std::max<int64_t>(max_gather, gather[i]);
    if (compressed) cseq[i] = static_cast<int32_t>(seq[i] / compressed->ratio());
  }
  qsl[Rp] = static_cast<int32_t>(Tp);
  int64_t N = 0;
  if (compressed)
    for (int i = 0; i < Rp; ++i) N = std::max<int64_t>(N, cseq[i]);
  const int64_t M = N + max_gather;
  std::vector<int64_t> prefill_ids(req_ids.begin() + nd, req_ids.end());

  TensorView kv_rows = ws.tensor(DType::bf16, {Rp, M, D});
  const TensorView seq_t = ws.upload(HostTensor::from_int32(seq));
  const TensorView gather_t = ws.upload(HostTensor::from_int32(gather));
  const TensorView qsl_t = ws.upload(HostTensor::from_int32(qsl));
  if (compressed && N > 0) {
    const TensorView ctable = ws.upload(pack_block_tables(*caches.compressed, prefill_ids));
    dequantize_and_gather(caches.compressed->kv_view(), ctable,
                          ws.upload(HostTensor::from_int32(cseq)), {}, 0, kv_rows, opts.stream);
  }
  const TensorView stable = ws.upload(pack_block_tables(*caches.swa, prefill_ids));
  dequantize_and_gather(caches.swa->kv_view(), stable, seq_t, gather_t, N, kv_rows, opts.stream);

  const TensorView topk_view =
      K > 0 ? cidx.local.slice0(t0, T) : ws.tensor(DType::int32, {Tp, 0});
  TensorView idx = ws.tensor(DType::int32, {Tp, K + W});
  TensorView len = ws.tensor(DType::int32, {Tp});
  combine_topk_swa_indices(topk_view, qsl_t, seq_t, gather_t, W, static_cast<int>(N), M,
                           compressed ? compressed->ratio() : 0, idx, len, opts.stream);

  SparsePrefillArgs a;
  a.q = q.slice0(t0, T);
  a.kv = reshape(kv_rows, {Rp * M, 1, D});
  a.indices = reshape(idx, {Tp, 1, K + W});
  a.topk_length = len;
  a.attn_sink = wv.attn_sink;
  a.softmax_scale = st.softmax_scale;
  a.d_v = D;
  a.out = o.slice0(t0, T);
  a.max_logits = ws.tensor(DType::fp32, {Tp, H});
  a.lse = ws.tensor(DType::fp32, {Tp, H});
  sparse_prefill(a, opts.stream);
}

void Attention::Impl::project_output(const Step& st, const TensorView& y) {
  const int64_t T = st.plan.num_tokens();
  const int H = cfg.n_heads, D = cfg.head_dim;
  const Stream stream = opts.stream;
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
    inv_rope_fp8_quant(o, st.positions, st.cos_sin, 128, oq, oscale, stream);
    if (device == Device::cuda && !wo_a_fp8) {
      TensorView o_deq = ws.tensor(DType::bf16, {T, HD});
      dequantize_fp8_blocks(oq, oscale, 1, 128, o_deq, stream);
      grouped_wo_a(o_deq, {}, wv.wo_a.value, wv.wo_a.scale, z, gemm_workspace, stream);
    } else {
      grouped_wo_a(oq, oscale, wv.wo_a.value, wv.wo_a.scale, z, gemm_workspace, stream);
    }
  } else {
    apply_rope(o, st.positions, st.cos_sin, /*inverse=*/true, o, stream);
    grouped_wo_a(reshape(o, {T, HD}), {}, wv.wo_a.value, wv.wo_a.scale, z, gemm_workspace, stream);
  }
  const GemmInput zin = make_gemm_input(z, z_fp8, ws);
  const auto [zb, zb_scale] = zin.for_weight(wv.wo_b);
  if (y.device == device) {
    linear(zb, zb_scale, wv.wo_b.value, wv.wo_b.scale, y, gemm_workspace, stream);
  } else {
    TensorView y_dev = ws.tensor(DType::fp32, {T, cfg.dim});
    linear(zb, zb_scale, wv.wo_b.value, wv.wo_b.scale, y_dev, gemm_workspace, stream);
    ws.download(y_dev, y);
  }
}

}  // namespace dsv4
