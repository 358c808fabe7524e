// dequantize_and_gather: copies (dequantized, as bf16) the last g entries of each prefill
// request's paged cache into a dense workspace row range, as vLLM's
// dequantize_and_gather_k_cache does before the sparse prefill (docs/spec.md §8).
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/gather_range.h"
#include "cpu/rows.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#include "ops/attention_checks.h"
#include "ops/backend.h"
#include "ops/validate.h"

namespace dsv4 {

namespace {

constexpr const char* kOp = "dequantize_and_gather";

// The one validation of dequantize_and_gather's arguments.
void validate_gather(const KvCacheView& cache, const TensorView& block_table,
                     const TensorView& seq_lens, const TensorView& gather_lens, int64_t offset,
                     const TensorView& workspace) {
  check_defined(kOp, "workspace", workspace);
  const Device device = workspace.device;
  const int dim = ops::check_cache(kOp, "cache", cache, device);
  ops::check_output_tensor(kOp, "workspace", workspace, DType::bf16, {-1, -1, dim}, device,
                           ops::Dense::last_dim);
  const int64_t requests = workspace.shape[0], rows = workspace.shape[1];
  ops::check_tensor(kOp, "block_table", block_table, DType::int32, {requests, -1}, device);
  ops::check_tensor(kOp, "seq_lens", seq_lens, DType::int32, {requests}, device);
  ops::check_optional_tensor(kOp, "gather_lens", gather_lens, DType::int32, {requests}, device);
  if (offset < 0 || offset > rows)
    fail_expected(kOp, "offset", detail::concat("a value in [0, ", rows, "]"), offset);
  ops::check_outputs_disjoint(kOp, {{"workspace", workspace}},
                              {{"cache.data", cache.data}, {"block_table", block_table},
                               {"seq_lens", seq_lens}, {"gather_lens", gather_lens}});
  if (device != Device::cpu) return;

  // Data checks (CPU): lengths, workspace room, and every gathered entry's block.
  const int32_t* lens = seq_lens.ptr<const int32_t>();
  const int32_t* glens = gather_lens.ptr<const int32_t>();
  const int32_t* table = block_table.ptr<const int32_t>();
  const int64_t max_blocks = block_table.shape[1], num_blocks = cache.data.shape[0];
  cpu::check_values_in_range(kOp, "seq_lens", lens, requests, 0, INT32_MAX);
  for (int64_t r = 0; r < requests; ++r) {
    if (glens && (glens[r] < 0 || glens[r] > lens[r]))
      fail_expected(kOp, detail::concat("gather_lens[", r, "]"),
                    detail::concat("a value in [0, seq_lens[", r, "] = ", lens[r], "]"), glens[r]);
    const cpu::GatherRange range = cpu::gather_range(lens, glens, r);
    if (offset + range.count > rows)
      fail_expected(kOp, "workspace.shape[1]",
                    detail::concat(">= ", offset + range.count,
                                   " (offset + rows gathered for request ", r, ")"),
                    rows);
    if (range.count == 0) continue;
    const int64_t first_block = range.first_entry / cache.block_size;
    const int64_t last_block = (range.first_entry + range.count - 1) / cache.block_size;
    for (int64_t blk = first_block; blk <= last_block; ++blk) {
      const std::string name = detail::concat("block_table[", r, "][", blk, "]");
      if (blk >= max_blocks)
        fail_expected(kOp, name, detail::concat("an entry of the table (max_blocks ", max_blocks, ")"),
                      "beyond the table");
      const int32_t block = table[r * max_blocks + blk];
      if (block < 0 || block >= num_blocks)
        fail_expected(kOp, name, detail::concat("a block in [0, ", num_blocks, ")"), block);
    }
  }
}

}  // namespace

void dequantize_and_gather(const KvCacheView& cache, const TensorView& block_table,
                           const TensorView& seq_lens, const TensorView& gather_lens,
                           int64_t offset, const TensorView& workspace,
                           Stream stream) {
  validate_gather(cache, block_table, seq_lens, gather_lens, offset, workspace);
  // Length and table values are checked above when they live on the host; on CUDA the kernel
  // skips rows it cannot gather validly.
  ops::kernel(kOp, ops::kDequantizeAndGather, workspace.device)(
      cache, block_table, seq_lens, gather_lens, offset, workspace, stream);
}

}  // namespace dsv4
