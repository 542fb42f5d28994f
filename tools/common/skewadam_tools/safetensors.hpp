#pragma once
// The tensor inventory of a .safetensors file, from its header alone.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON header, then the data section:
//
//   {"__metadata__": {...},
//    "name": {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [begin, end]}, ...}
//
// Offsets are relative to the data section. Only the first 8 + N bytes are
// ever read, so a checkpoint of hundreds of GB costs a few MB of I/O.
//
// Checks, each failing with InventoryError("<file>: <problem>"):
//   - N no larger than the file minus its 8 length bytes, and at most
//     max_safetensors_header_bytes (100 MB), before anything is allocated;
//   - the header is valid UTF-8 and well-formed JSON: an object of tensors,
//     `__metadata__` skipped;
//   - each tensor has a known dtype, a shape of positive integers (zero-size
//     tensors are rejected) and data_offsets [begin, end] with
//     begin <= end <= data section size and end - begin = numel * dtype size;
//   - no two tensors overlap in the data section and no name appears twice.
// Gaps between tensors are allowed.
//
// Dtypes: F32, BF16 and F16 tensors are planned. Integer and boolean tensors
// (BOOL, U8, I8, I16, U16, I32, U32, I64, U64) are buffers no optimizer
// updates: they are checked, then listed in Inventory::skipped. Other
// floating-point dtypes (F64, the F8, F6 and F4 formats) are an error: the
// optimizer trains F32, BF16 and F16 parameters only.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <skewadam/types/dtype.hpp>
#include <skewadam/plan.hpp>

#include "inventory.hpp"
#include "json_reader.hpp"

namespace skewadam::tools {

/// Largest header accepted, in bytes (as the reference safetensors library).
inline constexpr std::uint64_t max_safetensors_header_bytes = 100'000'000;

/// What skewadam-plan does with one safetensors dtype.
struct SafetensorsDtype {
  enum class Use { plan, skip, unsupported };
  std::string_view name;
  Use use = Use::unsupported;
  std::uint64_t bytes = 0;  ///< element size (0 for the unsupported sub-byte formats)
  Dtype dtype = Dtype::f32;  ///< for Use::plan
};

/// The dtype spelled `name`, or nothing when the safetensors format has no such dtype.
inline std::optional<SafetensorsDtype> find_safetensors_dtype(std::string_view name) {
  using U = SafetensorsDtype::Use;
  static constexpr SafetensorsDtype table[] = {
      {"F32", U::plan, 4, Dtype::f32},        {"BF16", U::plan, 2, Dtype::bf16},
      {"F16", U::plan, 2, Dtype::f16},        {"BOOL", U::skip, 1, {}},
      {"U8", U::skip, 1, {}},                 {"I8", U::skip, 1, {}},
      {"I16", U::skip, 2, {}},                {"U16", U::skip, 2, {}},
      {"I32", U::skip, 4, {}},                {"U32", U::skip, 4, {}},
      {"I64", U::skip, 8, {}},                {"U64", U::skip, 8, {}},
      {"F64", U::unsupported, 8, {}},         {"F8_E4M3", U::unsupported, 1, {}},
      {"F8_E5M2", U::unsupported, 1, {}},     {"F8_E8M0", U::unsupported, 1, {}},
      {"F6_E2M3", U::unsupported, 0, {}},     {"F6_E3M2", U::unsupported, 0, {}},
      {"F4", U::unsupported, 0, {}},
  };
  for (const SafetensorsDtype& d : table)
    if (d.name == name) return d;
  return std::nullopt;
}

/// Reads the header length N from the first 8 bytes of a file of `file_size`
/// bytes (`first_bytes` holds at least those 8 when the file has them) and
/// checks it. Throws InventoryError naming `source`.
inline std::uint64_t safetensors_header_length(std::string_view first_bytes, std::uint64_t file_size,
                                               std::string_view source) {
  const std::string src(source);
  if (file_size < 8 || first_bytes.size() < 8)
    throw InventoryError(src + ": " + std::to_string(std::min<std::uint64_t>(file_size, first_bytes.size())) +
                         " bytes is too short for a safetensors file (it starts with an 8-byte header length)");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(first_bytes[static_cast<std::size_t>(i)]);
  if (n > max_safetensors_header_bytes)
    throw InventoryError(src + ": header length " + std::to_string(n) + " is absurd (the limit is " +
                         std::to_string(max_safetensors_header_bytes) + " bytes); not a safetensors file?");
  if (n > file_size - 8)
    throw InventoryError(src + ": header length " + std::to_string(n) + " exceeds the file (" +
                         std::to_string(file_size - 8) + " bytes follow the length); truncated or not a safetensors file?");
  if (n < 2) throw InventoryError(src + ": header length " + std::to_string(n) + " is too short for a JSON object");
  return n;
}

namespace detail {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  RawDims dims;
  std::uint64_t offsets[2] = {0, 0};
  int offset_count = 0;
  bool has_dtype = false;
  bool has_offsets = false;
};

/// Reads the header's JSON into SafetensorsEntry records, in header order.
class SafetensorsHeaderReader : public JsonReader<SafetensorsHeaderReader> {
 public:
  std::vector<SafetensorsEntry> entries;

