// Shared helpers for the GPU tests (tests/cuda/*): skip without a device, RAII device buffers,
// random bf16 data, poisoning and copies back to the host.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/dtype.h"
#include "dsv4/tensor.h"

namespace dsv4::test {

inline int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
inline bool has_gpu() { return gpu_count() > 0; }

// Use first in every GPU test: reports the test as skipped (not passed) on machines without a GPU.
#define DSV4_SKIP_WITHOUT_GPU() \
  do {                          \
    if (!::dsv4::test::has_gpu()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// Use first in a multi-GPU test: skipped, naming both counts, with fewer than `n` GPUs visible.
#define DSV4_SKIP_WITHOUT_GPUS(n)                                                                  \
  do {                                                                                             \
    if (::dsv4::test::gpu_count() < (n))                                                           \
      GTEST_SKIP() << "needs " << (n) << " GPUs, " << ::dsv4::test::gpu_count() << " visible";    \
  } while (0)

#define DSV4_ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// Owning device allocation of `count` elements of T, freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ > 0 && cudaMalloc(&ptr_, count_ * sizeof(T)) != cudaSuccess) {
      ptr_ = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << count_ * sizeof(T) << " bytes failed";
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept { swap(o); return *this; }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }

  T* data() const { return static_cast<T*>(ptr_); }
  size_t size() const { return count_; }
  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), count_);
    ASSERT_EQ(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  // Every byte set to `byte` (0xFF makes bf16/fp32 NaN: unwritten outputs show up).
  void poison(uint8_t byte = 0xFF) {
    ASSERT_EQ(cudaMemset(ptr_, byte, count_ * sizeof(T)), cudaSuccess);
  }
  // Contiguous view with the given dims on the device.
  TensorView view(DType dtype, std::initializer_list<int64_t> dims) const {
    return TensorView(ptr_, dtype, dims, Device::cuda);
  }

 private:
  void swap(DeviceBuffer& o) { std::swap(ptr_, o.ptr_); std::swap(count_, o.count_); }
  void* ptr_ = nullptr;
  size_t count_ = 0;
};

// n bf16 values uniform in [lo, hi) (as raw bits), never exactly zero.
inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    float f = dist(rng);
    if (f == 0.f) f = 1e-3f;
    x = float_to_bf16_bits(f);
  }
  return v;
}

inline std::vector<float> random_f32(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A device tensor filled with 0xFF bytes (NaN in bf16 / fp32): what a kernel leaves unwritten fails.
inline DeviceTensor poisoned_device(DType dt, std::vector<int64_t> dims) {
  DeviceTensor d(dt, std::move(dims));
  d.fill_bytes(0xFF);
  return d;
}
// Waits for the op's kernels (so an asynchronous fault fails here) and copies the result back.
inline HostTensor synced_to_host(const DeviceTensor& d) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d.to_host();
}

inline double bf16_value(uint16_t bits) { return static_cast<double>(bf16_bits_to_float(bits)); }

inline bool bitwise_equal(const void* a, const void* b, size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}

}  // namespace dsv4::test
