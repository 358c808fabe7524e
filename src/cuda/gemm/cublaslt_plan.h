// A cuBLASLt matmul prepared once for one problem and reused: its descriptors (operation, the
// three matrix layouts, the preference) and the algorithm the heuristic chose. Building a plan
// costs the heuristic query (tens of µs of host time); running one costs setting the scale
// pointers and the launch, which is what a decode step can afford per GEMM.
//
// Plans are cached per host thread (no locking on the launch path: the scale pointers are
// attributes of the operation descriptor, set before each launch, so two threads must not share
// one) under the MatmulKey of everything the descriptors and the algorithm depend on. A thread's
// cache is cleared when it exceeds kMaxCachedPlans entries (a serving engine's shapes — token
// buckets × a handful of projections — stay far below it).
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>

#include "dsv4/dtype.h"

namespace dsv4::cuda {

struct MatmulKey {
  int device = 0;
  DType ab = DType::bf16, y = DType::bf16;
  int64_t batch = 1, T = 0, N = 0, K = 0;
  int64_t x_ld = 0, w_ld = 0, y_ld = 0;
  int64_t x_batch_stride = 0, w_batch_stride = 0, y_batch_stride = 0;
  uint32_t x_align = 0, w_align = 0, y_align = 0;  // bytes (see alignment_bytes)
  int64_t workspace_bytes = 0;

  bool operator==(const MatmulKey&) const = default;
};

struct MatmulKeyHash {
  size_t operator()(const MatmulKey& k) const;
};

inline constexpr size_t kMaxCachedPlans = 4096;

// Owns one cuBLASLt descriptor (destroyed with its owner, also when a constructor throws).
template <typename Handle, cublasStatus_t (*Destroy)(Handle)>
class LtDescriptor {
 public:
  LtDescriptor() = default;
  LtDescriptor(const LtDescriptor&) = delete;
  LtDescriptor& operator=(const LtDescriptor&) = delete;
  ~LtDescriptor() {
    if (handle_ != nullptr) Destroy(handle_);
  }
  Handle* out() { return &handle_; }
  Handle get() const { return handle_; }

 private:
  Handle handle_ = nullptr;
};

class MatmulPlan {
 public:
  // Creates the descriptors of `key` and asks the heuristic for its best algorithm; x_scale /
  // w_scale (fp8 only) must be set for the query. Throws dsv4::Error naming `where` and the
  // problem when cuBLASLt has no algorithm for it.
  MatmulPlan(const char* where, const MatmulKey& key, const float* x_scale, const float* w_scale,
             const char* x_name, const char* w_name, const char* y_name);

  // Enqueues y = x · wᵀ (beta 0: y is not read) on `stream`.
  void run(const char* where, const void* x, const float* x_scale, const void* w,
           const float* w_scale, void* y, void* workspace, cudaStream_t stream);

 private:
  using Desc = LtDescriptor<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
  using Layout = LtDescriptor<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
  MatmulKey key_;
  cublasLtHandle_t handle_ = nullptr;  // the device's (key_.device)
  Desc desc_;
  Layout a_, b_, d_;
  cublasLtMatmulAlgo_t algo_{};
};

// The calling thread's plan for `key`, built on first use.
MatmulPlan& cached_matmul_plan(const char* where, const MatmulKey& key, const float* x_scale,
                               const float* w_scale, const char* x_name, const char* w_name,
                               const char* y_name);

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address and
// every byte step from it that the kernel takes: the alignment every row of every batch has.
uint32_t alignment_bytes(const void* data, int64_t ld_bytes, int64_t batch_stride_bytes);

}  // namespace dsv4::cuda
