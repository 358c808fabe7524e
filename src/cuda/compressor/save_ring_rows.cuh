// Kernel 2 of compressor_update_and_emit: this call's rows that the next call needs, into the
// rings. Runs after emit_entries_kernel on the same stream: that kernel reads ring rows of
// earlier positions that these writes may replace (p and p + K share a ring row).
#pragma once

#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/compressor/update_params.cuh"

namespace dsv4::cuda::compressor {

constexpr int kSaveThreads = 256;

// One block per batch token; ring row pos mod K of its request ← [kv row | score row].
__global__ void __launch_bounds__(kSaveThreads) save_ring_rows_kernel(const UpdateParams p) {
  grid_dependency_entry();
  const int64_t t = blockIdx.x;
  const int64_t pos = p.positions[t];
  const int64_t q = p.token_to_req[t];
  if (pos < 0 || q < 0 || q >= p.R) return;
  // Only the last K tokens of the request's run are kept (positions [max(ctx, end − K), end));
  // the run is contiguous, so token t is one of them unless token t + K belongs to it too. This
  // also gives every ring row at most one writer.
  if (t + p.K < p.T && p.token_to_req[t + p.K] == q) return;
  const int64_t ring_slot = p.state_table.slot(q, pos % p.K);
  if (ring_slot < 0) return;
  float* row = p.state_rows + ring_slot * p.state_stride;
  const float* kv = p.kv_rows + t * p.kv_stride;
  const float* s = p.score_rows + t * p.score_stride;
  for (int64_t c = threadIdx.x; c < p.W; c += blockDim.x) {
    row[c] = kv[c];
    row[p.W + c] = s[c];
  }
}

}  // namespace dsv4::cuda::compressor
