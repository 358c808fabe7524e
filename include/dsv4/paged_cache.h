// Paged caches (docs/spec.md §8): a block pool, per-request block tables, slot mapping for new entries,
// and the set of caches one attention layer owns (SWA, compressed, indexer keys, compressor
// state) with the default block sizes.
//
// Entries are numbered per request (token position for SWA and compressor state, compressed
// entry number j for the compressed and indexer-key caches). Entry i of request r lives at global
// slot table[i / B] * B + i % B. Blocks that hold only entries a cache no longer needs (SWA
// beyond the window) are returned to the pool; their table entries become -1.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsv4/config.h"
#include "dsv4/device_tensor.h"
#include "dsv4/kv_layout.h"
#include "dsv4/tensor.h"

namespace dsv4 {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);
  // Lowest-numbered free block. Throws dsv4::Error("... exhausted ...") when none is free.
  int32_t allocate();
  // Throws for a block out of range or not allocated (double free); changes nothing then.
  void free(int32_t block);
  int32_t num_blocks() const { return static_cast<int32_t>(in_use_.size()); }
  int32_t num_free() const { return num_free_; }
  bool in_use(int32_t block) const;

 private:
  std::vector<uint8_t> in_use_;
  std::vector<int32_t> free_list_;  // min-heap of free blocks (deterministic reuse order)
  int32_t num_free_ = 0;
};

// How one cache is laid out.
struct CacheSpec {
  std::string name;            // "swa", "compressed", "indexer_keys", "compressor_state"
  int block_size = 64;         // entries per block
  int64_t block_bytes = 0;     // bytes per block (from the layout geometry, or rows*row_bytes)
  int32_t num_blocks = 0;
  int64_t retain = 0;          // entries a request must keep (0 = all; SWA keeps the window)
  std::optional<KvLayout> layout;  // set for KV caches read by attention
  float tensor_scale = 1.0f;       // FP8_PER_TENSOR: the cache's one dequantization scale
};

// One paged cache: storage (host memory it owns, or external device memory), a pool and the
// block tables of the requests using it. Or, caller-owned (the second constructor): a view of a
// serving engine's cache tensor, whose blocks the engine assigns (its block tables come with
// each step: include/dsv4/caller_step.h); such a cache has no pool blocks to hand out and
// refuses add_request / append.
class PagedCache {
  struct Request;

 public:
  // A request's entry, for a caller that appends to the same requests step after step (the
  // layer's planner at decode): the calls that take one look nothing up. Valid until the request
  // is removed.
  class Handle {
   public:
    Handle() = default;

   private:
    friend class PagedCache;
    explicit Handle(Request* r) : r_(r) {}
    Request* r_ = nullptr;
  };

  // external_storage == nullptr: allocate host storage of num_blocks * block_bytes bytes.
  explicit PagedCache(CacheSpec spec, void* external_storage = nullptr,
                      Device device = Device::cpu);
  // Caller-owned: `storage` uint8 [num_blocks, spec.block_bytes], bytes dense within a block
  // (strides[1] == 1) and any block stride strides[0] >= block_bytes (vLLM pads its pages);
  // spec.num_blocks is taken from it. Caches with a layout follow check_kv_cache's rules.
  // Throws dsv4::Error naming `where` and `name` for a tensor that does not fit.
  PagedCache(CacheSpec spec, const TensorView& storage, const char* where, const char* name);
  bool caller_owned() const { return caller_owned_; }
  int64_t block_stride() const { return block_stride_; }  // bytes from one block to the next

