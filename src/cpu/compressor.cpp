// CPU reference of the KV compressor (SPEC §4): projection, per-request ring state, windowed
// softmax pooling, RMSNorm, RoPE at the window's first position, and the target's quantization
// (KV cache layout, or Hadamard + FP8 indexer keys). One implementation for both compressors:
// head dim, ratio and target are parameters (CompressorConfig).
#include "dsv4/compressor.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/backend.h"
#include "math/compressor.h"
#include "math/hadamard.h"
#include "math/rms_norm.h"
#include "cpu/rope_common.h"
#include "cpu/rows.h"
#include "cpu/validate.h"
#include "dsv4/fp8_block.h"
#if defined(DSV4_WITH_CUDA)
#include "cuda/compressor/compressor.h"
#endif

namespace dsv4 {

// ================================ configuration ==============================================

CompressorConfig CompressorConfig::attention(const ModelConfig& cfg, int ratio) {
  CompressorConfig c;
  c.head_dim = cfg.head_dim;
  c.ratio = ratio;
  c.rope_dims = cfg.rope_head_dim;
  c.eps = static_cast<float>(cfg.norm_eps);
  c.target = CompressorTarget::kv_cache;
  return c;
}

CompressorConfig CompressorConfig::indexer(const ModelConfig& cfg) {
  CompressorConfig c;
  c.head_dim = cfg.index_head_dim;
  c.ratio = 4;
  c.rope_dims = cfg.rope_head_dim;
  c.eps = static_cast<float>(cfg.norm_eps);
  c.target = CompressorTarget::indexer_keys;
  return c;
}

void CompressorConfig::validate(const char* where) const {
  if (ratio != 4 && ratio != 128) fail_expected(where, "cfg.ratio", "4 or 128", ratio);
  if (target == CompressorTarget::kv_cache) {
    if (head_dim != model1::kDim)
      fail_expected(where, "cfg.head_dim", "512 (the KV cache entry dim)", head_dim);
  } else if (head_dim != indexer_keys::kDim) {
    fail_expected(where, "cfg.head_dim", "128 (the indexer key dim)", head_dim);
  }
  if (rope_dims <= 0 || rope_dims > head_dim || rope_dims % 2 != 0)
    fail_expected(where, "cfg.rope_dims", "even, in (0, head_dim]", rope_dims);
  // kv_cache entries round their nope dims in FP8 blocks of 64.
  if (target == CompressorTarget::kv_cache && (head_dim - rope_dims) % model1::kQuantBlock != 0)
    fail_expected(where, "cfg.rope_dims", "head_dim - rope_dims a multiple of 64", rope_dims);
  if (!(eps > 0.0f)) fail_expected(where, "cfg.eps", "> 0", eps);
}

// ================================ (a) projection =============================================

void compressor_project(const CompressorConfig& cfg, const TensorView& x, const TensorView& wkv,
                        const TensorView& wgate, const TensorView& ape, const TensorView& positions,
                        const TensorView& kv_rows, const TensorView& score_rows, Stream stream) {
  constexpr const char* kOp = "compressor_project";
  cfg.validate(kOp);
  const int64_t width = cfg.proj_width();
  check_defined(kOp, "x", x);
  check_ndim(kOp, "x", x, 2);
  const int64_t T = x.size(0), dim = x.size(1);
  cpu::check_dtype_in(kOp, "x", x, {DType::bf16, DType::fp32});
  cpu::check_row_strided(kOp, "x", x);
  for (const auto& [name, w] : {std::pair<const char*, const TensorView&>{"wkv", wkv},
                                std::pair<const char*, const TensorView&>{"wgate", wgate}}) {
    check_defined(kOp, name, w);
    cpu::check_dtype_in(kOp, name, w, {DType::bf16, DType::fp32});
    check_shape(kOp, name, w, {width, dim});
    cpu::check_row_strided(kOp, name, w);
  }
  check_defined(kOp, "ape", ape);
  check_dtype(kOp, "ape", ape, DType::fp32);
  check_shape(kOp, "ape", ape, {cfg.ratio, width});
  cpu::check_row_strided(kOp, "ape", ape);
  cpu::check_index_vector(kOp, "positions", positions, T);
  for (const auto& [name, out] :
       {std::pair<const char*, const TensorView&>{"kv_rows", kv_rows},
        std::pair<const char*, const TensorView&>{"score_rows", score_rows}}) {
    check_defined(kOp, name, out);
    check_dtype(kOp, name, out, DType::fp32);
    check_shape(kOp, name, out, {T, width});
    cpu::check_output_layout(kOp, name, out);
  }
  cpu::check_outputs_disjoint(kOp, {{"kv_rows", kv_rows}, {"score_rows", score_rows}},
                              {{"x", x}, {"wkv", wkv}, {"wgate", wgate}, {"ape", ape},
                               {"positions", positions}});
  const Device dev = cpu::common_device(kOp, {{"x", x},
                                              {"wkv", wkv},
                                              {"wgate", wgate},
                                              {"ape", ape},
                                              {"positions", positions},
                                              {"kv_rows", kv_rows},
                                              {"score_rows", score_rows}});
  if (dev == Device::cuda) {
#if defined(DSV4_WITH_CUDA)
    // The CUDA linear (cuBLASLt) multiplies x and a weight of one dtype: bf16 · bf16 or
    // fp32 · fp32 (fp32 out). Checked for both weights before the first GEMM writes anything.
    for (const auto& [name, w] : {std::pair<const char*, const TensorView&>{"wkv", wkv},
                                  std::pair<const char*, const TensorView&>{"wgate", wgate}})
      if (w.dtype != x.dtype)
        fail_expected(kOp, detail::concat(name, ".dtype"),
                      detail::concat(dtype_name(x.dtype),
                                     " (the dtype of x: on CUDA x and the weights share one dtype)"),
                      dtype_name(w.dtype));
    // ... and rows that do not overlap (linear's CUDA rule), checked here for all five operands
    // so that the second GEMM cannot reject what the first accepted.
    for (const auto& [name, m] : {std::pair<const char*, const TensorView&>{"x", x},
                                  std::pair<const char*, const TensorView&>{"wkv", wkv},
                                  std::pair<const char*, const TensorView&>{"wgate", wgate},
                                  std::pair<const char*, const TensorView&>{"kv_rows", kv_rows},
                                  std::pair<const char*, const TensorView&>{"score_rows", score_rows}})
      if (m.size(0) > 1 && m.stride(0) < m.size(1))
        fail_expected(kOp, detail::concat(name, ".stride(0)"),
                      detail::concat(">= ", m.size(1), " on CUDA (rows must not overlap)"),
                      m.stride(0));
    // positions are not read on the host: a negative one turns its score row into NaN there.
    linear(x, {}, wkv, {}, kv_rows, stream);
    linear(x, {}, wgate, {}, score_rows, stream);
    cuda::compressor_add_ape(cfg, ape, positions, score_rows, stream);
    return;
#else
    (void)stream;
    cpu::throw_cuda_unavailable(kOp);
#endif
  }
  for (int64_t t = 0; t < T; ++t)
    if (cpu::load_index(positions, t) < 0)
      fail_expected(kOp, detail::concat("positions[", t, "]"), ">= 0",
                    cpu::load_index(positions, t));

  linear(x, {}, wkv, {}, kv_rows);
  linear(x, {}, wgate, {}, score_rows);
  // The learned positional bias of the score: row p mod r of ape.
  const float* ape_base = ape.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* bias = ape_base + (cpu::load_index(positions, t) % cfg.ratio) * ape.stride(0);
    float* s = score_rows.ptr<float>() + t * score_rows.stride(0);
    for (int64_t c = 0; c < width; ++c) s[c] += bias[c];
  }
}

