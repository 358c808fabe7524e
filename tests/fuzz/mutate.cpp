#include "mutate.h"

#include <climits>
#include <cmath>
#include <limits>
#include <string>

namespace dsv4::fuzz {

namespace {

template <typename T>
const T& pick(Rng& rng, const std::vector<T>& v) {
  return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
}

int64_t uniform(Rng& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// A random defined argument satisfying `ok`, or nullptr.
template <typename Pred>
Arg* pick_arg(Case& c, Rng& rng, Pred ok) {
  std::vector<Arg*> cands;
  for (Arg& a : c.args)
    if (a.defined && ok(a)) cands.push_back(&a);
  return cands.empty() ? nullptr : pick(rng, cands);
}

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

constexpr int64_t kHuge = int64_t{1} << 40;

bool mutate_dtype(Case& c, Rng& rng) {
  Arg* a = pick_arg(c, rng, [](const Arg&) { return true; });
  if (!a) return false;
  static const std::vector<DType> all = {DType::bf16,  DType::fp16,  DType::fp32,  DType::fp8_e4m3,
                                         DType::ue8m0, DType::int32, DType::int64, DType::uint8};
  const DType t = pick(rng, all);
  if (t == a->dtype) return false;
  // Explicit strides are in elements and stay as they are: the byte layout changes with the size.
  c.mutations.push_back(a->name + ": dtype " + std::string(dtype_name(a->dtype)) + " -> " +
                        std::string(dtype_name(t)));
  a->dtype = t;
  return true;
}

bool mutate_shape(Case& c, Rng& rng) {
  Arg* a = pick_arg(c, rng, [](const Arg& x) { return !x.shape.empty(); });
  if (!a) return false;
  const size_t d = static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(a->shape.size()) - 1));
  const int64_t old = a->shape[d];
  const std::vector<int64_t> choices = {0, 1, old - 1, old + 1, 2 * old, old + 64, -1};
  int64_t v = pick(rng, choices);
  const auto st = a->effective_strides();
  std::vector<int64_t> strides = st;
  std::string note;
  if (uniform(rng, 0, 5) == 0) {
    // A huge dim over stride 0 spans no memory: tests size arithmetic, not allocation.
    v = kHuge;
    strides[d] = 0;
    note = " (stride 0)";
  }
  if (v == old) return false;
  a->shape[d] = v;
  a->strides = strides;  // keep the other dims' byte layout
  c.mutations.push_back(a->name + ": shape[" + std::to_string(d) + "] " + std::to_string(old) +
                        " -> " + std::to_string(v) + note);
  return true;
}

bool mutate_rank(Case& c, Rng& rng) {
  Arg* a = pick_arg(c, rng, [](const Arg&) { return true; });
  if (!a) return false;
  auto st = a->effective_strides();
  const std::vector<int64_t> before = a->shape;
  if (a->shape.empty() || (a->shape.size() < kMaxDims && uniform(rng, 0, 1))) {
    a->shape.insert(a->shape.begin(), 1);
    st.insert(st.begin(), st.empty() ? 1 : st.front() * a->shape[1]);
  } else {
    a->shape.erase(a->shape.begin());
    st.erase(st.begin());
  }
  a->strides = st;
  c.mutations.push_back(a->name + ": shape " + dims_str(before) + " -> " + dims_str(a->shape));
  return true;
}

bool mutate_stride(Case& c, Rng& rng) {
  Arg* a = pick_arg(c, rng, [](const Arg& x) { return !x.shape.empty(); });
  if (!a) return false;
  auto st = a->effective_strides();
  const size_t d = static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(st.size()) - 1));
  const int64_t old = st[d];
  static const std::vector<std::string> kinds = {"negative", "zero", "overlap", "padded", "two"};
  const std::string kind = pick(rng, kinds);
  if (kind == "negative") st[d] = old == 0 ? -1 : -old;
  if (kind == "zero") st[d] = 0;
  if (kind == "overlap") st[d] = d + 1 < st.size() ? std::max<int64_t>(1, old / 2) : 0;
  if (kind == "padded") st[d] = old + uniform(rng, 1, 16);
  if (kind == "two") st[d] = 2 * std::max<int64_t>(old, 1);
  if (st[d] == old) return false;
  a->strides = st;
  c.mutations.push_back(a->name + ": strides[" + std::to_string(d) + "] " + std::to_string(old) +
                        " -> " + std::to_string(st[d]) + " (" + kind + ")");
  return true;
}

bool mutate_undefined(Case& c, Rng& rng) {
  Arg* a = pick_arg(c, rng, [](const Arg&) { return true; });
  if (!a) return false;
  for (const Arg& other : c.args)
    if (other.defined && other.alias_of >= 0 && &c.args[other.alias_of] == a) return false;
  a->defined = false;
  c.mutations.push_back(a->name + ": undefined");
  return true;
}

bool mutate_device(Case& c, Rng& rng, const Devices& devices) {
  // With a device: one argument on CUDA (mixed), or one back on the CPU after all moved.
  // Without one: CUDA-labelled host memory, which must be refused before it is read.
  if (devices.cuda_available && uniform(rng, 0, 1)) {
    move_all_to_cuda(c);
    Arg* a = pick_arg(c, rng, [](const Arg& x) { return x.alias_of < 0; });
    if (!a) return false;
    a->cuda = false;
    c.mutations.push_back("every argument on CUDA but " + a->name);
    return true;
  }
  if (!devices.cuda_built && uniform(rng, 0, 1)) {
    move_all_to_cuda(c);
    c.mutations.push_back("every argument labelled CUDA (no CUDA backend)");
    return true;
  }
  Arg* a = pick_arg(c, rng, [](const Arg& x) { return x.alias_of < 0 && !x.cuda; });
  if (!a) return false;
  a->cuda = true;
  c.mutations.push_back(a->name + ": on CUDA, the others on the CPU");
  return true;
}

