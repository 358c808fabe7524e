// Shared helpers of the indexer GPU tests (test_indexer_cpu_vs_cuda.cpp,
// test_indexer_scores_cuda.cpp): random values, index tensors, poisoned outputs, byte-exact
// comparison and expected errors.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/gpu_test_util.h"
#include "dsv4/device_tensor.h"
#include "dsv4/status.h"
#include "dsv4/tensor.h"

namespace dsv4::indexer_test {

// Uniform in ±[lo, hi), never zero.
inline float nonzero(std::mt19937& rng, float lo = 0.05f, float hi = 2.0f) {
  std::uniform_real_distribution<float> mag(lo, hi);
  return (rng() & 1u) ? mag(rng) : -mag(rng);
}
inline int64_t integer(std::mt19937& rng, int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

inline HostTensor index_tensor(DType dtype, const std::vector<int64_t>& values) {
  HostTensor t(dtype, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::int64)
      t.data<int64_t>()[i] = values[i];
    else
      t.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
  }
  return t;
}

inline HostTensor copy_of(const HostTensor& t) {
  HostTensor c(t.dtype(), t.shape());
  std::memcpy(c.data<uint8_t>(), t.data<uint8_t>(), t.nbytes());
  return c;
}

// Device outputs poisoned with 0xFF bytes (NaN for fp32, −1 for int32, fp8 NaN) and their copies
// back after a sync: gpu_test_util.h's.
using dsv4::test::poisoned_device;
using dsv4::test::synced_to_host;
// A host output poisoned the same way.
inline HostTensor poisoned_host(DType dtype, std::vector<int64_t> dims) {
  HostTensor h(dtype, std::move(dims));
  h.fill_bytes(0xFF);
  return h;
}


// Byte equality, reporting the first differing element.
inline void expect_same_bytes(const char* what, const HostTensor& cpu, const HostTensor& gpu) {
  ASSERT_EQ(cpu.nbytes(), gpu.nbytes()) << what;
  const size_t elem = dtype_size(cpu.dtype());
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    if (std::memcmp(cpu.data<uint8_t>() + i * elem, gpu.data<uint8_t>() + i * elem, elem) != 0) {
      if (cpu.dtype() == DType::fp32 || cpu.dtype() == DType::int32)
        ADD_FAILURE() << what << ": element " << i << " differs (cpu " << cpu.get(i) << ", gpu "
                      << gpu.get(i) << ")";
      else
        ADD_FAILURE() << what << ": element " << i << " differs (cpu byte "
                      << int{cpu.data<uint8_t>()[i * elem]} << ", gpu byte "
                      << int{gpu.data<uint8_t>()[i * elem]} << ")";
      return;
    }
  }
}

template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected dsv4::Error";
  } catch (const Error& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace dsv4::indexer_test
