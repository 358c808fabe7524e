// What the launchers size their grids by: the current CUDA device's SM count, queried from the
// runtime once per device and kept (no synchronization, legal inside a stream capture).
#pragma once

namespace dsv4::cuda {

// SMs of the device current on the calling thread; throws dsv4::Error naming `where` if the
// runtime cannot say.
int current_device_sm_count(const char* where);

}  // namespace dsv4::cuda
