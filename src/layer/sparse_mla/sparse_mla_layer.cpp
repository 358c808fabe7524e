// dsv4::SparseMlaAttention: sequences the ops of one V3.2 sparse-MLA layer over a mixed batch (see
// include/dsv4/sparse_mla_layer.h). Projections with FP8 weights take FP8 inputs (per token and
// 128 columns, UE8M0) when fp8_gemm_activations is set, as DeepSeek's Linear does.
#include "dsv4/sparse_mla_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "dsv4/indexer.h"
#include "dsv4/indexing.h"
#include "dsv4/kv_rope_insert.h"
#include "dsv4/ops.h"
#include "dsv4/sparse_mla_indexer.h"
#include "dsv4/status.h"

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

// A projection's input: the dense activation, or its FP8 codes and scales (1 x 128 blocks) when
// the weight is FP8 and the layer quantizes GEMM inputs.
struct ProjectionInput {
  TensorView dense;
  HostTensor fp8, scale;

  ProjectionInput(const TensorView& x, bool quantize) : dense(x) {
    if (!quantize) return;
    fp8 = HostTensor(DType::fp8_e4m3, {x.shape[0], x.shape[1]});
    scale = HostTensor(DType::fp32, {x.shape[0], x.shape[1] / 128});
    quantize_act_fp8(x, 128, fp8, scale);
  }
  // y = input · wᵀ in the form the weight takes.
  void project(const Weight& w, const TensorView& y) const {
    if (w.quantized() && fp8.view().defined())
      linear(fp8, scale, w.value, w.scale, y);
    else
      linear(dense, {}, w.value, w.quantized() ? w.scale.view() : TensorView{}, y);
  }
};

// W_UK_T [H, c, n] and W_UV [H, v, c] from wkv_b [H*(n+v), c] (dequantized: fp8 times a power of
// two is exact in bf16, so the bf16 copies are the checkpoint's values).
std::pair<HostTensor, HostTensor> split_wkv_b(const ModelConfig& cfg, const Weight& wkv_b) {
  const int64_t H = cfg.n_heads, n = cfg.qk_nope_head_dim, v = cfg.mla_v_head_dim,
                c = cfg.nope_dim();
  const HostTensor w = dequantize_weight(wkv_b);
  const float* p = w.data<float>();
  HostTensor uk_t(DType::bf16, {H, c, n}), uv(DType::bf16, {H, v, c});
  for (int64_t h = 0; h < H; ++h) {
    const float* head = p + h * (n + v) * c;
    for (int64_t d = 0; d < n; ++d)
      for (int64_t cc = 0; cc < c; ++cc) uk_t.set((h * c + cc) * n + d, head[d * c + cc]);
    for (int64_t vv = 0; vv < v; ++vv)
      for (int64_t cc = 0; cc < c; ++cc) uv.set((h * v + vv) * c + cc, head[(n + vv) * c + cc]);
  }
  return {uk_t, uv};
}

}  // namespace

struct SparseMlaAttention::Impl {
  ModelConfig cfg;
  int layer = 0;
  SparseMlaWeights w;
  SparseMlaOptions opts;
  int heads = 0, padded = 0;
  HostTensor w_uk_t, w_uv;  // absorbed per-head up-projections (bf16)
  std::unique_ptr<PagedCache> kv, keys;
  HostTensor cos_sin;
  std::map<int64_t, int64_t> cached;  // tokens cached per request

  void ensure_rope(int64_t len) {
    const int64_t have = cos_sin.shape().empty() ? 0 : cos_sin.shape()[0];
    if (have >= len) return;
    int64_t rows = std::max<int64_t>(have, 1);
    while (rows < len) rows *= 2;
    cos_sin = build_rope_cache(cfg.rope_for_layer(layer), std::min<int64_t>(rows, cfg.max_position));
  }
  void check(const BatchPlan& plan, const TensorView& x, const TensorView& y) const;
  void check_plan(const BatchPlan& plan) const;
  // Reserves the step's cache entries (requests in plan order) and returns each token's slot in
  // the latent cache and in the key cache.
  std::pair<HostTensor, HostTensor> append_tokens(const BatchPlan& plan);
  void forward(const BatchPlan& plan, const TensorView& x, const TensorView& y);
  // The latent attention output o [T, Hp, 512] of every token.
  void attend(const BatchPlan& plan, const TensorView& q, const TensorView& local,
              const TensorView& lens, const TensorView& token_to_req, const TensorView& o) const;
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

