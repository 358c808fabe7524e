// Paged caches (docs/spec.md §8): block pool allocation order, exhaustion, double free and leak freedom
// over random operations; per-request tables and slots; atomic append; SWA block recycling; the
// per-layer cache sets with their default block sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>

#include "dsv4/paged_cache.h"

namespace {

using dsv4::BlockPool;
using dsv4::CacheSpec;
using dsv4::KvLayout;
using dsv4::LayerKind;
using dsv4::PagedCache;

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const dsv4::Error& e) {
    return e.what();
  }
  return "<no error>";
}

// ================================ BlockPool =================================================

TEST(BlockPool, AllocatesLowestFreeFirstAndReusesFreed) {
  BlockPool pool(4);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.allocate(), 0);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 2);
  pool.free(1);
  EXPECT_FALSE(pool.in_use(1));
  EXPECT_TRUE(pool.in_use(0));
  EXPECT_EQ(pool.allocate(), 1);  // the freed block, before the never-used 3
  EXPECT_EQ(pool.allocate(), 3);
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPool, ExhaustionIsAClearErrorAndChangesNothing) {
  BlockPool pool(2);
  pool.allocate();
  pool.allocate();
  const std::string err = error_of([&] { pool.allocate(); });
  EXPECT_NE(err.find("exhausted"), std::string::npos) << err;
  EXPECT_NE(err.find("2 blocks"), std::string::npos) << err;
  EXPECT_EQ(pool.num_free(), 0);
  pool.free(0);
  EXPECT_EQ(pool.allocate(), 0);
}

TEST(BlockPool, DoubleFreeAndOutOfRangeAreRejected) {
  BlockPool pool(3);
  const int32_t b = pool.allocate();
  pool.free(b);
  const std::string err = error_of([&] { pool.free(b); });
  EXPECT_NE(err.find("double free"), std::string::npos) << err;
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_NE(error_of([&] { pool.free(2); }).find("not allocated"), std::string::npos);  // never used
  EXPECT_NE(error_of([&] { pool.free(3); }).find("block"), std::string::npos);
  EXPECT_NE(error_of([&] { pool.free(-1); }).find("block"), std::string::npos);
  EXPECT_EQ(pool.num_free(), 3);
  // The free list is intact: all three blocks still come back, lowest first.
  EXPECT_EQ(pool.allocate(), 0);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_THROW(BlockPool(-1), dsv4::Error);
}

TEST(BlockPool, TenThousandRandomOpsMatchAModelWithoutLeaks) {
  constexpr int32_t kBlocks = 97;
  BlockPool pool(kBlocks);
  std::set<int32_t> held;  // the model: which blocks are allocated
  std::mt19937 rng(7);
  for (int op = 0; op < 10000; ++op) {
    const bool do_alloc = held.empty() || (held.size() < static_cast<size_t>(kBlocks) && rng() % 2);
    if (do_alloc) {
      int32_t lowest_free = 0;  // the model's expectation: smallest block not held
      while (held.count(lowest_free)) ++lowest_free;
      ASSERT_EQ(pool.allocate(), lowest_free) << "op " << op;
      held.insert(lowest_free);
    } else {
      auto it = held.begin();
      std::advance(it, static_cast<long>(rng() % held.size()));
      pool.free(*it);
      held.erase(it);
    }
    ASSERT_EQ(pool.num_free(), kBlocks - static_cast<int32_t>(held.size())) << "op " << op;
  }
  for (int32_t b = 0; b < kBlocks; ++b) ASSERT_EQ(pool.in_use(b), held.count(b) == 1) << b;
  for (int32_t b : held) pool.free(b);
  EXPECT_EQ(pool.num_free(), kBlocks);  // no leak
  for (int32_t b = 0; b < kBlocks; ++b) ASSERT_EQ(pool.allocate(), b);
  EXPECT_THROW(pool.allocate(), dsv4::Error);
}

// ================================ PagedCache ================================================

CacheSpec spec_of(int block_size, int32_t blocks, int64_t retain = 0,
                  std::optional<KvLayout> layout = KvLayout::model1_fp8) {
  CacheSpec s;
  s.name = "test";
  s.block_size = block_size;
  s.num_blocks = blocks;
  s.retain = retain;
  s.layout = layout;
  return s;
}

