// Buffered clock64 timestamps of a kernel's pipeline events, for reading one CTA's tile period
// apart on a device: which role waits, on what, for how long (docs/notes/decode.md, "Where the
// decode kernel stands"). Compiled only with -DDSV4_KERNEL_TRACE, in a build of its own
// (`device_session.sh decode-trace`); without it every trace point is an empty statement and the
// kernels' code does not change.
//
// A translation unit that includes this has its own buffer: kCtas traced CTAs (the kernel picks
// them: DSV4_TRACE's `cta` is their slot, −1 for the others) × kRows rows (a tile each, the last
// row for once-per-CTA events) × kEvents timestamps. Its launcher calls DSV4_TRACE_DUMP after
// each launch, which, when the environment names a file in DSV4_KERNEL_TRACE, waits for the
// stream and writes the buffer there (one line per CTA slot and row: slot, row, the events; 0 =
// not recorded), then clears it. A trace build is for reading a pipeline, never for timing.
// clock64 counts one SM's cycles: compare timestamps of one CTA only.
#pragma once

#if defined(DSV4_KERNEL_TRACE)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace dsv4::cuda::trace {
inline constexpr int kCtas = 2, kRows = 256, kEvents = 20;
inline constexpr int kOnceRow = kRows - 1;  // the row of once-per-CTA events; tiles use the others

namespace {  // one buffer per translation unit: its launcher dumps the buffer its kernels write
__device__ long long buffer[kCtas][kRows][kEvents];

__device__ __forceinline__ void record(int cta, int row, int event) {
  if (cta >= 0 && cta < kCtas && row >= 0 && row < kRows && event >= 0 && event < kEvents)
    buffer[cta][row][event] = clock64();
}

void dump(cudaStream_t stream) {
  const char* path = std::getenv("DSV4_KERNEL_TRACE");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (path == nullptr || cudaStreamIsCapturing(stream, &capture) != cudaSuccess) return;
  if (capture != cudaStreamCaptureStatusNone) return;  // a captured launch has not run yet
  if (cudaStreamSynchronize(stream) != cudaSuccess) return;
  static long long host[kCtas][kRows][kEvents];
  if (cudaMemcpyFromSymbol(host, buffer, sizeof(host)) != cudaSuccess) return;
  if (FILE* f = std::fopen(path, "w")) {
    for (int c = 0; c < kCtas; ++c)
      for (int r = 0; r < kRows; ++r) {
        std::fprintf(f, "%d %d", c, r);
        for (long long v : host[c][r]) std::fprintf(f, " %lld", v);
        std::fprintf(f, "\n");
      }
    std::fclose(f);
  }
  static const long long zeros[kCtas][kRows][kEvents] = {};
  cudaMemcpyToSymbol(buffer, zeros, sizeof(zeros));
}
}  // namespace
}  // namespace dsv4::cuda::trace

#define DSV4_TRACE(cta, row, event) ::dsv4::cuda::trace::record((cta), (row), (event))
#define DSV4_TRACE_DUMP(stream) ::dsv4::cuda::trace::dump(stream)
#else
#define DSV4_TRACE(cta, row, event) \
  do {                              \
  } while (0)
#define DSV4_TRACE_DUMP(stream) \
  do {                          \
  } while (0)
#endif
