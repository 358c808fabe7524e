#include "fuzz_case.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <sstream>

#include "dsv4/device_tensor.h"
#include "dsv4/status.h"

namespace dsv4::fuzz {

namespace {

// Element counts past this are filled and masked over their span instead of element by element
// (a huge dim with stride 0 spans a few bytes but has more elements than a loop can visit).
constexpr int64_t kMaxVisited = int64_t{1} << 22;

int64_t saturating_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) return 0;
    n = n > INT64_MAX / d ? INT64_MAX : n * d;
  }
  return n;
}

int root_of(const Case& c, int a) {
  for (int hops = 0; c.args[a].alias_of >= 0 && hops < 8; ++hops) a = c.args[a].alias_of;
  return c.args[a].alias_of >= 0 ? -1 : a;
}

// Bytes from the buffer's start to element 0 of the view, and the bytes the view needs in it.
struct Placement {
  int64_t base_off = 0, end = 0;
};
Placement place(const Arg& a) {
  const int64_t es = static_cast<int64_t>(dtype_size(a.dtype));
  const Span s = element_span(a.shape, a.effective_strides());
  const int64_t lead = (a.alias_of >= 0 ? a.alias_byte_offset : 0) + a.base_shift_bytes;
  if (s.empty()) return {lead, lead + es};
  return {lead - s.lo * es, lead + (s.hi - s.lo + 1) * es};
}

}  // namespace

std::vector<int64_t> Arg::effective_strides() const {
  if (!strides.empty()) return strides;
  std::vector<int64_t> st(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) st[d - 1] = st[d] * std::max<int64_t>(shape[d], 1);
  return st;
}

Arg& Case::arg(const std::string& name) { return args[static_cast<size_t>(index_of(name))]; }

const Arg* Case::find(const std::string& name) const {
  const int k = index_of(name);
  return k < 0 ? nullptr : &args[static_cast<size_t>(k)];
}

int Case::index_of(const std::string& name) const {
  for (size_t k = 0; k < args.size(); ++k)
    if (args[k].name == name) return static_cast<int>(k);
  return -1;
}

int64_t Case::i(const std::string& name) const {
  for (const Scalar& s : scalars)
    if (s.name == name) return static_cast<int64_t>(s.value);
  throw std::logic_error("fuzz: no scalar " + name);
}

float Case::f(const std::string& name) const {
  for (const Scalar& s : scalars)
    if (s.name == name) return static_cast<float>(s.value);
  throw std::logic_error("fuzz: no scalar " + name);
}

std::string Case::describe() const {
  std::ostringstream os;
  for (const Arg& a : args) {
    os << "  " << a.name << ": ";
    if (!a.defined) {
      os << "undefined\n";
      continue;
    }
    os << dtype_name(a.dtype) << (a.cuda ? " cuda" : " cpu") << " shape [";
    for (size_t d = 0; d < a.shape.size(); ++d) os << (d ? ", " : "") << a.shape[d];
    os << "] strides [";
    const auto st = a.effective_strides();
    for (size_t d = 0; d < st.size(); ++d) os << (d ? ", " : "") << st[d];
    os << "]";
    if (a.alias_of >= 0) os << " alias of " << args[a.alias_of].name << " +" << a.alias_byte_offset << " B";
    if (a.base_shift_bytes) os << " base +" << a.base_shift_bytes << " B";
    os << "\n";
  }
  for (const Scalar& s : scalars) os << "  " << s.name << " = " << s.value << "\n";
  return os.str();
}

Span element_span(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  Span s{0, 0};
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 0) return {};
    const int64_t reach = strides[d] * (shape[d] - 1);
    (reach < 0 ? s.lo : s.hi) += reach;
  }
  return s;
}

int64_t case_bytes(const Case& c) {
  std::vector<int64_t> size(c.args.size(), 0);
  for (size_t k = 0; k < c.args.size(); ++k) {
    const Arg& a = c.args[k];
    if (!a.defined) continue;
    // A view misaligned for its own dtype (a dtype changed after an alias or a shift) is the
    // caller's undefined behaviour, which no op can check portably: not drawn.
    const int64_t lead = (a.alias_of >= 0 ? a.alias_byte_offset : 0) + a.base_shift_bytes;
    if (lead % static_cast<int64_t>(dtype_size(a.dtype)) != 0) return -1;
    const int r = root_of(c, static_cast<int>(k));
    if (r < 0 || !c.args[r].defined) return -1;
    size[r] = std::max(size[r], place(a).end);
  }
  int64_t total = 0;
  for (int64_t s : size) total += s;
  return total;
}

struct Materialized::Buffer {
  int64_t bytes = 0;
  uint8_t* host = nullptr;  // exactly `bytes` long: ASan reports the first byte past it
  bool on_device = false;   // a CUDA buffer on a machine with a device: `device` holds it
  DeviceTensor device;
  ~Buffer() { ::operator delete(host, std::align_val_t{64}); }
  uint8_t* base() const { return on_device ? device.data<uint8_t>() : host; }
};

