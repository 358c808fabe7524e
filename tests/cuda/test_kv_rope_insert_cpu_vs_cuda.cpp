// kv_rope_insert on the V32_FP8 layout (the DeepSeek-V3.2 layer's cache write): the CUDA path
// against the CPU reference through the public API, on identical inputs. Tolerance: none — kv and
// the cache bytes must be byte-identical (both run qnorm_rope_kv_insert's shared DSV4_HD encode;
// see test_kv_insert_gather_cpu_vs_cuda.cpp). Also slot -1, int32 / int64 indices, block sizes
// 64 and 3, and a strided kv (rows wider than the token). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/dense_test_support.h"
#include "cpu_vs_cuda_util.h"
#include "dsv4/config.h"
#include "dsv4/kv_rope_insert.h"
#include "gpu_test_util.h"

namespace {

using dsv4::DType;
using dsv4::HostTensor;
using dsv4::KvCacheView;
using dsv4::KvLayout;
using dsv4::TensorView;
using dsv4::test::expect_bytes_equal;
using dsv4::test::same_view_on_device;
using dsv4::test::Twin;

struct Case {
  int64_t T;
  int block_size;
  DType index_dt;
  int64_t row_pad;  // kv rows this many elements wider than the token
};

class KvRopeInsertCpuVsCuda : public ::testing::TestWithParam<Case> {};

TEST_P(KvRopeInsertCpuVsCuda, BitIdenticalOnV32Fp8) {
  DSV4_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const int64_t D = dsv4::v32::kDim, num_blocks = 4, num_slots = num_blocks * c.block_size;
  HostTensor kv_rows = dense_test::random_tensor(DType::bf16, {c.T, D + c.row_pad}, 11);
  for (int64_t t = 0; t < c.T; ++t)  // token magnitudes 2^-6 .. 2^6: the UE8M0 scales differ
    for (int64_t i = 0; i < D; ++i)
      kv_rows.set(t * (D + c.row_pad) + i,
                  std::ldexp(kv_rows.get(t * (D + c.row_pad) + i), static_cast<int>((t * 5) % 13) - 6));
  HostTensor positions(c.index_dt, {c.T}), slots(c.index_dt, {c.T});
  std::mt19937 rng(7);
  std::vector<int64_t> perm(static_cast<size_t>(num_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int64_t max_pos = 163840;
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t p = t == 0 ? 0 : t == 1 ? max_pos - 1 : static_cast<int64_t>(rng() % max_pos);
    const int64_t s = t == 2 || t >= num_slots ? -1 : perm[static_cast<size_t>(t)];
    if (c.index_dt == DType::int64) {
      positions.data<int64_t>()[t] = p;
      slots.data<int64_t>()[t] = s;
    } else {
      positions.data<int32_t>()[t] = static_cast<int32_t>(p);
      slots.data<int32_t>()[t] = static_cast<int32_t>(s);
    }
  }
  HostTensor cache(DType::uint8, {num_blocks, int64_t{c.block_size} * dsv4::v32::kTokenBytes});
  for (int64_t i = 0; i < cache.numel(); ++i) cache.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
  const HostTensor table =
      dsv4::build_rope_cache(dsv4::ModelConfig::builtin("v3.2").rope_for_layer(0), max_pos);

  Twin kv_twin = Twin::of(HostTensor::copy_of(kv_rows)), cache_twin = Twin::of(HostTensor::copy_of(cache));
  Twin pos_twin = Twin::of(positions), slot_twin = Twin::of(slots), table_twin = Twin::of(table);
  TensorView kv_host = kv_twin.host.view();
  kv_host.shape[1] = D;  // the token's columns of the (possibly wider) rows
  const KvCacheView host_cache{cache_twin.host, KvLayout::v32_fp8, c.block_size};
  KvCacheView dev_cache = host_cache;
  dev_cache.data = cache_twin.dev.view();

  dsv4::kv_rope_insert(kv_host, positions, table, host_cache, slots);
  dsv4::kv_rope_insert(same_view_on_device(kv_twin, kv_host), pos_twin.dev, table_twin.dev, dev_cache,
                       slot_twin.dev);
  expect_bytes_equal("kv", kv_twin.host, kv_twin.dev_bytes());
  expect_bytes_equal("cache", cache_twin.host, cache_twin.dev_bytes());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, KvRopeInsertCpuVsCuda,
    ::testing::Values(Case{1, 64, DType::int64, 0}, Case{37, 64, DType::int32, 0},
                      Case{300, 3, DType::int64, 0}, Case{9, 64, DType::int32, 8}));

}  // namespace
