#include "tensor_args.h"

#include <cstring>
#include <string>
#include <vector>

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

// The DLPack element type of a DType (the inverse of dtype_of).
dl::dtype dlpack_dtype_of(DType t) {
  using C = dl::dtype_code;
  const auto make = [](C code, int bits) {
    return dl::dtype{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  };
  switch (t) {
    case DType::bf16: return make(C::Bfloat, 16);
    case DType::fp16: return make(C::Float, 16);
    case DType::fp32: return make(C::Float, 32);
    case DType::fp8_e4m3: return make(C::Float8_E4M3FN, 8);
    case DType::ue8m0: return make(C::Float8_E8M0FNU, 8);
    case DType::int32: return make(C::Int, 32);
    case DType::int64: return make(C::Int, 64);
    case DType::uint8: return make(C::UInt, 8);
  }
  fail("torch_copy: unknown dtype ", static_cast<int>(t));
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

namespace {

// What torch_view compares against, looked up once torch is in sys.modules: the two exact types
// it reads, torch.strided, the attribute names (interned) and each dtype the ops take. Every
// pointer is a new reference kept for the process's life (module objects are never freed).
struct TorchTypes {
  PyObject* tensor = nullptr;
  PyObject* parameter = nullptr;
  PyObject* strided = nullptr;
  PyObject *data_ptr, *shape, *stride, *dtype, *is_cuda, *is_cpu, *layout, *is_neg;
  struct Dtype {
    PyObject* object;
    DType dtype;
  } dtypes[8];
  int num_dtypes = 0;
};

// Null until torch has been imported (by anyone); filled once, on the first call after that
// (null for good if that torch lacks torch.Tensor or torch.strided: everything takes DLPack).
const TorchTypes* torch_types() {
  static TorchTypes types;
  static bool filled = false, ready = false;
  if (filled) return ready ? &types : nullptr;
  PyObject* torch = PyImport_GetModule(nb::str("torch").ptr());  // new reference or null, no import
  if (torch == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  filled = true;
  PyObject* nn_parameter = nullptr;
  if (PyObject* nn = PyObject_GetAttrString(torch, "nn")) {
    nn_parameter = PyObject_GetAttrString(nn, "Parameter");
    Py_DECREF(nn);
  }
  types.tensor = PyObject_GetAttrString(torch, "Tensor");
  types.parameter = nn_parameter;
  types.strided = PyObject_GetAttrString(torch, "strided");
  const std::pair<const char*, DType> known[] = {
      {"bfloat16", DType::bf16},       {"float16", DType::fp16},         {"float32", DType::fp32},
      {"float8_e4m3fn", DType::fp8_e4m3}, {"float8_e8m0fnu", DType::ue8m0}, {"int32", DType::int32},
      {"int64", DType::int64},         {"uint8", DType::uint8}};
  for (const auto& [name, dtype] : known)
    if (PyObject* object = PyObject_GetAttrString(torch, name)) types.dtypes[types.num_dtypes++] = {object, dtype};
  Py_DECREF(torch);
  PyErr_Clear();  // a dtype this torch lacks is simply never matched
  types.data_ptr = PyUnicode_InternFromString("data_ptr");
  types.shape = PyUnicode_InternFromString("shape");
  types.stride = PyUnicode_InternFromString("stride");
  types.dtype = PyUnicode_InternFromString("dtype");
  types.is_cuda = PyUnicode_InternFromString("is_cuda");
  types.is_cpu = PyUnicode_InternFromString("is_cpu");
  types.layout = PyUnicode_InternFromString("layout");
  types.is_neg = PyUnicode_InternFromString("is_neg");
  ready = types.tensor != nullptr && types.strided != nullptr;
  return ready ? &types : nullptr;
}

// A new reference to obj.<name> (and, with `call`, its result called with no arguments), held
// until the scope ends.
struct Attr {
  PyObject* object;
  Attr(PyObject* obj, PyObject* name, bool call = false)
      : object(call ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name)) {}
  ~Attr() { Py_XDECREF(object); }
  Attr(const Attr&) = delete;
  Attr& operator=(const Attr&) = delete;
  explicit operator bool() const { return object != nullptr; }
};

TorchRead read_torch_view(PyObject* obj, const TorchTypes& torch, TensorView& v) {
  const Attr layout(obj, torch.layout);
  if (!layout || layout.object != torch.strided) return TorchRead::other;
  const Attr dtype(obj, torch.dtype);
  int d = 0;
  while (d < torch.num_dtypes && torch.dtypes[d].object != dtype.object) ++d;
  if (d == torch.num_dtypes) return TorchRead::other;
  v.dtype = torch.dtypes[d].dtype;
  // Two boolean properties rather than .device.type: that builds a torch.device and a string for
  // every tensor of every call (~0.3 µs each on a desktop CPU).
  const Attr is_cuda(obj, torch.is_cuda);
  if (is_cuda.object == Py_True) {
    v.device = Device::cuda;
  } else {
    const Attr is_cpu(obj, torch.is_cpu);
    if (is_cuda.object != Py_False || is_cpu.object != Py_True) return TorchRead::other;
    v.device = Device::cpu;
  }
  const Attr shape(obj, torch.shape), strides(obj, torch.stride, /*call=*/true);
  if (!shape || !strides || !PyTuple_Check(shape.object) || !PyTuple_Check(strides.object))
    return TorchRead::other;
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape.object);
  if (ndim > kMaxDims || PyTuple_GET_SIZE(strides.object) != ndim) return TorchRead::other;
  v.ndim = static_cast<int>(ndim);
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.object, i));
    v.strides[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides.object, i));
  }
  const Attr is_neg(obj, torch.is_neg, /*call=*/true);
  if (is_neg.object == Py_True) return TorchRead::negated;
  if (is_neg.object != Py_False) return TorchRead::other;
  const Attr data_ptr(obj, torch.data_ptr, /*call=*/true);
  if (!data_ptr) return TorchRead::other;
  v.data = PyLong_AsVoidPtr(data_ptr.object);
  return PyErr_Occurred() == nullptr ? TorchRead::view : TorchRead::other;
}

}  // namespace