TEST(PagedCache, SlotsFollowTheBlockTable) {
  PagedCache cache(spec_of(4, 8));
  EXPECT_EQ(cache.spec().block_bytes, 2880);  // MODEL1 B=4: 4 x 584 = 2336 → 5 x 576
  cache.add_request(10);
  cache.add_request(20);
  EXPECT_EQ(cache.append(10, 5), (std::vector<int64_t>{0, 1, 2, 3, 4}));  // blocks 0, 1
  EXPECT_EQ(cache.append(20, 3), (std::vector<int64_t>{8, 9, 10}));       // block 2
  EXPECT_EQ(cache.append(10, 4), (std::vector<int64_t>{5, 6, 7, 12}));    // fills 1, takes 3
  EXPECT_EQ(cache.append(20, 0), (std::vector<int64_t>{}));
  EXPECT_EQ(cache.block_table(10), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(cache.block_table(20), (std::vector<int32_t>{2}));
  EXPECT_EQ(cache.num_entries(10), 9);
  EXPECT_EQ(cache.slot_of(10, 0), 0);
  EXPECT_EQ(cache.slot_of(10, 8), 12);
  EXPECT_EQ(cache.slot_of(10, 9), -1);   // not appended yet
  EXPECT_EQ(cache.slot_of(10, -1), -1);
  EXPECT_EQ(cache.slot_of(20, 2), 10);
  EXPECT_EQ(cache.pool().num_free(), 4);

  cache.remove_request(10);
  EXPECT_EQ(cache.pool().num_free(), 7);
  EXPECT_FALSE(cache.has_request(10));
  cache.add_request(30);
  EXPECT_EQ(cache.append(30, 1), (std::vector<int64_t>{0}));  // lowest freed block again
}

TEST(PagedCache, RequestErrors) {
  PagedCache cache(spec_of(4, 2));
  cache.add_request(1);
  EXPECT_NE(error_of([&] { cache.add_request(1); }).find("already exists"), std::string::npos);
  EXPECT_NE(error_of([&] { cache.remove_request(2); }).find("unknown request 2"), std::string::npos);
  EXPECT_NE(error_of([&] { cache.append(2, 1); }).find("unknown request 2"), std::string::npos);
  EXPECT_NE(error_of([&] { cache.append(1, -1); }).find("count"), std::string::npos);
  EXPECT_THROW(cache.block_table(2), dsv4::Error);
  EXPECT_THROW(cache.slot_of(2, 0), dsv4::Error);
}

TEST(PagedCache, AppendIsAtomicWhenThePoolRunsOut) {
  PagedCache cache(spec_of(4, 3));
  cache.add_request(1);
  cache.add_request(2);
  cache.append(1, 6);  // blocks 0, 1
  const auto table_before = cache.block_table(1);
  const std::string err = error_of([&] { cache.append(1, 7); });  // needs 2 more, 1 free
  EXPECT_NE(err.find("exhausted"), std::string::npos) << err;
  EXPECT_EQ(cache.num_entries(1), 6);
  EXPECT_EQ(cache.block_table(1), table_before);
  EXPECT_EQ(cache.pool().num_free(), 1);
  EXPECT_EQ(cache.append(2, 4), (std::vector<int64_t>{8, 9, 10, 11}));  // the free block still usable
}

TEST(PagedCache, SwaRetainRecyclesOldBlocksAndKeepsTheWindow) {
  // W = 6 retained entries, blocks of 4: decoding one token at a time, a request never holds
  // more than 3 blocks (entries e0-6 .. e0 span at most 3 blocks), so 3 blocks serve it forever.
  constexpr int kW = 6, kB = 4;
  PagedCache cache(spec_of(kB, 3, kW));
  cache.add_request(0);
  std::set<int64_t> used_slots;
  for (int64_t step = 0; step < 1000; ++step) {
    const auto slots = cache.append(0, 1);
    ASSERT_EQ(slots.size(), 1u);
    // Every entry of the newest token's window is still mapped, to distinct slots.
    const int64_t p = step;
    std::set<int64_t> window;
    for (int64_t q = std::max<int64_t>(0, p - kW + 1); q <= p; ++q) {
      const int64_t s = cache.slot_of(0, q);
      ASSERT_GE(s, 0) << "step " << step << " entry " << q;
      ASSERT_LT(s, 3 * kB);
      window.insert(s);
    }
    ASSERT_EQ(window.size(), static_cast<size_t>(std::min<int64_t>(kW, p + 1)));
    ASSERT_EQ(cache.slot_of(0, p), slots[0]);
    used_slots.insert(slots[0]);
  }
  // Old blocks were released (table entries -1) and reused.
  const auto& table = cache.block_table(0);
  EXPECT_EQ(table.size(), 250u);
  EXPECT_EQ(table[0], -1);
  EXPECT_EQ(cache.slot_of(0, 0), -1);
  EXPECT_EQ(used_slots.size(), 12u);
  cache.remove_request(0);  // frees only the live blocks (no double free of released ones)
  EXPECT_EQ(cache.pool().num_free(), 3);
}

TEST(PagedCache, ReleaseHappensBeforeAllocationInOneAppend) {
  // Pool of 2 blocks of 4, retain 4: after 8 entries, appending 1 more releases block 0
  // (entries 0..3 < 8 - 4) and reuses it for entry 8.
  PagedCache cache(spec_of(4, 2, 4));
  cache.add_request(0);
  cache.append(0, 8);
  EXPECT_EQ(cache.append(0, 1), (std::vector<int64_t>{0}));
  EXPECT_EQ(cache.block_table(0), (std::vector<int32_t>{-1, 1, 0}));
}

TEST(PagedCache, AppendIntoSlotsMatchesTheVectorFormAndReleasesEveryOldBlock) {
  // Two caches, one fed through append(req, n) and one through append(req, n, slots), several
  // requests with random chunk sizes: same slots, tables and pool state throughout; and after
  // every append the released blocks are exactly those wholly older than entries - retain (counted
  // before the append), however the appends were chunked.
  constexpr int kB = 4, kRetain = 9, kBlocks = 64;
  PagedCache a(spec_of(kB, kBlocks, kRetain)), b(spec_of(kB, kBlocks, kRetain));
  std::mt19937 rng(7);
  std::vector<int64_t> entries(3, 0);
  for (int64_t r = 0; r < 3; ++r) {
    a.add_request(r);
    b.add_request(r);
  }
  for (int step = 0; step < 600; ++step) {
    const int64_t r = static_cast<int64_t>(rng() % 3);
    const int64_t n = rng() % 4 == 0 ? 1 + static_cast<int64_t>(rng() % 11) : 1;
    const std::vector<int64_t> want = a.append(r, n);
    std::vector<int64_t> got(static_cast<size_t>(n), -7);
    b.append(r, n, got.data());
    ASSERT_EQ(got, want) << "step " << step;
    ASSERT_EQ(a.block_table(r), b.block_table(r));
    ASSERT_EQ(a.pool().num_free(), b.pool().num_free());
    const int64_t before = entries[static_cast<size_t>(r)];
    entries[static_cast<size_t>(r)] += n;
    const int64_t released = before > kRetain ? (before - kRetain) / kB : 0;
    const auto& table = b.block_table(r);
    for (int64_t k = 0; k < static_cast<int64_t>(table.size()); ++k)
      ASSERT_EQ(table[static_cast<size_t>(k)] < 0, k < released) << "step " << step << " block " << k;
  }
  b.append(0, 3, nullptr);  // slots not wanted
  EXPECT_EQ(b.num_entries(0), entries[0] + 3);
  EXPECT_THROW(b.append(0, -1, nullptr), dsv4::Error);
}

TEST(PagedCache, SpecValidationAndViews) {
  EXPECT_THROW(PagedCache(spec_of(0, 4)), dsv4::Error);
  EXPECT_THROW(PagedCache(spec_of(4, -1)), dsv4::Error);
  CacheSpec wrong = spec_of(4, 4);
  wrong.block_bytes = 4 * 584;  // unpadded: not the MODEL1 geometry
  EXPECT_NE(error_of([&] { PagedCache c(wrong); }).find("block_bytes"), std::string::npos);
  CacheSpec raw = spec_of(8, 2, 0, std::nullopt);
  EXPECT_NE(error_of([&] { PagedCache c(raw); }).find("block_bytes"), std::string::npos);
  raw.block_bytes = 100;
  PagedCache plain(raw);
  EXPECT_NE(error_of([&] { plain.kv_view(); }).find("no KV layout"), std::string::npos);
  const auto sv = plain.storage_view();
  EXPECT_EQ(sv.dtype, dsv4::DType::uint8);
  EXPECT_EQ(sv.shape_str(), "[2, 100]");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(plain.storage()) % 64, 0u);
  EXPECT_THROW(PagedCache(spec_of(4, 4), nullptr, dsv4::Device::cuda), dsv4::Error);
}

