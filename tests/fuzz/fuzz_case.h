// One fuzz case: the arguments of one op call described as data (tensor specs and scalars), so
// that generic mutations (dtype, shape, strides, devices, aliasing, index values, scalars) apply
// to every op alike, and the buffers behind the views are allocated, filled, snapshotted and
// compared by one piece of code.
//
// Every buffer is allocated on its own with exactly the bytes its views span, so that under
// AddressSanitizer a read or write one byte past a view is reported. Views may share a buffer
// (aliasing), carry negative, zero or overlapping strides, or be labelled CUDA; with a CUDA
// device present, CUDA-labelled buffers live in device memory.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dsv4/tensor.h"

namespace dsv4::fuzz {

using Rng = std::mt19937_64;

// What the call may do to an argument's memory.
enum class Role : uint8_t { input, output, inout };

// How the elements of a valid argument are drawn.
struct Values {
  enum class Kind : uint8_t { real, bytes, ints, list } kind = Kind::real;
  int64_t lo = 0, hi = 0;      // ints: uniform in [lo, hi]
  std::vector<int64_t> list;   // list: element i (row-major) = list[i % size]
};

struct Arg {
  std::string name;
  Role role = Role::input;
  DType dtype = DType::fp32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty: contiguous
  Values values;
  bool defined = true;
  bool cuda = false;
  // Index-valued (positions, slots, tables, lengths): the target of index-value mutations.
  bool index = false;
  // Shares the buffer of args[alias_of], starting alias_byte_offset bytes into it.
  int alias_of = -1;
  int64_t alias_byte_offset = 0;
  // Extra bytes before the view's lowest element (misaligns the base pointer).
  int64_t base_shift_bytes = 0;

  std::vector<int64_t> effective_strides() const;
  bool is_write() const { return role != Role::input; }
};

struct Scalar {
  std::string name;
  double value = 0;
  bool integral = true;
};

struct Case {
  std::vector<Arg> args;
  std::vector<Scalar> scalars;
  std::vector<std::string> mutations;  // what was changed from the valid case, for the report

  Arg& arg(const std::string& name);
  const Arg* find(const std::string& name) const;
  int index_of(const std::string& name) const;
  int64_t i(const std::string& name) const;
  float f(const std::string& name) const;
  std::string describe() const;  // every argument and scalar, one line each
};

// Element offsets spanned by a view: [lo, hi] (lo <= 0 with negative strides), or empty when the
// view has no elements.
struct Span {
  int64_t lo = 0, hi = -1;
  bool empty() const { return hi < lo; }
};
Span element_span(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides);

// Calls fn(flat row-major index, element offset) for every element of the view.
template <typename Fn>
void for_each_element(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                      Fn&& fn) {
  const size_t nd = shape.size();
  for (int64_t d : shape)
    if (d <= 0) return;
  std::vector<int64_t> idx(nd, 0);
  int64_t flat = 0, off = 0;
  while (true) {
    fn(flat++, off);
    size_t d = nd;
    while (d > 0) {
      --d;
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
      if (d == 0) return;
    }
    if (nd == 0) return;
  }
}

// The buffers of one case and the views into them.
class Materialized {
 public:
  // Allocates and fills (valid values for inputs, random poison for outputs). Device buffers only
  // when `use_device` (a CUDA device is present); otherwise CUDA-labelled views point at host
  // memory, which the ops must refuse before reading (no CUDA backend, or mixed devices).
  Materialized(const Case& c, Rng& rng, bool use_device);
  ~Materialized();
  Materialized(const Materialized&) = delete;
  Materialized& operator=(const Materialized&) = delete;

  const TensorView& view(const std::string& name) const;
  // Buffer contents now (device buffers copied back).
  std::vector<std::vector<uint8_t>> snapshot() const;
  // Bytes the call may write when it accepts: those of every output / inout view.
  std::vector<std::vector<bool>> writable_masks() const;
  // Byte budget of one case (shapes whose buffers would exceed it are not drawn).
  static constexpr int64_t kMaxBytes = int64_t{64} << 20;

 private:
  struct Buffer;
  const Case& case_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<int> buffer_of_;       // per arg: its buffer, -1 when undefined
  std::vector<int64_t> base_off_;    // per arg: byte offset of element 0 in its buffer
  std::vector<TensorView> views_;
};

// Bytes all of a case's buffers need, or -1 when a view is inconsistent (an alias whose target
// is undefined, a base misaligned for the view's dtype).
int64_t case_bytes(const Case& c);

}  // namespace dsv4::fuzz