bool mutate_alias(Case& c, Rng& rng) {
  Arg* out = pick_arg(c, rng, [](const Arg& x) { return x.is_write() && x.alias_of < 0; });
  if (!out) return false;
  const int self = static_cast<int>(out - c.args.data());
  std::vector<int> targets;
  for (size_t k = 0; k < c.args.size(); ++k)
    if (static_cast<int>(k) != self && c.args[k].defined && c.args[k].alias_of < 0)
      targets.push_back(static_cast<int>(k));
  if (targets.empty()) return false;
  // Nothing may alias the argument that becomes an alias (one level of sharing).
  for (const Arg& other : c.args)
    if (other.alias_of == self) return false;
  const int t = pick(rng, targets);
  const Arg& target = c.args[t];
  const Span s = element_span(target.shape, target.effective_strides());
  const int64_t span_bytes = s.empty() ? 0 : (s.hi - s.lo + 1) * static_cast<int64_t>(dtype_size(target.dtype));
  const int64_t es = static_cast<int64_t>(dtype_size(out->dtype));
  const std::vector<int64_t> offsets = {0, 0, span_bytes / 2 / es * es, es};
  out->alias_of = t;
  out->alias_byte_offset = pick(rng, offsets);
  out->cuda = target.cuda;
  c.mutations.push_back(out->name + ": aliases " + target.name + " at +" +
                        std::to_string(out->alias_byte_offset) + " B");
  return true;
}

bool mutate_misalign(Case& c, Rng& rng) {
  Arg* a = pick_arg(c, rng, [](const Arg& x) { return x.alias_of < 0; });
  if (!a) return false;
  // Whole elements only: a pointer misaligned for its own dtype is the caller's undefined
  // behaviour, not something an op can check portably.
  a->base_shift_bytes = static_cast<int64_t>(dtype_size(a->dtype)) * uniform(rng, 1, 3);
  c.mutations.push_back(a->name + ": base pointer +" + std::to_string(a->base_shift_bytes) + " B");
  return true;
}

bool mutate_index_value(Case& c, Rng& rng) {
  Arg* a = pick_arg(c, rng, [](const Arg& x) { return x.index && x.role != Role::output; });
  if (!a) return false;
  int64_t n = 1;
  for (int64_t d : a->shape) n *= d;
  if (n <= 0 || n > (int64_t{1} << 22)) return false;
  // Turn the drawn values into an explicit list so one element can be replaced.
  if (a->values.kind == Values::Kind::ints) {
    std::vector<int64_t> list(static_cast<size_t>(n));
    for (int64_t& v : list) v = uniform(rng, a->values.lo, a->values.hi);
    a->values = {Values::Kind::list, 0, 0, list};
  } else if (a->values.kind == Values::Kind::list) {
    std::vector<int64_t> list(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) list[i] = a->values.list[static_cast<size_t>(i) % a->values.list.size()];
    a->values.list = list;
  } else {
    return false;
  }
  int64_t hi = 0, lo = 0;
  for (int64_t v : a->values.list) hi = std::max(hi, v), lo = std::min(lo, v);
  hi = std::min(hi, kHuge), lo = std::max(lo, -kHuge);  // earlier mutations may have drawn extremes
  const std::vector<int64_t> bad = {-1, -2, lo - 1, hi + 1, hi + 64, INT32_MAX, INT32_MIN,
                                    kHuge, -kHuge, INT64_MAX, INT64_MIN};
  const size_t at = static_cast<size_t>(uniform(rng, 0, n - 1));
  const int64_t v = pick(rng, bad);
  c.mutations.push_back(a->name + "[" + std::to_string(at) + "] " + std::to_string(a->values.list[at]) +
                        " -> " + std::to_string(v));
  a->values.list[at] = v;
  return true;
}

bool mutate_scalar(Case& c, Rng& rng) {
  if (c.scalars.empty()) return false;
  Scalar& s = c.scalars[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(c.scalars.size()) - 1))];
  const double old = s.value;
  if (s.integral) {
    const std::vector<double> v = {0, -1, old - 1, old + 1, 2 * old, old * 64, INT32_MAX, INT32_MIN};
    s.value = pick(rng, v);
  } else {
    const std::vector<double> v = {std::numeric_limits<double>::quiet_NaN(),
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(), -1.0, 0.0, 1e30,
                                   1e-30};
    s.value = pick(rng, v);
  }
  if (s.value == old) return false;
  c.mutations.push_back(s.name + ": " + std::to_string(old) + " -> " + std::to_string(s.value));
  return true;
}

}  // namespace

void move_all_to_cuda(Case& c) {
  for (Arg& a : c.args) a.cuda = true;
}

bool mutate_once(Case& c, Rng& rng, const Devices& devices) {
  switch (uniform(rng, 0, 10)) {
    case 0: return mutate_dtype(c, rng);
    case 1: return mutate_shape(c, rng);
    case 2: return mutate_rank(c, rng);
    case 3: case 4: return mutate_stride(c, rng);
    case 5: return mutate_undefined(c, rng);
    case 6: return mutate_device(c, rng, devices);
    case 7: return mutate_alias(c, rng);
    case 8: return mutate_misalign(c, rng);
    case 9: return mutate_index_value(c, rng);
    default: return mutate_scalar(c, rng);
  }
}

}  // namespace dsv4::fuzz
