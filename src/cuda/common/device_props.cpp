#include "cuda/common/device_props.h"

#include <cuda_runtime.h>

#include <atomic>

#include "cuda/common/check.h"

namespace dsv4::cuda {

int current_device_sm_count(const char* where) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  DSV4_CUDA_CHECK(where, cudaGetDevice(&device));
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable) {
    const int sms = cached[device].load(std::memory_order_relaxed);
    if (sms > 0) return sms;
  }
  int sms = 0;
  DSV4_CUDA_CHECK(where, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (cacheable) cached[device].store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace dsv4::cuda
