// Issue 21's overlap and overflow cases on CUDA tensors: the checks live in each op's front door,
// shared by both backends, so a CUDA call with an index input inside memory the kernel writes
// (which would read indices the kernel is overwriting) is refused before anything is launched.
// Each test compares the device buffers, copied back, with their state before the call.
// (The CPU side of every item: tests/cpu/test_hostile_inputs.cpp.)
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/indexing.h"
#include "dsv4/kv_layout.h"
#include "dsv4/ops.h"
#include "gpu_test_util.h"

namespace {

using dsv4::DeviceTensor;
using dsv4::DType;
using dsv4::HostTensor;
using dsv4::TensorView;

std::vector<uint8_t> bytes_of(const DeviceTensor& t) {
  const HostTensor h = t.to_host();
  return std::vector<uint8_t>(h.data<uint8_t>(), h.data<uint8_t>() + h.nbytes());
}

// `call` must throw dsv4::Error containing `part`, and leave every buffer in `written` unchanged.
void expect_rejected(const std::function<void()>& call, const std::string& part,
                     std::initializer_list<const DeviceTensor*> written) {
  std::vector<std::vector<uint8_t>> before;
  for (const DeviceTensor* t : written) before.push_back(bytes_of(*t));
  try {
    call();
    ADD_FAILURE() << "expected dsv4::Error containing '" << part << "'";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  size_t i = 0;
  for (const DeviceTensor* t : written) EXPECT_EQ(bytes_of(*t), before[i++]) << "buffer " << i - 1;
}

// A device view of `t`'s memory from byte `offset` on (contiguous).
TensorView view_into(const DeviceTensor& t, int64_t offset, DType dtype, std::vector<int64_t> dims) {
  return TensorView(t.data<uint8_t>() + offset, dtype, dims, dsv4::Device::cuda);
}

DeviceTensor zeros(DType dtype, std::vector<int64_t> dims) {
  DeviceTensor t(dtype, std::move(dims));
  t.fill_bytes(0);
  return t;
}

constexpr int64_t kBlockBytes = 1152;  // MODEL1_FP8 at block size 1

TEST(HostileInputsCuda, ApplyRopePositionsOrTableInsideY) {
  DSV4_SKIP_WITHOUT_GPU();
  const DeviceTensor x = zeros(DType::fp32, {64, 512});
  DeviceTensor y = zeros(DType::fp32, {64, 512});
  const DeviceTensor table = DeviceTensor::from_host(dsv4::build_rope_cache(dsv4::RopeConfig{}, 1));
  const TensorView p = view_into(y, 0, DType::int64, {64});
  expect_rejected([&] { dsv4::apply_rope(x, p, table, false, y); },
                  "apply_rope: y: expected memory disjoint from positions", {&y});
  const DeviceTensor positions = zeros(DType::int64, {64});
  const TensorView table_in_y = view_into(y, 4096, DType::fp32, {1, 64});
  expect_rejected([&] { dsv4::apply_rope(x, positions, table_in_y, false, y); },
                  "apply_rope: y: expected memory disjoint from cos_sin", {&y});
}

TEST(HostileInputsCuda, InsertIndicesInsideWrittenMemory) {
  DSV4_SKIP_WITHOUT_GPU();
  DeviceTensor q = zeros(DType::bf16, {64, 1, 512}), kv = zeros(DType::bf16, {64, 512});
  DeviceTensor cache = zeros(DType::uint8, {16, kBlockBytes});
  const DeviceTensor positions = zeros(DType::int64, {64});
  const DeviceTensor table = DeviceTensor::from_host(dsv4::build_rope_cache(dsv4::RopeConfig{}, 64));
  std::vector<int64_t> slot_values(64, -1);
  slot_values[0] = 1;
  HostTensor host_slots(DType::int64, {64});
  std::memcpy(host_slots.data<int64_t>(), slot_values.data(), 64 * sizeof(int64_t));
  const DeviceTensor slots = DeviceTensor::from_host(host_slots);
  const dsv4::KvCacheView view{cache.view(), dsv4::KvLayout::model1_fp8, 1, 1.0f};

  const TensorView slots_in_cache = view_into(cache, kBlockBytes, DType::int64, {64});
  dsv4::copy_to_device(host_slots, slots_in_cache);
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(q, kv, positions, table, 1e-6f, view, slots_in_cache); },
                  "qnorm_rope_kv_insert: cache.data: expected memory disjoint from slot_mapping",
                  {&q, &kv, &cache});
  const TensorView positions_in_q = view_into(q, 0, DType::int64, {64});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(q, kv, positions_in_q, table, 1e-6f, view, slots); },
                  "qnorm_rope_kv_insert: q: expected memory disjoint from positions", {&q, &kv, &cache});
  const TensorView table_in_cache = view_into(cache, 0, DType::fp32, {64, 64});
  expect_rejected([&] { dsv4::qnorm_rope_kv_insert(q, kv, positions, table_in_cache, 1e-6f, view, slots); },
                  "qnorm_rope_kv_insert: cache.data: expected memory disjoint from cos_sin",
                  {&q, &kv, &cache});
}

TEST(HostileInputsCuda, CombineTopkSwaRowsOverflow) {
  DSV4_SKIP_WITHOUT_GPU();
  const DeviceTensor qsl = DeviceTensor::from_host(HostTensor::from_int32({0, 1, 2, 3, 4}));
  const DeviceTensor seq = DeviceTensor::from_host(HostTensor::from_int32({1, 1, 1, 1}));
  const DeviceTensor gather = DeviceTensor::from_host(HostTensor::from_int32({1, 1, 1, 1}));
  DeviceTensor out = zeros(DType::int32, {4, 1}), lens = zeros(DType::int32, {4});
  expect_rejected(
      [&] { dsv4::combine_topk_swa_indices({}, qsl, seq, gather, 1, 0, int64_t{1} << 62, 0, out, lens); },
      "combine_topk_swa_indices: rows_per_request", {&out, &lens});
}

}  // namespace