  const CacheSpec& spec() const { return spec_; }
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }

  void add_request(int64_t req);      // throws if it exists
  void remove_request(int64_t req);   // frees its blocks; throws if unknown
  bool has_request(int64_t req) const;
  int64_t num_entries(int64_t req) const;  // entries appended so far

  // Reserves `count` new entries at the end of the request, allocating blocks as needed, and
  // returns their global slots. Atomic: if the pool runs out, nothing changes and it throws.
  // Blocks holding only entries older than num_entries - retain (num_entries before this
  // call, so the new entries and the window of the first one stay mapped) are released first
  // and may be reused by this very call.
  std::vector<int64_t> append(int64_t req, int64_t count);
  // The same, writing the `count` slots to `slots` (nullptr: not wanted) instead of allocating:
  // the per-step path of a serving loop. Returns whether the request's block table changed
  // (blocks allocated or released), which a planner that re-sends tables only when they change
  // needs to know.
  bool append(int64_t req, int64_t count, int64_t* slots);
  // The request's handle (throws if unknown), and append / block_table through it.
  Handle handle(int64_t req);
  bool append(Handle h, int64_t count, int64_t* slots);
  // Global slot of entry `entry` of the request, or -1 if released / not yet appended.
  int64_t slot_of(int64_t req, int64_t entry) const;
  // The request's block table (one block id per B entries; -1 for released blocks).
  const std::vector<int32_t>& block_table(int64_t req) const;
  const std::vector<int32_t>& block_table(Handle h) const { return h.r_->table; }

  uint8_t* storage() const { return storage_; }
  Device device() const { return device_; }
  TensorView storage_view() const;  // uint8 [num_blocks, block_bytes], block stride block_stride()
  KvCacheView kv_view() const;  // needs spec().layout; tensor_scale from the spec

 private:
  struct Request {
    int64_t id = 0;
    std::vector<int32_t> table;
    int64_t entries = 0;
    int64_t released = 0;  // table[0, released) are all released (-1): not scanned again
  };
  const Request& request(int64_t req) const;
  bool release_old_blocks(Request& r);  // whether any block was released

  CacheSpec spec_;
  BlockPool pool_;
  std::shared_ptr<uint8_t[]> owned_;
  uint8_t* storage_ = nullptr;
  Device device_ = Device::cpu;
  int64_t block_stride_ = 0;
  bool caller_owned_ = false;
  std::unordered_map<int64_t, Request> requests_;  // looked up per request on every step
};

// Throws dsv4::Error("<where>: <name> cache exhausted: ...") unless the pool holds the new
// blocks that growing requests from `before` to `after` entries needs (one pair per request).
// Conservative: blocks that recycling would free are not counted. Lets a caller report
// exhaustion before it changes any state.
void require_blocks_for_growth(const char* where, const PagedCache& cache,
                               const std::vector<std::pair<int64_t, int64_t>>& growth);

// One cache of `spec` with storage of its own kind on `device`: host storage the cache owns (CPU),
// or device storage appended to `device_storage`, which must outlive the cache (CUDA). Throws
// dsv4::Error for a CUDA cache without blocks or bytes.
std::unique_ptr<PagedCache> make_paged_cache(CacheSpec spec, Device device,
                                             std::vector<DeviceTensor>& device_storage);

// Packs block tables of `reqs` (in order) into int32 [reqs.size(), max_blocks] padded with -1.
HostTensor pack_block_tables(const PagedCache& cache, const std::vector<int64_t>& reqs);

// Block-size defaults of docs/spec.md §8.
struct CacheDefaults {
  static constexpr int kSwaBlock = 64;          // tokens per SWA block
  static constexpr int kLogicalBlock = 256;     // tokens per compressed logical block
  static constexpr int compressed_block(int ratio) { return kLogicalBlock / ratio; }  // 64 / 2

  // Indexer key cache: one entry per ratio-4 compressed entry, 128 fp8 values + one fp32 scale.
  // A block is [block x 128 fp8 keys][block x 4 B fp32 scales] (keys first, like MODEL1).
  static constexpr int kIndexerKeyDim = 128;
  static constexpr int kIndexerKeyRowBytes = kIndexerKeyDim + 4;  // 132
  static constexpr int kIndexerBlock = kLogicalBlock / 4;         // 64 entries

  // Compressor state: per token position one fp32 row [kv (coff*D) | score (coff*D)], coff = 2
  // for ratio 4 (overlapping windows), 1 for ratio 128. A block holds one compression window
  // (ratio rows), so a window's rows are contiguous; a request retains coff * ratio rows (the
  // current window and, for ratio 4, the previous one).
  static constexpr int state_coff(int ratio) { return ratio == 4 ? 2 : 1; }
  static constexpr int state_block(int ratio) { return ratio; }
  static constexpr int64_t state_row_bytes(int ratio, int head_dim) {
    return int64_t{2} * state_coff(ratio) * head_dim * 4;
  }
  static constexpr int64_t state_retain(int ratio) { return int64_t{state_coff(ratio)} * ratio; }
};

