// DeviceTensor on a GPU: host → device → host round trips are exact, strided host views are
// packed, fill_bytes reaches every byte.
#include <gtest/gtest.h>

#include "dsv4/device_tensor.h"
#include "gpu_test_util.h"

namespace dsv4 {
namespace {

TEST(DeviceTensorGpu, RoundTripContiguousAndStrided) {
  DSV4_SKIP_WITHOUT_GPU();
  HostTensor h(DType::fp32, {3, 5});
  for (int64_t i = 0; i < h.numel(); ++i) h.set(i, 0.25f * static_cast<float>(i) + 1.0f);
  DeviceTensor d = DeviceTensor::from_host(h);
  ASSERT_EQ(d.view().device, Device::cuda);
  HostTensor back = d.to_host();
  for (int64_t i = 0; i < h.numel(); ++i) EXPECT_EQ(back.get(i), h.get(i)) << i;

  // Column 1..3 of every row: a strided view, packed by from_host.
  TensorView cols = h.view();
  cols.data = h.data<float>() + 1;
  cols.shape[1] = 3;
  DeviceTensor dc = DeviceTensor::from_host(cols);
  HostTensor packed = dc.to_host();
  ASSERT_EQ(packed.shape(), (std::vector<int64_t>{3, 3}));
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(packed.get(r * 3 + c), h.get(r * 5 + 1 + c));
}

TEST(DeviceTensorGpu, FillBytesReachesEveryByte) {
  DSV4_SKIP_WITHOUT_GPU();
  DeviceTensor d(DType::uint8, {1000});
  d.fill_bytes(0xA5);
  HostTensor h = d.to_host();
  for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h.data<uint8_t>()[i], 0xA5) << i;
}

}  // namespace
}  // namespace dsv4
