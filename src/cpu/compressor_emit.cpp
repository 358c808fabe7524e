// The CPU kernel of compressor_update_and_emit (docs/spec.md §4 (b)): the batch's runs and emitted
// entries (every index value checked before anything is written), then per entry the windowed
// softmax pooling, RMSNorm, RoPE at the window's first position (+ Hadamard for indexer keys)
// and the target's quantization, then the ring rows the next call needs.
#include <algorithm>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/rope_common.h"
#include "cpu/rows.h"
#include "dsv4/fp8_block.h"
#include "math/compressor.h"
#include "math/hadamard.h"
#include "math/rms_norm.h"

namespace dsv4::cpu {

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

// Checks that the batch's tokens form one run per request continuing at context_lens; returns
// the runs (indexed by request).
std::vector<RequestRun> request_runs(const CompressorBatch& batch, int64_t T, int64_t R) {
  std::vector<RequestRun> runs(static_cast<size_t>(R));
  for (int64_t q = 0; q < R; ++q) {
    runs[q].context = load_index(batch.context_lens, q);
    if (runs[q].context < 0)
      fail_expected(kEmitOp, detail::concat("context_lens[", q, "]"), ">= 0", runs[q].context);
  }
  int64_t prev = -1;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t q = load_index(batch.token_to_req, t);
    if (q < 0 || q >= R)
      fail_expected(kEmitOp, detail::concat("token_to_req[", t, "]"),
                    detail::concat("in [0, ", R, ")"), q);
    RequestRun& run = runs[q];
    if (run.count > 0 && q != prev)
      fail(kEmitOp, ": token_to_req[", t, "]: the tokens of request ", q,
           " must be one contiguous run of the batch, got a second run");
    if (run.count == 0) run.first_token = t;
    const int64_t p = load_index(batch.positions, t);
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

// The rows of the window that ends at position p (docs/spec.md §4), in pooling order, into kv[0, n) /
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
  math::rope_rotate_pairs(e + D - R, rope_table_row(cos_sin, rope_pos), R / 2,
                         /*inverse=*/false);
}

// Quantizes one finished entry (post norm + RoPE, + Hadamard for indexer keys) into its target;
// `v` may be modified.
void store_entry(const CompressorConfig& cfg, const CompressorOutputView& out, int64_t slot,
                 float* v) {
  if (cfg.target == CompressorTarget::kv_cache) {
    const KvCacheView& cache = out.kv_cache;
    // MODEL1_FP8 stores the nope dims as FP8 blocks of 64 itself; other layouts get the model's
    // FP8-rounded values (docs/spec.md §4) and then apply their own encoding.
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
                                const TensorView& entries, Stream /*stream*/) {
  const int D = cfg.head_dim, r = cfg.ratio, K = cfg.ring_rows();
  const int64_t width = cfg.proj_width();
  const int64_t T = batch.positions.size(0), R = batch.context_lens.size(0);
  // ---- data: runs, emitted entries and every slot this call touches ----
  const std::vector<RequestRun> runs = request_runs(batch, T, R);
  const int out_block = cfg.target == CompressorTarget::kv_cache ? out.kv_cache.block_size
                                                                 : out.indexer_keys.block_size;
  const int64_t out_slots = cfg.target == CompressorTarget::kv_cache ? out.kv_cache.num_slots()
                                                                     : out.indexer_keys.num_slots();
  std::vector<Emission> emissions;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = load_index(batch.positions, t);
    if ((p + 1) % r != 0) continue;
    const int64_t q = load_index(batch.token_to_req, t);
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
  load_row(norm_weight.data, norm_weight.dtype, D, weight.data());
  const int64_t E = static_cast<int64_t>(emissions.size());
#pragma omp parallel if (E > 1)
  {
    std::vector<float> v(static_cast<size_t>(D));
#pragma omp for schedule(dynamic, 1)
    for (int64_t e = 0; e < E; ++e) {
      const Emission& em = emissions[static_cast<size_t>(e)];
      compute_entry(cfg, runs[em.req], em.req, load_index(batch.positions, em.token),
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

}  // namespace dsv4::cpu
