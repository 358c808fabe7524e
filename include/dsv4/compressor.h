// The KV compressor of C4A / C128A layers and of the C4A indexer (docs/spec.md §4), as two ops on views
// so a CUDA twin can follow, plus the host bookkeeping for PagedCache-backed state.
//
// Per token at position p (one request):  kv = x·wkvᵀ,  s = x·wgateᵀ + ape[p mod r]   (fp32,
// width coff·D; coff = 2 for r = 4 (overlapping windows), 1 for r = 128).
// Entry j covers positions [j·r, (j+1)·r) and is emitted when position (j+1)·r − 1 arrives:
//   r = 128: e = Σ_t softmax_t(s_t) ⊙ kv_t over the window's r rows (per dim).
//   r = 4  : the softmax runs over 2r rows: the previous window's r rows with dims [0, D) of kv/s
//            and the current window's r rows with dims [D, 2D); for j = 0 the previous-window rows
//            are absent (kv = 0, s = −inf).
//   e ← RMSNorm(e; norm_weight, eps); RoPE on its last rope_dims at position j·r (the window's
//   first position), then by target:
//     kv_cache     : the nope dims [0, D − rope_dims) FP8-rounded in blocks of 64 (UE8M0), the
//                    rope dims as the cache stores them: written with kv_encode_token. MODEL1_FP8
//                    stores exactly this; BF16 / FP8_PER_TENSOR caches receive the values after
//                    the FP8 block rounding (the model's numerics), then their own encoding.
//     indexer_keys : e ← Hadamard(e) · D^-0.5 (Sylvester order; orthonormal), then FP8 with one
//                    power-of-two scale per entry into the indexer key cache (indexer_key_cache.h).
// All arithmetic is fp32; the only roundings are the cache's.
//
// State: partial windows are carried between calls in a per-request ring of coff·r fp32 rows
// [kv (coff·D) | score (coff·D)] (score already includes ape): position p lives in ring row
// p mod (coff·r). A ring row is addressed through a block table like any paged cache
// (row i of request q: block_table[q][i / B]·B + i % B), so the ring can be the
// `compressor_state` / `indexer_state` PagedCache of a layer, with coff·r entries appended once
// per request (compressor_state_init). After a call that ends at position `end`, the ring holds
// the rows of positions [max(0, end − coff·r), end) of each request in the batch.
//
// A layer step on PagedCaches (what the tests do):
//   new request: caches.add_request(req);
//                compressor_state_init(*caches.compressor_state, cfg, req);
//   each call:   caches.compressed->append(req, compressor_entries_after(r, ctx + n) -
//                                               compressor_entries_after(r, ctx));
//                compressor_project(cfg, x, wkv, wgate, ape, positions, kv_rows, score_rows);
//                compressor_update_and_emit(cfg, kv_rows, score_rows,
//                    {positions, token_to_req, context_lens}, norm_weight, cos_sin,
//                    {compressor_state_rows(state, cfg), pack_block_tables(state, reqs),
//                     state.spec().block_size},
//                    {compressed.kv_view(), {}, pack_block_tables(compressed, reqs)});
//   The indexer's compressor: CompressorConfig::indexer, indexer_state and indexer_keys
//   (out.indexer_keys instead of out.kv_cache).
//
// Backends: all tensors of a call on the CPU → the reference; all on CUDA → the CUDA twin on
// `stream` (src/cuda/compressor/); mixed → dsv4::Error. The CUDA twin computes bit-identical
// entries (the per-element math below is shared; CUDA's one difference: denormals flush to
// zero), the same ring rows and the same cache bytes, except for FP8_PER_TENSOR caches: their
// shared encoder's 1 / tensor_scale is approximate under --use_fast_math, which can move an fp8
// code by one step in rare values.
// On CUDA the data-dependent validation (documented per op) does not run: the host never reads
// index tensors. Instead the kernels skip what it would reject, never reading or writing outside
// a view: a token with a negative position or a request outside [0, R) is ignored; an entry is
// not emitted (its slot and `entries` row untouched) when its output block is unmapped or beyond
// the cache, j·r >= cos_sin.shape[0], or a window row is not where the contract puts it (not the
// matching token of this call's run, or its ring row unmapped); a ring row whose block is
// unmapped is not saved. A batch that breaks the contract otherwise (runs not contiguous,
// positions not consecutive) gets unspecified but in-bounds results, so callers must uphold the
// contract themselves on CUDA.
#pragma once

