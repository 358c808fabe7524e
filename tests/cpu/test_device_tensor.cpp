// DeviceTensor without a GPU: every device allocation or copy is a clear dsv4::Error (never a
// crash), and the availability query says so. On a GPU machine the round trip is tested in
// tests/cuda/test_device_tensor.cpp.
#include <gtest/gtest.h>

#include "dsv4/device_tensor.h"

namespace dsv4 {
namespace {

TEST(DeviceTensor, WithoutGpuAllocationAndCopiesThrow) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present (tested in tests/cuda)";
  EXPECT_THROW(DeviceTensor(DType::fp32, {4, 8}), Error);
  HostTensor h(DType::fp32, {4});
  EXPECT_THROW(DeviceTensor::from_host(h), Error);
}

TEST(DeviceTensor, CopiesRejectWrongDevicesAndShapes) {
  HostTensor a(DType::fp32, {4}), b(DType::fp32, {4});
  // Both views on the host: the "device" side is on the wrong device.
  EXPECT_THROW(copy_to_device(a, b), Error);
  EXPECT_THROW(copy_to_host(a, b), Error);
  // Shape / dtype mismatch is reported before any CUDA call.
  TensorView fake_dev(b.view().data, DType::fp32, {5}, Device::cuda);
  try {
    copy_to_device(a, fake_dev);
    FAIL() << "expected dsv4::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("numel"), std::string::npos) << e.what();
  }
  TensorView fake_dev16(b.view().data, DType::bf16, {4}, Device::cuda);
  EXPECT_THROW(copy_to_host(fake_dev16, a), Error);
}

}  // namespace
}  // namespace dsv4