  Impl& m = *impl_;
  m.cfg = cfg;
  m.layer = layer;
  m.opts = opts;
  m.heads = cfg.n_heads;
  m.padded = sparse_mla_padded_heads(cfg.n_heads);
  std::tie(m.w_uk_t, m.w_uv) = split_wkv_b(cfg, weights.wkv_b);
  m.w = std::move(weights);
  CacheSpec kv_spec{"kv", opts.block_size, kv_geometry(KvLayout::v32_fp8, opts.block_size).block_bytes,
                    opts.cache_blocks, 0, KvLayout::v32_fp8};
  CacheSpec key_spec{"indexer_keys", opts.block_size,
                     int64_t{opts.block_size} * indexer_keys::kEntryBytes, opts.cache_blocks, 0,
                     std::nullopt};
  m.kv = std::make_unique<PagedCache>(kv_spec);
  m.keys = std::make_unique<PagedCache>(key_spec);
}

SparseMlaAttention::~SparseMlaAttention() = default;
SparseMlaAttention::SparseMlaAttention(SparseMlaAttention&&) noexcept = default;
SparseMlaAttention& SparseMlaAttention::operator=(SparseMlaAttention&&) noexcept = default;

const ModelConfig& SparseMlaAttention::config() const { return impl_->cfg; }
const SparseMlaWeights& SparseMlaAttention::weights() const { return impl_->w; }
void SparseMlaAttention::check_plan(const BatchPlan& plan) const { impl_->check_plan(plan); }
int SparseMlaAttention::layer_index() const { return impl_->layer; }
int SparseMlaAttention::padded_heads() const { return impl_->padded; }
const PagedCache& SparseMlaAttention::kv_cache() const { return *impl_->kv; }
const PagedCache& SparseMlaAttention::indexer_keys() const { return *impl_->keys; }

void SparseMlaAttention::release(int64_t req_id) {
  Impl& m = *impl_;
  if (m.cached.count(req_id) == 0) fail("SparseMlaAttention::release: unknown request ", req_id);
  m.kv->remove_request(req_id);
  m.keys->remove_request(req_id);
  m.cached.erase(req_id);
}

void SparseMlaAttention::forward(const BatchPlan& plan, const TensorView& x, const TensorView& y) {
  impl_->check(plan, x, y);
  if (plan.num_tokens() == 0) return;
  impl_->forward(plan, x, y);
}