  OnOpen on_open(bool is_object) {
    switch (at_) {
      case At::start:
        if (!is_object) return fail_open("the header is not a JSON object");
        at_ = At::root;
        return OnOpen::enter;
      case At::root:
        if (key_ == "__metadata__") return OnOpen::skip;
        if (!is_object) return fail_open(where() + ": expected an object {\"dtype\", \"shape\", \"data_offsets\"}, not an array");
        entries.emplace_back();
        entries.back().name = key_;
        at_ = At::entry;
        return OnOpen::enter;
      case At::entry: {
        SafetensorsEntry& e = entries.back();
        if (field_ == "shape" || field_ == "data_offsets") {
          const bool shape = field_ == "shape";
          if (is_object || (shape ? e.dims.present : e.has_offsets))
            return fail_open(where() + ": \"" + field_ + "\" must be one array of integers");
          (shape ? e.dims.present : e.has_offsets) = true;
          at_ = shape ? At::shape : At::offsets;
          return OnOpen::enter;
        }
        if (field_ == "dtype") return fail_open(where() + ": \"dtype\" must be a string");
        return OnOpen::skip;
      }
      case At::shape:
      case At::offsets: return fail_open(where() + ": \"" + field_ + "\" must hold integers only");
      case At::done: break;
    }
    return OnOpen::fail;
  }

  bool on_close() {
    switch (at_) {
      case At::shape:
      case At::offsets: at_ = At::entry; return true;
      case At::entry: at_ = At::root; return true;
      case At::root: at_ = At::done; return true;
      default: return true;
    }
  }

  bool on_key(const std::string& k) {
    if (at_ == At::root) {
      key_ = k;
      if (k == "__metadata__") return true;
      if (std::string e = check_tensor_name(k); !e.empty()) return fail(e);
    } else {
      field_ = k;
    }
    return true;
  }

  bool on_scalar(const JsonScalar& v) {
    switch (at_) {
      case At::start: return fail("the header is not a JSON object");
      case At::root:
        if (key_ == "__metadata__") return true;
        return fail(where() + ": expected an object {\"dtype\", \"shape\", \"data_offsets\"}, not " +
                    std::string(v.kind_name()));
      case At::entry: {
        SafetensorsEntry& e = entries.back();
        if (field_ == "dtype") {
          if (v.kind != JsonScalar::Kind::string)
            return fail(where() + ": \"dtype\" must be a string, not " + std::string(v.kind_name()));
          e.dtype = *v.text;
          e.has_dtype = true;
          return true;
        }
        if (field_ == "shape" || field_ == "data_offsets")
          return fail(where() + ": \"" + field_ + "\" must be an array of integers, not " + std::string(v.kind_name()));
        return true;
      }
      case At::shape:
        if (std::string err = entries.back().dims.add(v); !err.empty()) return fail(where() + ": " + err);
        return true;
      case At::offsets: {
        SafetensorsEntry& e = entries.back();
        if (v.kind != JsonScalar::Kind::integer || v.negative)
          return fail(where() + ": \"data_offsets\" must hold non-negative integers");
        if (e.offset_count == 2) return fail(where() + ": \"data_offsets\" has more than two values");
        e.offsets[e.offset_count++] = v.magnitude;
        return true;
      }
      case At::done: break;
    }
    return true;
  }

 private:
  enum class At { start, root, entry, shape, offsets, done };

  std::string where() const { return "tensor '" + key_ + "'"; }

  OnOpen fail_open(std::string message) {
    fail(std::move(message));
    return OnOpen::fail;
  }

  At at_ = At::start;
  std::string key_;    // the tensor being read
  std::string field_;  // the key inside it
};

inline std::string offsets_str(const SafetensorsEntry& e) {
  return "[" + std::to_string(e.offsets[0]) + ", " + std::to_string(e.offsets[1]) + "]";
}

}  // namespace detail