TEST(PagedCache, KvViewWorksWithQuantize) {
  PagedCache cache(spec_of(4, 4));
  cache.add_request(0);
  const auto slots = cache.append(0, 6);
  dsv4::HostTensor values(dsv4::DType::fp32, {6, 512});
  for (int64_t i = 0; i < values.numel(); ++i) values.data<float>()[i] = 1.0f;
  dsv4::HostTensor slot_t(dsv4::DType::int64, {6});
  std::copy(slots.begin(), slots.end(), slot_t.data<int64_t>());
  dsv4::kv_quantize(cache.kv_view(), values, slot_t);
  dsv4::HostTensor out(dsv4::DType::fp32, {6, 512});
  dsv4::kv_dequantize(cache.kv_view(), slot_t, out);
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.data<float>()[i], 1.0f);
}

TEST(PackBlockTables, PadsWithMinusOne) {
  PagedCache cache(spec_of(4, 8));
  cache.add_request(1);
  cache.add_request(2);
  cache.add_request(3);
  cache.append(1, 9);  // blocks 0, 1, 2
  cache.append(2, 1);  // block 3
  const auto t = dsv4::pack_block_tables(cache, {2, 1, 3});
  ASSERT_EQ(t.shape(), (std::vector<int64_t>{3, 3}));
  const int32_t want[9] = {3, -1, -1, 0, 1, 2, -1, -1, -1};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(t.data<int32_t>()[i], want[i]) << i;
  EXPECT_THROW(dsv4::pack_block_tables(cache, {4}), dsv4::Error);
}

