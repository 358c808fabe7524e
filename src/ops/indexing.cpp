// Index planning utilities (docs/spec.md §8): request-local → global slots, SWA window indices, and the
// prefill gather-workspace index rewrite. Each public function validates every argument's shape,
// dtype and device, then dispatches: host tensors → the CPU kernels (src/cpu/indexing.cpp), which
// also validate every index (where documented) before writing any output; CUDA tensors → the
// kernels of src/cuda/index/, which treat what the CPU rejects as invalid (-1) instead.
#include "dsv4/indexing.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/int32_rows.h"
#include "dsv4/status.h"
#include "math/index.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {

using index_math::kMaxSlot;

// An int32 tensor of `ndim` dims whose rows are contiguous (on either device).
void check_int32(const char* where, const char* name, const TensorView& t, int ndim) {
  check_defined(where, name, t);
  check_dtype(where, name, t, DType::int32);
  check_ndim(where, name, t, ndim);
  check_inner_contiguous(where, name, t);
}

// An int32 output of `ndim` dims: check_int32, and no two elements at one address (see
// ops::check_output_layout; rows are written concurrently).
void check_int32_output(const char* where, const char* name, const TensorView& t, int ndim) {
  check_int32(where, name, t, ndim);
  ops::check_output_layout(where, name, t);
}

void check_positive(const char* where, const char* name, int64_t v) {
  if (v < 1) fail_expected(where, name, ">= 1", v);
}

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
  ops::check_alias_exact_or_disjoint(where, "global", global, "local", local);
  ops::check_outputs_disjoint(where, {{"global", global}, {"lens", lens}},
                              {{"token_to_req", token_to_req}, {"block_table", block_table}});
  ops::check_disjoint(where, "lens", lens, "local", local);
  const Device device =
      ops::common_device(where, {{"local", local}, {"token_to_req", token_to_req},
                                 {"block_table", block_table}, {"global", global}, {"lens", lens}});
  return {T, K, block_table.shape[0], block_table.shape[1], device};
}

}  // namespace

void local_to_global_slots(const TensorView& local, const TensorView& token_to_req,
                           const TensorView& block_table, int block_size, const TensorView& global,
                           const TensorView& lens, Stream stream) {
  constexpr const char* where = "local_to_global_slots";
  const SlotProblem p =
      check_slot_args(where, local, token_to_req, block_table, block_size, global, lens);
  ops::kernel(where, ops::kLocalToGlobalSlots, p.device)(local, token_to_req, block_table,
                                                        block_size, global, lens, stream);
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
    const int32_t r = cpu::elem1(token_to_req, t);
    if (r < 0 || r >= p.requests)
      fail(where, ": token_to_req[", t, "]: expected 0..", p.requests - 1, ", got ", r);
    const int32_t* table = cpu::row_of(block_table, r);
    const int32_t* in = cpu::row_of(local, t);
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
  ops::kernel(where, ops::kLocalToGlobalSlots, Device::cpu)(local, token_to_req, block_table,
                                                            block_size, global, lens, nullptr);
}

// ================================ SWA window ================================================

void swa_window_indices(const TensorView& positions, const TensorView& token_to_req,
                        const TensorView& block_table, int block_size, int window,
                        const TensorView& indices, const TensorView& lens,
                        Stream stream) {
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
  ops::check_outputs_disjoint(
      where, {{"indices", indices}, {"lens", lens}},
      {{"positions", positions}, {"token_to_req", token_to_req}, {"block_table", block_table}});
  const Device device = ops::common_device(
      where, {{"positions", positions}, {"token_to_req", token_to_req},
              {"block_table", block_table}, {"indices", indices}, {"lens", lens}});
  // The CPU kernel checks every window block before writing; the CUDA one writes -1 instead.
  ops::kernel(where, ops::kSwaWindowIndices, device)(positions, token_to_req, block_table,
                                                     block_size, window, indices, lens, stream);
}

// ================================ prefill gather rewrite ====================================

void combine_topk_swa_indices(const TensorView& topk, const TensorView& query_start_loc,
                              const TensorView& seq_lens, const TensorView& gather_lens,
                              int window, int compressed_region, int64_t rows_per_request,
                              int ratio, const TensorView& out, const TensorView& out_lens,
                              Stream stream) {
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
  ops::check_outputs_disjoint(where, {{"out", out}, {"out_lens", out_lens}},
                              {{"topk", topk}, {"query_start_loc", query_start_loc},
                               {"seq_lens", seq_lens}, {"gather_lens", gather_lens}});
  if (rows_per_request < 0) fail_expected(where, "rows_per_request", ">= 0", rows_per_request);
  // Every written row index r * rows_per_request + ... must fit int32 (checked without overflow).
  if (R > 0 && rows_per_request > kMaxSlot / R)
    fail(where, ": rows_per_request: ", R, " requests x ", rows_per_request,
         " rows exceed the int32 index range");
  const Device device = ops::common_device(
      where, {{"topk", topk}, {"query_start_loc", query_start_loc}, {"seq_lens", seq_lens},
              {"gather_lens", gather_lens}, {"out", out}, {"out_lens", out_lens}});
  // The CPU kernel checks the request metadata and every top-k entry before writing; the CUDA
  // one writes -1 for what it cannot place.
  ops::kernel(where, ops::kCombineTopkSwaIndices, device)(
      topk, query_start_loc, seq_lens, gather_lens, window, compressed_region, rows_per_request,
      ratio, out, out_lens, stream);
}

}  // namespace dsv4
