// safetensors reader/writer and Checkpoint: round trips of every dtype, headers built byte by byte
// here, and every class of corrupt file rejected with an error naming the file and tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dsv4/safetensors.h"
#include "weights_test_support.h"

namespace {

namespace fs = std::filesystem;
using dsv4::DType;
using dsv4::HostTensor;
using dsv4_test::expect_error;
using dsv4_test::TempDir;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The 8-byte little-endian length, written out byte by byte.
std::string le_u64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A whole file: length + header text + data bytes.
std::string file_bytes(const std::string& header, const std::string& data) {
  return le_u64(header.size()) + header + data;
}

// Random bytes: round trips are byte-exact, so any bit pattern (NaNs included) must survive.
HostTensor random_tensor(DType t, std::vector<int64_t> shape, std::mt19937& rng) {
  HostTensor h(t, std::move(shape));
  auto* p = h.data<uint8_t>();
  for (size_t i = 0; i < h.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng() & 0xff);
  return h;
}

// ---- dtype names ----------------------------------------------------------------------------

TEST(SafetensorsDType, NamesOfTheFormat) {
  const std::pair<DType, const char*> expected[] = {
      {DType::bf16, "BF16"},        {DType::fp16, "F16"},      {DType::fp32, "F32"},
      {DType::fp8_e4m3, "F8_E4M3"}, {DType::ue8m0, "F8_E8M0"}, {DType::uint8, "U8"},
      {DType::int32, "I32"},        {DType::int64, "I64"}};
  for (const auto& [t, name] : expected) {
    EXPECT_EQ(dsv4::safetensors_dtype_name(t), name);
    ASSERT_TRUE(dsv4::dtype_from_safetensors(name).has_value()) << name;
    EXPECT_EQ(*dsv4::dtype_from_safetensors(name), t);
  }
  EXPECT_FALSE(dsv4::dtype_from_safetensors("F64").has_value());
  EXPECT_FALSE(dsv4::dtype_from_safetensors("bf16").has_value());  // names are case-sensitive
}

// ---- round trips ----------------------------------------------------------------------------

TEST(SafetensorsRoundTrip, EveryDTypeAndShapeKind) {
  TempDir dir;
  std::mt19937 rng(1234);
  const DType dtypes[] = {DType::bf16,  DType::fp16,  DType::fp32,  DType::fp8_e4m3,
                          DType::ue8m0, DType::uint8, DType::int32, DType::int64};
  dsv4::TensorMap tensors;
  for (DType t : dtypes) {
    const std::string n(dsv4::safetensors_dtype_name(t));
    tensors[n + ".matrix"] = random_tensor(t, {3, 5}, rng);  // odd sizes: offsets stay aligned
    tensors[n + ".vector"] = random_tensor(t, {7}, rng);
    tensors[n + ".scalar"] = random_tensor(t, {}, rng);
    tensors[n + ".empty"] = random_tensor(t, {0, 4}, rng);
    tensors[n + ".4d"] = random_tensor(t, {2, 1, 3, 2}, rng);
  }
  const dsv4::MetadataMap meta = {{"format", "pt"}, {"note", "round trip \"quoted\" ü"}};
  const std::string path = dir.file("all.safetensors");
  dsv4::write_safetensors(path, tensors, meta);

  const auto f = dsv4::SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.contains(name));
    const auto& e = f.entry(name);
    EXPECT_EQ(e.dtype, t.dtype());
    EXPECT_EQ(e.shape, t.shape());
    EXPECT_EQ(e.nbytes(), t.nbytes());
    // The writer keeps every tensor aligned to its element size (the data section starts at a
    // multiple of 8, checked in BytesFollowTheFormat).
    EXPECT_EQ(e.begin % dsv4::dtype_size(e.dtype), 0u);
    const HostTensor back = f.read(name);
    EXPECT_EQ(back.dtype(), t.dtype());
    EXPECT_EQ(back.shape(), t.shape());
    EXPECT_EQ(std::memcmp(back.data<uint8_t>(), t.data<uint8_t>(), t.nbytes()), 0);
    const auto span = f.bytes(name);
    ASSERT_EQ(span.size(), t.nbytes());
    EXPECT_TRUE(std::equal(span.begin(), span.end(), t.data<uint8_t>()));
  }
}

