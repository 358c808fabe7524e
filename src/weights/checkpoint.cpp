// Checkpoint: one or more safetensors files (with or without model.safetensors.index.json) seen
// as one name -> tensor map.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dsv4/safetensors.h"
#include "dsv4/status.h"

namespace dsv4 {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const char* const kIndexName = "model.safetensors.index.json";

json read_json_file(const fs::path& file, const std::string& where) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(where, ": cannot open '", file.string(), "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail(where, ": '", file.string(), "' is not valid JSON: ", e.what());
  }
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  const std::string where = "checkpoint '" + path + "'";
  std::error_code ec;
  const fs::path p(path);
  Checkpoint c;
  if (fs::is_regular_file(p, ec)) {
    c.directory_ = p.has_parent_path() ? p.parent_path().string() : std::string(".");
    c.files_.push_back(SafetensorsFile::open(path));
    for (const std::string& name : c.files_[0].names()) c.where_[name] = 0;
    return c;
  }
  if (!fs::is_directory(p, ec)) fail(where, ": no such file or directory");
  c.directory_ = path;

  const fs::path index = p / kIndexName;
  if (fs::exists(index, ec)) {
    const json j = read_json_file(index, where);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(where, ": ", kIndexName, ": expected an object with a \"weight_map\" object");
    std::map<std::string, size_t> file_index;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string())
        fail(where, ": ", kIndexName, ": weight_map['", name, "']: expected a file name, got ",
             file.dump());
      const std::string fname = file.get<std::string>();
      auto it = file_index.find(fname);
      if (it == file_index.end()) {
        it = file_index.emplace(fname, c.files_.size()).first;
        c.files_.push_back(SafetensorsFile::open((p / fname).string()));
      }
      if (!c.files_[it->second].contains(name))
        fail(where, ": ", kIndexName, " maps tensor '", name, "' to '", fname,
             "', which has no such tensor");
      c.where_[name] = it->second;
    }
    return c;
  }

  std::vector<fs::path> found;
  for (const auto& item : fs::directory_iterator(p, ec))
    if (item.is_regular_file() && item.path().extension() == ".safetensors")
      found.push_back(item.path());
  if (ec) fail(where, ": cannot list the directory: ", ec.message());
  if (found.empty()) fail(where, ": no ", kIndexName, " and no *.safetensors files");
  std::sort(found.begin(), found.end());
  for (const fs::path& file : found) {
    const size_t idx = c.files_.size();
    c.files_.push_back(SafetensorsFile::open(file.string()));
    for (const std::string& name : c.files_[idx].names()) {
      const auto [it, inserted] = c.where_.emplace(name, idx);
      if (!inserted)
        fail(where, ": tensor '", name, "' is in both '", c.files_[it->second].path(), "' and '",
             file.string(), "'");
    }
  }
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, idx] : where_) out.push_back(name);
  return out;
}

const SafetensorsFile& Checkpoint::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) fail("checkpoint '", directory_, "': no tensor named '", name, "'");
  return files_[it->second];
}

const SafetensorsEntry& Checkpoint::entry(const std::string& name) const {
  return file_of(name).entry(name);
}

}  // namespace dsv4