// ================================ (b) update + emit ==========================================

namespace {

constexpr const char* kEmitOp = "compressor_update_and_emit";

// The run of one request in the batch.
struct RequestRun {
  int64_t first_token = -1;  // batch index of its first token
  int64_t count = 0;         // tokens in this call
  int64_t context = 0;       // positions consumed before this call (= first position)
  int64_t end() const { return context + count; }
};

// One entry completed by this call.
struct Emission {
  int64_t token;  // the token that completes it (position (j+1)·r − 1)
  int64_t req;
  int64_t entry;  // j
  int64_t slot;   // destination slot in the output cache
};

// Global slot of row/entry `i` of request `req` through a block table; -1 when the block lies
// beyond the table, is unmapped (-1), or the slot falls outside a cache of `num_slots`.
int64_t mapped_slot(const TensorView& table, int64_t req, int64_t i, int block_size,
                    int64_t num_slots) {
  const int64_t blk = i / block_size;
  if (blk >= table.size(1)) return -1;
  const int32_t b = table.ptr<int32_t>()[req * table.stride(0) + blk * table.stride(1)];
  if (b < 0) return -1;
  const int64_t slot = int64_t{b} * block_size + i % block_size;
  return slot < num_slots ? slot : -1;
}

void check_block_table(const char* name, const TensorView& table, int64_t rows, int64_t min_cols) {
  check_defined(kEmitOp, name, table);
  check_dtype(kEmitOp, name, table, DType::int32);
  check_ndim(kEmitOp, name, table, 2);
  check_dim(kEmitOp, name, table, 0, rows);
  if (table.size(1) < min_cols)
    fail_expected(kEmitOp, detail::concat(name, ".shape[1]"), detail::concat(">= ", min_cols),
                  table.size(1));
}

void check_output(const CompressorConfig& cfg, const CompressorOutputView& out, int64_t R) {
  check_block_table("out.block_table", out.block_table, R, 0);
  if (cfg.target == CompressorTarget::kv_cache) {
    check_kv_cache(kEmitOp, "out.kv_cache", out.kv_cache);
    const KvLayout l = out.kv_cache.layout;
    if (l != KvLayout::model1_fp8 && l != KvLayout::bf16 && l != KvLayout::fp8_per_tensor)
      fail_expected(kEmitOp, "out.kv_cache.layout", "MODEL1_FP8, BF16 or FP8_PER_TENSOR (dim 512)",
                    kv_layout_name(l));
    if (l == KvLayout::fp8_per_tensor && !(out.kv_cache.tensor_scale > 0.0f))
      fail_expected(kEmitOp, "out.kv_cache.tensor_scale", "> 0", out.kv_cache.tensor_scale);
  } else {
    check_indexer_key_cache(kEmitOp, "out.indexer_keys", out.indexer_keys);
  }
}

// Checks that the batch's tokens form one run per request continuing at context_lens; returns
// the runs (indexed by request).
std::vector<RequestRun> request_runs(const CompressorBatch& batch, int64_t T, int64_t R) {
  std::vector<RequestRun> runs(static_cast<size_t>(R));
  for (int64_t q = 0; q < R; ++q) {
    runs[q].context = cpu::load_index(batch.context_lens, q);
    if (runs[q].context < 0)
      fail_expected(kEmitOp, detail::concat("context_lens[", q, "]"), ">= 0", runs[q].context);
  }
  int64_t prev = -1;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t q = cpu::load_index(batch.token_to_req, t);
    if (q < 0 || q >= R)
      fail_expected(kEmitOp, detail::concat("token_to_req[", t, "]"),
                    detail::concat("in [0, ", R, ")"), q);
    RequestRun& run = runs[q];
    if (run.count > 0 && q != prev)
      fail(kEmitOp, ": token_to_req[", t, "]: the tokens of request ", q,
           " must be one contiguous run of the batch, got a second run");
    if (run.count == 0) run.first_token = t;
    const int64_t p = cpu::load_index(batch.positions, t);
    if (p != run.end())
      fail_expected(kEmitOp, detail::concat("positions[", t, "]"),
                    detail::concat(run.end(), " (request ", q,
                                   " continues at context_lens + its earlier tokens in the batch)"),
                    p);
    ++run.count;
    prev = q;
  }
  return runs;
}

