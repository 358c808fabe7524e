// One-time setup per CUDA device, for the setup a launcher does before its kernel's first launch:
// a kernel's function attributes (cudaFuncSetAttribute, e.g. its opt-in to more than 48 KB of
// dynamic shared memory) belong to the current device's context, so a process that drives several
// GPUs (tensor-parallel ranks, one host thread per GPU) must set them on every device it launches
// on. A process-wide `static const bool` guard sets them on the first device only, and the first
// launch on the next device fails (too much shared memory requested).
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <utility>

#include "cuda/common/check.h"

namespace dsv4::cuda {

// A launcher's function-local static: call() runs its setup once per device, whichever thread
// gets there first; other threads on that device wait for it. A setup that throws counts as not
// run (the next launch on that device tries again).
class PerDeviceOnce {
 public:
  template <class Setup>
  void call(const char* where, Setup&& setup) {
    int device = 0;
    DSV4_CUDA_CHECK(where, cudaGetDevice(&device));
    if (device < 0 || device >= kMaxDevices) {  // beyond the table: set up every time (legal, slower)
      std::forward<Setup>(setup)();
      return;
    }
    std::call_once(done_[device], std::forward<Setup>(setup));
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::once_flag done_[kMaxDevices];
};

// Opts `kernel` in to `bytes` of dynamic shared memory on the current device, the first time it
// launches there (`once`: the launcher's static, one per kernel instantiation).
template <class Kernel>
void opt_in_dynamic_smem(PerDeviceOnce& once, Kernel* kernel, int bytes, const char* where) {
  once.call(where, [&] {
    DSV4_CUDA_CHECK(where, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  });
}

}  // namespace dsv4::cuda
