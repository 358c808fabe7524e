// Validation of indexer key cache views (the byte layout itself is in indexer_key_cache.h).
#include "dsv4/indexer_key_cache.h"

#include <cstdint>
#include <string>

namespace dsv4 {

void check_indexer_key_cache(const char* where, const char* name,
                             const IndexerKeyCacheView& cache) {
  const std::string data = std::string(name) + ".data";
  if (cache.block_size < 1)
    fail_expected(where, std::string(name) + ".block_size", ">= 1", cache.block_size);
  check_defined(where, data.c_str(), cache.data);
  check_dtype(where, data.c_str(), cache.data, DType::uint8);
  check_ndim(where, data.c_str(), cache.data, 2);
  check_dim(where, data.c_str(), cache.data, 1,
            int64_t{cache.block_size} * indexer_keys::kEntryBytes);
  check_inner_contiguous(where, data.c_str(), cache.data);
  // The fp32 scales are read and written in place: every block starts 4-byte aligned like the
  // first, and blocks do not overlap (the emit writes whole entries).
  const int64_t block_bytes = int64_t{cache.block_size} * indexer_keys::kEntryBytes;
  if (cache.data.shape[0] > 1) {
    const int64_t stride = cache.data.strides[0];
    if (stride < block_bytes)
      fail_expected(where, data + ".stride(0) (block stride, bytes)", ">= " + std::to_string(block_bytes),
                    stride);
    if (stride % 4 != 0)
      fail_expected(where, data + ".stride(0) (block stride, bytes)", "a multiple of 4", stride);
  }
  if (reinterpret_cast<uintptr_t>(cache.data.data) % 4 != 0)
    fail_expected(where, data + " pointer", "4-byte aligned", cache.data.data);
}

}  // namespace dsv4
