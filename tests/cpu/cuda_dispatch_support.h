// What an op's front door does with all-CUDA arguments, in either build (the tests ask the
// library at run time, dsv4::cuda_built(), never the build's macros).
//   Without the CUDA backend: valid all-CUDA arguments are refused with "<op>: CUDA backend not
//     built" — after validation, before anything is written (the caller then checks its outputs).
//   With it: the views here point at host memory, which must never reach a CUDA kernel (tests/cuda
//     runs the ops on device memory), so instead dispatch must find the op's CUDA kernel.
// Either way the test fails if the op lost its CUDA row or its not-built error.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "dsv4/device_tensor.h"
#include "dsv4/status.h"
#include "ops/backend.h"

namespace dsv4::test {

template <class Fn>
void expect_cuda_dispatch(const char* op, ops::OpKey<Fn> key, const std::function<void()>& all_cuda_call) {
  if (cuda_built()) {
    EXPECT_NE(ops::kernel(op, key, Device::cuda), nullptr) << op << ": no CUDA kernel in a CUDA build";
    return;
  }
  const std::string want = std::string(op) + ": CUDA backend not built";
  try {
    all_cuda_call();
    ADD_FAILURE() << op << ": all-CUDA arguments ran without the CUDA backend";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what() << "\nlacks: " << want;
  }
}

}  // namespace dsv4::test