TorchRead torch_view(PyObject* obj, TensorView& view) noexcept {
  const TorchTypes* torch = torch_types();
  if (torch == nullptr) return TorchRead::other;
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj));
  if (type != torch->tensor && type != torch->parameter) return TorchRead::other;
  TensorView v;
  const TorchRead read = read_torch_view(obj, *torch, v);
  PyErr_Clear();
  if (read == TorchRead::view) view = v;
  return read;
}

TensorView tensor_arg(const char* where, const char* name, const TensorArg& a) {
  if (a.view) return *a.view;
  if (a.negated)
    fail(where, ": ", name, ": expected a tensor, got a negated torch view (its negation bit is "
         "set, e.g. torch._neg_view): call .resolve_neg() first");
  if (!a.array && a.dlpack_refused)
    fail(where, ": ", name, ": expected a dense tensor DLPack can export, got a ", a.type_name,
         " whose __dlpack__ failed (sparse or another layout DLPack has no form for)");
  if (!a.array) fail(where, ": ", name, ": expected a tensor, got ", a.none ? "None" : a.type_name);
  return view_of(*a.array, detail::concat(where, ": ", name).c_str());
}

TensorView optional_tensor_arg(const char* where, const char* name, const TensorArg& a) {
  if (a.none) return {};
  if (!a.view && !a.array && !a.dlpack_refused && !a.negated)
    fail(where, ": ", name, ": expected a tensor or None, got ", a.type_name);
  return tensor_arg(where, name, a);
}

KvCacheView cache_arg(const char* where, const char* name, const TensorArg& data,
                      const std::string& layout, const IntArg& block_size, float tensor_scale) {
  KvCacheView cache;
  cache.data = tensor_arg(where, name, data);
  cache.layout = parse_kv_layout(layout);
  cache.block_size = int_arg(where, "block_size", block_size);
  cache.tensor_scale = tensor_scale;
  return cache;
}

int64_t int64_arg(const char* where, const char* name, const IntArg& a, int64_t lo, int64_t hi) {
  if (a.type_name == nullptr && a.overflow == 0 && a.value >= lo && a.value <= hi) return a.value;
  // The message is formatted only here: every op call passes several integers, and a string
  // stream per argument cost microseconds of host time on the accepted path.
  const std::string range = detail::concat("an integer in [", lo, ", ", hi, "]");
  if (a.type_name != nullptr) fail_expected(where, name, range, a.type_name);
  if (a.overflow != 0)
    fail_expected(where, name, range, a.overflow > 0 ? "an int above 2**63 - 1" : "an int below -2**63");
  fail_expected(where, name, range, a.value);
}

int int_arg(const char* where, const char* name, const IntArg& a) {
  return static_cast<int>(int64_arg(where, name, a, INT_MIN, INT_MAX));
}

HostTensor host_copy(const AnyArray& a, const char* name) {
  const TensorView v = view_of(a, name);
  if (v.device != Device::cpu)
    fail_expected(name, "device", "a CPU tensor", "a CUDA tensor");
  return HostTensor::copy_of(v);
}

nb::ndarray<nb::pytorch> torch_copy(const HostTensor& t) {
  auto* copy = new HostTensor(t.dtype(), t.shape());
  if (t.nbytes() > 0) std::memcpy(copy->data<uint8_t>(), t.data<uint8_t>(), t.nbytes());
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<HostTensor*>(p); });
  const std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  return nb::ndarray<nb::pytorch>(copy->data<void>(), shape.size(), shape.data(), owner, nullptr,
                                  dlpack_dtype_of(t.dtype()), nb::device::cpu::value);
}

}  // namespace dsv4::python
