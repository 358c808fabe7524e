// The V3.2 indexer's row steps (sparse_mla_indexer.h) on CUDA against the CPU reference on the same
// inputs: query codes, scales and scaled head weights, and the key cache's bytes after an insert,
// bit for bit (both
// sides run the same fp32 operations in the same order: NeoX RoPE, the Hadamard butterflies,
// the FP8 quantizer, and the keys' LayerNorm with sequential sums). Also the CUDA handling of
// the index values the host cannot check: positions outside the table and slots -1 / outside the
// cache. Outputs poisoned on both sides; skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/compressor_test_support.h"
#include "cuda/cpu_vs_cuda_util.h"
#include "cuda/gpu_test_util.h"
#include "dsv4/device_tensor.h"
#include "dsv4/ops.h"
#include "dsv4/sparse_mla_indexer.h"

namespace dsv4 {
namespace {

using test::Rng;
using test::Twin;
constexpr int kDim = 128;
constexpr int64_t kMaxPos = 5000;

HostTensor random_rows(DType dt, std::vector<int64_t> dims, uint64_t seed) {
  Rng rng(seed);
  HostTensor f(DType::fp32, dims);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = static_cast<float>(rng.nonzero(0.05, 4.0));
  if (dt == DType::fp32) return f;
  HostTensor out(dt, dims);
  for (int64_t i = 0; i < f.numel(); ++i) out.set(i, f.get(i));
  return out;
}

HostTensor positions_of(DType dt, int64_t T, uint64_t seed) {
  Rng rng(seed);
  HostTensor pos(dt, {T});
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = t == 0 ? 0 : t == 1 ? kMaxPos - 1 : rng.integer(0, kMaxPos - 1);
    if (dt == DType::int64) pos.data<int64_t>()[t] = p;
    else pos.data<int32_t>()[t] = static_cast<int32_t>(p);
  }
  return pos;
}

// The V3.2 rope table (theta 10000, YaRN factor 40 over 4096, 64 dims) or a narrower one.
HostTensor rope_table(int R) {
  RopeConfig rope = ModelConfig::builtin("v3.2").rope_for_layer(0);
  rope.rope_dims = R;
  return build_rope_cache(rope, kMaxPos);
}

struct QueryCase {
  int64_t T, n;
  int R;
  DType x, pos;
};

class SparseMlaQueriesCpuVsCuda : public ::testing::TestWithParam<QueryCase> {};

TEST_P(SparseMlaQueriesCpuVsCuda, SameCodesAndScales) {
  DSV4_SKIP_WITHOUT_GPU();
  const QueryCase c = GetParam();
  // x as a window of wider rows (row strides), as the projection's output would be.
  const Twin wide = Twin::of(random_rows(c.x, {c.T, c.n, kDim + 32}, 11 + c.T));
  TensorView x = wide.host.view();
  x.shape[2] = kDim;
  const Twin pos = Twin::of(positions_of(c.pos, c.T, 12 + c.T));
  const Twin table = Twin::of(rope_table(c.R));
  Twin codes = Twin::poisoned(DType::fp8_e4m3, {c.T, c.n, kDim});
  Twin scales = Twin::poisoned(DType::fp32, {c.T, c.n});
  Twin weights = Twin::of(random_rows(DType::fp32, {c.T, c.n}, 13 + c.T));  // scaled in place
  sparse_mla_indexer_quantize(x, pos.host, table.host, codes.host, scales.host, weights.host, nullptr);
  sparse_mla_indexer_quantize(test::same_view_on_device(wide, x), pos.dev, table.dev, codes.dev,
                              scales.dev, weights.dev, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  test::expect_bytes_equal("codes", codes.host, codes.dev_bytes());
  test::expect_bytes_equal("scales", scales.host, scales.dev_bytes());
  test::expect_bytes_equal("weights", weights.host, weights.dev_bytes());
}

INSTANTIATE_TEST_SUITE_P(Grid, SparseMlaQueriesCpuVsCuda,
                         ::testing::Values(QueryCase{1, 64, 64, DType::bf16, DType::int64},
                                           QueryCase{37, 64, 64, DType::fp32, DType::int32},
                                           QueryCase{5, 3, 6, DType::bf16, DType::int64},     // R 6: pairs across lanes
                                           QueryCase{9, 2, 128, DType::fp32, DType::int64},   // R = d
                                           QueryCase{0, 64, 64, DType::bf16, DType::int64}),
                         [](const auto& info) {
                           const QueryCase& c = info.param;
                           return "T" + std::to_string(c.T) + "_n" + std::to_string(c.n) + "_R" +
                                  std::to_string(c.R) + "_" + std::string(dtype_name(c.x));
                         });

// A position outside the table: the CPU refuses it; CUDA writes zero codes and a NaN scale for
// that row and the other rows as usual.
TEST(SparseMlaQueriesCuda, PositionOutsideTheTable) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 3, n = 2;
  const Twin x = Twin::of(random_rows(DType::bf16, {T, n, kDim}, 21));
  HostTensor pos_h = positions_of(DType::int64, T, 22);
  pos_h.data<int64_t>()[1] = kMaxPos;  // one past the table
  const Twin pos = Twin::of(pos_h);
  const Twin table = Twin::of(rope_table(64));
  Twin codes = Twin::poisoned(DType::fp8_e4m3, {T, n, kDim});
  Twin scales = Twin::poisoned(DType::fp32, {T, n});
  EXPECT_THROW(sparse_mla_indexer_quantize(x.host, pos.host, table.host, codes.host, scales.host), Error);
  sparse_mla_indexer_quantize(x.dev, pos.dev, table.dev, codes.dev, scales.dev);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor got_codes = codes.dev_bytes(), got_scales = scales.dev_bytes();
  for (int64_t h = 0; h < n; ++h) {
    EXPECT_TRUE(std::isnan(got_scales.data<float>()[1 * n + h]));
    for (int d = 0; d < kDim; ++d) EXPECT_EQ(got_codes.data<uint8_t>()[(1 * n + h) * kDim + d], 0);
  }
  // The other rows: the CPU's values for the same rows alone.
  HostTensor pos_ok = pos_h;
  pos_ok.data<int64_t>()[1] = 0;
  HostTensor want_codes(DType::fp8_e4m3, {T, n, kDim}), want_scales(DType::fp32, {T, n});
  sparse_mla_indexer_quantize(x.host, pos_ok, table.host, want_codes, want_scales);
  for (int64_t t : {int64_t{0}, int64_t{2}})
    for (int64_t h = 0; h < n; ++h) {
      EXPECT_EQ(got_scales.data<float>()[t * n + h], want_scales.data<float>()[t * n + h]);
      for (int d = 0; d < kDim; ++d)
        EXPECT_EQ(got_codes.data<uint8_t>()[(t * n + h) * kDim + d], want_codes.data<uint8_t>()[(t * n + h) * kDim + d]);
    }
}

struct KeyCase {
  int64_t T;
  int block_size, R;
  DType k, norm;
  int64_t pad;  // bytes of padding after each cache block
};

class SparseMlaKeysCpuVsCuda : public ::testing::TestWithParam<KeyCase> {};

// Keys through LayerNorm, RoPE, Hadamard and FP8 into a cache of random bytes at permuted slots
// (one token at -1): every byte of the cache equals the CPU's afterwards.
TEST_P(SparseMlaKeysCpuVsCuda, SameCacheBytes) {
  DSV4_SKIP_WITHOUT_GPU();
  const KeyCase c = GetParam();
  const Twin k = Twin::of(random_rows(c.k, {c.T, kDim}, 31 + c.T));
  const Twin w = Twin::of(random_rows(c.norm, {kDim}, 32));
  const Twin b = Twin::of(random_rows(c.norm, {kDim}, 33));
  const Twin pos = Twin::of(positions_of(DType::int64, c.T, 34));
  const Twin table = Twin::of(rope_table(c.R));
  const int64_t blocks = (c.T + c.block_size) / c.block_size + 1;
  const int64_t block_bytes = c.block_size * (kDim + 4);
  HostTensor cache_h(DType::uint8, {blocks, block_bytes + c.pad});
  std::mt19937 rng(35);
  for (int64_t i = 0; i < cache_h.numel(); ++i) cache_h.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
  std::vector<int64_t> perm(static_cast<size_t>(blocks * c.block_size));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  HostTensor slots_h(DType::int32, {c.T});
  for (int64_t t = 0; t < c.T; ++t) slots_h.data<int32_t>()[t] = t == 2 ? -1 : static_cast<int32_t>(perm[static_cast<size_t>(t)]);
  const Twin slots = Twin::of(slots_h);
  Twin cache = Twin::of(cache_h);
  TensorView cache_view = cache.host.view();
  cache_view.shape[1] = block_bytes;  // the block stride stays block_bytes + pad
  sparse_mla_indexer_key_insert(k.host, w.host, b.host, 1e-6f, pos.host, table.host,
                                IndexerKeyCacheView{cache_view, c.block_size}, slots.host);
  sparse_mla_indexer_key_insert(k.dev, w.dev, b.dev, 1e-6f, pos.dev, table.dev,
                                IndexerKeyCacheView{test::same_view_on_device(cache, cache_view), c.block_size},
                                slots.dev);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  test::expect_bytes_equal("key cache", cache.host, cache.dev_bytes());
}

INSTANTIATE_TEST_SUITE_P(Grid, SparseMlaKeysCpuVsCuda,
                         ::testing::Values(KeyCase{5, 4, 64, DType::fp32, DType::fp32, 0},
                                           KeyCase{70, 64, 64, DType::bf16, DType::bf16, 16},
                                           KeyCase{9, 3, 6, DType::bf16, DType::fp32, 4},
                                           KeyCase{1, 64, 64, DType::bf16, DType::bf16, 0}),
                         [](const auto& info) {
                           const KeyCase& c = info.param;
                           return "T" + std::to_string(c.T) + "_block" + std::to_string(c.block_size) + "_R" +
                                  std::to_string(c.R) + "_" + std::string(dtype_name(c.k)) + "_pad" + std::to_string(c.pad);
                         });

// Slots the host cannot check (outside the cache) and a position outside the table: those keys
// are not stored on CUDA, the others are, and no other byte changes.
TEST(SparseMlaKeysCuda, UnstorableKeysAreSkipped) {
  DSV4_SKIP_WITHOUT_GPU();
  const int64_t T = 4;
  const int block_size = 4;
  const Twin k = Twin::of(random_rows(DType::bf16, {T, kDim}, 41));
  const Twin w = Twin::of(random_rows(DType::bf16, {kDim}, 42));
  const Twin b = Twin::of(random_rows(DType::bf16, {kDim}, 43));
  HostTensor pos_h = positions_of(DType::int64, T, 44);
  pos_h.data<int64_t>()[3] = kMaxPos + 5;
  const Twin pos = Twin::of(pos_h);
  const Twin table = Twin::of(rope_table(64));
  HostTensor slots_h(DType::int64, {T});
  const int64_t slot_values[T] = {1, 2 * block_size + 7, 5, 6};  // 2 blocks: 15 is outside
  for (int64_t t = 0; t < T; ++t) slots_h.data<int64_t>()[t] = slot_values[t];
  const Twin slots = Twin::of(slots_h);
  Twin cache = Twin::poisoned(DType::uint8, {2, block_size * (kDim + 4)}, 0xA5);
  sparse_mla_indexer_key_insert(k.dev, w.dev, b.dev, 1e-6f, pos.dev, table.dev,
                                IndexerKeyCacheView{cache.dev, block_size}, slots.dev);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The CPU with the storable keys only (token 1's slot and token 3's position made harmless).
  HostTensor slots_ok = slots_h;
  slots_ok.data<int64_t>()[1] = -1;
  slots_ok.data<int64_t>()[3] = -1;
  HostTensor pos_ok = pos_h;
  pos_ok.data<int64_t>()[3] = 0;
  sparse_mla_indexer_key_insert(k.host, w.host, b.host, 1e-6f, pos_ok, table.host,
                                IndexerKeyCacheView{cache.host, block_size}, slots_ok);
  test::expect_bytes_equal("key cache", cache.host, cache.dev_bytes());
}

}  // namespace
}  // namespace dsv4
