// safetensors reader: mmap + strict header validation (the writer and Checkpoint live in
// safetensors_writer.cpp and checkpoint.cpp).
#include "dsv4/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "dsv4/status.h"
#include "weights/weights_detail.h"

namespace dsv4 {

namespace {

using nlohmann::json;

struct DTypeName {
  DType dtype;
  std::string_view name;
};
constexpr std::array<DTypeName, 8> kDTypeNames = {{
    {DType::bf16, "BF16"},
    {DType::fp16, "F16"},
    {DType::fp32, "F32"},
    {DType::fp8_e4m3, "F8_E4M3"},
    {DType::ue8m0, "F8_E8M0"},
    {DType::uint8, "U8"},
    {DType::int32, "I32"},
    {DType::int64, "I64"},
}};

// Valid safetensors dtypes this library has no DType for: "unsupported" rather than "unknown".
constexpr std::array<std::string_view, 14> kUnsupportedDTypes = {
    "BOOL", "I8",      "I16", "U16",     "U32",     "U64",         "F64",
    "C64",  "F8_E5M2", "F4",  "F6_E2M3", "F6_E3M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"};

// The header of a file larger than this is refused (the reference implementation's limit).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string where_file(const std::string& path) { return "safetensors '" + path + "'"; }

// Read-only mapping of a whole file; unmapped when the last owner goes.
class Mapping {
 public:
  explicit Mapping(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(where_file(path), ": cannot open: ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      fail(where_file(path), ": cannot stat: ", std::strerror(err));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        fail(where_file(path), ": cannot mmap ", size_, " bytes: ", std::strerror(err));
      }
      base_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);  // the mapping keeps the file alive
  }
  ~Mapping() {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  const uint8_t* data() const { return base_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

uint64_t load_le_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// nlohmann keeps the last of two equal keys silently; the format forbids them, so the parser
// callback records the first repeated key (and how deep it was) for a precise error.
struct DuplicateKeyFinder {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  int duplicate_depth = -1;

  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate_depth < 0) {
          duplicate = parsed.get<std::string>();
          duplicate_depth = depth;
        }
        break;
      default:
        break;
    }
    return true;
  }
};

DType parse_dtype(const std::string& where, const json& value) {
  if (!value.is_string()) fail(where, ": dtype: expected a string, got ", value.dump());
  const std::string name = value.get<std::string>();
  if (auto t = dtype_from_safetensors(name)) return *t;
  for (std::string_view u : kUnsupportedDTypes)
    if (name == u)
      fail(where, ": dtype: ", name,
           " is not supported (supported: BF16, F16, F32, F8_E4M3, F8_E8M0, U8, I32, I64)");
  fail(where, ": dtype: unknown safetensors dtype '", name, "'");
}

std::vector<int64_t> parse_shape(const std::string& where, const json& value) {
  if (!value.is_array()) fail(where, ": shape: expected an array of integers, got ", value.dump());
  if (value.size() > static_cast<size_t>(kMaxDims))
    fail_expected(where, "shape", "at most " + std::to_string(kMaxDims) + " dimensions",
                  value.dump());
  std::vector<int64_t> shape;
  for (const json& d : value) {
    if (!d.is_number_integer() ||
        (d.is_number_integer() && !d.is_number_unsigned() && d.get<int64_t>() < 0))
      fail_expected(where, "shape", "non-negative integers", value.dump());
    const uint64_t u = d.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_expected(where, "shape", "dimensions below 2^63", value.dump());
    shape.push_back(static_cast<int64_t>(u));
  }
  return shape;
}

// Byte size of a tensor, or nullopt when numel * element size overflows 64 bits.
std::optional<uint64_t> byte_size(const std::vector<int64_t>& shape, DType t) {
  uint64_t n = dtype_size(t);
  for (int64_t d : shape) {
    const auto u = static_cast<uint64_t>(d);
    if (u != 0 && n > std::numeric_limits<uint64_t>::max() / u) return std::nullopt;
    n *= u;
  }
  return n;
}

SafetensorsEntry parse_entry(const std::string& file_where, const std::string& name,
                             const json& value, uint64_t data_size) {
  const std::string where = file_where + ": tensor '" + name + "'";
  if (!value.is_object())
    fail(where, ": expected an object {dtype, shape, data_offsets}, got ", value.dump());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!value.contains(key)) fail(where, ": missing key '", key, "'");

  SafetensorsEntry e;
  e.name = name;
  e.dtype = parse_dtype(where, value["dtype"]);
  e.shape = parse_shape(where, value["shape"]);

  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    fail_expected(where, "data_offsets", "[begin, end] (non-negative integers)", offsets.dump());
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.begin > e.end) fail_expected(where, "data_offsets", "begin <= end", offsets.dump());
  if (e.end > data_size)
    fail(where, ": data_offsets ", offsets.dump(), " out of range: the data section has ",
         data_size, " bytes");
  const auto want = byte_size(e.shape, e.dtype);
  if (!want || *want != e.nbytes())
    fail(where, ": data_offsets ", offsets.dump(), " hold ", e.nbytes(), " bytes, but shape ",
         e.shape_str(), " of ", safetensors_dtype_name(e.dtype), " needs ",
         want ? std::to_string(*want) : std::string("more than 2^64"), " bytes");
  return e;
}

