// Conversions from Python arguments to the C++ API's argument types: DLPack tensors (nanobind
// ndarrays: torch, numpy, ...) to dsv4::TensorView, a paged cache tensor plus its layout to
// dsv4::KvCacheView, and a stream handle (an int, e.g. torch.cuda.current_stream().cuda_stream)
// to dsv4::Stream. Conversion only describes memory: no copy, no synchronization (host_copy and
// torch_copy are the two explicit copies, host tensors in and out of the layer bindings).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <string>

#include "dsv4/kv_layout.h"
#include "dsv4/ops.h"
#include "dsv4/tensor.h"

namespace dsv4::python {

namespace nb = nanobind;

// Any DLPack tensor, any strides, any device: the C++ ops validate what they need.
using AnyArray = nb::ndarray<>;

// A tensor argument exactly as Python passed it: a DLPack tensor, None, or any other object. The
// binding turns it into a view with the op's and the argument's name (tensor_arg /
// optional_tensor_arg), so None or a wrong object is a dsv4::Error naming the argument rather
// than nanobind's TypeError "incompatible function arguments". Bind such parameters with
// nb::arg(...).none() so that None reaches the caster.
struct TensorArg {
  std::optional<TensorView> view;   // a torch.Tensor read directly (torch_view), or
  std::optional<AnyArray> array;    // any other DLPack tensor
  bool none = false;                // Python passed None
  bool dlpack_refused = false;      // a tensor type whose __dlpack__ failed (e.g. sparse)
  bool negated = false;             // a torch.Tensor with its negation bit set (torch_view)
  const char* type_name = nullptr;  // the Python type of a non-tensor ("NoneType", "list", ...)
};

// An integer argument exactly as Python passed it: an int of any size (or anything with
// __index__), or another object (bool, float, None, ...), narrowed by the binding with the
// argument's name (int_arg / int64_arg): out of range or not an integer is a dsv4::Error.
struct IntArg {
  int64_t value = 0;
  int overflow = 0;                 // +1 / -1: the int lies above / below the int64 range
  const char* type_name = nullptr;  // the Python type of a non-integer (bool included)
};

// The view of a required tensor argument; "<where>: <name>: expected a tensor, got None" etc.
TensorView tensor_arg(const char* where, const char* name, const TensorArg& a);
// The same for an optional one: None gives an undefined view.
TensorView optional_tensor_arg(const char* where, const char* name, const TensorArg& a);
// A paged cache: `data` is the byte tensor [num_blocks, block_bytes]; layout by name
// ("model1_fp8", "v32_fp8", "bf16", "fp8_per_tensor").
KvCacheView cache_arg(const char* where, const char* name, const TensorArg& data,
                      const std::string& layout, const IntArg& block_size, float tensor_scale);

// An integer argument in [lo, hi] (default: the C API's int / int64 range).
int64_t int64_arg(const char* where, const char* name, const IntArg& a, int64_t lo = INT64_MIN,
                  int64_t hi = INT64_MAX);
int int_arg(const char* where, const char* name, const IntArg& a);

// The view of a tensor; `name` is used in the error for an unsupported dtype or device.
TensorView view_of(const AnyArray& a, const char* name);

// What torch_view made of a Python object.
enum class TorchRead {
  view,     // a torch.Tensor, read into the view
  other,    // not one it reads: another type, layout, dtype or device, more than kMaxDims dims
  negated,  // a torch.Tensor whose negation bit is set (torch._neg_view, .conj() of a real view)
};
// A plain torch.Tensor (or nn.Parameter) read from its attributes — data_ptr(), shape, stride(),
// dtype, is_cuda / is_cpu — when it is strided, on the CPU or a CUDA device, of a dtype the ops take, with
// at most kMaxDims dims. Anything else (`other`, no Python error left set) goes through DLPack and
// its errors. torch's __dlpack__ export cost ~5 µs a tensor, most of an op's host time with six
// or more tensors; this reads the same fields in well under one. A negated view is refused:
// DLPack exports its memory without the negation, so the op would read the wrong sign. torch is
// never imported here: without it in sys.modules nothing is a torch.Tensor.
TorchRead torch_view(PyObject* obj, TensorView& view) noexcept;

inline Stream stream_of(uintptr_t handle) { return reinterpret_cast<Stream>(handle); }

// A contiguous host copy of a CPU tensor of any strides (weights handed over from Python).
HostTensor host_copy(const AnyArray& a, const char* name);
// A new torch tensor (CPU) holding a copy of `t`.
nb::ndarray<nb::pytorch> torch_copy(const HostTensor& t);

}  // namespace dsv4::python

// nanobind casters of TensorArg and IntArg: they accept every Python object (so the binding, not
// the dispatcher, reports a wrong one) and never fail.
namespace nanobind::detail {

template <>
struct type_caster<dsv4::python::TensorArg> {
  NB_TYPE_CASTER(dsv4::python::TensorArg, const_name("Tensor | None"))
  // (Flags: uint8_t before nanobind 3, uint32_t since.)
  template <typename Flags>
  bool from_python(handle src, Flags flags, cleanup_list* cleanup) noexcept {
    value = {};
    value.none = src.is_none();
    if (!value.none) {
      dsv4::TensorView view;
      switch (dsv4::python::torch_view(src.ptr(), view)) {
        case dsv4::python::TorchRead::view: value.view = view; return true;
        case dsv4::python::TorchRead::negated: value.negated = true; return true;
        case dsv4::python::TorchRead::other: break;
      }
      make_caster<dsv4::python::AnyArray> array;
      if (array.from_python(src, static_cast<Flags>(flags & ~Flags(cast_flags::accepts_none)),
                            cleanup)) {
        value.array = array.value;
        return true;
      }
    }
    value.type_name = Py_TYPE(src.ptr())->tp_name;  // the type outlives the call's argument
    value.dlpack_refused = PyObject_HasAttrString(src.ptr(), "__dlpack__") == 1;
    return true;
  }
  static handle from_cpp(const dsv4::python::TensorArg&, rv_policy, cleanup_list*) noexcept {
    return handle();  // arguments only
  }
};

template <>
struct type_caster<dsv4::python::IntArg> {
  NB_TYPE_CASTER(dsv4::python::IntArg, const_name("int"))
  template <typename Flags>
  bool from_python(handle src, Flags, cleanup_list*) noexcept {
    value = {};
    PyObject* index = PyBool_Check(src.ptr()) || !PyIndex_Check(src.ptr())
                          ? nullptr
                          : PyNumber_Index(src.ptr());
    if (index != nullptr) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
      Py_DECREF(index);
      if (!(v == -1 && PyErr_Occurred())) {
        value.value = v;
        value.overflow = overflow;
        return true;
      }
    }
    PyErr_Clear();
    value.type_name = Py_TYPE(src.ptr())->tp_name;
    return true;
  }
  static handle from_cpp(const dsv4::python::IntArg&, rv_policy, cleanup_list*) noexcept {
    return handle();
  }
};

}  // namespace nanobind::detail
