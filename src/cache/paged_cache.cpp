// Paged caches (docs/spec.md §8): block pool, per-request block tables with SWA block recycling, and the
// cache set of one attention layer.
#include "dsv4/paged_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <new>

#include "core/nonneg_div.h"
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
    : spec_(checked_spec(std::move(spec))),
      pool_(spec_.num_blocks),
      device_(device),
      block_stride_(spec_.block_bytes) {
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

PagedCache::PagedCache(CacheSpec spec, const TensorView& storage, const char* where,
                       const char* name)
    : spec_(checked_spec([&] {
        const std::string n = name;
        if (!storage.defined()) fail(where, ": ", n, ": expected the caller's cache tensor, got none");
        check_dtype(where, name, storage, DType::uint8);
        check_ndim(where, name, storage, 2);
        spec.num_blocks = static_cast<int32_t>(std::min<int64_t>(storage.shape[0], INT32_MAX));
        if (spec.num_blocks != storage.shape[0])
          fail_expected(where, n + ".shape[0] (blocks)", "<= INT32_MAX", storage.shape[0]);
        return std::move(spec);
      }())),
      pool_(0),
      storage_(static_cast<uint8_t*>(storage.data)),
      device_(storage.device),
      block_stride_(storage.shape[0] > 1 ? storage.strides[0] : spec_.block_bytes),
      caller_owned_(true) {
  const std::string n = name;
  if (storage.shape[1] != spec_.block_bytes || storage.strides[1] != 1)
    fail(where, ": ", n, ": expected [num_blocks, ", spec_.block_bytes, "] uint8 (", spec_.name,
         " blocks of ", spec_.block_size, " entries) with dense blocks, got shape ",
         storage.shape_str(), ", strides [", storage.strides[0], ", ", storage.strides[1], "]");
  if (block_stride_ < spec_.block_bytes)
    fail_expected(where, n + ".strides[0] (block stride)", ">= " + std::to_string(spec_.block_bytes),
                  block_stride_);
  if (spec_.layout) check_kv_cache(where, name, kv_view());
}

void PagedCache::add_request(int64_t req) {
  if (caller_owned_)
    fail("PagedCache(", spec_.name, ")::add_request: the cache is caller-owned (its block tables "
         "come from the caller)");
  if (requests_.count(req))
    fail("PagedCache(", spec_.name, ")::add_request: request ", req, " already exists");
  Request r;
  r.id = req;
  requests_.emplace(req, std::move(r));
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
  return div_nonneg(entries - retain, block_size);
}
}  // namespace

bool PagedCache::release_old_blocks(Request& r) {
  const int64_t prefix = std::min<int64_t>(releasable_prefix(r.entries, spec_.retain, spec_.block_size),
                                           static_cast<int64_t>(r.table.size()));
  bool released = false;
  for (int64_t k = r.released; k < prefix; ++k) {
    int32_t& b = r.table[static_cast<size_t>(k)];
    if (b >= 0) {
      pool_.free(b);
      b = -1;
      released = true;
    }
  }
  r.released = std::max(r.released, prefix);
  return released;
}

std::vector<int64_t> PagedCache::append(int64_t req, int64_t count) {
  if (count < 0)
    fail_expected("PagedCache(" + spec_.name + ")::append", "count", ">= 0", count);
  std::vector<int64_t> slots(static_cast<size_t>(count));
  append(req, count, slots.data());
  return slots;
}

PagedCache::Handle PagedCache::handle(int64_t req) {
  if (caller_owned_)
    fail("PagedCache(", spec_.name, ")::append: the cache is caller-owned (its block tables come "
         "from the caller)");
  auto it = requests_.find(req);
  if (it == requests_.end())
    fail("PagedCache(", spec_.name, ")::append: unknown request ", req);
  return Handle(&it->second);
}

bool PagedCache::append(int64_t req, int64_t count, int64_t* slots) {
  return append(handle(req), count, slots);
}

bool PagedCache::append(Handle h, int64_t count, int64_t* slots) {
  if (count < 0)
    fail_expected("PagedCache(" + spec_.name + ")::append", "count", ">= 0", count);
  DSV4_CHECK(h.r_ != nullptr, "PagedCache(", spec_.name, ")::append: an empty handle");
  Request& r = *h.r_;
  const int64_t req = r.id;
  const int64_t bs = spec_.block_size;
  const int64_t first = r.entries;
  const int64_t total = first + count;
  const int64_t blocks_needed = ceil_div_nonneg(total, bs) - static_cast<int64_t>(r.table.size());

  // Atomicity: decide before touching anything whether the pool (plus the blocks this call
  // releases) can supply every new block.
  int64_t released = 0;
  const int64_t prefix = releasable_prefix(first, spec_.retain, spec_.block_size);
  for (int64_t k = r.released; k < prefix && k < static_cast<int64_t>(r.table.size()); ++k)
    released += r.table[static_cast<size_t>(k)] >= 0;
  if (blocks_needed > pool_.num_free() + released)
    fail("PagedCache(", spec_.name, ")::append: pool exhausted: request ", req, " needs ",
         blocks_needed, " new block(s) for ", count, " entries, ", pool_.num_free() + released,
         " free of ", pool_.num_blocks());

  const bool released_blocks = release_old_blocks(r);
  for (int64_t k = 0; k < blocks_needed; ++k) r.table.push_back(pool_.allocate());
  r.entries = total;

  if (slots != nullptr)
    for (int64_t i = first; i < total; ++i)
      slots[i - first] = int64_t{r.table[static_cast<size_t>(div_nonneg(i, bs))]} * bs + mod_nonneg(i, bs);
  return released_blocks || blocks_needed > 0;
}