// Ring slot of position `pos` of request `req`, or an error naming what is missing.
int64_t ring_slot(const CompressorConfig& cfg, const CompressorStateView& state, int64_t req,
                  int64_t pos) {
  const int64_t slot = mapped_slot(state.block_table, req, pos % cfg.ring_rows(), state.block_size,
                                   state.rows.size(0));
  if (slot < 0)
    fail(kEmitOp, ": state.block_table: ring row ", pos % cfg.ring_rows(), " of request ", req,
         " (position ", pos, ") is not mapped to a row of state.rows (", state.rows.size(0),
         " rows)");
  return slot;
}

// The rows of the window that ends at position p (SPEC §4), in pooling order, into kv[0, n) /
// s[0, n); returns n. Rows come from this call's projections (positions >= context) or from the
// ring; every ring row it reads was validated before the parallel region, so ring_slot cannot
// throw here. Positions before 0 are absent (kv = 0, s = −inf: no contribution).
int window_rows(const CompressorConfig& cfg, const RequestRun& run, int64_t req, int64_t p,
                const TensorView& kv_rows, const TensorView& score_rows,
                const CompressorStateView& state, const float** kv, const float** s) {
  const int D = cfg.head_dim, r = cfg.ratio, K = cfg.ring_rows();
  const int64_t width = cfg.proj_width();
  int n = 0;
  for (int i = 0; i < K; ++i) {
    const int64_t pos = p - K + 1 + i;
    if (pos < 0) continue;
    // Overlap (r = 4): the previous window's rows use dims [0, D), the current window's [D, 2D).
    const int64_t col = (cfg.coff() == 2 && i >= r) ? D : 0;
    if (pos >= run.context) {
      const int64_t t = run.first_token + (pos - run.context);
      kv[n] = kv_rows.ptr<float>() + t * kv_rows.stride(0) + col;
      s[n] = score_rows.ptr<float>() + t * score_rows.stride(0) + col;
    } else {
      const float* row =
          state.rows.ptr<float>() + ring_slot(cfg, state, req, pos) * state.rows.stride(0);
      kv[n] = row + col;
      s[n] = row + width + col;
    }
    ++n;
  }
  return n;
}

