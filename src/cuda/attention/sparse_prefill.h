// CUDA entry point of the sparse prefill (implemented in src/cuda/attention/ .cu files). Called
// by dsv4::sparse_prefill (src/ops/sparse_prefill.cpp) after it validated every argument; index
// values are not checked: -1 and indices >= s_kv are masked by the kernel, as in FlashMLA.
#pragma once

#include "dsv4/ops.h"

namespace dsv4::cuda {

void sparse_prefill(const SparsePrefillArgs& args, Stream stream);

// How the kernel's two math warpgroups share the gathered tiles (sparse_prefill/config.h):
// sparse_prefill lets the launch choose from the head count (kAuto); the GPU tests run every case
// under both schedules through this entry.
enum class SparsePrefillSchedule { kAuto, kSerial, kPair };
void sparse_prefill_with_schedule(const SparsePrefillArgs& args, Stream stream, SparsePrefillSchedule schedule);

}  // namespace dsv4::cuda