MetadataMap parse_metadata(const std::string& file_where, const json& value) {
  if (!value.is_object())
    fail(file_where, ": __metadata__: expected an object of strings, got ", value.dump());
  MetadataMap out;
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string())
      fail(file_where, ": __metadata__['", key, "']: expected a string, got ", v.dump());
    out[key] = v.get<std::string>();
  }
  return out;
}

// The data section must be covered exactly once: tensors in offset order, each starting where
// the previous one ended, the last ending at the end of the file (no overlap, no hole).
void check_coverage(const std::string& file_where,
                    const std::map<std::string, SafetensorsEntry>& entries, uint64_t data_size) {
  std::vector<const SafetensorsEntry*> order;
  order.reserve(entries.size());
  for (const auto& [name, e] : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : order) {
    if (e->begin < covered)
      fail(file_where, ": tensor '", e->name, "' bytes [", e->begin, ", ", e->end,
           ") overlap tensor '", prev->name, "' bytes [", prev->begin, ", ", prev->end, ")");
    if (e->begin > covered)
      fail(file_where, ": bytes [", covered, ", ", e->begin,
           ") of the data section (before tensor '", e->name, "') belong to no tensor");
    covered = e->end;
    prev = e;
  }
  if (covered != data_size)
    fail(file_where, ": bytes [", covered, ", ", data_size,
         ") at the end of the data section belong to no tensor");
}

}  // namespace

// ---- dtype names ----------------------------------------------------------------------------

std::string_view safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& d : kDTypeNames)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsEntry::shape_str() const { return weights_detail::shape_text(shape); }

// ---- SafetensorsFile ------------------------------------------------------------------------

struct SafetensorsFile::Impl {
  std::string path;
  std::shared_ptr<Mapping> mapping;
  uint64_t data_start = 0;  // 8 + header length
  std::map<std::string, SafetensorsEntry> entries;
  MetadataMap metadata;
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  impl->mapping = std::make_shared<Mapping>(path);
  const std::string where = where_file(path);
  const uint8_t* base = impl->mapping->data();
  const uint64_t file_size = impl->mapping->size();

  if (file_size < 8)
    fail(where, ": truncated: the file has ", file_size,
         " bytes, a safetensors file starts with an 8-byte header length");
  const uint64_t header_len = load_le_u64(base);
  if (header_len < 2 || header_len > kMaxHeaderBytes)
    fail_expected(where, "header length", "2.." + std::to_string(kMaxHeaderBytes) + " bytes",
                  header_len);
  if (header_len > file_size - 8)
    fail(where, ": truncated: header length ", header_len, " goes beyond the end of the file (",
         file_size, " bytes, ", file_size - 8, " after the length field)");

  const char* text = reinterpret_cast<const char*>(base + 8);
  if (text[0] != '{')
    fail(where, ": header: expected a JSON object starting with '{', got byte 0x", std::hex,
         static_cast<int>(static_cast<unsigned char>(text[0])));
  DuplicateKeyFinder dups;
  json header;
  try {
    header = json::parse(text, text + header_len, std::ref(dups));
  } catch (const json::exception& e) {
    fail(where, ": header is not valid JSON: ", e.what());
  }
  if (!header.is_object())
    fail(where, ": header: expected a JSON object, got ", header.type_name());
  if (dups.duplicate_depth == 1)
    fail(where, ": tensor name '", dups.duplicate, "' appears twice in the header");
  if (dups.duplicate_depth > 1)
    fail(where, ": header: key '", dups.duplicate, "' appears twice in one object");

  impl->data_start = 8 + header_len;
  const uint64_t data_size = file_size - impl->data_start;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      impl->metadata = parse_metadata(where, value);
      continue;
    }
    if (name.empty()) fail(where, ": a tensor has an empty name");
    impl->entries.emplace(name, parse_entry(where, name, value, data_size));
  }
  check_coverage(where, impl->entries, data_size);

  SafetensorsFile f;
  f.impl_ = std::move(impl);
  return f;
}

const std::string& SafetensorsFile::path() const {
  static const std::string kNone;
  return impl_ ? impl_->path : kNone;
}

const MetadataMap& SafetensorsFile::metadata() const {
  static const MetadataMap kNone;
  return impl_ ? impl_->metadata : kNone;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  if (impl_)
    for (const auto& [name, e] : impl_->entries) out.push_back(name);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const {
  return impl_ && impl_->entries.count(name) != 0;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  DSV4_CHECK(impl_ != nullptr, "safetensors: no file is open (looking for '", name, "')");
  const auto it = impl_->entries.find(name);
  if (it == impl_->entries.end()) fail(where_file(impl_->path), ": no tensor named '", name, "'");
  return it->second;
}

std::span<const uint8_t> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  return {impl_->mapping->data() + impl_->data_start + e.begin, static_cast<size_t>(e.nbytes())};
}

HostTensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  HostTensor t(e.dtype, e.shape);
  const auto src = bytes(name);
  if (!src.empty()) std::memcpy(t.data<uint8_t>(), src.data(), src.size());
  return t;
}

}  // namespace dsv4
