// Scratch: the temporaries of one layer forward, on the layer's device.
//
// CPU: each tensor is a HostTensor kept until reset(). CUDA: tensors are carved out of one
// grow-only device arena (256-byte aligned), so a steady stream of forwards allocates nothing:
// when a forward needs more than the arena holds, the extra tensors come from overflow chunks and
// the next reset() replaces everything with one arena of the total size. Reuse is safe because
// every kernel of a layer runs on the layer's one stream, in order.
//
// The arena's address matters to captured CUDA graphs (they replay its addresses): generation()
// changes whenever the arena moves, and while `capturing` is set a tensor that does not fit throws
// instead of allocating (allocation is not allowed inside a capture). reserve() grows the arena
// ahead of time (the layer's warm-up).
//
// upload() is the slow path for host inputs (a host x given to a CUDA layer): a copy from pageable
// memory. The step's metadata goes through StepUpload instead.
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/ops.h"
#include "dsv4/tensor.h"

namespace dsv4 {

class Scratch {
 public:
  Scratch(Device device, Stream stream) : device_(device), stream_(stream) {}

  Device device() const { return device_; }
  Stream stream() const { return stream_; }
  // Later tensors are used on `stream`: the arena is reused only after the work already enqueued
  // on the old stream, which set_stream waits for (a rare call: once per stream change).
  void set_stream(Stream stream);

  // An uninitialized contiguous tensor, valid until reset().
  TensorView tensor(DType t, std::vector<int64_t> dims);
  // The host tensor on the scratch's device (CPU: `host` itself, kept alive until reset()).
  TensorView upload(const HostTensor& host);
  // Copies a device tensor of this scratch to a contiguous host view on the scratch's stream and
  // waits for it (the end of a forward whose caller wants host results).
  void download(const TensorView& device, const TensorView& host);
  // Forgets every tensor (the memory is reused by the next forward).
  void reset();
  // CUDA: an arena of at least `bytes` from now on (moves it if it grows).
  void reserve(int64_t bytes);
  // Bytes the last forward needed (what reserve() should cover), and the arena's size.
  int64_t high_water() const { return high_water_; }
  int64_t capacity() const { return device_ == Device::cpu ? cpu_reserved_ : arena_.numel(); }
  uint64_t generation() const { return generation_; }
  // While set, a tensor that does not fit the arena is an error (see above).
  void set_capturing(bool capturing) { capturing_ = capturing; }

 private:
  Device device_;
  Stream stream_;
  std::vector<HostTensor> host_;         // CPU tensors and uploads kept alive
  DeviceTensor arena_;                   // CUDA: the arena
  int64_t used_ = 0;                     // bytes of the arena handed out
  std::vector<DeviceTensor> overflow_;   // CUDA: tensors that did not fit this forward
  int64_t overflow_bytes_ = 0;
  int64_t high_water_ = 0;
  uint64_t generation_ = 0;
  bool capturing_ = false;
  int64_t cpu_reserved_ = 0;  // CPU: what reserve() asked for (reported as the capacity)
};

// One forward's use of a Scratch: resets it on entry and again as the forward ends (by return or
// by exception), so temporaries that outgrew the arena are released, and the arena grown, as this
// forward ends rather than as the next one starts (which may be inside a caller's graph capture).
class ScratchStep {
 public:
  explicit ScratchStep(Scratch& scratch) : scratch_(scratch) { scratch_.reset(); }
  ~ScratchStep() {
    try {
      scratch_.reset();
    } catch (...) {  // a destructor: the forward's own error, if any, is the one to report
    }
  }
  ScratchStep(const ScratchStep&) = delete;
  ScratchStep& operator=(const ScratchStep&) = delete;

 private:
  Scratch& scratch_;
};

// The arguments of a layer's reserve(max_tokens, max_requests, max_context), checked alike by
// every layer: 1 <= max_requests <= max_tokens, and max_context at least what the largest share of
// max_tokens among max_requests requests needs (ceil(max_tokens / max_requests)) and at most the
// model's max_position. Throws dsv4::Error naming the argument.
void check_reserve_bounds(const char* where, int64_t max_tokens, int max_requests, int64_t max_context,
                          int64_t max_position);

}  // namespace dsv4