int64_t PagedCache::slot_of(int64_t req, int64_t entry) const {
  const Request& r = request(req);
  if (entry < 0 || entry >= r.entries) return -1;
  const int64_t bs = spec_.block_size;
  const int32_t b = r.table[static_cast<size_t>(div_nonneg(entry, bs))];
  return b < 0 ? -1 : int64_t{b} * bs + mod_nonneg(entry, bs);
}

TensorView PagedCache::storage_view() const {
  TensorView v(storage_, DType::uint8, {int64_t{spec_.num_blocks}, spec_.block_bytes}, device_);
  v.strides[0] = block_stride_;
  return v;
}

KvCacheView PagedCache::kv_view() const {
  if (!spec_.layout)
    fail("PagedCache(", spec_.name, ")::kv_view: cache has no KV layout (not read by attention)");
  KvCacheView v;
  v.data = storage_view();
  v.layout = *spec_.layout;
  v.block_size = spec_.block_size;
  v.tensor_scale = spec_.tensor_scale;
  return v;
}

void require_blocks_for_growth(const char* where, const PagedCache& cache,
                               const std::vector<std::pair<int64_t, int64_t>>& growth) {
  const int64_t B = cache.spec().block_size;
  int64_t blocks = 0;
  for (const auto& [before, after] : growth) blocks += ceil_div_nonneg(after, B) - ceil_div_nonneg(before, B);
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
// The specs of the caches a layer of `kind` has, in LayerCaches' order, each with the member it
// fills. Storage is the caller's business (make_layer_caches / make_caller_layer_caches).
struct LayerCacheSlot {
  std::unique_ptr<PagedCache> LayerCaches::*member;
  TensorView CallerCaches::*caller;
  const char* caller_name;
  CacheSpec spec;
};
std::vector<LayerCacheSlot> layer_cache_slots(const ModelConfig& cfg, LayerKind kind,
                                              const LayerCacheOptions& opts, const char* where) {
  cfg.validate();
  const KvGeometry g = kv_geometry(opts.layout, opts.swa_block_size);
  if (g.dim != cfg.head_dim)
    fail_expected(where, "opts.layout",
                  "a layout of dim " + std::to_string(cfg.head_dim) + " (config " + cfg.name + ")",
                  std::string(kv_layout_name(opts.layout)) + " (dim " + std::to_string(g.dim) + ")");
  if (opts.layout == KvLayout::fp8_per_tensor &&
      !(opts.kv_scale > 0.0f && std::isfinite(opts.kv_scale)))
    fail_expected(where, "opts.kv_scale", "a finite value > 0 (FP8_PER_TENSOR)", opts.kv_scale);
  // (Not a cache's property, but the queries decoded over these caches: checked with their scale.)
  if (opts.layout == KvLayout::fp8_per_tensor &&
      !(opts.q_scale > 0.0f && std::isfinite(opts.q_scale)))
    fail_expected(where, "opts.q_scale", "a finite value > 0 (FP8_PER_TENSOR)", opts.q_scale);
  const float tensor_scale = opts.kv_scale;
  auto spec = [tensor_scale](std::string name, int block_size, int64_t block_bytes, int32_t num_blocks,
                 int64_t retain, std::optional<KvLayout> layout) {
    CacheSpec s;
    s.name = std::move(name);
    s.block_size = block_size;
    s.block_bytes = block_bytes == 0 && layout ? kv_geometry(*layout, block_size).block_bytes
                                               : block_bytes;
    s.num_blocks = num_blocks;
    s.retain = retain;
    s.layout = layout;
    if (layout) s.tensor_scale = tensor_scale;
    return s;
  };
  std::vector<LayerCacheSlot> slots;
  // SWA keeps the last W tokens; blocks wholly older than that are recycled.
  slots.push_back({&LayerCaches::swa, &CallerCaches::swa, "caches.swa",
                   spec("swa", opts.swa_block_size, 0, opts.swa_blocks,
                        cfg.window_size > 0 ? cfg.window_size : 0, opts.layout)});
  if (kind == LayerKind::swa) return slots;

  const int ratio = kind == LayerKind::c4a ? 4 : 128;
  slots.push_back({&LayerCaches::compressed, &CallerCaches::compressed, "caches.compressed",
                   spec("compressed", CacheDefaults::compressed_block(ratio), 0,
                        opts.compressed_blocks, 0, opts.layout)});
  slots.push_back({&LayerCaches::compressor_state, &CallerCaches::compressor_state,
                   "caches.compressor_state",
                   spec("compressor_state", CacheDefaults::state_block(ratio),
                        CacheDefaults::state_block(ratio) * CacheDefaults::state_row_bytes(ratio, cfg.head_dim),
                        opts.state_blocks, CacheDefaults::state_retain(ratio), std::nullopt)});
  if (kind == LayerKind::c128a) return slots;

  if (cfg.index_head_dim != CacheDefaults::kIndexerKeyDim)
    fail_expected(where, "cfg.index_head_dim", CacheDefaults::kIndexerKeyDim, cfg.index_head_dim);
  slots.push_back({&LayerCaches::indexer_keys, &CallerCaches::indexer_keys, "caches.indexer_keys",
                   spec("indexer_keys", CacheDefaults::kIndexerBlock,
                        int64_t{CacheDefaults::kIndexerBlock} * CacheDefaults::kIndexerKeyRowBytes,
                        opts.compressed_blocks, 0, std::nullopt)});
  slots.push_back({&LayerCaches::indexer_state, &CallerCaches::indexer_state, "caches.indexer_state",
                   spec("indexer_state", CacheDefaults::state_block(4),
                        CacheDefaults::state_block(4) * CacheDefaults::state_row_bytes(4, cfg.index_head_dim),
                        opts.state_blocks, CacheDefaults::state_retain(4), std::nullopt)});
  return slots;
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
  LayerCaches lc;
  lc.kind = kind;
  // Host storage is owned by the cache; device storage by `lc` (the PagedCache borrows it).
  for (LayerCacheSlot& s : layer_cache_slots(cfg, kind, opts, "make_layer_caches"))
    lc.*s.member = make_paged_cache(std::move(s.spec), opts.device, lc.device_storage);
  return lc;
}

std::unique_ptr<PagedCache> make_paged_cache(CacheSpec spec, Device device,
                                             std::vector<DeviceTensor>& device_storage) {
  if (device == Device::cpu) return std::make_unique<PagedCache>(std::move(spec));
  DSV4_CHECK(spec.block_bytes > 0 && spec.num_blocks > 0, "make_paged_cache: ", spec.name,
             " cache: block_bytes ", spec.block_bytes, " and num_blocks ", spec.num_blocks,
             " must be positive");
  device_storage.emplace_back(DType::uint8, std::vector<int64_t>{int64_t{spec.num_blocks} * spec.block_bytes});
  uint8_t* storage = device_storage.back().data<uint8_t>();
  return std::make_unique<PagedCache>(std::move(spec), storage, device);
}

LayerCaches make_caller_layer_caches(const ModelConfig& cfg, LayerKind kind,
                                     const LayerCacheOptions& opts, const CallerCaches& storage,
                                     Device device) {
  constexpr const char* where = "Attention::bind_caches";
  std::vector<LayerCacheSlot> slots = layer_cache_slots(cfg, kind, opts, where);
  // A cache the kind does not have must not be given (a caller mixing up layers is told so).
  const std::pair<TensorView CallerCaches::*, const char*> all[] = {
      {&CallerCaches::swa, "caches.swa"},
      {&CallerCaches::compressed, "caches.compressed"},
      {&CallerCaches::compressor_state, "caches.compressor_state"},
      {&CallerCaches::indexer_keys, "caches.indexer_keys"},
      {&CallerCaches::indexer_state, "caches.indexer_state"}};
  for (const auto& [field, name] : all) {
    const bool wanted = std::any_of(slots.begin(), slots.end(),
                                    [&](const LayerCacheSlot& s) { return s.caller == field; });
    if (!wanted && (storage.*field).defined())
      fail(where, ": ", name, ": expected none (a ", layer_kind_name(kind), " layer has no such cache)");
  }
  LayerCaches lc;
  lc.kind = kind;
  for (LayerCacheSlot& s : slots) {
    const TensorView& t = storage.*s.caller;
    if (t.defined() && t.device != device)
      fail_expected(where, std::string(s.caller_name) + ".device",
                    device == Device::cuda ? "cuda (the layer's)" : "cpu (the layer's)",
                    t.device == Device::cuda ? "cuda" : "cpu");
    const bool ring = s.spec.retain > 0 && !s.spec.layout;  // compressor rings: fp32 rows
    lc.*s.member = std::make_unique<PagedCache>(std::move(s.spec), t, where, s.caller_name);
    const PagedCache& c = *(lc.*s.member);
    if (ring && c.block_stride() != c.spec().block_bytes)
      fail_expected(where, std::string(s.caller_name) + ".strides[0] (block stride)",
                    std::to_string(c.spec().block_bytes) + " (dense: the ring is read as fp32 rows)",
                    c.block_stride());
  }
  return lc;
}

}  // namespace dsv4
