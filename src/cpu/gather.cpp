// The CPU kernel of dequantize_and_gather: each gathered cache entry decoded (kv_layout.h's
// per-token decode, shared with CUDA) and written as bf16 into the workspace rows.
#include <cstdint>
#include <vector>

#include "cpu/gather_range.h"
#include "cpu/kernels.h"

namespace dsv4::cpu {

void dequantize_and_gather(const KvCacheView& cache, const TensorView& block_table,
                           const TensorView& seq_lens, const TensorView& gather_lens,
                           int64_t offset, const TensorView& workspace, Stream /*stream*/) {
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

}  // namespace dsv4::cpu
