#include "layer/step_rows.h"

#include "dsv4/status.h"
#include "layer/decode_graphs.h"
#include "runtime/device_runtime.h"

namespace dsv4 {

namespace {
size_t row_bytes(const TensorView& t) { return static_cast<size_t>(t.size(1)) * dtype_size(t.dtype); }
}  // namespace

int64_t step_rows(Device device, int64_t tokens, bool bucketed) {
  if (device == Device::cpu) return tokens;
  if (bucketed) return DecodeGraphs::rows(tokens);
  return (tokens + kFp8GemmRowMultiple - 1) / kFp8GemmRowMultiple * kFp8GemmRowMultiple;
}

void copy_rows_in(const TensorView& x, const TensorView& x_rows, Stream stream) {
  DSV4_CHECK(x.dtype == x_rows.dtype && x.size(1) == x_rows.size(1) && x.size(0) <= x_rows.size(0),
             "copy_rows_in: ", x.shape_str(), " -> ", x_rows.shape_str());
  rt::copy_device_to_device_async(x_rows.data, x.data, x.size(0) * row_bytes(x), stream);
}

void copy_rows_out(const TensorView& y_rows, const TensorView& y, Scratch& scratch, Stream stream) {
  const int64_t T = y.size(0);
  DSV4_CHECK(y.dtype == y_rows.dtype && y.size(1) == y_rows.size(1) && T <= y_rows.size(0),
             "copy_rows_out: ", y_rows.shape_str(), " -> ", y.shape_str());
  const TensorView real = y_rows.slice0(0, T);
  if (y.device == y_rows.device)
    rt::copy_device_to_device_async(y.data, real.data, T * row_bytes(y), stream);
  else
    scratch.download(real, y);
}

void run_eager_step(int64_t rows, const TensorView& x, const TensorView& y, Scratch& scratch,
                    Stream stream, const StepLaunch& launch) {
  const int64_t T = x.size(0), dim = x.size(1);
  if (rows == T && y.device == scratch.device()) {
    launch(x, y, stream);
    return;
  }
  TensorView x_rows = x;
  if (rows > T) {
    x_rows = scratch.tensor(x.dtype, {rows, dim});
    copy_rows_in(x, x_rows, stream);
    rt::memset_device_async(static_cast<uint8_t*>(x_rows.data) + T * row_bytes(x), 0,
                            (rows - T) * row_bytes(x), stream);
  }
  const TensorView y_rows = scratch.tensor(DType::fp32, {rows, dim});
  launch(x_rows, y_rows, stream);
  copy_rows_out(y_rows, y, scratch, stream);
}

}  // namespace dsv4
