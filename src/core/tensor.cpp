#include "dsv4/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace dsv4 {

namespace {
void init_contiguous(TensorView& v, const int64_t* dims, size_t n) {
  DSV4_CHECK(n <= static_cast<size_t>(kMaxDims), "TensorView: at most ", kMaxDims,
             " dimensions, got ", n);
  v.ndim = static_cast<int>(n);
  int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    DSV4_CHECK(dims[d] >= 0, "TensorView: negative dimension ", dims[d]);
    v.shape[d] = dims[d];
    v.strides[d] = stride;
    stride *= dims[d];
  }
}
}  // namespace

TensorView::TensorView(void* ptr, DType t, std::initializer_list<int64_t> dims, Device dev)
    : data(ptr), dtype(t), device(dev) {
  init_contiguous(*this, dims.begin(), dims.size());
}

TensorView::TensorView(void* ptr, DType t, const std::vector<int64_t>& dims, Device dev)
    : data(ptr), dtype(t), device(dev) {
  init_contiguous(*this, dims.data(), dims.size());
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    stride *= shape[d];
  }
  return true;
}

std::string TensorView::shape_str() const {
  std::ostringstream os;
  os << '[';
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << shape[d];
  os << ']';
  return os.str();
}

TensorView TensorView::slice0(int64_t begin, int64_t end) const {
  DSV4_CHECK(ndim >= 1 && begin >= 0 && begin <= end && end <= shape[0],
             "TensorView::slice0: range [", begin, ", ", end, ") outside ", shape_str());
  TensorView v = *this;
  v.shape[0] = end - begin;
  if (data) v.data = static_cast<uint8_t*>(data) + begin * strides[0] * dtype_size(dtype);
  return v;
}

void check_defined(const char* where, const char* name, const TensorView& t) {
  if (!t.defined()) fail(where, ": ", name, ": expected a tensor, got an empty view");
}
void check_dtype(const char* where, const char* name, const TensorView& t, DType expected) {
  if (t.dtype != expected)
    fail_expected(where, std::string(name) + ".dtype", dtype_name(expected), dtype_name(t.dtype));
}
// A negative dim is no size at all (a view whose sizes the ops multiply and loop over): every
// shape check refuses it, whatever size it expects.
static void check_sizes(const char* where, const char* name, const TensorView& t) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] < 0)
      fail_expected(where, std::string(name) + ".shape[" + std::to_string(d) + "]", "a size >= 0",
                    t.shape[d]);
}
void check_ndim(const char* where, const char* name, const TensorView& t, int expected) {
  if (t.ndim != expected)
    fail_expected(where, std::string(name) + ".ndim", expected,
                  std::to_string(t.ndim) + " (shape " + t.shape_str() + ")");
  check_sizes(where, name, t);
}
void check_dim(const char* where, const char* name, const TensorView& t, int dim,
               int64_t expected) {
  if (dim >= t.ndim || t.shape[dim] != expected)
    fail_expected(where, std::string(name) + ".shape[" + std::to_string(dim) + "]", expected,
                  dim >= t.ndim ? std::string("no such dim") : std::to_string(t.shape[dim]));
}
void check_shape(const char* where, const char* name, const TensorView& t,
                 std::initializer_list<int64_t> expected) {
  bool ok = static_cast<int>(expected.size()) == t.ndim;
  int d = 0;
  for (int64_t e : expected) {
    if (ok && e >= 0 && t.shape[d] != e) ok = false;  // -1: any size
    ++d;
  }
  if (ok) check_sizes(where, name, t);
  if (!ok) {
    std::ostringstream os;
    os << '[';
    d = 0;
    for (int64_t e : expected) {
      os << (d++ ? ", " : "");
      if (e < 0) os << '*'; else os << e;
    }
    os << ']';
    fail_expected(where, std::string(name) + ".shape", os.str(), t.shape_str());
  }
}
void check_contiguous(const char* where, const char* name, const TensorView& t) {
  if (!t.is_contiguous())
    fail(where, ": ", name, ": expected a contiguous tensor, got shape ", t.shape_str(),
         " with non-row-major strides");
}
void check_inner_contiguous(const char* where, const char* name, const TensorView& t) {
  check_sizes(where, name, t);
  if (t.ndim > 0 && t.shape[t.ndim - 1] > 1 && t.strides[t.ndim - 1] != 1)
    fail_expected(where, std::string(name) + ".stride(-1)", 1, t.strides[t.ndim - 1]);
}
void check_device(const char* where, const char* name, const TensorView& t, Device expected) {
  if (t.device != expected)
    fail_expected(where, std::string(name) + ".device", expected == Device::cpu ? "cpu" : "cuda",
                  t.device == Device::cpu ? "cpu" : "cuda");
}

