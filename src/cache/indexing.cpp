// Index planning utilities (SPEC §8): request-local → global slots, SWA window indices, and the
// prefill gather-workspace index rewrite. Each public function validates every argument's shape,
// dtype and device, then dispatches: host tensors → the CPU reference here, which also validates
// every index (where documented) before writing any output; CUDA tensors → the kernels of
// src/cuda/index/, which treat what the CPU rejects as invalid (-1) instead.
#include "dsv4/indexing.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "math/index.h"
#include "cpu/backend.h"
#include "cpu/validate.h"
#include "dsv4/status.h"
#ifdef DSV4_WITH_CUDA
#include "cuda/index/indexing.h"
#endif

namespace dsv4 {

namespace {

using index_math::kMaxSlot;
using index_math::paged_slot;
using index_math::visible_compressed;
using index_math::window_first;

// An int32 tensor of `ndim` dims whose rows are contiguous (on either device).
void check_int32(const char* where, const char* name, const TensorView& t, int ndim) {
  check_defined(where, name, t);
  check_dtype(where, name, t, DType::int32);
  check_ndim(where, name, t, ndim);
  check_inner_contiguous(where, name, t);
}

// An int32 output of `ndim` dims: check_int32, and no two elements at one address (see
// cpu::check_output_layout; rows are written concurrently).
void check_int32_output(const char* where, const char* name, const TensorView& t, int ndim) {
  check_int32(where, name, t, ndim);
  cpu::check_output_layout(where, name, t);
}

void check_positive(const char* where, const char* name, int64_t v) {
  if (v < 1) fail_expected(where, name, ">= 1", v);
}

// Row r of a 2-d int32 tensor; element i of a 1-d one.
const int32_t* row_of(const TensorView& t, int64_t r) {
  return t.ptr<const int32_t>() + r * t.strides[0];
}
int32_t elem1(const TensorView& t, int64_t i) { return t.ptr<const int32_t>()[i * t.strides[0]]; }
int32_t* mut_row(const TensorView& t, int64_t r) { return t.ptr<int32_t>() + r * t.strides[0]; }

// Validated shapes shared by both slot-conversion variants, and the device they live on.
struct SlotProblem {
  int64_t tokens, k, requests, max_blocks;
  Device device;
};

SlotProblem check_slot_args(const char* where, const TensorView& local,
                            const TensorView& token_to_req, const TensorView& block_table,
                            int block_size, const TensorView& global, const TensorView& lens) {
  check_positive(where, "block_size", block_size);
  check_int32(where, "local", local, 2);
  const int64_t T = local.shape[0], K = local.shape[1];
  check_int32(where, "token_to_req", token_to_req, 1);
  check_dim(where, "token_to_req", token_to_req, 0, T);
  check_int32(where, "block_table", block_table, 2);
  check_int32_output(where, "global", global, 2);
  check_shape(where, "global", global, {T, K});
  if (lens.defined()) {
    check_int32_output(where, "lens", lens, 1);
    check_dim(where, "lens", lens, 0, T);
  }
  // global may be local itself (each row is read before it is written), nothing else.
  cpu::check_alias_exact_or_disjoint(where, "global", global, "local", local);
  cpu::check_outputs_disjoint(where, {{"global", global}, {"lens", lens}},
                              {{"token_to_req", token_to_req}, {"block_table", block_table}});
  cpu::check_disjoint(where, "lens", lens, "local", local);
  const Device device =
      cpu::common_device(where, {{"local", local}, {"token_to_req", token_to_req},
                                 {"block_table", block_table}, {"global", global}, {"lens", lens}});
  return {T, K, block_table.shape[0], block_table.shape[1], device};
}

void convert_slots(const SlotProblem& p, const TensorView& local, const TensorView& token_to_req,
                   const TensorView& block_table, int block_size, const TensorView& global,
                   const TensorView& lens) {
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

}  // namespace

void local_to_global_slots(const TensorView& local, const TensorView& token_to_req,
                           const TensorView& block_table, int block_size, const TensorView& global,
                           const TensorView& lens, [[maybe_unused]] Stream stream) {
  constexpr const char* where = "local_to_global_slots";
  const SlotProblem p =
      check_slot_args(where, local, token_to_req, block_table, block_size, global, lens);
  if (p.device != Device::cpu) {
    DSV4_CUDA_DISPATCH(where, cuda::local_to_global_slots(local, token_to_req, block_table,
                                                          block_size, global, lens, stream));
  }
  convert_slots(p, local, token_to_req, block_table, block_size, global, lens);
}

void local_to_global_slots_checked(const TensorView& local, const TensorView& token_to_req,
                                   const TensorView& block_table, int block_size,
                                   const TensorView& global, const TensorView& lens) {
  constexpr const char* where = "local_to_global_slots_checked";
  const SlotProblem p =
      check_slot_args(where, local, token_to_req, block_table, block_size, global, lens);
  if (p.device != Device::cpu)
    fail(where, ": got CUDA tensors, but the index checks read every value on the host; on CUDA "
                "use local_to_global_slots (invalid entries become -1)");
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int32_t r = elem1(token_to_req, t);
    if (r < 0 || r >= p.requests)
      fail(where, ": token_to_req[", t, "]: expected 0..", p.requests - 1, ", got ", r);
    const int32_t* table = row_of(block_table, r);
    const int32_t* in = row_of(local, t);
    for (int64_t k = 0; k < p.k; ++k) {
      const int32_t i = in[k];
      if (i == -1) continue;
      if (i < -1) fail(where, ": local[", t, "][", k, "]: expected -1 or >= 0, got ", i);
      const int64_t blk = i / block_size;
      if (blk >= p.max_blocks)
        fail(where, ": local[", t, "][", k, "] = ", i, ": block ", blk,
             " is beyond the block table (", p.max_blocks, " blocks of ", block_size,
             " entries) of request ", r);
      if (table[blk] < 0)
        fail(where, ": local[", t, "][", k, "] = ", i, ": block ", blk, " of request ", r,
             " is not allocated (table entry -1)");
      if (int64_t{table[blk]} * block_size + i % block_size > kMaxSlot)
        fail(where, ": local[", t, "][", k, "] = ", i, ": global slot exceeds int32");
    }
  }
  convert_slots(p, local, token_to_req, block_table, block_size, global, lens);
}

// ================================ SWA window ================================================

void swa_window_indices(const TensorView& positions, const TensorView& token_to_req,
                        const TensorView& block_table, int block_size, int window,
                        const TensorView& indices, const TensorView& lens,
                        [[maybe_unused]] Stream stream) {
  constexpr const char* where = "swa_window_indices";
  check_positive(where, "block_size", block_size);
  check_positive(where, "window", window);
  check_defined(where, "positions", positions);
  if (positions.dtype != DType::int64 && positions.dtype != DType::int32)
    fail_expected(where, "positions.dtype", "int64 or int32", dtype_name(positions.dtype));
  check_ndim(where, "positions", positions, 1);
  const int64_t T = positions.shape[0];
  check_int32(where, "token_to_req", token_to_req, 1);
  check_dim(where, "token_to_req", token_to_req, 0, T);
  check_int32(where, "block_table", block_table, 2);
  check_int32_output(where, "indices", indices, 2);
  check_shape(where, "indices", indices, {T, int64_t{window}});
  check_int32_output(where, "lens", lens, 1);
  check_dim(where, "lens", lens, 0, T);
  cpu::check_outputs_disjoint(
      where, {{"indices", indices}, {"lens", lens}},
      {{"positions", positions}, {"token_to_req", token_to_req}, {"block_table", block_table}});
  const Device device = cpu::common_device(
      where, {{"positions", positions}, {"token_to_req", token_to_req},
              {"block_table", block_table}, {"indices", indices}, {"lens", lens}});
  if (device != Device::cpu) {
    DSV4_CUDA_DISPATCH(where, cuda::swa_window_indices(positions, token_to_req, block_table,
                                                       block_size, window, indices, lens, stream));
  }
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

// ================================ prefill gather rewrite ====================================

void combine_topk_swa_indices(const TensorView& topk, const TensorView& query_start_loc,
                              const TensorView& seq_lens, const TensorView& gather_lens,
                              int window, int compressed_region, int64_t rows_per_request,
                              int ratio, const TensorView& out, const TensorView& out_lens,
                              [[maybe_unused]] Stream stream) {
  constexpr const char* where = "combine_topk_swa_indices";
  check_positive(where, "window", window);
  if (compressed_region < 0) fail_expected(where, "compressed_region", ">= 0", compressed_region);
  if (ratio != 0 && ratio != 4 && ratio != 128)
    fail_expected(where, "ratio", "0, 4 or 128", ratio);
  check_int32(where, "query_start_loc", query_start_loc, 1);
  if (query_start_loc.shape[0] < 1)
    fail_expected(where, "query_start_loc.shape[0]", ">= 1 (R + 1)", query_start_loc.shape[0]);
  const int64_t R = query_start_loc.shape[0] - 1;
  check_int32(where, "seq_lens", seq_lens, 1);
  check_dim(where, "seq_lens", seq_lens, 0, R);
  check_int32(where, "gather_lens", gather_lens, 1);
  check_dim(where, "gather_lens", gather_lens, 0, R);
  check_int32_output(where, "out", out, 2);
  const int64_t T = out.shape[0];
  int64_t K = 0;
  if (topk.defined()) {
    check_int32(where, "topk", topk, 2);
    check_dim(where, "topk", topk, 0, T);
    K = topk.shape[1];
  }
  check_dim(where, "out", out, 1, K + window);
  check_int32_output(where, "out_lens", out_lens, 1);
  check_dim(where, "out_lens", out_lens, 0, T);
  cpu::check_outputs_disjoint(where, {{"out", out}, {"out_lens", out_lens}},
                              {{"topk", topk}, {"query_start_loc", query_start_loc},
                               {"seq_lens", seq_lens}, {"gather_lens", gather_lens}});
  if (rows_per_request < 0) fail_expected(where, "rows_per_request", ">= 0", rows_per_request);
  // Every written row index r * rows_per_request + ... must fit int32 (checked without overflow).
  if (R > 0 && rows_per_request > kMaxSlot / R)
    fail(where, ": rows_per_request: ", R, " requests x ", rows_per_request,
         " rows exceed the int32 index range");
  const Device device = cpu::common_device(
      where, {{"topk", topk}, {"query_start_loc", query_start_loc}, {"seq_lens", seq_lens},
              {"gather_lens", gather_lens}, {"out", out}, {"out_lens", out_lens}});
  if (device != Device::cpu) {
    DSV4_CUDA_DISPATCH(where,
                       cuda::combine_topk_swa_indices(topk, query_start_loc, seq_lens, gather_lens,
                                                      window, compressed_region, rows_per_request,
                                                      ratio, out, out_lens, stream));
  }

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

}  // namespace dsv4