TEST(SafetensorsRoundTrip, NoTensorsAndNoMetadata) {
  TempDir dir;
  const std::string path = dir.file("empty.safetensors");
  dsv4::write_safetensors(path, {});
  const auto f = dsv4::SafetensorsFile::open(path);
  EXPECT_TRUE(f.names().empty());
  EXPECT_TRUE(f.metadata().empty());
}

// The writer's bytes, checked against the format: length field, space padding to 8, a JSON header
// that (parsed independently here) says exactly the expected thing, then the raw data in order.
TEST(SafetensorsWriter, BytesFollowTheFormat) {
  TempDir dir;
  HostTensor a(DType::fp32, {2});
  a.data<float>()[0] = 1.5f;
  a.data<float>()[1] = -2.0f;
  HostTensor b(DType::bf16, {1, 3});
  const uint16_t bbits[3] = {0x3F80, 0xC000, 0x7FC0};  // 1.0, -2.0, NaN
  std::memcpy(b.data<uint16_t>(), bbits, 6);
  HostTensor c(DType::uint8, {3});
  c.data<uint8_t>()[0] = 7;
  c.data<uint8_t>()[1] = 8;
  c.data<uint8_t>()[2] = 9;
  const std::string path = dir.file("w.safetensors");
  dsv4::write_safetensors(path, {{"c", c}, {"b", b}, {"a", a}}, {{"k", "v"}});

  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "header padded to a multiple of 8";
  ASSERT_EQ(bytes.size(), 8 + n + 8 + 6 + 3);
  const std::string header = bytes.substr(8, n);
  const size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  const auto j = nlohmann::json::parse(header);
  // Larger elements first: a (4-byte) at 0, b (2-byte) at 8, c (1-byte) at 14.
  const auto expected = nlohmann::json::parse(R"({
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "BF16", "shape": [1, 3], "data_offsets": [8, 14]},
    "c": {"dtype": "U8", "shape": [3], "data_offsets": [14, 17]},
    "__metadata__": {"k": "v"}})");
  EXPECT_EQ(j, expected);
  const std::string data = bytes.substr(8 + n);
  float a0, a1;
  std::memcpy(&a0, data.data(), 4);
  std::memcpy(&a1, data.data() + 4, 4);
  EXPECT_EQ(a0, 1.5f);
  EXPECT_EQ(a1, -2.0f);
  EXPECT_EQ(std::memcmp(data.data() + 8, bbits, 6), 0);
  EXPECT_EQ(data.substr(14), std::string("\x07\x08\x09"));
}

// A file assembled byte by byte here (no writer involved), read through the API.
TEST(SafetensorsReader, HandBuiltFile) {
  TempDir dir;
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[4,12]},)"
      R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
      R"("q":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[12,14]},)"
      R"("e":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[14,15]},)"
      R"("i":{"dtype":"I64","shape":[1],"data_offsets":[15,23]}}   )";
  std::string data;
  const float s = 0.25f;
  data.append(reinterpret_cast<const char*>(&s), 4);
  for (uint16_t bits : {0x3F80, 0x4000, 0xBF80, 0x0000}) {  // bf16 1, 2, -1, 0 (little-endian)
    data.push_back(static_cast<char>(bits & 0xff));
    data.push_back(static_cast<char>(bits >> 8));
  }
  data.push_back(static_cast<char>(0x38));    // fp8 e4m3 1.0
  data.push_back(static_cast<char>(0xC0));    // fp8 e4m3 -2.0
  data.push_back(static_cast<char>(130));     // ue8m0 2^3
  data += le_u64(static_cast<uint64_t>(-5));  // int64 -5, two's complement little-endian
  const std::string path = dir.file("hand.safetensors");
  write_bytes(path, file_bytes(header, data));

  const auto f = dsv4::SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"e", "i", "q", "s", "w"}));
  const HostTensor w = f.read("w");
  EXPECT_EQ(w.dtype(), DType::bf16);
  EXPECT_EQ(w.shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(w.get(0), 1.0f);
  EXPECT_EQ(w.get(1), 2.0f);
  EXPECT_EQ(w.get(2), -1.0f);
  EXPECT_EQ(w.get(3), 0.0f);
  const HostTensor sc = f.read("s");
  EXPECT_TRUE(sc.shape().empty());
  EXPECT_EQ(sc.get(0), 0.25f);
  const HostTensor q = f.read("q");
  EXPECT_EQ(q.get(0), 1.0f);
  EXPECT_EQ(q.get(1), -2.0f);
  EXPECT_EQ(f.read("e").get(0), 8.0f);
  EXPECT_EQ(f.read("i").data<int64_t>()[0], -5);
  EXPECT_EQ(f.entry("w").begin, 4u);
  EXPECT_EQ(f.entry("w").end, 12u);
  expect_error([&] { f.entry("nope"); }, {"hand.safetensors", "no tensor named 'nope'"});
}

