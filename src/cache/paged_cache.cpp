// Paged caches (docs/spec.md §8): block pool, per-request block tables with SWA block recycling, and the
// cache set of one attention layer.
#include "dsv4/paged_cache.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <new>

#include "dsv4/status.h"

namespace dsv4 {

// ================================ BlockPool =================================================

BlockPool::BlockPool(int32_t num_blocks) {
  if (num_blocks < 0) fail_expected("BlockPool", "num_blocks", ">= 0", num_blocks);
  in_use_.assign(static_cast<size_t>(num_blocks), 0);
  free_list_.resize(static_cast<size_t>(num_blocks));
  for (int32_t b = 0; b < num_blocks; ++b) free_list_[static_cast<size_t>(b)] = b;
  // An ascending array already is a min-heap.
  num_free_ = num_blocks;
}

int32_t BlockPool::allocate() {
  if (free_list_.empty())
    fail("BlockPool::allocate: pool exhausted: all ", num_blocks(), " blocks are in use");
  std::pop_heap(free_list_.begin(), free_list_.end(), std::greater<>());
  const int32_t b = free_list_.back();
  free_list_.pop_back();
  in_use_[static_cast<size_t>(b)] = 1;
  --num_free_;
  return b;
}

void BlockPool::free(int32_t block) {
  if (block < 0 || block >= num_blocks())
    fail_expected("BlockPool::free", "block", "0.." + std::to_string(num_blocks() - 1), block);
  if (!in_use_[static_cast<size_t>(block)])
    fail("BlockPool::free: block ", block, " is not allocated (double free?)");
  in_use_[static_cast<size_t>(block)] = 0;
  free_list_.push_back(block);
  std::push_heap(free_list_.begin(), free_list_.end(), std::greater<>());
  ++num_free_;
}

bool BlockPool::in_use(int32_t block) const {
  return block >= 0 && block < num_blocks() && in_use_[static_cast<size_t>(block)] != 0;
}

// ================================ PagedCache ================================================

namespace {
CacheSpec checked_spec(CacheSpec spec) {
  const std::string where = "PagedCache(" + spec.name + ")";
  if (spec.block_size < 1) fail_expected(where, "block_size", ">= 1", spec.block_size);
  if (spec.num_blocks < 0) fail_expected(where, "num_blocks", ">= 0", spec.num_blocks);
  if (spec.retain < 0) fail_expected(where, "retain", ">= 0 (0 = keep all)", spec.retain);
  if (spec.layout) {
    const int64_t geometry_bytes = kv_geometry(*spec.layout, spec.block_size).block_bytes;
    if (spec.block_bytes == 0) spec.block_bytes = geometry_bytes;
    if (spec.block_bytes != geometry_bytes)
      fail_expected(where, "block_bytes",
                    std::to_string(geometry_bytes) + " (" +
                        std::string(kv_layout_name(*spec.layout)) + " geometry)",
                    spec.block_bytes);
  }
  if (spec.block_bytes <= 0) fail_expected(where, "block_bytes", "> 0", spec.block_bytes);
  return spec;
}
}  // namespace

PagedCache::PagedCache(CacheSpec spec, void* external_storage, Device device)
    : spec_(checked_spec(std::move(spec))), pool_(spec_.num_blocks), device_(device) {
  if (external_storage != nullptr) {
    storage_ = static_cast<uint8_t*>(external_storage);
    return;
  }
  if (device != Device::cpu)
    fail("PagedCache(", spec_.name, "): external_storage: expected device memory for a CUDA "
         "cache (the library never allocates on the GPU), got nullptr");
  const size_t bytes = static_cast<size_t>(spec_.num_blocks) * static_cast<size_t>(spec_.block_bytes);
  if (bytes > 0) {
    // 64-byte aligned, zeroed host storage (fp32 scales / bf16 rope are read in place).
    auto* raw = static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t{64}));
    std::memset(raw, 0, bytes);
    owned_ = std::shared_ptr<uint8_t[]>(
        raw, [](uint8_t* p) { ::operator delete[](p, std::align_val_t{64}); });
    storage_ = raw;
  }
}

void PagedCache::add_request(int64_t req) {
  if (requests_.count(req))
    fail("PagedCache(", spec_.name, ")::add_request: request ", req, " already exists");
  requests_.emplace(req, Request{});
}

void PagedCache::remove_request(int64_t req) {
  auto it = requests_.find(req);
  if (it == requests_.end())
    fail("PagedCache(", spec_.name, ")::remove_request: unknown request ", req);
  for (int32_t b : it->second.table)
    if (b >= 0) pool_.free(b);
  requests_.erase(it);
}

bool PagedCache::has_request(int64_t req) const { return requests_.count(req) != 0; }

