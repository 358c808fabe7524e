// Deterministic synthetic hidden states, for benchmarks and the serving simulation (`dsv4 run`):
// row t holds values that depend only on (seed, req_ids[t], positions[t], i), so a request that is
// recomputed (preempted, or run in another batch) sees the same inputs. Each value is the sum of
// four uniforms in [0, 1) drawn from a counter-based hash (splitmix64), shifted and scaled to mean
// 0 and variance 1 (bell-shaped, |v| < 2·sqrt(3)). Integer hashing and float adds only, so the CPU
// and the GPU write the same bits, and generating on the GPU moves nothing over PCIe.
#pragma once

#include <cstdint>

#include "dsv4/ops.h"
#include "dsv4/tensor.h"

namespace dsv4 {

// req_ids [T] int64, positions [T] int64, out [T, dim] fp32 or bf16 (last dim contiguous; not
// overlapping the inputs). All on one device; CUDA runs on `stream`.
void synthetic_hidden(const TensorView& req_ids, const TensorView& positions, uint64_t seed,
                      const TensorView& out, Stream stream = nullptr);

// The value of element i of the row of (seed, req, pos), as synthetic_hidden writes it (fp32).
float synthetic_hidden_value(uint64_t seed, int64_t req, int64_t pos, int64_t i);

}  // namespace dsv4