// Pools the window of position p into e[0, D), then RMSNorm and RoPE at position j·r (the
// window's first position), with the per-element math the CUDA kernel runs too
// (math/compressor.h, math/rms_norm.h, math/rope.h).
void compute_entry(const CompressorConfig& cfg, const RequestRun& run, int64_t req, int64_t p,
                   const TensorView& kv_rows, const TensorView& score_rows,
                   const CompressorStateView& state, const float* norm_weight,
                   const TensorView& cos_sin, float* e) {
  namespace cm = compressor_math;
  const int D = cfg.head_dim, K = cfg.ring_rows(), R = cfg.rope_dims;
  std::vector<const float*> kv(static_cast<size_t>(K)), s(static_cast<size_t>(K));
  const int n = window_rows(cfg, run, req, p, kv_rows, score_rows, state, kv.data(), s.data());
  for (int d = 0; d < D; ++d) e[d] = cm::pool_dim(kv.data(), s.data(), n, d);
  math::rms_normalize(e, D, cfg.eps, norm_weight);
  const int64_t rope_pos = (p + 1) - cfg.ratio;  // j·r
  math::rope_rotate_pairs(e + D - R, cpu::rope_table_row(cos_sin, rope_pos), R / 2,
                         /*inverse=*/false);
}

// Quantizes one finished entry (post norm + RoPE, + Hadamard for indexer keys) into its target;
// `v` may be modified.
void store_entry(const CompressorConfig& cfg, const CompressorOutputView& out, int64_t slot,
                 float* v) {
  if (cfg.target == CompressorTarget::kv_cache) {
    const KvCacheView& cache = out.kv_cache;
    // MODEL1_FP8 stores the nope dims as FP8 blocks of 64 itself; other layouts get the model's
    // FP8-rounded values (SPEC §4) and then apply their own encoding.
    if (cache.layout != KvLayout::model1_fp8)
      for (int b = 0; b < cfg.head_dim - cfg.rope_dims; b += model1::kQuantBlock)
        fp8_round_block(v + b, model1::kQuantBlock);
    const KvGeometry g = kv_geometry(cache.layout, cache.block_size);
    uint8_t* block = cache.data.ptr<uint8_t>() + (slot / cache.block_size) * cache.data.stride(0);
    kv_encode_token(g, block, static_cast<int>(slot % cache.block_size), v, cache.tensor_scale);
  } else {
    const IndexerKeyCacheView& keys = out.indexer_keys;
    uint8_t* block = keys.data.ptr<uint8_t>() + (slot / keys.block_size) * keys.data.stride(0);
    indexer_key_encode(block, keys.block_size, static_cast<int>(slot % keys.block_size), v);
  }
}

}  // namespace