void SparseMlaAttention::Impl::check(const BatchPlan& plan, const TensorView& x,
                                     const TensorView& y) const {
  const int64_t T = plan.num_tokens();
  for (const auto& [name, t] : {std::pair<const char*, const TensorView&>{"x", x}, {"y", y}}) {
    check_device(kWhere, name, t, Device::cpu);
    check_shape(kWhere, name, t, {T, cfg.dim});
    check_contiguous(kWhere, name, t);
  }
  if (x.dtype != DType::bf16 && x.dtype != DType::fp32)
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

std::pair<HostTensor, HostTensor> SparseMlaAttention::Impl::append_tokens(const BatchPlan& plan) {
  const int64_t T = plan.num_tokens();
  HostTensor kv_slots(DType::int64, {T}), key_slots(DType::int64, {T});
  for (int r = 0; r < plan.num_requests(); ++r) {
    const RequestStep& step = plan.requests[r];
    if (cached.emplace(step.req_id, 0).second) {
      kv->add_request(step.req_id);
      keys->add_request(step.req_id);
    }
    const std::vector<int64_t> a = kv->append(step.req_id, step.num_new);
    const std::vector<int64_t> b = keys->append(step.req_id, step.num_new);
    std::copy(a.begin(), a.end(), kv_slots.data<int64_t>() + plan.query_start_loc[r]);
    std::copy(b.begin(), b.end(), key_slots.data<int64_t>() + plan.query_start_loc[r]);
    cached[step.req_id] += step.num_new;
  }
  return {kv_slots, key_slots};
}

void SparseMlaAttention::Impl::forward(const BatchPlan& plan, const TensorView& x,
                                       const TensorView& y) {
  const int64_t T = plan.num_tokens();
  const int64_t H = heads, Hp = padded, n = cfg.qk_nope_head_dim, R = cfg.rope_head_dim;
  const int64_t c = cfg.nope_dim(), d_qk = cfg.head_dim, v = cfg.mla_v_head_dim;
  const int64_t I = cfg.index_n_heads, d_i = cfg.index_head_dim;
  const float eps = static_cast<float>(cfg.norm_eps);
  int64_t max_len = 0;
  for (int r = 0; r < plan.num_requests(); ++r) max_len = std::max(max_len, plan.seq_len(r));
  ensure_rope(max_len);
  HostTensor positions(DType::int64, {T});
  std::copy(plan.positions.begin(), plan.positions.end(), positions.data<int64_t>());
  const HostTensor token_to_req = HostTensor::from_int32(plan.token_to_req);
  const auto [kv_slots, key_slots] = append_tokens(plan);

  // Low-rank projections and their norms; RoPE on the last R dims of each q head.
  const bool quantize = opts.fp8_gemm_activations;
  const ProjectionInput x_in(x, quantize);
  HostTensor qr(DType::bf16, {T, cfg.q_lora_rank}), kv_row(DType::bf16, {T, d_qk});
  x_in.project(w.wq_a, qr);
  x_in.project(w.wkv_a, kv_row);
  rms_norm(qr, w.q_norm, eps, qr);
  const TensorView latent = strided(kv_row, {T, c}, {d_qk, 1});
  rms_norm(latent, w.kv_norm, eps, latent);
  const ProjectionInput qr_in(qr, quantize);
  HostTensor q(DType::bf16, {T, H, n + R});
  qr_in.project(w.wq_b, strided(q, {T, H * (n + R)}, {H * (n + R), 1}));
  apply_rope(q, positions, cos_sin, false, q);

  // The 576-wide query: q_nope · W_UK per head into the latent dims, q_pe after it; padded heads 0.
  HostTensor q_mqa = HostTensor::zeros(DType::bf16, {T, Hp, d_qk});
  for (int64_t h = 0; h < H; ++h) {
    linear(strided(q, {T, n}, {H * (n + R), 1}, h * (n + R)), {},
           strided(w_uk_t, {c, n}, {n, 1}, h * c * n), {},
           strided(q_mqa, {T, c}, {Hp * d_qk, 1}, h * d_qk));
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(q_mqa.data<uint16_t>() + (t * Hp + h) * d_qk + c,
                  q.data<uint16_t>() + (t * H + h) * (n + R) + n, static_cast<size_t>(R) * 2);
  }

  // RoPE on k_pe, then the token's latent + k_pe into the V32_FP8 cache.
  kv_rope_insert(kv_row, positions, cos_sin, kv->kv_view(), kv_slots);

  // The lightning indexer: FP8 queries and weights, the token's key into the key cache, scores
  // over the request's tokens up to itself, top-k (request-local token numbers).
  HostTensor qi(DType::fp32, {T, I, d_i}), q_codes(DType::fp8_e4m3, {T, I, d_i});
  HostTensor q_scales(DType::fp32, {T, I}), ki(DType::fp32, {T, d_i}), weights(DType::fp32, {T, I});
  qr_in.project(w.indexer.wq_b, strided(qi, {T, I * d_i}, {I * d_i, 1}));
  sparse_mla_indexer_quantize(qi, positions, cos_sin, q_codes, q_scales);
  x_in.project(w.indexer.wk, ki);
  const IndexerKeyCacheView key_view{keys->storage_view(), keys->spec().block_size};
  sparse_mla_indexer_key_insert(ki, w.indexer.k_norm, w.indexer.k_norm_bias, kIndexerNormEps,
                                positions, cos_sin, key_view, key_slots);
  linear(x, {}, w.indexer.weights_proj.value, w.indexer.weights_proj.scale, weights);
  const float w_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(I * d_i)));
  for (int64_t i = 0; i < T * I; ++i) weights.data<float>()[i] *= w_scale;
  std::vector<int64_t> reqs;
  for (const RequestStep& r : plan.requests) reqs.push_back(r.req_id);
  const HostTensor key_tables = pack_block_tables(*keys, reqs);
  HostTensor scores(DType::fp32, {T, max_len});
  indexer_scores(q_codes, q_scales, weights, positions, token_to_req, key_view, key_tables, 1,
                 scores);
  const int64_t K = cfg.index_topk;
  HostTensor local(DType::int32, {T, K}), lens(DType::int32, {T});
  indexer_topk(scores, positions, 1, local, lens);

  // Sparse attention into the latent output, then W_UV per head and wo.
  HostTensor o_latent(DType::bf16, {T, Hp, c});
  attend(plan, q_mqa, local, lens, token_to_req, o_latent);
  HostTensor o(DType::bf16, {T, H * v});
  for (int64_t h = 0; h < H; ++h)
    linear(strided(o_latent, {T, c}, {Hp * c, 1}, h * c), {},
           strided(w_uv, {v, c}, {c, 1}, h * v * c), {}, strided(o, {T, v}, {H * v, 1}, h * v));
  const ProjectionInput o_in(o, opts.fp8_activations && w.wo.quantized());
  o_in.project(w.wo, y);
}

