// The backend tables: how the front doors (src/ops/*.cpp) find an op's kernel, and what
// `dsv4 info --ops` prints. Each backend declares itself and its rows (one per op it implements,
// with the kernel and the features it supports) in its own file, src/ops/backends/<name>.cpp;
// the build lists those files, so adding a backend is a new kernel folder plus that file.
//
// Dispatch: every tensor argument of one call lives on one device (mixing is an argument error),
// and the first backend in the list that runs on that device and is dispatched from C++ runs the
// op. Backends dispatched elsewhere (the Triton one, selected in Python) only declare rows.
#pragma once

#include <initializer_list>
#include <span>
#include <type_traits>

#include "dsv4/tensor.h"
#include "ops/op_table.h"

namespace dsv4::ops {

// What a backend's kernel of an op supports, as FlashMLA declares per implementation: free text
// per aspect, "" where the aspect does not apply.
struct OpFeatures {
  const char* dtypes = "";      // operand dtypes ("bf16, fp32; fp8_e4m3 + scales")
  const char* layouts = "";     // cache layouts / memory layouts accepted
  const char* shapes = "";      // head dims, block sizes, ... it is built for
  bool graph_capturable = false;  // may run inside a CUDA graph capture (no sync, no allocation)
  const char* notes = "";
};

// One row of a backend's table: the op, its kernel (null for a backend not dispatched from C++
// or not built), and its features.
struct OpRow {
  OpId op;
  void (*kernel)();  // the OpKey's function type, type-erased; cast back by kernel()
  OpFeatures features;
};

// A row; `kernel` must have the key's signature (an overload set resolves to it), or be nullptr
// for a backend dispatched outside C++ or not built.
template <class Fn>
OpRow row(OpKey<Fn> key, std::type_identity_t<Fn>* kernel, OpFeatures features) {
  return {key.id, reinterpret_cast<void (*)()>(kernel), features};
}

struct BackendDecl {
  const char* name;          // "cpu", "cuda", "triton": the id users select it by
  const char* title;         // "CPU", "CUDA", "Triton": how messages name it
  Device device;             // where its tensors live
  const char* selected_by;   // how a caller reaches it
  bool dispatched_from_cpp;  // the C++ front doors call its kernels
  bool built;                // compiled into this library (always true for declaration-only ones)
  const char* not_built_hint;  // the error's advice when it is not built
  std::span<const OpRow> rows;
};

// Every backend, in dispatch order (the build's list of src/ops/backends/*.cpp, by name).
std::span<const BackendDecl* const> backends();

// The row of `op` in `backend`, or nullptr.
const OpRow* find_row(const BackendDecl& backend, OpId op);

// The kernel of `key` for tensors on `device`. Throws dsv4::Error "<where>: CUDA backend not
// built (...)" / "<where>: CUDA backend not implemented" when no built backend of that device
// has a kernel for the op.
void (*find_kernel(const char* where, OpId op, Device device))();
template <class Fn>
Fn* kernel(const char* where, OpKey<Fn> key, Device device) {
  return reinterpret_cast<Fn*>(find_kernel(where, key.id, device));
}

struct NamedView {
  const char* name;
  const TensorView& view;
};

// The device shared by the defined views of `args`; undefined (optional) views are ignored.
// Throws "<where>: <name>.device: expected <device of the first>, got <other>" when they differ.
Device common_device(const char* where, std::initializer_list<NamedView> args);

}  // namespace dsv4::ops