#include <cstdint>

#include "dsv4/config.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/kv_layout.h"
#include "dsv4/ops.h"
#include "dsv4/paged_cache.h"
#include "dsv4/tensor.h"

namespace dsv4 {

enum class CompressorTarget : uint8_t {
  kv_cache,      // the attention compressor (D = 512): entries go to a KV cache layout
  indexer_keys,  // the indexer's compressor (D = 128): Hadamard + FP8 into the indexer key cache
};

// The static shape of one compressor.
struct CompressorConfig {
  int head_dim = 512;  // D: 512 (kv_cache) or 128 (indexer_keys)
  int ratio = 4;       // r: 4 (overlapping windows) or 128
  int rope_dims = 64;  // the LAST rope_dims of an entry rotate (GPT-J pairs)
  float eps = 1e-6f;   // RMSNorm epsilon
  CompressorTarget target = CompressorTarget::kv_cache;

  int coff() const { return ratio == 4 ? 2 : 1; }
  int proj_width() const { return coff() * head_dim; }  // rows of wkv / wgate, columns of ape
  int state_width() const { return 2 * proj_width(); }  // fp32 per ring row: [kv | score]
  int ring_rows() const { return coff() * ratio; }      // ring rows per request

  // The attention compressor of a layer with compress ratio `ratio` (4 or 128).
  static CompressorConfig attention(const ModelConfig& cfg, int ratio);
  // The C4A indexer's compressor (head_dim = index_head_dim, ratio 4, indexer_keys).
  static CompressorConfig indexer(const ModelConfig& cfg);
  // Throws dsv4::Error naming the field: ratio not 4/128, head_dim not 512 (kv_cache) / 128
  // (indexer_keys), rope_dims odd or outside (0, head_dim], eps <= 0.
  void validate(const char* where = "CompressorConfig") const;
};

// ---- (a) projection ------------------------------------------------------------------------
// kv_rows = x·wkvᵀ, score_rows = x·wgateᵀ + ape[positions[t] mod r] (rows of both in fp32).
//   x [T, dim] bf16/fp32; wkv, wgate [coff·D, dim] bf16/fp32; ape [r, coff·D] fp32;
//   positions [T] int32/int64 (>= 0); kv_rows, score_rows [T, coff·D] fp32 (inner-contiguous).
// CUDA: the two GEMMs are dsv4::linear on `stream`, so x, wkv and wgate must share
// one dtype (bf16 or fp32) and no operand may have overlapping rows (else dsv4::Error before
// anything is written); positions are not checked on the host: a row with a negative position
// gets NaN scores. Should cuBLASLt find no algorithm for the second GEMM only (linear throws),
// kv_rows has already been written.
void compressor_project(const CompressorConfig& cfg, const TensorView& x, const TensorView& wkv,
                        const TensorView& wgate, const TensorView& ape, const TensorView& positions,
                        const TensorView& kv_rows, const TensorView& score_rows,
                        Stream stream = nullptr);
// The same with a GEMM workspace for the two projections, as linear's (CUDA; ignored on the CPU):
// with one, a decode-sized projection may split K across thread blocks (deterministically).
void compressor_project(const CompressorConfig& cfg, const TensorView& x, const TensorView& wkv,
                        const TensorView& wgate, const TensorView& ape, const TensorView& positions,
                        const TensorView& kv_rows, const TensorView& score_rows,
                        const TensorView& workspace, Stream stream);

// ---- (b) state update + emission -----------------------------------------------------------
// The tokens of one call. Requests are the rows of the block tables; each request's tokens form
// one contiguous run of the batch with consecutive positions context_lens[q], context_lens[q]+1,
// ... (the run continues exactly where the request's state stopped). Requests without tokens in
// the batch are untouched.
struct CompressorBatch {
  TensorView positions;     // [T] int32/int64
  TensorView token_to_req;  // [T] int32, in [0, R)
  TensorView context_lens;  // [R] int32/int64: positions the request's state has consumed
};

// The per-request rings (see the header comment).
struct CompressorStateView {
  TensorView rows;         // fp32 [num_slots, state_width] (inner-contiguous)
  TensorView block_table;  // int32 [R, >= ceil(ring_rows / block_size)]
  int block_size = 0;      // ring rows per block
};

// Where entries go: entry j of request q → block_table[q][j / B]·B + j % B (B = the cache's
// block size). Set kv_cache for CompressorTarget::kv_cache (layout MODEL1_FP8, BF16 or
// FP8_PER_TENSOR; dim == head_dim), indexer_keys for CompressorTarget::indexer_keys.
struct CompressorOutputView {
  KvCacheView kv_cache;
  IndexerKeyCacheView indexer_keys;
  TensorView block_table;  // int32 [R, max_blocks]
};

// Emits every entry completed by the batch's tokens (token t emits entry (p+1)/r − 1 when
// (p+1) mod r == 0) into `out`, then saves the rows the next call needs into the rings.
//   kv_rows, score_rows: [T, coff·D] fp32 from compressor_project.
//   norm_weight [D] bf16/fp32; cos_sin fp32 [max_pos, rope_dims] (build_rope_cache of the layer's
//   rope), every emitted j·r < max_pos.
//   entries (optional) fp32 [T, D]: row t receives the emitted entry's values just before the
//   cache's quantization (post RoPE; post Hadamard for indexer_keys); other rows are untouched.
// Validation before anything is written: shapes/dtypes/devices; token_to_req in range; runs
// contiguous with consecutive positions starting at context_lens; every ring row read or written
// and every emitted entry's slot mapped (block table entry >= 0, slot inside the cache). On CUDA
// only the first part (no index values are read; see the header comment for what the kernels
// skip instead), plus: indexer key blocks 4-byte aligned (their fp32 scales are stored in place).
void compressor_update_and_emit(const CompressorConfig& cfg, const TensorView& kv_rows,
                                const TensorView& score_rows, const CompressorBatch& batch,
                                const TensorView& norm_weight, const TensorView& cos_sin,
                                const CompressorStateView& state, const CompressorOutputView& out,
                                const TensorView& entries = {}, Stream stream = nullptr);

// ---- host bookkeeping for PagedCache-backed rings ----------------------------------------
// Reserves the ring of `req` in `state`: coff·r rows appended once (the ring never grows).
// Registers the request when `state` does not know it yet (LayerCaches::add_request may already
// have done so); it must not hold rows yet. The cache's rows must be state_width fp32
// (block_bytes == block_size · state_width · 4). Atomic: on failure (pool exhausted) the cache is
// as it was.
void compressor_state_init(PagedCache& state, const CompressorConfig& cfg, int64_t req);
// The ring cache's storage seen as fp32 rows [num_blocks · block_size, state_width].
TensorView compressor_state_rows(const PagedCache& state, const CompressorConfig& cfg);
// Entries a request has once `num_positions` positions have been compressed: num_positions / r.
// Before a call, append (entries_after(ctx + n) − entries_after(ctx)) entries to the output cache.
constexpr int64_t compressor_entries_after(int ratio, int64_t num_positions) {
  return num_positions / ratio;
}


}  // namespace dsv4