// ================================ LayerCaches ===============================================

TEST(LayerCaches, V4FlashDefaultsPerKind) {
  const auto cfg = dsv4::ModelConfig::builtin("v4-flash");
  const auto swa = dsv4::make_layer_caches(cfg, LayerKind::swa);
  ASSERT_TRUE(swa.swa);
  EXPECT_FALSE(swa.compressed || swa.compressor_state || swa.indexer_keys || swa.indexer_state);
  EXPECT_EQ(swa.swa->spec().block_size, 64);
  EXPECT_EQ(swa.swa->spec().block_bytes, 37440);
  EXPECT_EQ(swa.swa->spec().retain, 128);  // the window
  EXPECT_EQ(swa.swa->spec().num_blocks, 256);

  const auto c4 = dsv4::make_layer_caches(cfg, LayerKind::c4a);
  ASSERT_TRUE(c4.swa && c4.compressed && c4.compressor_state && c4.indexer_keys && c4.indexer_state);
  EXPECT_EQ(c4.compressed->spec().block_size, 64);  // 256-token logical block / 4
  EXPECT_EQ(c4.compressed->spec().block_bytes, 37440);
  EXPECT_EQ(c4.compressed->spec().retain, 0);
  // State rows: fp32 [kv 2x512 | score 2x512] = 8192 B; one 4-row window per block; keep 8 rows.
  EXPECT_EQ(c4.compressor_state->spec().block_size, 4);
  EXPECT_EQ(c4.compressor_state->spec().block_bytes, 4 * 8192);
  EXPECT_EQ(c4.compressor_state->spec().retain, 8);
  // Indexer keys: 64 entries x (128 fp8 + 4 B scale) = 8448 B.
  EXPECT_EQ(c4.indexer_keys->spec().block_size, 64);
  EXPECT_EQ(c4.indexer_keys->spec().block_bytes, 8448);
  // Indexer state: fp32 [kv 2x128 | score 2x128] = 2048 B per row.
  EXPECT_EQ(c4.indexer_state->spec().block_size, 4);
  EXPECT_EQ(c4.indexer_state->spec().block_bytes, 4 * 2048);
  EXPECT_EQ(c4.indexer_state->spec().retain, 8);

  const auto c128 = dsv4::make_layer_caches(cfg, LayerKind::c128a);
  ASSERT_TRUE(c128.swa && c128.compressed && c128.compressor_state);
  EXPECT_FALSE(c128.indexer_keys || c128.indexer_state);
  EXPECT_EQ(c128.compressed->spec().block_size, 2);        // 256 / 128
  EXPECT_EQ(c128.compressed->spec().block_bytes, 1728);    // 2 x 584 = 1168 → 3 x 576
  EXPECT_EQ(c128.compressor_state->spec().block_size, 128);
  EXPECT_EQ(c128.compressor_state->spec().block_bytes, 128 * 4096);  // [kv 512 | score 512] fp32
  EXPECT_EQ(c128.compressor_state->spec().retain, 128);
}

