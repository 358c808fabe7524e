// RelaxedCaptureMode: for its lifetime, this host thread's stream-capture mode is relaxed.
//
// Creating streams and events is no stream work, but a capture begun in global mode (the default
// of cudaStreamBeginCapture and torch.cuda.graph) refuses such calls from any thread. Our streams
// and events are created on first use, which may fall inside a capture (a layer's first step
// captured by torch.cuda.graph, a fanned-out op's first run inside one): each creation is wrapped
// in this guard.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/check.h"

namespace dsv4::cuda {

class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(const char* where) {
    check_cuda(cudaThreadExchangeStreamCaptureMode(&mode_), where, "cudaThreadExchangeStreamCaptureMode");
  }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }  // restores the mode
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace dsv4::cuda