const PagedCache::Request& PagedCache::request(int64_t req) const {
  auto it = requests_.find(req);
  if (it == requests_.end()) fail("PagedCache(", spec_.name, "): unknown request ", req);
  return it->second;
}

int64_t PagedCache::num_entries(int64_t req) const { return request(req).entries; }

const std::vector<int32_t>& PagedCache::block_table(int64_t req) const {
  return request(req).table;
}

namespace {
// Blocks [0, result) of a request hold only entries < entries - retain: no longer needed.
int64_t releasable_prefix(int64_t entries, int64_t retain, int block_size) {
  if (retain <= 0 || entries <= retain) return 0;
  return (entries - retain) / block_size;
}
}  // namespace

void PagedCache::release_old_blocks(Request& r) {
  const int64_t prefix = releasable_prefix(r.entries, spec_.retain, spec_.block_size);
  for (int64_t k = 0; k < prefix && k < static_cast<int64_t>(r.table.size()); ++k) {
    int32_t& b = r.table[static_cast<size_t>(k)];
    if (b >= 0) {
      pool_.free(b);
      b = -1;
    }
  }
}

std::vector<int64_t> PagedCache::append(int64_t req, int64_t count) {
  if (count < 0)
    fail_expected("PagedCache(" + spec_.name + ")::append", "count", ">= 0", count);
  auto it = requests_.find(req);
  if (it == requests_.end())
    fail("PagedCache(", spec_.name, ")::append: unknown request ", req);
  Request& r = it->second;
  const int64_t bs = spec_.block_size;
  const int64_t first = r.entries;
  const int64_t total = first + count;
  const int64_t blocks_needed = (total + bs - 1) / bs - static_cast<int64_t>(r.table.size());

  // Atomicity: decide before touching anything whether the pool (plus the blocks this call
  // releases) can supply every new block.
  int64_t released = 0;
  const int64_t prefix = releasable_prefix(first, spec_.retain, spec_.block_size);
  for (int64_t k = 0; k < prefix && k < static_cast<int64_t>(r.table.size()); ++k)
    released += r.table[static_cast<size_t>(k)] >= 0;
  if (blocks_needed > pool_.num_free() + released)
    fail("PagedCache(", spec_.name, ")::append: pool exhausted: request ", req, " needs ",
         blocks_needed, " new block(s) for ", count, " entries, ", pool_.num_free() + released,
         " free of ", pool_.num_blocks());

  release_old_blocks(r);
  for (int64_t k = 0; k < blocks_needed; ++k) r.table.push_back(pool_.allocate());
  r.entries = total;

  std::vector<int64_t> slots(static_cast<size_t>(count));
  for (int64_t i = first; i < total; ++i)
    slots[static_cast<size_t>(i - first)] = int64_t{r.table[static_cast<size_t>(i / bs)]} * bs + i % bs;
  return slots;
}

int64_t PagedCache::slot_of(int64_t req, int64_t entry) const {
  const Request& r = request(req);
  if (entry < 0 || entry >= r.entries) return -1;
  const int64_t bs = spec_.block_size;
  const int32_t b = r.table[static_cast<size_t>(entry / bs)];
  return b < 0 ? -1 : int64_t{b} * bs + entry % bs;
}

TensorView PagedCache::storage_view() const {
  return TensorView(storage_, DType::uint8, {int64_t{spec_.num_blocks}, spec_.block_bytes},
                    device_);
}

KvCacheView PagedCache::kv_view(float tensor_scale) const {
  if (!spec_.layout)
    fail("PagedCache(", spec_.name, ")::kv_view: cache has no KV layout (not read by attention)");
  KvCacheView v;
  v.data = storage_view();
  v.layout = *spec_.layout;
  v.block_size = spec_.block_size;
  v.tensor_scale = tensor_scale;
  return v;
}

void require_blocks_for_growth(const char* where, const PagedCache& cache,
                               const std::vector<std::pair<int64_t, int64_t>>& growth) {
  const int64_t B = cache.spec().block_size;
  int64_t blocks = 0;
  for (const auto& [before, after] : growth) blocks += (after + B - 1) / B - (before + B - 1) / B;
  if (blocks > cache.pool().num_free())
    fail(where, ": ", cache.spec().name, " cache exhausted: this step needs ", blocks, " new blocks, ",
         cache.pool().num_free(), " of ", cache.pool().num_blocks(), " are free");
}

HostTensor pack_block_tables(const PagedCache& cache, const std::vector<int64_t>& reqs) {
  size_t max_blocks = 1;
  for (int64_t req : reqs) max_blocks = std::max(max_blocks, cache.block_table(req).size());
  HostTensor out(DType::int32, {static_cast<int64_t>(reqs.size()), static_cast<int64_t>(max_blocks)});
  int32_t* p = out.data<int32_t>();
  std::fill(p, p + out.numel(), -1);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& table = cache.block_table(reqs[i]);
    std::copy(table.begin(), table.end(), p + i * max_blocks);
  }
  return out;
}

