// safetensors writer: tests and tools generate checkpoints with it.
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "dsv4/safetensors.h"
#include "dsv4/status.h"

namespace dsv4 {

namespace {

void store_le_u64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xffu);
}

}  // namespace

void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const MetadataMap& metadata) {
  const std::string where = "write_safetensors '" + path + "'";
  std::vector<const TensorMap::value_type*> order;
  for (const auto& item : tensors) {
    const auto& [name, t] = item;
    if (name.empty() || name == "__metadata__")
      fail(where, ": tensor name '", name, "' is reserved or empty");
    if (safetensors_dtype_name(t.dtype()) == "?")
      fail(where, ": tensor '", name, "': dtype ", dtype_name(t.dtype()),
           " has no safetensors name");
    if (t.numel() > 0 && t.data<uint8_t>() == nullptr)
      fail(where, ": tensor '", name, "' has no data");
    order.push_back(&item);
  }
  // Larger elements first keeps every offset a multiple of its element size without padding
  // (the format forbids holes in the data section).
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return dtype_size(a->second.dtype()) > dtype_size(b->second.dtype());
  });

  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto* item : order) {
    const HostTensor& t = item->second;
    nlohmann::json shape = nlohmann::json::array();
    for (int64_t d : t.shape()) shape.push_back(d);
    header[item->first] = {{"dtype", std::string(safetensors_dtype_name(t.dtype()))},
                           {"shape", shape},
                           {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::array<char, 8> len{};
  store_le_u64(text.size(), len.data());

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(where, ": cannot open for writing: ", std::strerror(errno));
  out.write(len.data(), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto* item : order) {
    const HostTensor& t = item->second;
    if (t.nbytes() > 0)
      out.write(reinterpret_cast<const char*>(t.data<uint8_t>()),
                static_cast<std::streamsize>(t.nbytes()));
  }
  out.close();
  if (!out) fail(where, ": write failed: ", std::strerror(errno));
}

}  // namespace dsv4
