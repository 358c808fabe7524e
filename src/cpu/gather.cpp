// dequantize_and_gather: copies (dequantized, as bf16) the last g entries of each prefill
// request's paged cache into a dense workspace row range, as vLLM's
// dequantize_and_gather_k_cache does before the sparse prefill (docs/spec.md §8).
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/attention_checks.h"
#include "cpu/backend.h"
#include "cpu/validate.h"
#include "dsv4/ops.h"
#include "dsv4/status.h"
#if defined(DSV4_WITH_CUDA)
#include "cuda/kv/dequantize_and_gather.h"
#endif

namespace dsv4 {

namespace {

constexpr const char* kOp = "dequantize_and_gather";

// Rows to gather for request r: the last g of its seq_len entries.
struct GatherRange {
  int64_t first_entry, count;
};
GatherRange gather_range(const int32_t* seq_lens, const int32_t* gather_lens, int64_t r) {
  const int64_t g = gather_lens ? gather_lens[r] : seq_lens[r];
  return {seq_lens[r] - g, g};
}

// The one validation of dequantize_and_gather's arguments.
void validate_gather(const KvCacheView& cache, const TensorView& block_table,
                     const TensorView& seq_lens, const TensorView& gather_lens, int64_t offset,
                     const TensorView& workspace) {
  check_defined(kOp, "workspace", workspace);
  const Device device = workspace.device;
  const int dim = cpu::check_cache(kOp, "cache", cache, device);
  cpu::check_output_tensor(kOp, "workspace", workspace, DType::bf16, {-1, -1, dim}, device,
                           cpu::Dense::last_dim);
  const int64_t requests = workspace.shape[0], rows = workspace.shape[1];
  cpu::check_tensor(kOp, "block_table", block_table, DType::int32, {requests, -1}, device);
  cpu::check_tensor(kOp, "seq_lens", seq_lens, DType::int32, {requests}, device);
  cpu::check_optional_tensor(kOp, "gather_lens", gather_lens, DType::int32, {requests}, device);
  if (offset < 0 || offset > rows)
    fail_expected(kOp, "offset", detail::concat("a value in [0, ", rows, "]"), offset);
  cpu::check_outputs_disjoint(kOp, {{"workspace", workspace}},
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
    const GatherRange range = gather_range(lens, glens, r);
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

void dequantize_and_gather_cpu(const KvCacheView& cache, const TensorView& block_table,
                               const TensorView& seq_lens, const TensorView& gather_lens,
                               int64_t offset, const TensorView& workspace) {
  const KvGeometry geometry = kv_geometry(cache.layout, cache.block_size);
  const int32_t* lens = seq_lens.ptr<const int32_t>();
  const int32_t* glens = gather_lens.ptr<const int32_t>();
  const int32_t* table = block_table.ptr<const int32_t>();
  const int64_t requests = workspace.shape[0], max_blocks = block_table.shape[1];
  const int64_t rows = workspace.shape[1], bs = cache.block_size;
  const uint8_t* blocks = cache.data.ptr<const uint8_t>();
  uint16_t* ws = workspace.ptr<uint16_t>();

#pragma omp parallel
  {
    std::vector<float> row(geometry.dim);
#pragma omp for collapse(2) schedule(static)
    for (int64_t r = 0; r < requests; ++r)
      for (int64_t j = 0; j < rows; ++j) {
        const GatherRange range = gather_range(lens, glens, r);
        if (j >= range.count) continue;
        const int64_t entry = range.first_entry + j;
        const int32_t block = table[r * max_blocks + entry / bs];
        kv_decode_token(geometry, blocks + block * cache.data.strides[0],
                        static_cast<int>(entry % bs), row.data(), cache.tensor_scale);
        uint16_t* dst = ws + r * workspace.strides[0] + (offset + j) * workspace.strides[1];
        for (int d = 0; d < geometry.dim; ++d) dst[d] = float_to_bf16_bits(row[d]);
      }
  }
}

}  // namespace

void dequantize_and_gather(const KvCacheView& cache, const TensorView& block_table,
                           const TensorView& seq_lens, const TensorView& gather_lens,
                           int64_t offset, const TensorView& workspace,
                           [[maybe_unused]] Stream stream) {
  validate_gather(cache, block_table, seq_lens, gather_lens, offset, workspace);
  if (workspace.device == Device::cpu) {
    dequantize_and_gather_cpu(cache, block_table, seq_lens, gather_lens, offset, workspace);
    return;
  }
  // Length and table values live on the device: the kernel skips rows it cannot gather validly.
  DSV4_CUDA_DISPATCH(kOp, cuda::dequantize_and_gather(cache, block_table, seq_lens, gather_lens,
                                                      offset, workspace, stream));
}

}  // namespace dsv4
