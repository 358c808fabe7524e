#include "step_tensors.h"

#include <cstring>

#include "dsv4/synthetic.h"

namespace dsv4::cli {

void StepTensors::prepare(const BatchPlan& plan) {
  const int64_t T = plan.num_tokens();
  if (T > rows_) {
    rows_ = T;
    if (device_ == Device::cuda) {
      for (const rt::Event& e : meta_copied_) e.wait_host();
      dev_meta_ = DeviceTensor(DType::int64, {2, T});
      dev_x_ = DeviceTensor(DType::fp32, {T, dim_});
      dev_y_ = DeviceTensor(DType::fp32, {T, dim_});
      for (rt::PinnedBuffer& b : pinned_meta_)
        b = rt::PinnedBuffer(static_cast<size_t>(2 * T) * sizeof(int64_t));
    } else {
      host_meta_ = HostTensor(DType::int64, {2, T});
      host_x_ = HostTensor(DType::fp32, {T, dim_});
      host_y_ = HostTensor(DType::fp32, {T, dim_});
    }
  }
  // Each token's request id and position.
  const int turn = turn_;
  turn_ ^= 1;
  int64_t* meta = device_ == Device::cuda ? reinterpret_cast<int64_t*>(pinned_meta_[turn].data())
                                          : host_meta_.data<int64_t>();
  if (device_ == Device::cuda) meta_copied_[turn].wait_host();  // its last copy has read it
  for (int64_t t = 0; t < T; ++t) {
    meta[t] = plan.requests[plan.token_to_req[t]].req_id;
    meta[rows_ + t] = plan.positions[t];
  }
  uint8_t* base = device_ == Device::cuda ? dev_meta_.data<uint8_t>() : host_meta_.data<uint8_t>();
  if (device_ == Device::cuda) {
    rt::copy_host_to_device_async(base, meta, static_cast<size_t>(2 * rows_) * sizeof(int64_t),
                                  stream_);
    meta_copied_[turn].record(stream_);
  }
  const TensorView ids(base, DType::int64, {T}, device_);
  const TensorView pos(base + rows_ * sizeof(int64_t), DType::int64, {T}, device_);
  const OwnedTensor& xs = device_ == Device::cuda ? static_cast<const OwnedTensor&>(dev_x_) : host_x_;
  const OwnedTensor& ys = device_ == Device::cuda ? static_cast<const OwnedTensor&>(dev_y_) : host_y_;
  x_ = TensorView(xs.view().data, DType::fp32, {T, dim_}, device_);
  y_ = TensorView(ys.view().data, DType::fp32, {T, dim_}, device_);
  synthetic_hidden(ids, pos, seed_, x_, stream_);
}

HostTensor StepTensors::y_on_host() const {
  HostTensor out(DType::fp32, {y_.shape[0], dim_});
  if (device_ == Device::cpu) {
    std::memcpy(out.data<float>(), y_.data, out.nbytes());
  } else {
    rt::Event done;
    done.record(stream_);
    done.wait_host();
    copy_to_host(y_, out);
  }
  return out;
}

}  // namespace dsv4::cli
