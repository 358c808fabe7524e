#include "kv_pools.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <unistd.h>

#include "dsv4/compressor.h"
#include "dsv4/indexer_key_cache.h"
#include "dsv4/status.h"
#include "runtime/device_runtime.h"


namespace dsv4::cli {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of a state ring: what compressor_state_init reserves for a request.
int64_t ring_blocks(const CompressorConfig& c, int block_size) { return ceil_div(c.ring_rows(), block_size); }

// The three block counts of LayerCacheOptions, as a vector to scale together.
enum Knob { kSwa, kCompressed, kState, kKnobs };

// Bytes one block of each knob costs in one layer of `kind` (summed over the caches the knob
// sizes), read off real caches of one block each so they match make_layer_caches by construction.
std::array<int64_t, kKnobs> knob_block_bytes(const ModelConfig& cfg, LayerKind kind,
                                             const LayerCacheOptions& base) {
  // V3.2 (SparseMlaAttention): a V32_FP8 latent cache and the indexer's key cache, both with
  // swa_blocks blocks of swa_block_size tokens and no window: every token stays cached.
  if (cfg.family == "v3.2")
    return {kv_geometry(KvLayout::v32_fp8, base.swa_block_size).block_bytes +
                int64_t{base.swa_block_size} * indexer_keys::kEntryBytes,
            0, 0};
  LayerCacheOptions o = base;
  o.device = Device::cpu;
  o.swa_blocks = o.compressed_blocks = o.state_blocks = 1;
  const LayerCaches lc = make_layer_caches(cfg, kind, o);
  auto bytes = [](const std::unique_ptr<PagedCache>& c) { return c ? c->spec().block_bytes : int64_t{0}; };
  return {bytes(lc.swa), bytes(lc.compressed) + bytes(lc.indexer_keys),
          bytes(lc.compressor_state) + bytes(lc.indexer_state)};
}

}  // namespace