void compressor_update_and_emit(const CompressorConfig& cfg, const TensorView& kv_rows,
                                const TensorView& score_rows, const CompressorBatch& batch,
                                const TensorView& norm_weight, const TensorView& cos_sin,
                                const CompressorStateView& state, const CompressorOutputView& out,
                                const TensorView& entries, [[maybe_unused]] Stream stream) {
  cfg.validate(kEmitOp);
  const int D = cfg.head_dim, r = cfg.ratio, K = cfg.ring_rows();
  const int64_t width = cfg.proj_width();

  // ---- shapes, dtypes, devices ----
  check_defined(kEmitOp, "positions", batch.positions);
  check_ndim(kEmitOp, "positions", batch.positions, 1);
  const int64_t T = batch.positions.size(0);
  cpu::check_index_vector(kEmitOp, "positions", batch.positions, T);
  cpu::check_index_vector(kEmitOp, "token_to_req", batch.token_to_req, T);
  check_defined(kEmitOp, "context_lens", batch.context_lens);
  check_ndim(kEmitOp, "context_lens", batch.context_lens, 1);
  const int64_t R = batch.context_lens.size(0);
  cpu::check_index_vector(kEmitOp, "context_lens", batch.context_lens, R);
  for (const auto& [name, rows] :
       {std::pair<const char*, const TensorView&>{"kv_rows", kv_rows},
        std::pair<const char*, const TensorView&>{"score_rows", score_rows}}) {
    check_defined(kEmitOp, name, rows);
    check_dtype(kEmitOp, name, rows, DType::fp32);
    check_shape(kEmitOp, name, rows, {T, width});
    cpu::check_row_strided(kEmitOp, name, rows);
  }
  check_defined(kEmitOp, "norm_weight", norm_weight);
  cpu::check_dtype_in(kEmitOp, "norm_weight", norm_weight, {DType::bf16, DType::fp32});
  check_shape(kEmitOp, "norm_weight", norm_weight, {D});
  cpu::check_row_strided(kEmitOp, "norm_weight", norm_weight);
  check_defined(kEmitOp, "cos_sin", cos_sin);
  check_dtype(kEmitOp, "cos_sin", cos_sin, DType::fp32);
  check_ndim(kEmitOp, "cos_sin", cos_sin, 2);
  check_dim(kEmitOp, "cos_sin", cos_sin, 1, cfg.rope_dims);
  cpu::check_row_strided(kEmitOp, "cos_sin", cos_sin);
  check_defined(kEmitOp, "state.rows", state.rows);
  check_dtype(kEmitOp, "state.rows", state.rows, DType::fp32);
  check_ndim(kEmitOp, "state.rows", state.rows, 2);
  check_dim(kEmitOp, "state.rows", state.rows, 1, cfg.state_width());
  cpu::check_row_strided(kEmitOp, "state.rows", state.rows);
  if (state.block_size < 1) fail_expected(kEmitOp, "state.block_size", ">= 1", state.block_size);
  check_block_table("state.block_table", state.block_table, R,
                    (K + state.block_size - 1) / state.block_size);
  check_output(cfg, out, R);
  if (entries.defined()) {
    check_dtype(kEmitOp, "entries", entries, DType::fp32);
    check_shape(kEmitOp, "entries", entries, {T, D});
    cpu::check_output_layout(kEmitOp, "entries", entries);
  }
  const TensorView& out_data =
      cfg.target == CompressorTarget::kv_cache ? out.kv_cache.data : out.indexer_keys.data;
  // Written: the ring (read-modify-write of its own rows), the output cache and entries.
  cpu::check_outputs_disjoint(
      kEmitOp, {{"state.rows", state.rows}, {"out cache", out_data}, {"entries", entries}},
      {{"kv_rows", kv_rows}, {"score_rows", score_rows}, {"positions", batch.positions},
       {"token_to_req", batch.token_to_req}, {"context_lens", batch.context_lens},
       {"norm_weight", norm_weight}, {"cos_sin", cos_sin},
       {"state.block_table", state.block_table}, {"out.block_table", out.block_table}});
  const Device dev = cpu::common_device(kEmitOp, {{"kv_rows", kv_rows},
                                                  {"score_rows", score_rows},
                                                  {"positions", batch.positions},
                                                  {"token_to_req", batch.token_to_req},
                                                  {"context_lens", batch.context_lens},
                                                  {"norm_weight", norm_weight},
                                                  {"cos_sin", cos_sin},
                                                  {"state.rows", state.rows},
                                                  {"state.block_table", state.block_table},
                                                  {"out.block_table", out.block_table},
                                                  {"out cache", out_data},
                                                  {"entries", entries}});
  if (dev == Device::cuda) {
    // The data-dependent checks below read index tensors: not on the host for CUDA tensors. The
    // kernels skip what they would reject (header comment); they rely on the checks above.
    DSV4_CUDA_DISPATCH(kEmitOp, cuda::compressor_update_and_emit(cfg, kv_rows, score_rows, batch,
                                                                 norm_weight, cos_sin, state, out,
                                                                 entries, stream));
  }

  // ---- data: runs, emitted entries and every slot this call touches ----
  const std::vector<RequestRun> runs = request_runs(batch, T, R);
  const int out_block = cfg.target == CompressorTarget::kv_cache ? out.kv_cache.block_size
                                                                 : out.indexer_keys.block_size;
  const int64_t out_slots = cfg.target == CompressorTarget::kv_cache ? out.kv_cache.num_slots()
                                                                     : out.indexer_keys.num_slots();
  std::vector<Emission> emissions;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = cpu::load_index(batch.positions, t);
    if ((p + 1) % r != 0) continue;
    const int64_t q = cpu::load_index(batch.token_to_req, t);
    const int64_t j = (p + 1) / r - 1;
    if (j * r >= cos_sin.size(0))
      fail_expected(kEmitOp, "cos_sin.shape[0]",
                    detail::concat("> ", j * r, " (RoPE position of entry ", j, ")"),
                    cos_sin.size(0));
    const int64_t slot = mapped_slot(out.block_table, q, j, out_block, out_slots);
    if (slot < 0)
      fail(kEmitOp, ": out.block_table: entry ", j, " of request ", q,
           " is not mapped to a slot of the output cache (", out_slots, " slots)");
    for (int64_t pos = std::max<int64_t>(0, p - K + 1); pos < runs[q].context; ++pos)
      ring_slot(cfg, state, q, pos);  // the older rows this window reads must be in the ring
    emissions.push_back({t, q, j, slot});
  }
  for (int64_t q = 0; q < R; ++q)
    for (int64_t pos = std::max(runs[q].context, runs[q].end() - K); pos < runs[q].end(); ++pos)
      ring_slot(cfg, state, q, pos);  // rows saved for the next call

  // ---- emit: pool → RMSNorm → RoPE at j·r (→ Hadamard) → target quantization ----
  std::vector<float> weight(static_cast<size_t>(D));
  cpu::load_row(norm_weight.data, norm_weight.dtype, D, weight.data());
  const int64_t E = static_cast<int64_t>(emissions.size());
