#include "cuda/common/device_props.h"

#include <cuda_runtime.h>

#include <atomic>

#include "cuda/common/check.h"

namespace dsv4::cuda {
namespace {

// Attribute `Attr` of the current device, cached per device (per attribute: each instantiation
// has its own table).
template <cudaDeviceAttr Attr>
int cached_device_attribute(const char* where) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  DSV4_CUDA_CHECK(where, cudaGetDevice(&device));
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable) {
    const int value = cached[device].load(std::memory_order_relaxed);
    if (value > 0) return value;
  }
  int value = 0;
  DSV4_CUDA_CHECK(where, cudaDeviceGetAttribute(&value, Attr, device));
  if (cacheable) cached[device].store(value, std::memory_order_relaxed);
  return value;
}

}  // namespace

int current_device_sm_count(const char* where) {
  return cached_device_attribute<cudaDevAttrMultiProcessorCount>(where);
}

int64_t current_device_l2_bytes(const char* where) { return cached_device_attribute<cudaDevAttrL2CacheSize>(where); }

}  // namespace dsv4::cuda
