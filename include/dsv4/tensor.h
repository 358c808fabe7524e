// TensorView: a non-owning, strided view of an n-d array on the host or a CUDA device, and
// HostTensor: a small owning host buffer used by tests, the CLI and the CPU layer.
//
// Strides are in elements (not bytes), like torch. Validation helpers throw dsv4::Error naming
// the op, the argument, the expected and the actual value.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dsv4/dtype.h"
#include "dsv4/status.h"

namespace dsv4 {

enum class Device : uint8_t { cpu, cuda };

inline constexpr int kMaxDims = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::fp32;
  Device device = Device::cpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};

  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* ptr, DType t, std::initializer_list<int64_t> dims, Device dev = Device::cpu);
  TensorView(void* ptr, DType t, const std::vector<int64_t>& dims, Device dev = Device::cpu);

  bool defined() const { return data != nullptr; }
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t stride(int d) const { return strides[d < 0 ? d + ndim : d]; }
  int64_t numel() const;
  bool is_contiguous() const;
  std::string shape_str() const;  // "[2, 3, 4]"
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  // View with one leading dimension's range [begin, end) (no copy).
  TensorView slice0(int64_t begin, int64_t end) const;
};

// Argument validation at the API edge. `where` is the op name, `name` the argument.
void check_defined(const char* where, const char* name, const TensorView& t);
void check_dtype(const char* where, const char* name, const TensorView& t, DType expected);
void check_ndim(const char* where, const char* name, const TensorView& t, int expected);
void check_dim(const char* where, const char* name, const TensorView& t, int dim, int64_t expected);
void check_shape(const char* where, const char* name, const TensorView& t,
                 std::initializer_list<int64_t> expected);
void check_contiguous(const char* where, const char* name, const TensorView& t);
// Last dimension has stride 1 (rows may be padded).
void check_inner_contiguous(const char* where, const char* name, const TensorView& t);
void check_device(const char* where, const char* name, const TensorView& t, Device expected);

// Owning host tensor (contiguous, 64-byte aligned).
// What an owning tensor exposes, whatever memory holds it (HostTensor, DeviceTensor): the view
// of its contiguous buffer and that view's shape, dtype and size.
class OwnedTensor {
 public:
  TensorView view() const { return view_; }
  operator TensorView() const { return view_; }  // NOLINT(google-explicit-constructor)
  template <typename T>
  T* data() const { return static_cast<T*>(view_.data); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(view_.dtype); }
  DType dtype() const { return view_.dtype; }
  const std::vector<int64_t>& shape() const { return dims_; }

 protected:
  OwnedTensor() = default;
  explicit OwnedTensor(std::vector<int64_t> dims) : dims_(std::move(dims)) {}
  std::vector<int64_t> dims_;
  TensorView view_;
};

class HostTensor : public OwnedTensor {
 public:
  HostTensor() = default;
  HostTensor(DType t, std::vector<int64_t> dims);
  static HostTensor zeros(DType t, std::vector<int64_t> dims);
  // A 1-d int32 tensor holding `values` (index lists built on the host: offsets, lengths, ...).
  static HostTensor from_int32(const std::vector<int32_t>& values);
  // A contiguous copy of a host view of any strides, in its dtype or converted to `as` (through
  // float: load_as_float / store_from_float, so bf16 targets are rounded to nearest even).
  static HostTensor copy_of(const TensorView& host);
  static HostTensor copy_of(const TensorView& host, DType as);

  // Fills every byte with `byte` (tests poison outputs with 0xFF / NaN patterns).
  void fill_bytes(uint8_t byte);
  // Element access as float for float-like dtypes (bf16/fp16/fp32/fp8/ue8m0) and integers.
  float get(int64_t flat_index) const;
  void set(int64_t flat_index, float value);

 private:
  std::shared_ptr<uint8_t[]> buf_;
};

// Reads/writes element i (flat, contiguous) of a float-like buffer as float.
float load_as_float(const void* base, DType t, int64_t i);
void store_from_float(void* base, DType t, int64_t i, float v);

}  // namespace dsv4