#pragma omp parallel if (E > 1)
  {
    std::vector<float> v(static_cast<size_t>(D));
#pragma omp for schedule(dynamic, 1)
    for (int64_t e = 0; e < E; ++e) {
      const Emission& em = emissions[static_cast<size_t>(e)];
      compute_entry(cfg, runs[em.req], em.req, cpu::load_index(batch.positions, em.token),
                    kv_rows, score_rows, state, weight.data(), cos_sin, v.data());
      if (cfg.target == CompressorTarget::indexer_keys) math::hadamard_rotate(v.data(), D);
      if (entries.defined())
        std::copy(v.begin(), v.end(), entries.ptr<float>() + em.token * entries.stride(0));
      store_entry(cfg, out, em.slot, v.data());
    }
  }

  // ---- save the rows the next call needs (after every read of the ring above) ----
  for (int64_t q = 0; q < R; ++q) {
    const RequestRun& run = runs[q];
    for (int64_t pos = std::max(run.context, run.end() - K); pos < run.end(); ++pos) {
      const int64_t t = run.first_token + (pos - run.context);
      float* row = state.rows.ptr<float>() + ring_slot(cfg, state, q, pos) * state.rows.stride(0);
      const float* kv = kv_rows.ptr<float>() + t * kv_rows.stride(0);
      const float* s = score_rows.ptr<float>() + t * score_rows.stride(0);
      std::copy(kv, kv + width, row);
      std::copy(s, s + width, row + width);
    }
  }
}

