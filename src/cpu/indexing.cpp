// The CPU kernels of the index planning utilities (include/dsv4/indexing.h): each validates the
// index values it depends on (where documented) before writing any output, then computes every
// slot with math/index.h's integer operations (the CUDA kernels' too).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/int32_rows.h"
#include "cpu/kernels.h"
#include "dsv4/status.h"
#include "math/index.h"

namespace dsv4::cpu {

namespace {

using index_math::kMaxSlot;
using index_math::paged_slot;
using index_math::visible_compressed;
using index_math::window_first;

struct SlotShape {
  int64_t tokens, k, requests, max_blocks;
};

}  // namespace

void local_to_global_slots(const TensorView& local, const TensorView& token_to_req,
                           const TensorView& block_table, int block_size, const TensorView& global,
                           const TensorView& lens, Stream /*stream*/) {
  const SlotShape p{local.shape[0], local.shape[1], block_table.shape[0], block_table.shape[1]};
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int32_t r = elem1(token_to_req, t);
    const int32_t* table = (r >= 0 && r < p.requests) ? row_of(block_table, r) : nullptr;
    const int32_t* in = row_of(local, t);
    int32_t* out = mut_row(global, t);
    int32_t valid = 0;
    for (int64_t k = 0; k < p.k; ++k) {
      // Read before write: `in` may alias `out`.
      const int32_t g = table ? paged_slot(table, p.max_blocks, block_size, in[k]) : -1;
      out[k] = g;
      valid += g >= 0;
    }
    if (lens.defined()) lens.ptr<int32_t>()[t * lens.strides[0]] = valid;
  }
}

void swa_window_indices(const TensorView& positions, const TensorView& token_to_req,
                        const TensorView& block_table, int block_size, int window,
                        const TensorView& indices, const TensorView& lens, Stream /*stream*/) {
  constexpr const char* where = "swa_window_indices";
  const int64_t T = positions.shape[0];
  const int64_t R = block_table.shape[0], max_blocks = block_table.shape[1];

  auto position = [&](int64_t t) -> int64_t {
    return positions.dtype == DType::int64
               ? positions.ptr<const int64_t>()[t * positions.strides[0]]
               : positions.ptr<const int32_t>()[t * positions.strides[0]];
  };

  // Every block the windows touch must be present: checked for all tokens before any write.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = position(t);
    const int32_t r = elem1(token_to_req, t);
    if (p < 0) fail(where, ": positions[", t, "]: expected >= 0, got ", p);
    if (r < 0 || r >= R)
      fail(where, ": token_to_req[", t, "]: expected 0..", R - 1, ", got ", r);
    const int64_t lo = window_first(p, window);
    const int32_t* table = row_of(block_table, r);
    for (int64_t blk = lo / block_size; blk <= p / block_size; ++blk) {
      if (blk >= max_blocks)
        fail(where, ": token ", t, " (request ", r, ", position ", p, "): window block ", blk,
             " is beyond the block table (", max_blocks, " blocks)");
      if (table[blk] < 0)
        fail(where, ": token ", t, " (request ", r, ", position ", p, "): window block ", blk,
             " was released or never allocated (table entry -1)");
      // The block's last window position has its largest slot.
      const int64_t last = std::min(p, (blk + 1) * block_size - 1);
      if (int64_t{table[blk]} * block_size + last % block_size > kMaxSlot)
        fail(where, ": token ", t, ": the global slot of position ", last, " exceeds int32");
    }
  }

#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = position(t);
    const int32_t* table = row_of(block_table, elem1(token_to_req, t));
    int32_t* out = mut_row(indices, t);
    int64_t n = 0;
    for (int64_t q = window_first(p, window); q <= p; ++q, ++n)
      out[n] = paged_slot(table, max_blocks, block_size, q);  // checked above: never -1
    for (int64_t k = n; k < window; ++k) out[k] = -1;
    lens.ptr<int32_t>()[t * lens.strides[0]] = static_cast<int32_t>(n);
  }
}

