// Conversions from Python arguments to the C++ API's argument types: DLPack tensors (nanobind
// ndarrays: torch, numpy, ...) to dsv4::TensorView, a paged cache tensor plus its layout to
// dsv4::KvCacheView, and a stream handle (an int, e.g. torch.cuda.current_stream().cuda_stream)
// to dsv4::Stream. Conversion only describes memory: no copy, no synchronization (host_copy and
// torch_copy are the two explicit copies, host tensors in and out of the layer bindings).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

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
using OptArray = std::optional<AnyArray>;

// The view of `a`; `name` is used in the error for an unsupported dtype or device.
TensorView view_of(const AnyArray& a, const char* name);
// An undefined view for None (optional arguments of the C++ API).
TensorView view_of(const OptArray& a, const char* name);

// A paged cache: `data` is the byte tensor [num_blocks, block_bytes]; layout by name
// ("model1_fp8", "v32_fp8", "bf16", "fp8_per_tensor").
KvCacheView cache_of(const AnyArray& data, const std::string& layout, int block_size,
                     float tensor_scale, const char* name);

inline Stream stream_of(uintptr_t handle) { return reinterpret_cast<Stream>(handle); }

// A contiguous host copy of a CPU tensor of any strides (weights handed over from Python).
HostTensor host_copy(const AnyArray& a, const char* name);
// A new torch tensor (CPU) holding a copy of `t`.
nb::ndarray<nb::pytorch> torch_copy(const HostTensor& t);

}  // namespace dsv4::python
