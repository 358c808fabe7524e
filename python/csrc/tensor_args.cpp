#include "tensor_args.h"

#include <string>

#include "dsv4/status.h"

namespace dsv4::python {

namespace {

namespace dl = nb::dlpack;

// The DType of a DLPack element type; throws dsv4::Error for one the ops never take.
DType dtype_of(dl::dtype t, const char* name) {
  using C = dl::dtype_code;
  const auto code = static_cast<C>(t.code);
  if (t.lanes == 1) {
    if (code == C::Bfloat && t.bits == 16) return DType::bf16;
    if (code == C::Float && t.bits == 16) return DType::fp16;
    if (code == C::Float && t.bits == 32) return DType::fp32;
    if (code == C::Float8_E4M3FN && t.bits == 8) return DType::fp8_e4m3;
    if (code == C::Float8_E8M0FNU && t.bits == 8) return DType::ue8m0;
    if (code == C::Int && t.bits == 32) return DType::int32;
    if (code == C::Int && t.bits == 64) return DType::int64;
    if (code == C::UInt && t.bits == 8) return DType::uint8;
  }
  fail(name, ".dtype: expected one of bfloat16, float16, float32, float8_e4m3fn, float8_e8m0fnu, "
             "int32, int64, uint8, got DLPack (code ", int(t.code), ", bits ", int(t.bits),
       ", lanes ", int(t.lanes), ")");
}

Device device_of(int device_type, const char* name) {
  if (device_type == nb::device::cpu::value) return Device::cpu;
  if (device_type == nb::device::cuda::value) return Device::cuda;
  fail(name, ".device: expected cpu or cuda, got DLPack device type ", device_type);
}

}  // namespace

TensorView view_of(const AnyArray& a, const char* name) {
  TensorView v;
  if (a.ndim() > static_cast<size_t>(kMaxDims))
    fail_expected(name, "ndim", std::string("<= ") + std::to_string(kMaxDims), a.ndim());
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = dtype_of(a.dtype(), name);
  v.device = device_of(a.device_type(), name);
  v.ndim = static_cast<int>(a.ndim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = static_cast<int64_t>(a.shape(d));
    v.strides[d] = a.stride(d);
  }
  return v;
}

TensorView view_of(const OptArray& a, const char* name) {
  return a.has_value() ? view_of(*a, name) : TensorView{};
}

KvCacheView cache_of(const AnyArray& data, const std::string& layout, int block_size,
                     float tensor_scale, const char* name) {
  KvCacheView cache;
  cache.data = view_of(data, name);
  cache.layout = parse_kv_layout(layout);
  cache.block_size = block_size;
  cache.tensor_scale = tensor_scale;
  return cache;
}

}  // namespace dsv4::python
