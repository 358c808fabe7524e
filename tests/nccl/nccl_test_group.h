// The NCCL tests' groups: NVLink multicast (NVLS) off, as the lent multi-GPU machines require,
// set before the first communicator of the process is made (NCCL reads its environment once).
#pragma once

#include <cstdlib>
#include <memory>
#include <numeric>
#include <vector>

#include "dsv4/communicator.h"

namespace dsv4_test {

// GPUs 0..n-1, rank r on GPU r.
inline std::vector<int> first_gpus(int n) {
  std::vector<int> devices(static_cast<size_t>(n));
  std::iota(devices.begin(), devices.end(), 0);
  return devices;
}

// One NCCL group over GPUs 0..n-1 (make_nccl_group), NVLS off.
inline std::vector<std::unique_ptr<dsv4::Communicator>> nccl_group(int n) {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  return dsv4::make_nccl_group(first_gpus(n));
}

}  // namespace dsv4_test