// ---- corrupt files --------------------------------------------------------------------------

struct CorruptCase {
  const char* label;
  std::string bytes;                   // the whole file
  std::vector<std::string> fragments;  // the error must mention each
};

std::string one_tensor(const std::string& entry, size_t data_bytes) {
  return file_bytes(R"({"t":)" + entry + "}", std::string(data_bytes, '\x01'));
}

std::vector<CorruptCase> corrupt_cases() {
  const std::string ok_entry = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::vector<CorruptCase> c;
  c.push_back({"empty_file", "", {"truncated", "0 bytes"}});
  c.push_back({"shorter_than_length_field", std::string("\x05\0\0", 3), {"truncated"}});
  c.push_back({"header_length_zero", le_u64(0) + "{}", {"header length", "got 0"}});
  c.push_back({"header_length_beyond_file",
               le_u64(1000) + R"({"a":1})",
               {"truncated", "header length 1000", "beyond the end of the file"}});
  c.push_back({"header_length_huge", le_u64(1ull << 62) + "{}", {"header length"}});
  c.push_back({"truncated_data", one_tensor(ok_entry, 5), {"tensor 't'", "out of range"}});
  c.push_back({"bad_json", file_bytes(R"({"t": {"dtype": "F32",)", ""), {"not valid JSON"}});
  c.push_back({"trailing_garbage", file_bytes(R"({} x)", ""), {"not valid JSON"}});
  c.push_back({"not_an_object", file_bytes(R"([1, 2])", ""), {"JSON object"}});
  c.push_back({"entry_not_object", one_tensor("3", 0), {"tensor 't'", "expected an object"}});
  c.push_back({"missing_dtype",
               one_tensor(R"({"shape":[2],"data_offsets":[0,8]})", 8),
               {"tensor 't'", "missing key 'dtype'"}});
  c.push_back({"missing_offsets",
               one_tensor(R"({"dtype":"F32","shape":[2]})", 8),
               {"tensor 't'", "missing key 'data_offsets'"}});
  c.push_back({"unknown_dtype",
               one_tensor(R"({"dtype":"F7","shape":[2],"data_offsets":[0,8]})", 8),
               {"tensor 't'", "unknown safetensors dtype 'F7'"}});
  c.push_back({"unsupported_dtype",
               one_tensor(R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})", 8),
               {"tensor 't'", "F64 is not supported"}});
  c.push_back({"negative_dim",
               one_tensor(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", 8),
               {"tensor 't'", "shape", "non-negative"}});
  c.push_back({"fractional_dim",
               one_tensor(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})", 8),
               {"tensor 't'", "shape"}});
  c.push_back({"too_many_dims",
               one_tensor(R"({"dtype":"U8","shape":[1,1,1,1,1,1,1],"data_offsets":[0,1]})", 1),
               {"tensor 't'", "at most 6 dimensions"}});
  c.push_back({"offsets_out_of_range",
               one_tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,16]})", 8),
               {"tensor 't'", "out of range", "8 bytes"}});
  c.push_back({"offsets_reversed",
               one_tensor(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})", 8),
               {"tensor 't'", "begin <= end"}});
  c.push_back({"offsets_negative",
               one_tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})", 8),
               {"tensor 't'", "data_offsets"}});
  c.push_back({"offsets_wrong_arity",
               one_tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})", 8),
               {"tensor 't'", "data_offsets"}});
  c.push_back({"size_mismatch",
               one_tensor(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})", 8),
               {"tensor 't'", "hold 8 bytes", "shape [3] of F32 needs 12 bytes"}});
  c.push_back(
      {"size_overflow",
       one_tensor(R"({"dtype":"I64","shape":[4294967296,4294967296],"data_offsets":[0,8]})", 8),
       {"tensor 't'", "needs more than 2^64 bytes"}});
  c.push_back({"overlap",
               file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          std::string(8, '\0')),
               {"tensor 'b'", "overlap tensor 'a'"}});
  c.push_back({"hole",
               file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                          std::string(12, '\0')),
               {"bytes [4, 8)", "before tensor 'b'", "belong to no tensor"}});
  c.push_back({"trailing_bytes", one_tensor(ok_entry, 9), {"bytes [8, 9)", "belong to no tensor"}});
  c.push_back({"duplicate_name",
               file_bytes(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                          R"("t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                          std::string(2, '\0')),
               {"tensor name 't' appears twice"}});
  c.push_back({"duplicate_entry_key",
               one_tensor(R"({"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]})", 1),
               {"key 'dtype' appears twice"}});
  c.push_back({"metadata_not_strings",
               file_bytes(R"({"__metadata__":{"k":3}})", ""),
               {"__metadata__['k']", "string"}});
  c.push_back({"metadata_not_object", file_bytes(R"({"__metadata__":[]})", ""), {"__metadata__"}});
  c.push_back(
      {"empty_name",
       file_bytes(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0')),
       {"empty name"}});
  return c;
}

