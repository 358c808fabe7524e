// Index planning utilities (docs/spec.md §8): request-local → global slot conversion, SWA window indices
// for decode and prefill tokens, and the prefill gather-workspace index rewrite.
//
// Like the ops (ops.h), each takes views and dispatches on where they live: all host → the CPU
// reference; all CUDA → a CUDA kernel on `stream` (no allocation, no synchronization); mixed → a
// dsv4::Error. Shapes, dtypes and devices are validated on both paths before anything is written.
// Index tensors are int32 unless stated; the last dimension must be contiguous (2-d tensors may
// have padded rows: any row stride).
//
// Index VALUES can only be checked on the host. Where the CPU version rejects bad data, the CUDA
// version cannot: it treats that data as invalid instead — the entry, window position or row
// becomes -1 and is not counted in the lengths — and never reads or writes out of bounds. Each
// function states exactly what that means for it. Given valid data both paths write identical
// bytes.
#pragma once

#include <cstdint>

#include "dsv4/ops.h"  // Stream
#include "dsv4/tensor.h"

namespace dsv4 {

// Kernel-facing conversion (never throws on data): for each token t and slot k,
//   global[t][k] = table[r][i / B] * B + i % B  with r = token_to_req[t], i = local[t][k];
// i == -1, an i whose block lies beyond the table (or whose table entry is -1) → -1.
//   local [T, K] int32, token_to_req [T] int32, block_table [R, max_blocks] int32,
//   global [T, K] int32 (may alias local).
// If lens is defined ([T] int32), it receives the number of leading valid entries... precisely:
// the count of k with global >= 0 (indices are expected packed, -1 padding at the end).
// CUDA: the same results for ALL data (this version checks nothing on data on either device):
// i < -1, a token_to_req outside 0..R-1 and a slot beyond int32 also give -1.
void local_to_global_slots(const TensorView& local, const TensorView& token_to_req,
                           const TensorView& block_table, int block_size,
                           const TensorView& global, const TensorView& lens = {},
                           Stream stream = nullptr);

// Validating variant: the same, but an index < -1 or beyond the request's table, or a table
// entry of -1 where a valid index points, is a dsv4::Error naming token, slot and value, and
// nothing is written. Host tensors only: CUDA tensors are a dsv4::Error pointing to
// local_to_global_slots (the checks would need the values on the host).
void local_to_global_slots_checked(const TensorView& local, const TensorView& token_to_req,
                                   const TensorView& block_table, int block_size,
                                   const TensorView& global, const TensorView& lens = {});

// SWA window of each token: the last min(W, p+1) positions of its request up to and including
// p = positions[t], oldest first, as global slots of the SWA cache; padded with -1 to W.
//   positions [T] int64 or int32, token_to_req [T] int32, block_table [R, max_blocks] int32,
//   indices [T, W] int32, lens [T] int32 (= min(W, p+1)).
// A window position whose block was released or lies beyond the table is an error (the cache
// must hold the window), as are a negative position, a token_to_req outside 0..R-1 and a slot
// beyond int32; all are checked before anything is written.
// CUDA (no checks on data): a window position whose block was released or lies beyond the table,
// or whose slot exceeds int32, is left out — the remaining positions stay packed oldest first,
// lens counts only them and the rest of the row is -1 (a window whose oldest blocks were released
// becomes its live suffix). A token with a negative position or a token_to_req outside 0..R-1
// gets an all -1 row and lens 0.
void swa_window_indices(const TensorView& positions, const TensorView& token_to_req,
                        const TensorView& block_table, int block_size, int window,
                        const TensorView& indices, const TensorView& lens,
                        Stream stream = nullptr);

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
// CUDA (no checks on data): a top-k entry the CPU rejects (< -1, >= N, or not causal — every
// entry when ratio == 0) is left out like -1; the kept ones stay packed in order. A row gets all
// -1 and out_lens 0 when metadata the CPU rejects concerns it: query_start_loc[R] -
// query_start_loc[0] != T (every row), or its request's seq_lens[r] < its query length,
// gather_lens[r] outside 0..seq_lens[r], N + gather_lens[r] > M, or its first query token's
// window starting before the gathered range. A row's request is found by binary search over
// query_start_loc: if that decreases somewhere (rejected on the CPU), a row may land in no
// request (-1 row) or in a request whose range holds it; every row index written stays inside
// [r*M, (r+1)*M) of the request r it was given.
void combine_topk_swa_indices(const TensorView& topk, const TensorView& query_start_loc,
                              const TensorView& seq_lens, const TensorView& gather_lens,
                              int window, int compressed_region, int64_t rows_per_request,
                              int ratio, const TensorView& out, const TensorView& out_lens,
                              Stream stream = nullptr);

}  // namespace dsv4