KvPoolSizes size_kv_pools(const ModelConfig& cfg, const std::vector<int>& layers,
                          const LayerCacheOptions& base, const KvWorkload& w, int64_t budget_bytes) {
  if (w.prompt_lens.empty()) fail_expected("size_kv_pools", "workload.prompt_lens", "at least one request", 0);
  if (w.chunk < 1) fail_expected("size_kv_pools", "workload.chunk", ">= 1", w.chunk);
  if (budget_bytes < 1) fail_expected("size_kv_pools", "budget_bytes", ">= 1", budget_bytes);

  // Bytes per block of each knob, over all layers; which compressed ratios occur.
  std::array<int64_t, kKnobs> knob_bytes{};
  std::map<LayerKind, std::array<int64_t, kKnobs>> per_kind;
  bool has_c4a = false, has_c128a = false;
  for (int l : layers) {
    const LayerKind kind = cfg.layer_kind(l);
    has_c4a |= kind == LayerKind::c4a;
    has_c128a |= kind == LayerKind::c128a;
    if (!per_kind.count(kind)) per_kind[kind] = knob_block_bytes(cfg, kind, base);
    for (int k = 0; k < kKnobs; ++k) knob_bytes[k] += per_kind[kind][k];
  }

  // A request's peak blocks per knob (see the header); the largest one's and the sum.
  const int64_t B = base.swa_block_size;
  std::array<int64_t, kKnobs> one{}, all{};
  for (int64_t prompt : w.prompt_lens) {
    const int64_t S = prompt + w.decode_steps;  // positions it ever holds
    const int64_t C = std::min(w.chunk, S);
    std::array<int64_t, kKnobs> need{};
    // SWA: before a step from c to c + n the request holds blocks back to the window of the
    // previous step's start c' >= c - C, and the check wants the step's new blocks free on top:
    // ceil((c + n) / B) - floor((c' - W) / B) <= (2C + W) / B + 2.
    need[kSwa] = cfg.window_size > 0 ? std::min(ceil_div(S, B), ceil_div(2 * C + cfg.window_size, B) + 2)
                                     : ceil_div(S, B);
    if (has_c4a) need[kCompressed] = ceil_div(S / 4, CacheDefaults::compressed_block(4));
    if (has_c128a)
      need[kCompressed] = std::max(need[kCompressed], ceil_div(S / 128, CacheDefaults::compressed_block(128)));
    if (has_c4a)
      need[kState] = std::max(ring_blocks(CompressorConfig::attention(cfg, 4), CacheDefaults::state_block(4)),
                              ring_blocks(CompressorConfig::indexer(cfg), CacheDefaults::state_block(4)));
    else if (has_c128a)
      need[kState] = ring_blocks(CompressorConfig::attention(cfg, 128), CacheDefaults::state_block(128));
    for (int k = 0; k < kKnobs; ++k) {
      one[k] = std::max(one[k], need[k]);
      all[k] += need[k];
    }
  }

  // R requests' worth: a uniform share of `all`, never below what the largest request needs.
  const int N = static_cast<int>(w.prompt_lens.size());
  auto blocks_for = [&](int R) {
    std::array<int64_t, kKnobs> b{};
    for (int k = 0; k < kKnobs; ++k) b[k] = std::max<int64_t>({1, one[k], ceil_div(all[k] * R, N)});
    return b;
  };
  auto bytes_of = [&](const std::array<int64_t, kKnobs>& b) {
    int64_t total = 0;
    for (int k = 0; k < kKnobs; ++k) total += b[k] * knob_bytes[k];
    return total;
  };
  KvPoolSizes out;
  out.all_resident_bytes = bytes_of(blocks_for(N));
  out.one_request_bytes = bytes_of(blocks_for(1));
  if (out.one_request_bytes > budget_bytes)
    fail("--kv-memory: ", format_bytes(budget_bytes), " cannot hold the largest request alone: it needs ",
         format_bytes(out.one_request_bytes), " (", one[kSwa], " SWA, ", one[kCompressed], " compressed and ",
         one[kState], " state blocks per layer)");
  int lo = 1, hi = N;  // bytes(lo) fits; find the largest R that does
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (bytes_of(blocks_for(mid)) <= budget_bytes)
      lo = mid;
    else
      hi = mid - 1;
  }
  const std::array<int64_t, kKnobs> b = blocks_for(lo);
  for (int k = 0; k < kKnobs; ++k)
    if (b[k] > INT32_MAX) fail("--kv-memory: pools of ", b[k], " blocks exceed the 2^31 blocks a pool can index");
  out.swa_blocks = static_cast<int32_t>(b[kSwa]);
  out.compressed_blocks = static_cast<int32_t>(b[kCompressed]);
  out.state_blocks = static_cast<int32_t>(b[kState]);
  out.bytes = bytes_of(b);
  out.resident_requests = lo;
  return out;
}

int64_t parse_memory_size(std::string_view flag, std::string_view text, int64_t percent_of) {
  const std::string s(text);
  auto bad = [&]() -> int64_t {
    fail("--", flag, ": expected a size like 8G, 512M, 1.5GiB, 1073741824 or 40%, got '", s, "'");
  };
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) return bad();
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno == ERANGE || !std::isfinite(v) || v <= 0) return bad();
  const std::string unit(end);
  double bytes = 0;
  if (unit == "%") {
    if (v > 100) fail_expected(std::string("--") + std::string(flag), "percentage", "in (0, 100]", s);
    bytes = v / 100.0 * static_cast<double>(percent_of);
  } else {
    static const std::map<std::string, double> kUnits = [] {
      std::map<std::string, double> m = {{"", 1.0}, {"B", 1.0}};
      const std::pair<const char*, double> scales[] = {
          {"K", 0x1p10}, {"k", 0x1p10}, {"M", 0x1p20}, {"G", 0x1p30}, {"T", 0x1p40}};
      for (const auto& [prefix, scale] : scales)
        for (const char* tail : {"", "B", "iB"}) m[std::string(prefix) + tail] = scale;
      return m;
    }();
    auto it = kUnits.find(unit);
    if (it == kUnits.end()) return bad();
    bytes = v * it->second;
  }
  if (!(bytes >= 1)) fail("--", flag, ": '", s, "' is less than one byte");
  if (bytes > 0x1p62) fail_expected(std::string("--") + std::string(flag), "size", "<= 2^62 bytes", s);
  return static_cast<int64_t>(bytes);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

