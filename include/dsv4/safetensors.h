// Reading and writing the safetensors format, and opening a (multi-file) checkpoint.
//
// File layout (https://github.com/huggingface/safetensors):
//   [8 bytes: header length N, little-endian u64]
//   [N bytes: JSON object, UTF-8, may be padded with trailing spaces]
//       { "<tensor name>": {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [begin, end]},
//         ...,
//         "__metadata__": {"<key>": "<string value>", ...}   (optional) }
//   [data section: the tensors' bytes, row-major, little-endian]
// data_offsets are relative to the start of the data section.
//
// The reader is strict (it refuses what the reference implementation refuses, so a file it accepts
// is one every other reader accepts too). It throws dsv4::Error naming the file (and the tensor
// where there is one) for: a file shorter than 8 bytes; a header length below 2, above 100 MB or
// beyond the file;
// a header that is not a JSON object; an entry that is not {dtype, shape, data_offsets}; an
// unknown or unsupported dtype; a negative dimension; offsets with begin > end or end beyond the
// data section; (end - begin) != numel * dtype size; two entries whose byte ranges overlap; bytes
// of the data section that no tensor covers (holes, trailing bytes); a name given twice;
// __metadata__ that is not an object of strings.
//
// Supported dtypes (safetensors name -> DType): BF16 -> bf16, F16 -> fp16, F32 -> fp32,
// F8_E4M3 -> fp8_e4m3, F8_E8M0 -> ue8m0, U8 -> uint8, I32 -> int32, I64 -> int64. Other valid
// safetensors dtypes (BOOL, I8, I16, U16, U32, U64, F64, F8_E5M2, F4, ...) are reported as
// "unsupported", anything else as "unknown". (The official DeepSeek-V4 checkpoints store their
// FP4 routed experts as I8; the attention layer never reads those.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/dtype.h"
#include "dsv4/tensor.h"

namespace dsv4 {

// "BF16", "F16", "F32", "F8_E4M3", "F8_E8M0", "U8", "I32", "I64".
std::string_view safetensors_dtype_name(DType t);
// The DType of a safetensors dtype name; nullopt for names we do not support.
std::optional<DType> dtype_from_safetensors(std::string_view name);

// One tensor's entry in a safetensors header.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::fp32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range [begin, end) within the data section
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
  std::string shape_str() const;  // "[2, 3]"
};

using TensorMap = std::map<std::string, HostTensor>;
using MetadataMap = std::map<std::string, std::string>;

// One .safetensors file, memory-mapped read-only and validated when opened. Copies share the
// mapping; byte spans stay valid while any copy is alive.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const;
  const MetadataMap& metadata() const;
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  // Throws "safetensors '<path>': no tensor named '<name>'".
  const SafetensorsEntry& entry(const std::string& name) const;
  // The tensor's raw bytes inside the mapping (no alignment guarantee: read with memcpy).
  std::span<const uint8_t> bytes(const std::string& name) const;
  // A contiguous, aligned copy of the tensor.
  HostTensor read(const std::string& name) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// Writes `tensors` (each contiguous, on the host) and optional string metadata to `path`.
// Tensors are laid out by decreasing element size, then name, so every tensor's offset is a
// multiple of its element size (the header is padded with spaces to a multiple of 8).
// Throws naming the tensor for an unsupported dtype or a name that is empty or "__metadata__".
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const MetadataMap& metadata = {});

// A checkpoint: one or more safetensors files seen as one name -> tensor map.
//   open(<file>.safetensors): that file alone.
//   open(<directory>): with model.safetensors.index.json, the files its "weight_map" names (each
//     listed tensor must be in the file the index names; only listed tensors are visible); without
//     it, every *.safetensors file in
//     the directory (a tensor name found in two files is an error naming both).
class Checkpoint {
 public:
  Checkpoint() = default;
  static Checkpoint open(const std::string& path);

  // The directory holding the checkpoint (where config.json lives).
  const std::string& directory() const { return directory_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // Throws "checkpoint '<dir>': no tensor named '<name>'".
  const SafetensorsEntry& entry(const std::string& name) const;
  const SafetensorsFile& file_of(const std::string& name) const;
  HostTensor read(const std::string& name) const { return file_of(name).read(name); }

 private:
  std::string directory_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

}  // namespace dsv4
