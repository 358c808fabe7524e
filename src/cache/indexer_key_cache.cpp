// Validation of indexer key cache views (the byte layout itself is in indexer_key_cache.h).
#include "dsv4/indexer_key_cache.h"

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
}

}  // namespace dsv4
