// `dsv4 run`'s cache pools (tools/dsv4/kv_pools.h): sizing from a workload within a budget,
// --kv-memory values, and the live view the scheduler plans with, which must predict exactly
// what the layers' own pre-step check accepts.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "dsv4/model.h"
#include "dsv4/status.h"
#include "kv_pools.h"

namespace {

using dsv4::cli::KvPoolSizes;
using dsv4::cli::KvWorkload;
using dsv4::cli::parse_memory_size;
using dsv4::cli::size_kv_pools;

const std::vector<int> kTinyLayers = {0, 1, 2, 3};  // SWA, C4A, C128A, C4A

int64_t pool_bytes(const dsv4::ModelConfig& cfg, const std::vector<int>& layers, const KvPoolSizes& s) {
  dsv4::LayerCacheOptions o;
  o.swa_blocks = s.swa_blocks;
  o.compressed_blocks = s.compressed_blocks;
  o.state_blocks = s.state_blocks;
  int64_t bytes = 0;
  for (int l : layers) {
    const dsv4::LayerCaches lc = dsv4::make_layer_caches(cfg, cfg.layer_kind(l), o);
    for (const dsv4::PagedCache* c : {lc.swa.get(), lc.compressed.get(), lc.compressor_state.get(),
                                      lc.indexer_keys.get(), lc.indexer_state.get()})
      if (c) bytes += int64_t{c->pool().num_blocks()} * c->spec().block_bytes;
  }
  return bytes;
}

TEST(KvPools, RoomyBudgetHoldsEveryRequestAndCostsWhatTheCachesAllocate) {
  const auto cfg = dsv4::ModelConfig::builtin("tiny");
  const KvWorkload w{{150, 40, 90, 1024}, 16, 64};
  const KvPoolSizes s = size_kv_pools(cfg, kTinyLayers, {}, w, int64_t{1} << 40);
  EXPECT_EQ(s.resident_requests, 4);
  EXPECT_EQ(s.bytes, s.all_resident_bytes);
  EXPECT_EQ(s.bytes, pool_bytes(cfg, kTinyLayers, s));
  // SWA (window 16, blocks of 64): at most window + two chunks per request.
  EXPECT_EQ(s.swa_blocks, 3 + 1 + 2 + 5);
  // Compressed: the whole sequence, 256 positions per block (ratio 4: 64 entries; 128: 2).
  EXPECT_EQ(s.compressed_blocks, 1 + 1 + 1 + 5);
  // State rings: 2 blocks per request (C4A: 8 rows in blocks of 4).
  EXPECT_EQ(s.state_blocks, 8);
  EXPECT_LT(s.one_request_bytes, s.all_resident_bytes);
}

TEST(KvPools, TightBudgetSharesPoolsAndNeverExceedsIt) {
  const auto cfg = dsv4::ModelConfig::builtin("tiny");
  const KvWorkload w{std::vector<int64_t>(64, 1024), 16, 8192};
  const KvPoolSizes all = size_kv_pools(cfg, kTinyLayers, {}, w, int64_t{1} << 40);
  for (int64_t budget : {all.one_request_bytes, all.one_request_bytes + 1, all.all_resident_bytes / 3,
                         all.all_resident_bytes - 1}) {
    const KvPoolSizes s = size_kv_pools(cfg, kTinyLayers, {}, w, budget);
    EXPECT_LE(s.bytes, budget);
    EXPECT_EQ(s.bytes, pool_bytes(cfg, kTinyLayers, s));
    EXPECT_GE(s.resident_requests, 1);
    EXPECT_LT(s.resident_requests, 64);
  }
  try {
    size_kv_pools(cfg, kTinyLayers, {}, w, all.one_request_bytes - 1);
    FAIL() << "expected dsv4::Error";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-memory"), std::string::npos) << e.what();
  }
}

TEST(KvPools, SwaOnlyStackNeedsNoCompressedBytes) {
  const auto cfg = dsv4::ModelConfig::builtin("tiny");
  const KvPoolSizes s = size_kv_pools(cfg, {0}, {}, {{300}, 4, 128}, int64_t{1} << 30);
  EXPECT_EQ(s.bytes, pool_bytes(cfg, {0}, s));
  dsv4::LayerCacheOptions o;
  o.swa_blocks = s.swa_blocks;
  EXPECT_EQ(s.bytes, int64_t{s.swa_blocks} * dsv4::make_layer_caches(cfg, dsv4::LayerKind::swa, o).swa->spec().block_bytes);
}

TEST(KvPools, MemorySizes) {
  EXPECT_EQ(parse_memory_size("kv-memory", "8G", 0), int64_t{8} << 30);
  EXPECT_EQ(parse_memory_size("kv-memory", "512M", 0), int64_t{512} << 20);
  EXPECT_EQ(parse_memory_size("kv-memory", "1.5GiB", 0), int64_t{3} << 29);
  EXPECT_EQ(parse_memory_size("kv-memory", "64KB", 0), int64_t{64} << 10);
  EXPECT_EQ(parse_memory_size("kv-memory", "2T", 0), int64_t{2} << 40);
  EXPECT_EQ(parse_memory_size("kv-memory", "1073741824", 0), int64_t{1} << 30);
  EXPECT_EQ(parse_memory_size("kv-memory", "40%", 1000), 400);
  EXPECT_EQ(parse_memory_size("kv-memory", "100%", 1000), 1000);
  for (const char* bad : {"", "abc", "0", "-1G", "12X", "G", "150%", "0%", "1e30", "nan", "inf", "8 G", "4GG"}) {
    try {
      parse_memory_size("kv-memory", bad, 1000);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const dsv4::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-memory"), std::string::npos) << bad << ": " << e.what();
    }
  }
  EXPECT_EQ(dsv4::cli::format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(dsv4::cli::format_bytes(100), "100 B");
}

// The scheduler's view of a stack's pools predicts, for random steps, exactly whether every
// layer's check_plan accepts the step; releasing a request returns the blocks it held.
TEST(KvPools, StackCapacityPredictsTheLayersCheck) {
  const auto cfg = dsv4::ModelConfig::builtin("tiny");
  dsv4::StackOptions so;
  so.attention.caches.swa_blocks = 7;
  so.attention.caches.compressed_blocks = 3;
  so.attention.caches.state_blocks = 7;
  dsv4::AttentionStack stack(cfg, so);
  const dsv4::cli::StackKvCapacity kv(stack);
  ASSERT_EQ(kv.num_pools(), 1 + 3 + 5 + 5);
  std::mt19937 rng(7);
  std::map<int64_t, int64_t> cached;  // request -> tokens the layers hold
  int accepted = 0, refused = 0;
  for (int iter = 0; iter < 60; ++iter) {
    if (iter % 9 == 8 && !cached.empty()) {  // release one
      auto it = std::next(cached.begin(), static_cast<long>(rng() % cached.size()));
      std::vector<int64_t> expect_free;
      for (int p = 0; p < kv.num_pools(); ++p) expect_free.push_back(kv.free_blocks(p) + kv.held_blocks(p, it->first));
      stack.release(it->first);
      for (int p = 0; p < kv.num_pools(); ++p) EXPECT_EQ(kv.free_blocks(p), expect_free[p]) << kv.pool_name(p);
      for (int p = 0; p < kv.num_pools(); ++p) EXPECT_EQ(kv.held_blocks(p, it->first), 0);
      cached.erase(it);
      continue;
    }
    std::vector<dsv4::RequestStep> steps;
    const int n_req = 1 + static_cast<int>(rng() % 3);
    for (int64_t id = rng() % 6; static_cast<int>(steps.size()) < n_req && id < 6; id += 1 + rng() % 2) {
      const int64_t ctx = cached.count(id) ? cached[id] : 0;
      steps.push_back({id, ctx, rng() % 4 == 0 ? 1 : 1 + static_cast<int64_t>(rng() % 90)});
    }
    if (steps.empty()) continue;
    bool predicted = true;
    for (int p = 0; p < kv.num_pools(); ++p) {
      int64_t need = 0;
      for (const auto& s : steps) need += kv.step_blocks(p, s.context, s.num_new);
      predicted &= need <= kv.free_blocks(p);
    }
    const dsv4::BatchPlan plan = dsv4::BatchPlan::make(steps);
    bool actual = true;
    try {
      for (int l = 0; l < stack.num_layers(); ++l) stack.layer(l).check_plan(plan);
    } catch (const dsv4::Error& e) {
      actual = false;
      EXPECT_NE(std::string(e.what()).find("exhausted"), std::string::npos) << e.what();
    }
    EXPECT_EQ(predicted, actual) << "iteration " << iter;
    if (!actual) {
      ++refused;
      continue;
    }
    ++accepted;
    dsv4::HostTensor x(dsv4::DType::fp32, {plan.num_tokens(), cfg.dim}), y(dsv4::DType::fp32, {plan.num_tokens(), cfg.dim});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 7) - 3.0f;
    stack.forward(plan, x, y);
    for (const auto& s : steps) cached[s.req_id] = s.context + s.num_new;
  }
  // Both outcomes occurred, so the comparison above means something.
  EXPECT_GT(accepted, 10);
  EXPECT_GT(refused, 5);
}

}  // namespace
