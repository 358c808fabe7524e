// CUDA entry point of the sparse prefill (implemented in src/cuda/attention/ .cu files). Called
// by dsv4::sparse_prefill (src/ops/sparse_prefill.cpp) after it validated every argument; index
// values are not checked: -1 and indices >= s_kv are masked by the kernel, as in FlashMLA.
#pragma once

#include <cstdint>

#include "dsv4/ops.h"

namespace dsv4::cuda {

void sparse_prefill(const SparsePrefillArgs& args, Stream stream);

// With a work counter, the items a launch of `ctas` persistent CTAs hands out round-robin before
// the counter takes over (sparse_prefill/work_item.cuh): every round but the last eighth (rounded
// down), so that the counter evens out what round-robin's drift piled up by then. Afterwards the
// counter holds items − this + ctas (each CTA's last claim falls past the end).
inline int64_t sparse_prefill_round_robin_items(int64_t items, int64_t ctas) {
  const int64_t rounds = (items + ctas - 1) / ctas;
  const int64_t counted = rounds / 8;
  return items < (rounds - counted) * ctas ? items : (rounds - counted) * ctas;
}

// How the kernel's two math warpgroups share the gathered tiles (sparse_prefill/config.h):
// sparse_prefill lets the launch choose from the head count (kAuto); the GPU tests run every case
// under both schedules through this entry.
enum class SparsePrefillSchedule { kAuto, kSerial, kPair };
void sparse_prefill_with_schedule(const SparsePrefillArgs& args, Stream stream, SparsePrefillSchedule schedule);

}  // namespace dsv4::cuda
