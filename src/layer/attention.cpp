// dsv4::Attention: sequences the ops of one layer over a mixed batch (SPEC §2).
//
//   x ─► wq_a, wkv ─► fused q/kv RMSNorm ─► wq_b ─► q head-norm + RoPE, kv RoPE + quant + insert
//     ─► [compressor ─► compressed cache; C4A: indexer top-k; C128A: all entries]
//     ─► decodes: sparse_decode over (SWA window | compressed entries) read from the FP8 caches
//     ─► prefills: gather (compressed | SWA) into a bf16 workspace, sparse_prefill
//     ─► inverse RoPE ─► FP8 act quant ─► grouped wo_a ─► wo_b ─► y
#include "dsv4/layer.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "dsv4/indexing.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#include "layer/compressed_scope.h"

namespace dsv4 {

namespace {
constexpr const char* kWhere = "Attention::forward";

// Reinterprets a contiguous tensor with a new shape (same element count).
TensorView reshape(const TensorView& t, std::initializer_list<int64_t> dims) {
  TensorView v(t.data, t.dtype, dims, t.device);
  DSV4_CHECK(v.numel() == t.numel(), "reshape: ", t.shape_str(), " -> ", v.shape_str());
  return v;
}

}  // namespace

struct Attention::Impl {
  ModelConfig cfg;
  int layer = 0;
  LayerKind kind = LayerKind::swa;
  AttentionWeights w;
  AttentionOptions opts;
  LayerCaches caches;
  RopeConfig rope;
  HostTensor cos_sin;                 // [rows, R] for positions [0, rows); grown on demand
  std::map<int64_t, int64_t> cached;  // tokens cached per request
  std::unique_ptr<CompressedScope> compressed;  // ratio > 0 layers