/// Parses a safetensors header. `file_start` holds the file's first bytes (at
/// least 8 + N, N the header length; more is ignored) and `file_size` is the
/// size of the whole file, which may be far larger than `file_start`. Nothing
/// is allocated before the header length has been checked. Throws
/// InventoryError naming `source`.
inline Inventory parse_safetensors(std::string_view file_start, std::uint64_t file_size, std::string_view source) {
  const std::string src(source);
  const std::uint64_t n = safetensors_header_length(file_start, file_size, source);
  if (file_start.size() - 8 < n)
    throw InventoryError(src + ": only " + std::to_string(file_start.size() - 8) + " of the header's " +
                         std::to_string(n) + " bytes are available");
  const std::string_view header = file_start.substr(8, static_cast<std::size_t>(n));
  const std::uint64_t data_size = file_size - 8 - n;

  detail::SafetensorsHeaderReader reader;
  reader.parse(header, src, "the JSON header");
  std::vector<detail::SafetensorsEntry>& entries = reader.entries;

  {
    std::vector<std::string_view> names;
    names.reserve(entries.size());
    for (const detail::SafetensorsEntry& e : entries) names.emplace_back(e.name);
    detail::check_unique_names(std::move(names), source);
  }

  // Each tensor on its own, in header order.
  for (const detail::SafetensorsEntry& e : entries) {
    const std::string where = src + ": tensor '" + e.name + "'";
    if (!e.has_dtype) throw InventoryError(where + ": missing \"dtype\"");
    if (!e.dims.present) throw InventoryError(where + ": missing \"shape\"");
    if (!e.has_offsets) throw InventoryError(where + ": missing \"data_offsets\"");
    const std::optional<SafetensorsDtype> dt = find_safetensors_dtype(e.dtype);
    if (!dt) throw InventoryError(where + ": unknown dtype '" + e.dtype + "'");
    if (dt->use == SafetensorsDtype::Use::unsupported)
      throw InventoryError(where + ": unsupported dtype " + e.dtype +
                           " (skewadam trains F32, BF16 and F16 parameters)");
    if (e.offset_count != 2)
      throw InventoryError(where + ": \"data_offsets\" must be [begin, end], got " +
                           std::to_string(e.offset_count) + " values");
    if (e.offsets[0] > e.offsets[1] || e.offsets[1] > data_size)
      throw InventoryError(where + ": data_offsets " + detail::offsets_str(e) +
                           " are out of range (the data section holds " + std::to_string(data_size) + " bytes)");
    // numel * element size, compared with the data section's size at each step so it cannot overflow.
    std::uint64_t bytes = dt->bytes;
    for (int i = 0; i < e.dims.rank; ++i) {
      const auto d = static_cast<std::uint64_t>(e.dims.dims[static_cast<std::size_t>(i)]);
      if (d > data_size / bytes)
        throw InventoryError(where + ": shape " + e.dims.str() + " of " + e.dtype +
                             " needs more bytes than the data section holds (" + std::to_string(data_size) + ")");
      bytes *= d;
    }
    if (e.offsets[1] - e.offsets[0] != bytes)
      throw InventoryError(where + ": data_offsets " + detail::offsets_str(e) + " span " +
                           std::to_string(e.offsets[1] - e.offsets[0]) + " bytes, but shape " + e.dims.str() +
                           " of " + e.dtype + " needs " + std::to_string(bytes));
  }

  // No overlaps; the result lists tensors in data order.
  std::vector<std::size_t> order(entries.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return entries[a].offsets[0] != entries[b].offsets[0] ? entries[a].offsets[0] < entries[b].offsets[0] : a < b;
  });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const detail::SafetensorsEntry& prev = entries[order[k - 1]];
    const detail::SafetensorsEntry& next = entries[order[k]];
    if (next.offsets[0] < prev.offsets[1])
      throw InventoryError(src + ": tensors '" + prev.name + "' " + detail::offsets_str(prev) + " and '" + next.name +
                           "' " + detail::offsets_str(next) + " overlap in the data section");
  }

  Inventory inv;
  for (std::size_t i : order) {
    detail::SafetensorsEntry& e = entries[i];
    const SafetensorsDtype dt = *find_safetensors_dtype(e.dtype);
    if (dt.use == SafetensorsDtype::Use::skip) {
      inv.skipped.push_back(SkippedTensor{std::move(e.name), std::move(e.dtype)});
      continue;
    }
    TensorSpec t;
    try {
      t.shape = e.dims.shape(src + ": tensor '" + e.name + "': shape");
    } catch (const std::invalid_argument& ex) {
      throw InventoryError(ex.what());
    }
    t.dtype = dt.dtype;
    t.name = std::move(e.name);
    inv.tensors.push_back(std::move(t));
  }
  if (inv.tensors.empty())
    throw InventoryError(src + ": no F32, BF16 or F16 tensors in the header" +
                         (inv.skipped.empty() ? std::string() : " (only integer or boolean buffers)"));
  return inv;
}

/// Reads the inventory of the safetensors file at `path`: its size, 8 bytes,
/// then the header. Throws InventoryError.
inline Inventory read_safetensors(const std::filesystem::path& path) {
  const std::string src = path.string();
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw InventoryError(src + ": cannot read: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InventoryError(src + ": cannot open");
  std::string buffer(8, '\0');
  in.read(buffer.data(), static_cast<std::streamsize>(std::min<std::uintmax_t>(size, 8)));
  if (static_cast<std::uintmax_t>(in.gcount()) < std::min<std::uintmax_t>(size, 8))
    throw InventoryError(src + ": read error");
  buffer.resize(static_cast<std::size_t>(in.gcount()));
  const std::uint64_t n = safetensors_header_length(buffer, size, src);  // checked before allocating
  buffer.resize(static_cast<std::size_t>(8 + n));
  in.read(buffer.data() + 8, static_cast<std::streamsize>(n));
  if (static_cast<std::uint64_t>(in.gcount()) != n)
    throw InventoryError(src + ": read error: the file ended inside its " + std::to_string(n) + "-byte header");
  return parse_safetensors(buffer, size, src);
}

}  // namespace skewadam::tools