HostTensor::HostTensor(DType t, std::vector<int64_t> dims) : OwnedTensor(std::move(dims)) {
  int64_t n = 1;
  for (int64_t d : dims_) {
    DSV4_CHECK(d >= 0, "HostTensor: negative dimension ", d);
    n *= d;
  }
  const size_t bytes = std::max<size_t>(64, (static_cast<size_t>(n) * dtype_size(t) + 63) / 64 * 64);
  buf_ = std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)),
                                    [](uint8_t* p) { std::free(p); });
  DSV4_CHECK(buf_ != nullptr, "HostTensor: out of memory allocating ", bytes, " bytes");
  view_ = TensorView(buf_.get(), t, dims_);
}

HostTensor HostTensor::zeros(DType t, std::vector<int64_t> dims) {
  HostTensor h(t, std::move(dims));
  h.fill_bytes(0);
  return h;
}

HostTensor HostTensor::from_int32(const std::vector<int32_t>& values) {
  HostTensor h(DType::int32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), h.data<int32_t>());
  return h;
}

namespace {
// Visits the elements of `v` in row-major order: fn(i, element offset in v).
template <class Fn>
void for_each_offset(const TensorView& v, Fn&& fn) {
  std::array<int64_t, kMaxDims> idx{};
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int d = 0; d < v.ndim; ++d) off += idx[d] * v.strides[d];
    fn(i, off);
    for (int d = v.ndim - 1; d >= 0; --d) {
      if (++idx[d] < v.shape[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace

HostTensor HostTensor::copy_of(const TensorView& host) {
  check_device("HostTensor::copy_of", "host", host, Device::cpu);
  HostTensor out(host.dtype, std::vector<int64_t>(host.shape.begin(), host.shape.begin() + host.ndim));
  const size_t esize = dtype_size(host.dtype);
  if (host.is_contiguous()) {
    if (out.nbytes() > 0) std::memcpy(out.buf_.get(), host.data, out.nbytes());
    return out;
  }
  const auto* src = static_cast<const uint8_t*>(host.data);
  uint8_t* dst = out.buf_.get();
  for_each_offset(host, [&](int64_t i, int64_t off) {
    std::memcpy(dst + i * esize, src + off * static_cast<int64_t>(esize), esize);
  });
  return out;
}

HostTensor HostTensor::copy_of(const TensorView& host, DType as) {
  if (as == host.dtype) return copy_of(host);
  check_device("HostTensor::copy_of", "host", host, Device::cpu);
  HostTensor out(as, std::vector<int64_t>(host.shape.begin(), host.shape.begin() + host.ndim));
  for_each_offset(host, [&](int64_t i, int64_t off) {
    store_from_float(out.buf_.get(), as, i, load_as_float(host.data, host.dtype, off));
  });
  return out;
}

void HostTensor::fill_bytes(uint8_t byte) {
  if (buf_) std::memset(buf_.get(), byte, nbytes());
}

float HostTensor::get(int64_t i) const { return load_as_float(view_.data, view_.dtype, i); }
void HostTensor::set(int64_t i, float v) { store_from_float(view_.data, view_.dtype, i, v); }

float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::bf16: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::fp16: return fp16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::fp32: return static_cast<const float*>(base)[i];
    case DType::fp8_e4m3: return fp8_e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::ue8m0: return ue8m0_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::int32: return static_cast<float>(static_cast<const int32_t*>(base)[i]);
    case DType::int64: return static_cast<float>(static_cast<const int64_t*>(base)[i]);
    case DType::uint8: return static_cast<float>(static_cast<const uint8_t*>(base)[i]);
  }
  return 0.0f;
}

void store_from_float(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::bf16: static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(v); return;
    case DType::fp16: static_cast<uint16_t*>(base)[i] = float_to_fp16_bits(v); return;
    case DType::fp32: static_cast<float*>(base)[i] = v; return;
    case DType::fp8_e4m3: static_cast<uint8_t*>(base)[i] = float_to_fp8_e4m3(v); return;
    case DType::ue8m0: static_cast<uint8_t*>(base)[i] = ue8m0_for_amax(v * kFp8Max); return;
    case DType::int32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); return;
    case DType::int64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); return;
    case DType::uint8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); return;
  }
}

}  // namespace dsv4