  void check_inputs(const BatchPlan& plan, const TensorView& x, const TensorView& y) const;
  // Grows the cos/sin table (doubling, up to max_position) to cover positions [0, len). A table
  // for all of max_position (1M for v4-flash) would cost 256 MB and seconds per layer.
  void ensure_rope(int64_t len) {
    const int64_t have = cos_sin.shape().empty() ? 0 : cos_sin.shape()[0];
    if (have >= len) return;
    int64_t rows = std::max<int64_t>(have, 1);
    while (rows < len) rows *= 2;
    cos_sin = build_rope_cache(rope, std::min<int64_t>(rows, cfg.max_position));
  }
  void forward(const BatchPlan& plan, const TensorView& x, const TensorView& y);
};

Attention::Attention(const ModelConfig& cfg, int layer, AttentionWeights weights,
                     AttentionOptions opts)
    : impl_(std::make_unique<Impl>()) {
  cfg.validate();
  DSV4_CHECK(cfg.family == "v4", "Attention: the layer is DeepSeek-V4's; config family is ",
             cfg.family);
  if (opts.backend != Backend::cpu)
    fail("Attention: backend cuda: the layer's CUDA path is not available yet (the sparse "
         "attention kernels are callable as ops); use Backend::cpu");
  Impl& m = *impl_;
  m.cfg = cfg;
  m.layer = layer;
  m.kind = cfg.layer_kind(layer);
  m.w = std::move(weights);
  m.opts = opts;
  m.caches = make_layer_caches(cfg, m.kind, opts.caches);
  m.rope = cfg.rope_for_layer(layer);
  m.ensure_rope(4096);
  if (m.kind != LayerKind::swa)
    m.compressed = std::make_unique<CompressedScope>(cfg, layer, m.w, m.caches, m.cos_sin);
}

Attention::~Attention() = default;
Attention::Attention(Attention&&) noexcept = default;
Attention& Attention::operator=(Attention&&) noexcept = default;

const ModelConfig& Attention::config() const { return impl_->cfg; }
int Attention::layer_index() const { return impl_->layer; }
LayerKind Attention::kind() const { return impl_->kind; }
const AttentionWeights& Attention::weights() const { return impl_->w; }
const LayerCaches& Attention::caches() const { return impl_->caches; }

void Attention::release(int64_t req_id) {
  auto it = impl_->cached.find(req_id);
  if (it == impl_->cached.end()) fail("Attention::release: unknown request ", req_id);
  impl_->caches.remove_request(req_id);
  if (impl_->compressed) impl_->compressed->release(req_id);
  impl_->cached.erase(it);
}

void Attention::forward(const BatchPlan& plan, const TensorView& x, const TensorView& y) {
  impl_->check_inputs(plan, x, y);
  if (plan.num_tokens() == 0) return;  // an empty step (x, y [0, dim] may have no data)
  impl_->forward(plan, x, y);
}

void Attention::Impl::check_inputs(const BatchPlan& plan, const TensorView& x,
                                   const TensorView& y) const {
  const int64_t T = plan.num_tokens();
  check_device(kWhere, "x", x, Device::cpu);
  check_shape(kWhere, "x", x, {T, cfg.dim});
  check_contiguous(kWhere, "x", x);
  if (x.dtype != DType::bf16 && x.dtype != DType::fp32)
    fail_expected(kWhere, "x.dtype", "bf16 or fp32", dtype_name(x.dtype));
  check_device(kWhere, "y", y, Device::cpu);
  check_shape(kWhere, "y", y, {T, cfg.dim});
  check_dtype(kWhere, "y", y, DType::fp32);
  check_contiguous(kWhere, "y", y);
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

void Attention::Impl::forward(const BatchPlan& plan, const TensorView& x, const TensorView& y) {
  const int64_t T = plan.num_tokens();
  const int H = cfg.n_heads, D = cfg.head_dim, W = cfg.window_size;
  const float eps = static_cast<float>(cfg.norm_eps);
  const int nd = plan.num_decodes;
  const int R = plan.num_requests();

  int64_t longest = 0;
  for (int r = 0; r < R; ++r) longest = std::max(longest, plan.seq_len(r));
  ensure_rope(longest);

  // Register new requests (check_inputs verified the others' context).
  for (const RequestStep& s : plan.requests)
    if (!cached.count(s.req_id)) {
      caches.add_request(s.req_id);  // every cache of the layer
      if (compressed) compressed->add_request(s.req_id);
      cached[s.req_id] = 0;
    }

  // 1–3. Projections and norms.
  HostTensor qr(DType::fp32, {T, cfg.q_lora_rank}), kv_raw(DType::fp32, {T, D});
  linear(x, {}, w.wq_a.value, w.wq_a.scale, qr);
  linear(x, {}, w.wkv.value, w.wkv.scale, kv_raw);
  HostTensor qr_n(DType::bf16, {T, cfg.q_lora_rank}), kv(DType::bf16, {T, D});
  fused_qkv_rms_norm(qr, w.q_norm, kv_raw, w.kv_norm, eps, qr_n, kv);
  HostTensor q(DType::bf16, {T, H, D});
  linear(qr_n, {}, w.wq_b.value, w.wq_b.scale, reshape(q, {T, int64_t{H} * D}));

  // 4–5. SWA slots, q head-norm + RoPE, kv RoPE + quant + insert.
  HostTensor positions(DType::int64, {T});
  std::copy(plan.positions.begin(), plan.positions.end(), positions.data<int64_t>());
  HostTensor slot_mapping(DType::int64, {T});
  for (int r = 0; r < R; ++r) {
    const RequestStep& s = plan.requests[r];
    const std::vector<int64_t> slots = caches.swa->append(s.req_id, s.num_new);
    std::copy(slots.begin(), slots.end(), slot_mapping.data<int64_t>() + plan.query_start_loc[r]);
  }
  qnorm_rope_kv_insert(q, kv, positions, cos_sin, eps, caches.swa->kv_view(), slot_mapping);

  // 6. Compressor (and indexer) for compressed layers: request-local entry lists per token.
  CompressedIndices cidx;
  if (compressed) cidx = compressed->step(plan, x, qr_n, positions);
  const int K = cidx.topk;  // compressed slots per token (0 for SWA layers)

  std::vector<int64_t> req_ids(R);
  for (int r = 0; r < R; ++r) req_ids[r] = plan.requests[r].req_id;
  HostTensor o(DType::bf16, {T, H, D});
  HostTensor token_to_req = HostTensor::from_int32(plan.token_to_req);

  // 7a. Decodes: read the caches directly through two scopes.
  if (nd > 0) {
    HostTensor swa_table = pack_block_tables(*caches.swa, req_ids);
    HostTensor swa_idx(DType::int32, {nd, W}), swa_len(DType::int32, {nd});
    swa_window_indices(positions.view().slice0(0, nd), token_to_req.view().slice0(0, nd), swa_table,
                       caches.swa->spec().block_size, W, swa_idx, swa_len);
    SparseDecodeArgs a;
    a.q = reshape(q.view().slice0(0, nd), {nd, 1, H, D});
    a.k_cache = caches.swa->kv_view();
    a.indices = reshape(swa_idx, {nd, 1, W});
    a.topk_length = swa_len;
    HostTensor ext_idx, ext_len;
    if (K > 0) {
      ext_idx = HostTensor(DType::int32, {nd, K});
      ext_len = HostTensor(DType::int32, {nd});
      HostTensor table = pack_block_tables(*caches.compressed, req_ids);
      local_to_global_slots(cidx.local.view().slice0(0, nd), token_to_req.view().slice0(0, nd),
                            table, caches.compressed->spec().block_size, ext_idx, ext_len);
      a.extra_k_cache = caches.compressed->kv_view();
      a.extra_indices = reshape(ext_idx, {nd, 1, K});
      a.extra_topk_length = ext_len;
    }
    a.attn_sink = w.attn_sink;
    a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.d_v = D;
    a.out = reshape(o.view().slice0(0, nd), {nd, 1, H, D});
    HostTensor lse(DType::fp32, {nd, 1, H});
    a.lse = lse;
    const DecodeSchedule sched = make_decode_schedule(nd, 1, H, W + K, opts.num_sms);
    HostTensor ws(DType::uint8, {std::max<int64_t>(sched.workspace_bytes, 1)});
    sparse_decode(a, sched, ws);
  }

  // 7b. Prefill chunks: gather (compressed | SWA) rows into a bf16 workspace, then sparse prefill.
  if (nd < R) {
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

    HostTensor ws(DType::bf16, {Rp, M, D});
    HostTensor seq_t = HostTensor::from_int32(seq), gather_t = HostTensor::from_int32(gather), qsl_t = HostTensor::from_int32(qsl);
    if (compressed && N > 0) {
      HostTensor ctable = pack_block_tables(*caches.compressed, prefill_ids);
      dequantize_and_gather(caches.compressed->kv_view(), ctable, HostTensor::from_int32(cseq), {}, 0, ws);
    }
    HostTensor stable = pack_block_tables(*caches.swa, prefill_ids);
    dequantize_and_gather(caches.swa->kv_view(), stable, seq_t, gather_t, N, ws);

    HostTensor topk_local = K > 0 ? HostTensor() : HostTensor(DType::int32, {Tp, 0});
    TensorView topk_view = K > 0 ? cidx.local.view().slice0(t0, T) : topk_local.view();
    HostTensor idx(DType::int32, {Tp, K + W}), len(DType::int32, {Tp});
    combine_topk_swa_indices(topk_view, qsl_t, seq_t, gather_t, W, static_cast<int>(N), M,
                             compressed ? compressed->ratio() : 0, idx, len);

    SparsePrefillArgs a;
    a.q = q.view().slice0(t0, T);
    a.kv = reshape(ws, {Rp * M, 1, D});
    a.indices = reshape(idx, {Tp, 1, K + W});
    a.topk_length = len;
    a.attn_sink = w.attn_sink;
    a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.d_v = D;
    a.out = o.view().slice0(t0, T);
    HostTensor max_logits(DType::fp32, {Tp, H}), lse(DType::fp32, {Tp, H});
    a.max_logits = max_logits;
    a.lse = lse;
    sparse_prefill(a);
  }

  // 8–9. Inverse RoPE, FP8 activation quant, grouped wo_a, wo_b.
  apply_rope(o, positions, cos_sin, /*inverse=*/true, o);
  const int64_t HD = int64_t{H} * D;
  HostTensor z(DType::fp32, {T, int64_t{cfg.o_groups} * cfg.o_lora_rank});
  if (opts.fp8_activations) {
    HostTensor oq(DType::fp8_e4m3, {T, HD}), oscale(DType::fp32, {T, HD / 128});
    quantize_act_fp8(reshape(o, {T, HD}), 128, oq, oscale);
    grouped_wo_a(oq, oscale, w.wo_a.value, w.wo_a.scale, z);
  } else {
    grouped_wo_a(reshape(o, {T, HD}), {}, w.wo_a.value, w.wo_a.scale, z);
  }
  linear(z, {}, w.wo_b.value, w.wo_b.scale, y);

  for (const RequestStep& s : plan.requests) cached[s.req_id] = s.context + s.num_new;
}

}  // namespace dsv4