// ================================ LayerCaches ===============================================

namespace {
// One cache of a layer, its storage on `lc`'s device: host memory owned by the cache, or a
// DeviceTensor owned by `lc` (the PagedCache only borrows it).
std::unique_ptr<PagedCache> make_cache(LayerCaches& lc, Device device, std::string name,
                                       int block_size, int64_t block_bytes, int32_t num_blocks,
                                       int64_t retain, std::optional<KvLayout> layout) {
  CacheSpec spec;
  spec.name = std::move(name);
  spec.block_size = block_size;
  spec.block_bytes = block_bytes;
  spec.num_blocks = num_blocks;
  spec.retain = retain;
  spec.layout = layout;
  if (device == Device::cpu) return std::make_unique<PagedCache>(std::move(spec));
  if (spec.block_bytes == 0 && layout) spec.block_bytes = kv_geometry(*layout, block_size).block_bytes;
  DSV4_CHECK(spec.block_bytes > 0 && spec.num_blocks > 0, "make_layer_caches: ", spec.name,
             " cache: block_bytes ", spec.block_bytes, " and num_blocks ", spec.num_blocks,
             " must be positive");
  lc.device_storage.emplace_back(DType::uint8,
                                 std::vector<int64_t>{int64_t{spec.num_blocks} * spec.block_bytes});
  return std::make_unique<PagedCache>(std::move(spec), lc.device_storage.back().data<uint8_t>(),
                                      device);
}
}  // namespace

void LayerCaches::add_request(int64_t req) {
  for (PagedCache* c : {swa.get(), compressed.get(), compressor_state.get(), indexer_keys.get(),
                        indexer_state.get()})
    if (c) c->add_request(req);
}

void LayerCaches::remove_request(int64_t req) {
  for (PagedCache* c : {swa.get(), compressed.get(), compressor_state.get(), indexer_keys.get(),
                        indexer_state.get()})
    if (c) c->remove_request(req);
}

LayerCaches make_layer_caches(const ModelConfig& cfg, LayerKind kind,
                              const LayerCacheOptions& opts) {
  cfg.validate();
  const KvGeometry g = kv_geometry(opts.layout, opts.swa_block_size);
  if (g.dim != cfg.head_dim)
    fail_expected("make_layer_caches", "opts.layout",
                  "a layout of dim " + std::to_string(cfg.head_dim) + " (config " + cfg.name + ")",
                  std::string(kv_layout_name(opts.layout)) + " (dim " + std::to_string(g.dim) + ")");
  LayerCaches lc;
  lc.kind = kind;
  // SWA keeps the last W tokens; blocks wholly older than that are recycled.
  lc.swa = make_cache(lc, opts.device, "swa", opts.swa_block_size, 0, opts.swa_blocks,
                      cfg.window_size > 0 ? cfg.window_size : 0, opts.layout);
  if (kind == LayerKind::swa) return lc;

  const int ratio = kind == LayerKind::c4a ? 4 : 128;
  lc.compressed = make_cache(lc, opts.device, "compressed", CacheDefaults::compressed_block(ratio), 0,
                             opts.compressed_blocks, 0, opts.layout);
  lc.compressor_state =
      make_cache(lc, opts.device, "compressor_state", CacheDefaults::state_block(ratio),
                 CacheDefaults::state_block(ratio) * CacheDefaults::state_row_bytes(ratio, cfg.head_dim),
                 opts.state_blocks, CacheDefaults::state_retain(ratio), std::nullopt);
  if (kind == LayerKind::c128a) return lc;

  if (cfg.index_head_dim != CacheDefaults::kIndexerKeyDim)
    fail_expected("make_layer_caches", "cfg.index_head_dim",
                  CacheDefaults::kIndexerKeyDim, cfg.index_head_dim);

  lc.indexer_keys = make_cache(lc, opts.device, "indexer_keys", CacheDefaults::kIndexerBlock,
                               int64_t{CacheDefaults::kIndexerBlock} * CacheDefaults::kIndexerKeyRowBytes,
                               opts.compressed_blocks, 0, std::nullopt);
  lc.indexer_state = make_cache(
      lc, opts.device, "indexer_state", CacheDefaults::state_block(4),
      CacheDefaults::state_block(4) * CacheDefaults::state_row_bytes(4, cfg.index_head_dim),
      opts.state_blocks, CacheDefaults::state_retain(4), std::nullopt);
  return lc;
}

}  // namespace dsv4