TEST(LayerCaches, RequestsSpanEveryCacheAndLayoutMustMatchTheHeadDim) {
  const auto tiny = dsv4::ModelConfig::builtin("tiny");
  dsv4::LayerCacheOptions opts;
  opts.swa_blocks = 8;
  opts.compressed_blocks = 4;
  opts.state_blocks = 4;
  auto lc = dsv4::make_layer_caches(tiny, LayerKind::c4a, opts);
  EXPECT_EQ(lc.swa->spec().retain, 16);
  lc.add_request(5);
  for (auto* c : {lc.swa.get(), lc.compressed.get(), lc.compressor_state.get(),
                  lc.indexer_keys.get(), lc.indexer_state.get()})
    EXPECT_TRUE(c->has_request(5)) << c->spec().name;
  lc.swa->append(5, 70);
  lc.remove_request(5);
  EXPECT_EQ(lc.swa->pool().num_free(), 8);
  EXPECT_FALSE(lc.compressed->has_request(5));

  const auto v32 = dsv4::ModelConfig::builtin("tiny-v3.2");
  const std::string err = error_of([&] { dsv4::make_layer_caches(v32, LayerKind::swa, opts); });
  EXPECT_NE(err.find("opts.layout"), std::string::npos) << err;
  opts.layout = KvLayout::v32_fp8;
  const auto ok = dsv4::make_layer_caches(v32, LayerKind::swa, opts);
  EXPECT_EQ(ok.swa->spec().block_bytes, 64 * 656);
  EXPECT_EQ(ok.swa->spec().retain, 0);  // no sliding window in v3.2: keep everything
}

// FP8_PER_TENSOR's two scales, the caches' (kv_scale, their tensor_scale) and the FP8 queries'
// (q_scale), must be finite and > 0, each error naming its option; other layouts ignore them.
TEST(LayerCaches, PerTensorScalesAreChecked) {
  const auto tiny = dsv4::ModelConfig::builtin("tiny");
  dsv4::LayerCacheOptions opts;
  opts.swa_blocks = opts.compressed_blocks = opts.state_blocks = 4;
  opts.layout = KvLayout::fp8_per_tensor;
  opts.kv_scale = 0.7f;
  opts.q_scale = 0.6f;
  const auto ok = dsv4::make_layer_caches(tiny, LayerKind::c128a, opts);
  EXPECT_EQ(ok.swa->kv_view().tensor_scale, 0.7f);
  EXPECT_EQ(ok.compressed->kv_view().tensor_scale, 0.7f);
  for (const float bad : {0.0f, -1.0f, INFINITY, NAN}) {
    SCOPED_TRACE(bad);
    dsv4::LayerCacheOptions k = opts, q = opts;
    k.kv_scale = bad;
    q.q_scale = bad;
    EXPECT_NE(error_of([&] { dsv4::make_layer_caches(tiny, LayerKind::swa, k); }).find("opts.kv_scale"),
              std::string::npos);
    EXPECT_NE(error_of([&] { dsv4::make_layer_caches(tiny, LayerKind::swa, q); }).find("opts.q_scale"),
              std::string::npos);
    q.layout = KvLayout::model1_fp8;  // no FP8 queries: the scale is not read
    EXPECT_NO_THROW(dsv4::make_layer_caches(tiny, LayerKind::swa, q));
  }
}

}  // namespace
