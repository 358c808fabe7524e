// What the launchers size their grids and choose their schedules by: attributes of the current
// CUDA device, queried from the runtime once per device and kept (no synchronization, legal
// inside a stream capture).
#pragma once

#include <cstdint>

namespace dsv4::cuda {

// SMs of the device current on the calling thread; throws dsv4::Error naming `where` if the
// runtime cannot say.
int current_device_sm_count(const char* where);

// Bytes of L2 cache of the device current on the calling thread; throws as above.
int64_t current_device_l2_bytes(const char* where);

}  // namespace dsv4::cuda