// Sizes for the caches of one layer.
struct LayerCacheOptions {
  KvLayout layout = KvLayout::model1_fp8;  // of the SWA and compressed caches (dim = head_dim)
  int32_t swa_blocks = 256;
  int32_t compressed_blocks = 256;  // also the indexer key cache's block count
  int32_t state_blocks = 64;        // compressor state and indexer compressor state
  int swa_block_size = CacheDefaults::kSwaBlock;
  // FP8_PER_TENSOR only: the one scale of the SWA and compressed caches (value = fp8 · kv_scale),
  // vLLM's per-layer kv scale. 1 (vLLM's default without a calibrated scale) suits the layer's
  // RMS-normed rows: they stay inside e4m3's normal range. A finite value > 0.
  float kv_scale = 1.0f;
  // FP8_PER_TENSOR only: the scale of the FP8 queries the layer decodes with over those caches
  // (q_fp8 = e4m3(q / q_scale), vLLM's per-layer _q_scale, the FlashInfer port's FP8 query path:
  // qnorm_rope_kv_insert writes them, sparse_decode reads them; prefills attend with the bf16 q,
  // which then holds bf16(fp8 · q_scale)). 1 by default, as vLLM's. A finite value > 0.
  float q_scale = 1.0f;
  // Where the caches' storage lives: host memory, or CUDA device memory (DeviceTensors owned by
  // the LayerCaches; block tables and pools stay on the host either way).
  Device device = Device::cpu;
};

// The caches of one attention layer; which exist depends on the layer kind:
//   SWA: swa. C128A: swa, compressed, compressor_state. C4A: all four (+ indexer keys and the
//   indexer compressor's state).
struct LayerCaches {
  LayerKind kind = LayerKind::swa;
  std::unique_ptr<PagedCache> swa;
  std::unique_ptr<PagedCache> compressed;
  std::unique_ptr<PagedCache> compressor_state;  // fp32 rows [kv (coff*D) | score (coff*D)]
  std::unique_ptr<PagedCache> indexer_keys;      // fp8 [128] + fp32 scale per entry
  std::unique_ptr<PagedCache> indexer_state;     // indexer compressor state rows
  std::vector<DeviceTensor> device_storage;      // the storage of CUDA caches (else empty)

  void add_request(int64_t req);
  void remove_request(int64_t req);
};
LayerCaches make_layer_caches(const ModelConfig& cfg, LayerKind kind,
                              const LayerCacheOptions& opts = {});

// A serving engine's cache tensors for one layer (AttentionOptions::caller_caches): each uint8
// [num_blocks, block_bytes] with bytes dense within a block and any block stride >= block_bytes
// (multiple of 16 for the KV caches; the compressor rings, read as fp32 rows, need dense blocks:
// stride == block_bytes). Block sizes are the LayerCacheOptions' (swa_block_size) and
// CacheDefaults' (compressed: 256 / ratio, indexer keys: 64, rings: ratio rows), so block_bytes
// is: swa / compressed the layout's kv_geometry; indexer_keys 64 x 132; compressor_state ratio x
// state_row_bytes(ratio, head_dim); indexer_state 4 x state_row_bytes(4, index_head_dim).
// Which are needed depends on the kind (as LayerCaches); the others must be left undefined.
struct CallerCaches {
  TensorView swa;
  TensorView compressed;        // C4A, C128A
  TensorView compressor_state;  // C4A, C128A
  TensorView indexer_keys;      // C4A
  TensorView indexer_state;     // C4A
};
// LayerCaches over `storage` (nothing allocated; every cache caller_owned()), all on `device`.
// Throws dsv4::Error naming the CallerCaches field that is missing, extra or does not fit.
LayerCaches make_caller_layer_caches(const ModelConfig& cfg, LayerKind kind,
                                     const LayerCacheOptions& opts, const CallerCaches& storage,
                                     Device device);

}  // namespace dsv4
