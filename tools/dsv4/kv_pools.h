// The KV cache pools of `dsv4 run`: how many blocks each pool gets for a workload within a
// memory budget (size_kv_pools), and the live pools of an AttentionStack as the scheduler sees
// them (StackKvCapacity).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/config.h"
#include "dsv4/model.h"
#include "dsv4/paged_cache.h"
#include "scheduler.h"

namespace dsv4::cli {

struct KvWorkload {
  std::vector<int64_t> prompt_lens;  // one per request
  int64_t decode_steps = 0;
  int64_t chunk = 256;               // token budget per step
};

// Blocks per pool (the same for every layer: LayerCacheOptions' three counts) and what they cost.
struct KvPoolSizes {
  int32_t swa_blocks = 1;
  int32_t compressed_blocks = 1;  // also the indexer key cache
  int32_t state_blocks = 1;       // compressor and indexer-compressor state rings
  int64_t bytes = 0;              // every layer's pools together
  int64_t all_resident_bytes = 0; // pools that hold every request at its peak at once
  int64_t one_request_bytes = 0;  // the least that runs the largest request alone
  int resident_requests = 0;      // requests the pools hold at their peak at once (>= 1)
};

// Sizes the pools of `layers` (layer indices of cfg) for the workload: every request at its peak
// at once if that fits `budget_bytes`, else the largest uniform share of that which does (at
// least what the largest request needs alone; the scheduler queues or preempts the rest).
// A request's peak, per pool, bounds what it holds plus what one more step needs under any
// schedule with steps of <= chunk tokens (SWA: the window plus two chunks; compressed caches:
// the whole sequence; state rings: one per request). Throws dsv4::Error naming --kv-memory when
// the budget cannot run the largest request alone.
KvPoolSizes size_kv_pools(const ModelConfig& cfg, const std::vector<int>& layers,
                          const LayerCacheOptions& base, const KvWorkload& workload,
                          int64_t budget_bytes);

// `--kv-memory` values: bytes with an optional K/M/G/T suffix (powers of 1024, an optional
// trailing B/iB; fractions allowed: 1.5G), or "P%" of `percent_of` bytes. Throws dsv4::Error
// naming `flag` for anything else, zero, or more than 2^62 bytes.
int64_t parse_memory_size(std::string_view flag, std::string_view text, int64_t percent_of);
// "1.5 GiB".
std::string format_bytes(int64_t bytes);

// Bytes a percentage budget refers to: free device memory of the current CUDA device (cuda), or
// the machine's physical memory (cpu).
int64_t memory_for_kv_budget(bool cuda);

// The pools of every layer of a stack (SWA, compressed, indexer keys, compressor states), read
// live: what a step would need is counted as Attention::check_plan counts it.
class StackKvCapacity final : public KvCapacity {
 public:
  explicit StackKvCapacity(AttentionStack& stack);
  int num_pools() const override { return static_cast<int>(pools_.size()); }
  std::string pool_name(int pool) const override { return pools_[pool].name; }
  int64_t total_blocks(int pool) const override;
  int64_t free_blocks(int pool) const override;
  int64_t step_blocks(int pool, int64_t context, int64_t num_new) const override;
  int64_t held_blocks(int pool, int64_t req) const override;
  bool grows(int pool) const override { return pools_[pool].ring_blocks == 0; }

 private:
  struct Pool {
    std::string name;           // "layer 2 swa"
    const PagedCache* cache = nullptr;
    int positions_per_entry = 1;  // 1: an entry per token; r: compressed (an entry per r tokens)
    int64_t ring_blocks = 0;      // > 0: a state ring, reserved whole when a request first runs
  };
  std::vector<Pool> pools_;
};

}  // namespace dsv4::cli
