// Every kernel of the library is launched through launch_kernel(), as a programmatic dependent
// launch (PDL, sm_90): the next kernel in the stream may be scheduled onto the SMs while this one
// still runs, and its CTAs then wait on the device for this one's results instead of the stream
// front end waiting for this one to drain before it even starts the next launch. A decode step is
// some forty kernels of a few microseconds each, so that hand-off is a large share of its time.
//
// The contract, for every kernel launched here:
//   - its first statement is grid_dependency_entry(): it waits until the kernels before it in
//     the stream have completed and their writes are visible, and only then lets the kernel after
//     it launch. Because every kernel waits before it reads, writes or exits, "completed" is
//     transitive along the stream, exactly as without PDL (a kernel that exited without waiting
//     could let its successor overtake its predecessor);
//   - nothing else changes: grids, shared memory and arguments are the caller's.
// Stream order, events, CUDA-graph capture and replay all keep their meaning: a PDL edge only
// lets the dependent grid become resident early, it never lets it run ahead of the wait.
//
// DSV4_PDL=0 in the environment launches plainly instead (read once per process), so that one
// binary can time both (bench/scripts/device_session.sh); grid_dependency_entry() is then a no-op
// wait on a kernel that has no programmatic predecessor.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "cuda/common/check.h"

namespace dsv4::cuda {

// The first statement of every kernel launched by launch_kernel() (see above).
__device__ __forceinline__ void grid_dependency_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// The grid, block, dynamic shared memory and (optionally) cluster width of one launch.
struct LaunchShape {
  dim3 grid;
  dim3 block;
  size_t smem_bytes = 0;
  unsigned cluster_x = 1;  // > 1: thread-block clusters of this many CTAs along x
};

// Whether launches are programmatic (DSV4_PDL unset or anything but "0").
inline bool programmatic_launch_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DSV4_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

// Launches `kernel` on `stream` with `shape`; throws dsv4::Error naming `where` on a launch error.
template <typename... Params, typename... Args>
void launch_kernel(const char* where, void (*kernel)(Params...), const LaunchShape& shape,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attrs[2];
  unsigned num_attrs = 0;
  if (programmatic_launch_enabled()) {
    attrs[num_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[num_attrs].val.programmaticStreamSerializationAllowed = 1;
    ++num_attrs;
  }
  if (shape.cluster_x > 1) {
    attrs[num_attrs].id = cudaLaunchAttributeClusterDimension;
    attrs[num_attrs].val.clusterDim.x = shape.cluster_x;
    attrs[num_attrs].val.clusterDim.y = 1;
    attrs[num_attrs].val.clusterDim.z = 1;
    ++num_attrs;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = shape.grid;
  config.blockDim = shape.block;
  config.dynamicSmemBytes = shape.smem_bytes;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = num_attrs;
  check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), where, "cudaLaunchKernelEx");
}

}  // namespace dsv4::cuda