class SafetensorsCorrupt : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(SafetensorsCorrupt, RejectedWithNamedError) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, GetParam().bytes);
  std::vector<std::string> fragments = GetParam().fragments;
  fragments.push_back(path);  // every message names the file
  expect_error([&] { dsv4::SafetensorsFile::open(path); }, fragments);
  // The same file inside a checkpoint directory fails the same way.
  expect_error([&] { dsv4::Checkpoint::open(dir.str()); }, fragments);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, SafetensorsCorrupt, ::testing::ValuesIn(corrupt_cases()),
                         [](const auto& info) { return std::string(info.param.label); });

// A valid file becomes invalid by cutting its last byte: the data section no longer holds the
// last tensor.
TEST(SafetensorsReader, TruncatedWrittenFile) {
  TempDir dir;
  std::mt19937 rng(7);
  const std::string path = dir.file("t.safetensors");
  dsv4::write_safetensors(path, {{"x", random_tensor(DType::fp32, {4, 4}, rng)}});
  std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 1));
  expect_error([&] { dsv4::SafetensorsFile::open(path); }, {path, "tensor 'x'", "out of range"});
}

TEST(SafetensorsReader, MissingFile) {
  TempDir dir;
  const std::string path = dir.file("absent.safetensors");
  expect_error([&] { dsv4::SafetensorsFile::open(path); }, {path, "cannot open"});
}

TEST(SafetensorsWriter, RejectsReservedNames) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  expect_error(
      [&] {
        dsv4::write_safetensors(path, {{"__metadata__", HostTensor(DType::fp32, {1})}});
      },
      {"__metadata__", "reserved"});
  expect_error(
      [&] {
        dsv4::write_safetensors(path, {{"", HostTensor(DType::fp32, {1})}});
      },
      {"reserved or empty"});
  expect_error([&] { dsv4::write_safetensors(path, {{"x", HostTensor()}}); }, {"'x'", "no data"});
  EXPECT_FALSE(fs::exists(path)) << "validation happens before the file is created";
}