// ================================ PagedCache bookkeeping =====================================

namespace {
void check_state_cache(const char* where, const PagedCache& state, const CompressorConfig& cfg) {
  const int64_t row_bytes = int64_t{cfg.state_width()} * 4;
  const int64_t want = int64_t{state.spec().block_size} * row_bytes;
  if (state.spec().block_bytes != want)
    fail_expected(where, "state.spec().block_bytes",
                  detail::concat(want, " (block_size x ", row_bytes, " B fp32 rows)"),
                  state.spec().block_bytes);
}
}  // namespace

void compressor_state_init(PagedCache& state, const CompressorConfig& cfg, int64_t req) {
  constexpr const char* kOp = "compressor_state_init";
  cfg.validate(kOp);
  check_state_cache(kOp, state, cfg);
  const bool registered = state.has_request(req);
  if (registered && state.num_entries(req) != 0)
    fail_expected(kOp, detail::concat("rows of request ", req), "0 (a ring is reserved once)",
                  state.num_entries(req));
  if (!registered) state.add_request(req);
  try {
    state.append(req, cfg.ring_rows());
  } catch (...) {
    if (!registered) state.remove_request(req);  // atomic: a full pool leaves the cache as it was
    throw;
  }
}

TensorView compressor_state_rows(const PagedCache& state, const CompressorConfig& cfg) {
  constexpr const char* kOp = "compressor_state_rows";
  cfg.validate(kOp);
  check_state_cache(kOp, state, cfg);
  return TensorView(
      state.storage(), DType::fp32,
      {int64_t{state.spec().num_blocks} * state.spec().block_size, int64_t{cfg.state_width()}},
      state.device());
}

}  // namespace dsv4