void SparseMlaAttention::Impl::attend(const BatchPlan& plan, const TensorView& q,
                                      const TensorView& local, const TensorView& lens,
                                      const TensorView& token_to_req, const TensorView& o) const {
  const int64_t Hp = padded, d_qk = cfg.head_dim, c = cfg.nope_dim(), K = cfg.index_topk;
  const float scale = static_cast<float>(cfg.mla_softmax_scale());
  const KvCacheView kv_view = kv->kv_view();

  // Decodes: one query token each, straight from the FP8 cache through global slots.
  const int64_t nd = plan.num_decode_tokens();
  if (nd > 0) {
    std::vector<int64_t> reqs;
    for (int r = 0; r < plan.num_decodes; ++r) reqs.push_back(plan.requests[r].req_id);
    const HostTensor tables = pack_block_tables(*kv, reqs);
    HostTensor global(DType::int32, {nd, K});
    local_to_global_slots(local.slice0(0, nd), token_to_req.slice0(0, nd), tables,
                          kv->spec().block_size, global);
    SparseDecodeArgs a;
    a.q = strided(q, {nd, 1, Hp, d_qk}, {Hp * d_qk, Hp * d_qk, d_qk, 1});
    a.k_cache = kv_view;
    a.indices = strided(global, {nd, 1, K}, {K, K, 1});
    a.topk_length = lens.slice0(0, nd);
    a.softmax_scale = scale;
    a.d_v = static_cast<int>(c);
    a.out = strided(o, {nd, 1, Hp, c}, {Hp * c, Hp * c, c, 1});
    HostTensor lse(DType::fp32, {nd, 1, Hp});
    a.lse = lse;
    const DecodeSchedule schedule = make_decode_schedule(static_cast<int>(nd), 1, static_cast<int>(Hp),
                                                         static_cast<int>(K), opts.num_sms,
                                                         static_cast<int>(c));
    HostTensor workspace(DType::uint8, {std::max<int64_t>(schedule.workspace_bytes, 16)});
    sparse_decode(a, schedule, workspace);
  }

  // Prefill chunks: the request's cached rows (this chunk's included) dequantized into a bf16
  // workspace, which request-local indices address directly.
  for (int r = plan.num_decodes; r < plan.num_requests(); ++r) {
    const int64_t t0 = plan.query_start_loc[r], t1 = plan.query_start_loc[r + 1];
    const int64_t len = plan.seq_len(r);
    const HostTensor table = pack_block_tables(*kv, {plan.requests[r].req_id});
    const HostTensor seq_lens = HostTensor::from_int32({static_cast<int32_t>(len)});
    HostTensor rows(DType::bf16, {1, len, d_qk});
    dequantize_and_gather(kv_view, table, seq_lens, {}, 0, rows);
    SparsePrefillArgs a;
    a.q = q.slice0(t0, t1);
    a.kv = strided(rows, {len, 1, d_qk}, {d_qk, d_qk, 1});
    a.indices = strided(local.slice0(t0, t1), {t1 - t0, 1, K}, {K, K, 1});
    a.topk_length = lens.slice0(t0, t1);
    a.softmax_scale = scale;
    a.d_v = static_cast<int>(c);
    a.out = o.slice0(t0, t1);
    HostTensor max_logits(DType::fp32, {t1 - t0, Hp}), lse(DType::fp32, {t1 - t0, Hp});
    a.max_logits = max_logits;
    a.lse = lse;
    sparse_prefill(a);
  }
}

}  // namespace dsv4