Materialized::Materialized(const Case& c, Rng& rng, bool use_device) : case_(c) {
  const size_t n = c.args.size();
  buffer_of_.assign(n, -1);
  base_off_.assign(n, 0);
  views_.resize(n);
  // Buffers: one per root argument, as long as the furthest view into it needs.
  std::vector<int64_t> need(n, 0);
  for (size_t k = 0; k < n; ++k) {
    if (!c.args[k].defined) continue;
    const int r = root_of(c, static_cast<int>(k));
    if (r < 0 || !c.args[r].defined) throw std::logic_error("fuzz: alias of an undefined argument");
    const Placement p = place(c.args[k]);
    need[r] = std::max(need[r], p.end);
    base_off_[k] = p.base_off;
  }
  std::vector<int> buffer_of_root(n, -1);
  for (size_t r = 0; r < n; ++r) {
    if (need[r] == 0) continue;
    auto b = std::make_unique<Buffer>();
    b->bytes = need[r];
    b->host = static_cast<uint8_t*>(::operator new(static_cast<size_t>(b->bytes), std::align_val_t{64}));
    for (int64_t i = 0; i < b->bytes; i += 8) {  // poison
      const uint64_t r64 = rng();
      std::memcpy(b->host + i, &r64, static_cast<size_t>(std::min<int64_t>(8, b->bytes - i)));
    }
    buffer_of_root[r] = static_cast<int>(buffers_.size());
    buffers_.push_back(std::move(b));
  }
  // Valid values of the inputs, through their own views (outputs keep the poison).
  std::uniform_real_distribution<float> real(-2.0f, 2.0f);
  for (size_t k = 0; k < n; ++k) {
    const Arg& a = c.args[k];
    if (!a.defined) continue;
    const int r = root_of(c, static_cast<int>(k));
    buffer_of_[k] = buffer_of_root[r];
    if (a.role == Role::output) continue;
    uint8_t* base = buffers_[buffer_of_[k]]->host + base_off_[k];
    const int64_t es = static_cast<int64_t>(dtype_size(a.dtype));
    auto write = [&](int64_t flat, int64_t off) {
      uint8_t* p = base + off * es;
      int64_t v = 0;
      switch (a.values.kind) {
        case Values::Kind::bytes:
          for (int64_t i = 0; i < es; ++i) p[i] = static_cast<uint8_t>(rng());
          return;
        case Values::Kind::real:
          store_from_float(p, a.dtype, 0, real(rng));
          return;
        case Values::Kind::ints:
          v = std::uniform_int_distribution<int64_t>(a.values.lo, a.values.hi)(rng);
          break;
        case Values::Kind::list:
          v = a.values.list[static_cast<size_t>(flat) % a.values.list.size()];
          break;
      }
      switch (a.dtype) {
        case DType::int32: { const auto x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); return; }
        case DType::int64: std::memcpy(p, &v, 8); return;
        case DType::uint8: *p = static_cast<uint8_t>(v); return;
        default: store_from_float(p, a.dtype, 0, static_cast<float>(v)); return;
      }
    };
    const auto st = a.effective_strides();
    if (saturating_numel(a.shape) <= kMaxVisited) {
      for_each_element(a.shape, st, write);
    } else {
      const Span s = element_span(a.shape, st);
      for (int64_t off = s.lo; off <= s.hi; ++off) write(off - s.lo, off);
    }
  }
  // Device copies, then the views.
  for (size_t r = 0; r < n; ++r) {
    if (buffer_of_root[r] < 0 || !use_device || !c.args[r].cuda) continue;
    Buffer& b = *buffers_[buffer_of_root[r]];
    b.device = DeviceTensor(DType::uint8, {b.bytes});
    b.on_device = true;
    copy_to_device(TensorView(b.host, DType::uint8, {b.bytes}), b.device.view());
  }
  for (size_t k = 0; k < n; ++k) {
    const Arg& a = c.args[k];
    if (!a.defined) continue;
    TensorView& v = views_[k];
    v.data = buffers_[buffer_of_[k]]->base() + base_off_[k];
    v.dtype = a.dtype;
    v.device = c.args[root_of(c, static_cast<int>(k))].cuda ? Device::cuda : Device::cpu;
    v.ndim = static_cast<int>(a.shape.size());
    const auto st = a.effective_strides();
    for (int d = 0; d < v.ndim; ++d) {
      v.shape[d] = a.shape[d];
      v.strides[d] = st[d];
    }
  }
}

Materialized::~Materialized() = default;

const TensorView& Materialized::view(const std::string& name) const {
  const int k = case_.index_of(name);
  if (k < 0) throw std::logic_error("fuzz: no argument " + name);
  return views_[k];
}

std::vector<std::vector<uint8_t>> Materialized::snapshot() const {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& b : buffers_) {
    std::vector<uint8_t> bytes(static_cast<size_t>(b->bytes));
    if (b->on_device)
      copy_to_host(b->device.view(), TensorView(bytes.data(), DType::uint8, {b->bytes}));
    else
      std::memcpy(bytes.data(), b->host, bytes.size());
    out.push_back(std::move(bytes));
  }
  return out;
}

std::vector<std::vector<bool>> Materialized::writable_masks() const {
  std::vector<std::vector<bool>> masks;
  for (const auto& b : buffers_) masks.emplace_back(static_cast<size_t>(b->bytes), false);
  for (size_t k = 0; k < case_.args.size(); ++k) {
    const Arg& a = case_.args[k];
    if (!a.defined || !a.is_write()) continue;
    std::vector<bool>& m = masks[buffer_of_[k]];
    const int64_t es = static_cast<int64_t>(dtype_size(a.dtype));
    auto mark = [&](int64_t, int64_t off) {
      const int64_t at = base_off_[k] + off * es;
      for (int64_t i = 0; i < es; ++i) m[static_cast<size_t>(at + i)] = true;
    };
    const auto st = a.effective_strides();
    if (saturating_numel(a.shape) <= kMaxVisited) {
      for_each_element(a.shape, st, mark);
    } else {
      const Span s = element_span(a.shape, st);
      for (int64_t off = s.lo; off <= s.hi; ++off) mark(0, off);
    }
  }
  return masks;
}

}  // namespace dsv4::fuzz