int64_t memory_for_kv_budget(bool cuda) {
  if (cuda) {
    if (!rt::built()) fail("--kv-memory: this build has no CUDA backend");
    return static_cast<int64_t>(rt::device_free_bytes("--kv-memory: the device's free memory"));
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) fail("--kv-memory: cannot read the machine's physical memory; give a size");
  return static_cast<int64_t>(pages) * page;
}

// ================================ StackKvCapacity ===========================================

StackKvCapacity::StackKvCapacity(AttentionStack& stack) {
  const ModelConfig& cfg = stack.config();
  for (int l = 0; l < stack.num_layers() && stack.sparse_mla(); ++l) {
    const SparseMlaAttention& a = stack.sparse_mla_layer(l);
    const std::string layer = "layer " + std::to_string(a.layer_index()) + " ";
    pools_.push_back({layer + "kv", &a.kv_cache(), 1, 0});
    pools_.push_back({layer + "indexer_keys", &a.indexer_keys(), 1, 0});
  }
  for (int l = 0; l < stack.num_layers() && !stack.sparse_mla(); ++l) {
    const Attention& a = stack.layer(l);
    const LayerCaches& lc = a.caches();
    const std::string layer = "layer " + std::to_string(a.layer_index()) + " ";
    pools_.push_back({layer + "swa", lc.swa.get(), 1, 0});
    if (a.kind() == LayerKind::swa) continue;
    const int r = a.kind() == LayerKind::c4a ? 4 : 128;
    pools_.push_back({layer + "compressed", lc.compressed.get(), r, 0});
    pools_.push_back({layer + "compressor_state", lc.compressor_state.get(), 1,
                      ring_blocks(CompressorConfig::attention(cfg, r), lc.compressor_state->spec().block_size)});
    if (a.kind() != LayerKind::c4a) continue;
    pools_.push_back({layer + "indexer_keys", lc.indexer_keys.get(), 4, 0});
    pools_.push_back({layer + "indexer_state", lc.indexer_state.get(), 1,
                      ring_blocks(CompressorConfig::indexer(cfg), lc.indexer_state->spec().block_size)});
  }
}

int64_t StackKvCapacity::total_blocks(int pool) const { return pools_[pool].cache->pool().num_blocks(); }

int64_t StackKvCapacity::free_blocks(int pool) const { return pools_[pool].cache->pool().num_free(); }

int64_t StackKvCapacity::step_blocks(int pool, int64_t context, int64_t num_new) const {
  const Pool& p = pools_[pool];
  // State rings: reserved once, when a request the cache does not hold first runs
  // (StepPlanner::check).
  if (p.ring_blocks > 0) return context == 0 ? p.ring_blocks : 0;
  // Growing caches: every block the new entries start, without credit for blocks the step
  // recycles (require_blocks_for_growth).
  const int64_t B = p.cache->spec().block_size;
  const int64_t before = context / p.positions_per_entry, after = (context + num_new) / p.positions_per_entry;
  return ceil_div(after, B) - ceil_div(before, B);
}

int64_t StackKvCapacity::held_blocks(int pool, int64_t req) const {
  const PagedCache& c = *pools_[pool].cache;
  if (!c.has_request(req)) return 0;
  const std::vector<int32_t>& table = c.block_table(req);
  return std::count_if(table.begin(), table.end(), [](int32_t b) { return b >= 0; });
}

}  // namespace dsv4::cli