void combine_topk_swa_indices(const TensorView& topk, const TensorView& query_start_loc,
                              const TensorView& seq_lens, const TensorView& gather_lens,
                              int window, int compressed_region, int64_t rows_per_request,
                              int ratio, const TensorView& out, const TensorView& out_lens,
                              Stream /*stream*/) {
  constexpr const char* where = "combine_topk_swa_indices";
  const int64_t R = query_start_loc.shape[0] - 1, T = out.shape[0];
  const int64_t K = topk.defined() ? topk.shape[1] : 0;
  // Request metadata: token ranges cover out's T rows exactly; each request's gathered SWA
  // range fits its workspace rows and holds every query token's window.
  const int64_t base = elem1(query_start_loc, 0);
  if (elem1(query_start_loc, R) - base != T)
    fail_expected(where, "query_start_loc[R] - query_start_loc[0]", std::to_string(T) + " (out rows)",
                  elem1(query_start_loc, R) - base);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t q0 = elem1(query_start_loc, r), q1 = elem1(query_start_loc, r + 1);
    const int64_t seq = elem1(seq_lens, r), g = elem1(gather_lens, r);
    const std::string req = "request " + std::to_string(r);
    if (q1 < q0) fail(where, ": query_start_loc: decreases at ", r + 1, " (", q0, " > ", q1, ")");
    if (seq < q1 - q0)
      fail(where, ": seq_lens[", r, "]: expected >= its query length ", q1 - q0, ", got ", seq);
    if (g < 0 || g > seq) fail(where, ": gather_lens[", r, "]: expected 0..", seq, ", got ", g);
    if (compressed_region + g > rows_per_request)
      fail(where, ": ", req, ": compressed_region ", compressed_region, " + gather_lens ", g,
           " exceed rows_per_request ", rows_per_request);
    if (q1 > q0) {
      const int64_t first_pos = seq - (q1 - q0);
      const int64_t lo = window_first(first_pos, window);
      if (lo < seq - g)
        fail(where, ": ", req, ": the window of position ", first_pos, " starts at ", lo,
             ", before the gathered SWA range [", seq - g, ", ", seq, ")");
    }
  }

  // Token → request, and every top-k entry: -1, or inside the compressed region and causal.
  std::vector<int32_t> req_of(static_cast<size_t>(T));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = elem1(query_start_loc, r) - base; t < elem1(query_start_loc, r + 1) - base; ++t)
      req_of[static_cast<size_t>(t)] = static_cast<int32_t>(r);
  for (int64_t t = 0; t < T && K > 0; ++t) {
    const int64_t r = req_of[static_cast<size_t>(t)];
    const int64_t p = elem1(seq_lens, r) - (elem1(query_start_loc, r + 1) - base - t);
    const int64_t visible = visible_compressed(p, ratio);
    const int32_t* row = row_of(topk, t);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t j = row[k];
      if (j == -1) continue;
      if (j < -1 || j >= compressed_region)
        fail(where, ": topk[", t, "][", k, "]: expected -1 or 0..", compressed_region - 1,
             " (compressed region), got ", j);
      if (j >= visible)
        fail(where, ": topk[", t, "][", k, "] = ", j, ": token at position ", p,
             " may only see compressed entries < ", visible, " (ratio ", ratio, ")");
    }
  }

#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = req_of[static_cast<size_t>(t)];
    const int64_t seq = elem1(seq_lens, r), g = elem1(gather_lens, r);
    const int64_t p = seq - (elem1(query_start_loc, r + 1) - base - t);
    const int64_t row0 = r * rows_per_request;
    int32_t* o = mut_row(out, t);
    int64_t n = 0;
    if (K > 0) {
      const int32_t* sel = row_of(topk, t);
      for (int64_t k = 0; k < K; ++k)
        if (sel[k] >= 0) o[n++] = static_cast<int32_t>(row0 + sel[k]);
    }
    // SWA region: workspace row N + (q - (seq - g)) holds position q.
    const int64_t swa0 = row0 + compressed_region - (seq - g);
    for (int64_t q = window_first(p, window); q <= p; ++q)
      o[n++] = static_cast<int32_t>(swa0 + q);
    const int64_t len = n;
    for (; n < K + window; ++n) o[n] = -1;
    out_lens.ptr<int32_t>()[t * out_lens.strides[0]] = static_cast<int32_t>(len);
  }
}

}  // namespace dsv4::cpu
