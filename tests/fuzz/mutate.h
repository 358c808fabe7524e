// Generic mutations of a valid fuzz case: each changes one thing the ops must validate (or
// accept) and records what it did in Case::mutations.
#pragma once

#include "fuzz_case.h"

namespace dsv4::fuzz {

struct Devices {
  bool cuda_built = false;      // the library has a CUDA backend
  bool cuda_available = false;  // ... and a device is present: CUDA cases really run
};

// Applies one random mutation (one of: dtype, shape, rank, stride, undefined, device, alias,
// misaligned base, index value, scalar). Returns false when the drawn mutation does not apply to
// this case (the caller draws again).
bool mutate_once(Case& c, Rng& rng, const Devices& devices);

// Moves every argument to CUDA (valid cases run on the device too when one is present).
void move_all_to_cuda(Case& c);

}  // namespace dsv4::fuzz