// ---- checkpoints ----------------------------------------------------------------------------

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(99);
    first_ = {{"layers.0.a", random_tensor(DType::bf16, {4, 3}, rng)},
              {"layers.0.b", random_tensor(DType::fp32, {2}, rng)}};
    second_ = {{"layers.1.a", random_tensor(DType::fp8_e4m3, {5}, rng)}};
    dsv4::write_safetensors(dir_.file("model-00001-of-00002.safetensors"), first_);
    dsv4::write_safetensors(dir_.file("model-00002-of-00002.safetensors"), second_);
  }
  void expect_all_readable(const dsv4::Checkpoint& c) {
    EXPECT_EQ(c.names(), (std::vector<std::string>{"layers.0.a", "layers.0.b", "layers.1.a"}));
    for (const auto* m : {&first_, &second_})
      for (const auto& [name, t] : *m) {
        const HostTensor back = c.read(name);
        EXPECT_EQ(back.shape(), t.shape()) << name;
        EXPECT_EQ(std::memcmp(back.data<uint8_t>(), t.data<uint8_t>(), t.nbytes()), 0) << name;
      }
  }
  TempDir dir_;
  dsv4::TensorMap first_, second_;
};

TEST_F(CheckpointTest, DirectoryWithoutIndexUsesEveryFile) {
  const auto c = dsv4::Checkpoint::open(dir_.str());
  EXPECT_EQ(c.files().size(), 2u);
  EXPECT_EQ(c.directory(), dir_.str());
  expect_all_readable(c);
  EXPECT_EQ(c.file_of("layers.1.a").path(), dir_.file("model-00002-of-00002.safetensors"));
  EXPECT_FALSE(c.contains("layers.2.a"));
  expect_error([&] { c.entry("layers.2.a"); }, {"no tensor named 'layers.2.a'"});
}

TEST_F(CheckpointTest, IndexJsonWeightMap) {
  write_bytes(dir_.file("model.safetensors.index.json"), R"({"metadata": {"total_size": 43},
    "weight_map": {"layers.0.a": "model-00001-of-00002.safetensors",
                   "layers.0.b": "model-00001-of-00002.safetensors",
                   "layers.1.a": "model-00002-of-00002.safetensors"}})");
  // A stray file the index does not name is not read (it would otherwise be a duplicate).
  dsv4::write_safetensors(dir_.file("stray.safetensors"), first_);
  const auto c = dsv4::Checkpoint::open(dir_.str());
  EXPECT_EQ(c.files().size(), 2u);
  expect_all_readable(c);
}

TEST_F(CheckpointTest, IndexNamingTheWrongFile) {
  write_bytes(dir_.file("model.safetensors.index.json"),
              R"({"weight_map": {"layers.1.a": "model-00001-of-00002.safetensors"}})");
  expect_error([&] { dsv4::Checkpoint::open(dir_.str()); },
               {"'layers.1.a'", "model-00001-of-00002.safetensors", "has no such tensor"});
}

TEST_F(CheckpointTest, IndexNamingAMissingFile) {
  write_bytes(dir_.file("model.safetensors.index.json"),
              R"({"weight_map": {"layers.1.a": "model-00009.safetensors"}})");
  expect_error([&] { dsv4::Checkpoint::open(dir_.str()); },
               {"model-00009.safetensors", "cannot open"});
}

TEST_F(CheckpointTest, IndexNotJson) {
  write_bytes(dir_.file("model.safetensors.index.json"), "{weight_map");
  expect_error([&] { dsv4::Checkpoint::open(dir_.str()); },
               {"model.safetensors.index.json", "not valid JSON"});
  write_bytes(dir_.file("model.safetensors.index.json"), R"({"weight_map": 3})");
  expect_error([&] { dsv4::Checkpoint::open(dir_.str()); }, {"weight_map"});
}

TEST_F(CheckpointTest, SameTensorInTwoFiles) {
  dsv4::write_safetensors(dir_.file("model-00003.safetensors"), second_);
  expect_error([&] { dsv4::Checkpoint::open(dir_.str()); },
               {"'layers.1.a'", "model-00002-of-00002.safetensors", "model-00003.safetensors"});
}

TEST_F(CheckpointTest, SingleFilePath) {
  const auto c = dsv4::Checkpoint::open(dir_.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(c.names(), (std::vector<std::string>{"layers.1.a"}));
  EXPECT_EQ(c.directory(), dir_.str());
}

TEST(Checkpoint, EmptyOrAbsentDirectory) {
  TempDir dir;
  expect_error([&] { dsv4::Checkpoint::open(dir.str()); }, {"no *.safetensors files"});
  expect_error([&] { dsv4::Checkpoint::open(dir.file("nothing")); },
               {"nothing", "no such file or directory"});
}

}  // namespace
