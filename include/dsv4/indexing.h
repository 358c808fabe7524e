// Index planning utilities (SPEC §8): request-local → global slot conversion, SWA window indices
// for decode and prefill tokens, and the prefill gather-workspace index rewrite.
//
// All take TensorViews so a CUDA twin can share the signature; the CPU versions run on host
// tensors. Index tensors are int32 unless stated.
#pragma once

#include <cstdint>

#include "dsv4/tensor.h"

namespace dsv4 {

// Kernel-facing conversion (never throws on data): for each token t and slot k,
//   global[t][k] = table[r][i / B] * B + i % B  with r = token_to_req[t], i = local[t][k];
// i == -1, an i whose block lies beyond the table (or whose table entry is -1) → -1.
//   local [T, K] int32, token_to_req [T] int32, block_table [R, max_blocks] int32,
//   global [T, K] int32 (may alias local).
// If lens is defined ([T] int32), it receives the number of leading valid entries... precisely:
// the count of k with global >= 0 (indices are expected packed, -1 padding at the end).
void local_to_global_slots(const TensorView& local, const TensorView& token_to_req,
                           const TensorView& block_table, int block_size,
                           const TensorView& global, const TensorView& lens = {});

// Validating variant: the same, but an index < -1 or beyond the request's table, or a table
// entry of -1 where a valid index points, is a dsv4::Error naming token, slot and value, and
// nothing is written.
void local_to_global_slots_checked(const TensorView& local, const TensorView& token_to_req,
                                   const TensorView& block_table, int block_size,
                                   const TensorView& global, const TensorView& lens = {});

// SWA window of each token: the last min(W, p+1) positions of its request up to and including
// p = positions[t], oldest first, as global slots of the SWA cache; padded with -1 to W.
//   positions [T] int64 or int32, token_to_req [T] int32, block_table [R, max_blocks] int32,
//   indices [T, W] int32, lens [T] int32 (= min(W, p+1)).
// A window position whose block was released or lies beyond the table is an error (the cache
// must hold the window), as are a negative position and a token_to_req outside 0..R-1; all are
// checked before anything is written.
void swa_window_indices(const TensorView& positions, const TensorView& token_to_req,
                        const TensorView& block_table, int block_size, int window,
                        const TensorView& indices, const TensorView& lens);

// Prefill gather-workspace rewrite (vLLM combine_topk_swa_indices). Prefill request r (of R) has
// its rows gathered into workspace rows [r*M, (r+1)*M): compressed entries 0..N-1 at
// [r*M, r*M + N) (N = compressed region size, same for all requests), then the last
// gather_lens[r] SWA tokens of its sequence (positions seq_lens[r]-gather_lens[r] ..
// seq_lens[r]-1) at [r*M + N, r*M + N + gather_lens[r]).
// query_start_loc [R+1] int32 may start at a non-zero offset (a slice of the whole batch's):
// row t of topk/out is token query_start_loc[0] + t.
// Token t of request r (query_start_loc[r] <= t < query_start_loc[r+1]) sits at position
// p = seq_lens[r] - (query_start_loc[r+1] - t); its combined indices are its top-k compressed
// entries (topk [T, K] local entry numbers, -1 padded; K may be 0) followed by its SWA window,
// all as workspace rows, packed: out [T, K + W] int32, -1 padded; out_lens [T] int32.
// Validation: every top-k entry must be < N and < (p + 1) / ratio when ratio > 0 (causality),
// the window must lie inside the gathered range.
void combine_topk_swa_indices(const TensorView& topk, const TensorView& query_start_loc,
                              const TensorView& seq_lens, const TensorView& gather_lens,
                              int window, int compressed_region, int64_t rows_per_request,
                              int ratio, const TensorView& out, const TensorView& out_lens);

}  // namespace dsv4
