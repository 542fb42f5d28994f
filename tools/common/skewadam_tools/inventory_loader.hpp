#pragma once
// Loading a model's inventory from the inputs given to skewadam-plan.
//
// An input is one of:
//   - a .safetensors file (only its header is read);
//   - a sharded checkpoint's index, *.index.json ({"weight_map": {tensor: shard}}):
//     every shard it names, relative to the index's folder;
//   - a folder: its model.safetensors.index.json when there is one, otherwise
//     every *.safetensors file in it;
//   - a JSON inventory (see inventory.hpp);
//   - a file with another extension: a JSON inventory when it starts with '{'
//     (after white space), a safetensors file otherwise.
// Several inputs are one model: their tensors are pooled and a name that
// appears twice is an error.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "inventory.hpp"
#include "json_reader.hpp"
#include "safetensors.hpp"

namespace skewadam::tools {

namespace detail {

inline bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

/// Reads a whole (small) file; throws InventoryError past `limit` bytes.
inline std::string read_small_file(const std::filesystem::path& path, std::uint64_t limit) {
  const std::string src = path.string();
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw InventoryError(src + ": cannot read: " + ec.message());
  if (size > limit)
    throw InventoryError(src + ": " + std::to_string(size) + " bytes is larger than the limit of " +
                         std::to_string(limit) + " bytes for a JSON file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InventoryError(src + ": cannot open");
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (static_cast<std::uintmax_t>(in.gcount()) != size) throw InventoryError(src + ": read error");
  return text;
}

/// Reads {"weight_map": {"tensor": "shard file", ...}} and keeps the shard names.
class IndexReader : public JsonReader<IndexReader> {
 public:
  std::set<std::string> shards;

  OnOpen on_open(bool is_object) {
    if (at_ == At::start && is_object) {
      at_ = At::root;
      return OnOpen::enter;
    }
    if (at_ == At::root && key_ == "weight_map") {
      if (!is_object) {
        fail("\"weight_map\" must be an object {tensor: shard file}");
        return OnOpen::fail;
      }
      at_ = At::map;
      saw_map = true;
      return OnOpen::enter;
    }
    if (at_ == At::root) return OnOpen::skip;
    fail(at_ == At::start ? "the document is not a JSON object" : "\"weight_map\" values must be file names");
    return OnOpen::fail;
  }
  bool on_close() {
    at_ = at_ == At::map ? At::root : At::done;
    return true;
  }
  bool on_key(const std::string& k) {
    key_ = k;
    return true;
  }
  bool on_scalar(const JsonScalar& v) {
    if (at_ == At::start) return fail("the document is not a JSON object");
    if (at_ != At::map) return true;
    if (v.kind != JsonScalar::Kind::string || v.text->empty())
      return fail("\"weight_map\": tensor '" + key_ + "' must map to a file name");
    shards.insert(*v.text);
    return true;
  }

  bool saw_map = false;

 private:
  enum class At { start, root, map, done };
  At at_ = At::start;
  std::string key_;
};

/// The files one input stands for, each with how to read it.
struct InputFile {
  std::filesystem::path path;
  bool safetensors = true;
};

inline std::vector<InputFile> expand_index(const std::filesystem::path& index) {
  const std::string src = index.string();
  IndexReader reader;
  reader.parse(read_small_file(index, max_json_inventory_bytes), src);
  if (!reader.saw_map || reader.shards.empty())
    throw InventoryError(src + ": no \"weight_map\" naming shard files");
  std::vector<InputFile> files;
  for (const std::string& shard : reader.shards) {
    const std::filesystem::path p(shard);
    if (p.is_absolute() || p.empty())
      throw InventoryError(src + ": shard '" + shard + "' must be a path relative to the index");
    files.push_back({index.parent_path() / p, true});
  }
  return files;
}

inline std::vector<InputFile> expand_input(const std::string& input) {
  namespace fs = std::filesystem;
  const fs::path path(input);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw InventoryError(input + ": no such file or folder");
  if (fs::is_directory(st)) {
    const fs::path index = path / "model.safetensors.index.json";
    if (fs::is_regular_file(index, ec)) return expand_index(index);
    std::vector<InputFile> files;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
      if (ends_with(it->path().filename().string(), ".safetensors") && it->is_regular_file(ec))
        files.push_back({it->path(), true});
    if (ec) throw InventoryError(input + ": cannot list: " + ec.message());
    if (files.empty()) throw InventoryError(input + ": folder holds no .safetensors files");
    std::sort(files.begin(), files.end(), [](const InputFile& a, const InputFile& b) { return a.path < b.path; });
    return files;
  }
  const std::string name = path.filename().string();
  if (ends_with(name, ".index.json")) return expand_index(path);
  if (ends_with(name, ".safetensors")) return {{path, true}};
  if (ends_with(name, ".json")) return {{path, false}};
  // Anything else: sniff the first byte that is not white space.
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InventoryError(input + ": cannot open");
  char c = 0;
  while (in.get(c) && (c == ' ' || c == '\t' || c == '\n' || c == '\r')) {
  }
  return {{path, !(in && c == '{')}};
}

}  // namespace detail

/// Reads one file: a safetensors header or a JSON inventory.
inline Inventory read_inventory_file(const std::filesystem::path& path, bool safetensors) {
  if (safetensors) return read_safetensors(path);
  return parse_json_inventory(detail::read_small_file(path, max_json_inventory_bytes), path.string());
}

/// Reads and pools every input (see the top of this header). Throws InventoryError.
inline Inventory load_inventory(const std::vector<std::string>& inputs) {
  Inventory all;
  std::unordered_map<std::string, std::string> seen;  // tensor name -> file
  for (const std::string& input : inputs) {
    for (const detail::InputFile& f : detail::expand_input(input)) {
      Inventory part = read_inventory_file(f.path, f.safetensors);
      const std::string src = f.path.string();
      for (TensorSpec& t : part.tensors) {
        const auto [it, fresh] = seen.emplace(t.name, src);
        if (!fresh)
          throw InventoryError(src + ": tensor '" + t.name + "' was already read from " + it->second);
        all.tensors.push_back(std::move(t));
      }
      for (SkippedTensor& s : part.skipped) all.skipped.push_back(std::move(s));
    }
  }
  return all;
}

}  // namespace skewadam::tools
