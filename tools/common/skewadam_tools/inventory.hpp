#pragma once
// A model's tensor inventory, and the JSON inventory format:
//
//   {"tensors": [{"name": "blocks.0.attn.q.weight", "shape": [4096, 4096], "dtype": "bf16"}, ...]}
//
// dtype is "f32", "bf16" or "f16" ("float32", "bfloat16", "float16" and the
// safetensors spellings are accepted too). Every dimension must be a positive
// integer: zero-size tensors are rejected, since they hold no parameters and
// in an inventory are almost always a mistake. A scalar (shape []) is planned
// as shape [1]. Names are non-empty, valid UTF-8, at most
// max_tensor_name_length bytes and unique. Other keys are ignored.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <skewadam/types/dtype.hpp>
#include <skewadam/plan.hpp>
#include <skewadam/types/shape.hpp>
#include <skewadam/tiers/tier_assignment.hpp>

#include "json_reader.hpp"

namespace skewadam::tools {

/// A tensor the planner leaves out: an integer or boolean buffer of a
/// checkpoint (position ids, masks), which no optimizer updates.
struct SkippedTensor {
  std::string name;
  std::string dtype;  ///< as the file spells it
};

/// The tensors of a model.
struct Inventory {
  std::vector<TensorSpec> tensors;
  std::vector<SkippedTensor> skipped;
};

namespace detail {

/// Dimensions as read from JSON, checked one by one.
struct RawDims {
  std::array<index_t, max_rank> dims{};
  int rank = 0;
  bool present = false;

  /// Appends one JSON value; returns an error message, empty when fine.
  std::string add(const JsonScalar& v) {
    const std::string where = "shape: dimension " + std::to_string(rank);
    if (v.kind != JsonScalar::Kind::integer)
      return where + " is " + std::string(v.kind_name()) + ", not an integer";
    if (v.negative) return where + " is negative (-" + std::to_string(v.magnitude) + ")";
    if (v.magnitude == 0) return where + " is zero (zero-size tensors are not supported)";
    if (v.magnitude > (std::uint64_t{1} << 62)) return where + " is too large (" + std::to_string(v.magnitude) + ")";
    if (rank == max_rank) return "shape: more than " + std::to_string(max_rank) + " dimensions";
    dims[static_cast<std::size_t>(rank++)] = static_cast<index_t>(v.magnitude);
    return {};
  }

  /// The shape; a scalar becomes [1]. Throws std::invalid_argument naming `argument`.
  Shape shape(std::string_view argument) const {
    if (rank == 0) return Shape({1}, argument);
    return Shape(dims.data(), rank, argument);
  }

  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[static_cast<std::size_t>(i)]);
    return s + "]";
  }
};

/// Returns an error message for a bad tensor name, empty when fine.
inline std::string check_tensor_name(const std::string& name) {
  if (name.empty()) return "empty tensor name";
  if (static_cast<index_t>(name.size()) > max_tensor_name_length)
    return "tensor name of " + std::to_string(name.size()) + " bytes is longer than the limit of " +
           std::to_string(max_tensor_name_length) + " ('" + name.substr(0, 64) + "...')";
  return {};
}

/// Throws InventoryError when two of `names` are equal.
inline void check_unique_names(std::vector<std::string_view> names, std::string_view source) {
  std::sort(names.begin(), names.end());
  const auto dup = std::adjacent_find(names.begin(), names.end());
  if (dup != names.end())
    throw InventoryError(std::string(source) + ": tensor '" + std::string(*dup) + "' appears more than once");
}

/// Reads {"tensors": [{"name", "shape", "dtype"}, ...]}.
class JsonInventoryReader : public JsonReader<JsonInventoryReader> {
 public:
  Inventory result;
  bool saw_tensors = false;

  OnOpen on_open(bool is_object) {
    switch (at_) {
      case At::start:
        if (!is_object) return fail_open("the document is not a JSON object");
        at_ = At::root;
        return OnOpen::enter;
      case At::root:
        if (key_ != "tensors") return OnOpen::skip;
        if (is_object || saw_tensors) return fail_open("\"tensors\" must be one JSON array");
        saw_tensors = true;
        at_ = At::list;
        return OnOpen::enter;
      case At::list:
        if (!is_object) return fail_open(item() + ": expected an object {\"name\", \"shape\", \"dtype\"}");
        at_ = At::item;
        name_.clear();
        dtype_.clear();
        has_name_ = has_dtype_ = false;
        dims_ = RawDims{};
        return OnOpen::enter;
      case At::item:
        if (key_ == "shape") {
          if (is_object || dims_.present) return fail_open(item() + ": \"shape\" must be one array of integers");
          dims_.present = true;
          at_ = At::shape;
          return OnOpen::enter;
        }
        if (key_ == "name" || key_ == "dtype") return fail_open(item() + ": \"" + key_ + "\" must be a string");
        return OnOpen::skip;
      case At::shape: return fail_open(item() + ": shape: dimension " + std::to_string(dims_.rank) + " is not an integer");
      case At::done: break;
    }
    return OnOpen::fail;
  }

  bool on_close() {
    switch (at_) {
      case At::shape: at_ = At::item; return true;
      case At::item: {
        at_ = At::list;
        const bool ok = finish_item();
        ++index_;
        return ok;
      }
      case At::list: at_ = At::root; return true;
      case At::root:
        at_ = At::done;
        if (!saw_tensors) return fail("no \"tensors\" array (expected {\"tensors\": [{\"name\", \"shape\", \"dtype\"}, ...]})");
        if (result.tensors.empty()) return fail("\"tensors\" is empty");
        return true;
      default: return true;
    }
  }

  bool on_key(const std::string& k) {
    key_ = k;
    return true;
  }

  bool on_scalar(const JsonScalar& v) {
    switch (at_) {
      case At::start: return fail("the document is not a JSON object");
      case At::root:
        if (key_ == "tensors") return fail("\"tensors\" must be a JSON array, not " + std::string(v.kind_name()));
        return true;
      case At::list: return fail(item() + ": expected an object, not " + std::string(v.kind_name()));
      case At::item:
        if (key_ == "name" || key_ == "dtype") {
          if (v.kind != JsonScalar::Kind::string)
            return fail(item() + ": \"" + key_ + "\" must be a string, not " + std::string(v.kind_name()));
          if (key_ == "name") {
            name_ = *v.text;
            has_name_ = true;
          } else {
            dtype_ = *v.text;
            has_dtype_ = true;
          }
          return true;
        }
        if (key_ == "shape") return fail(item() + ": \"shape\" must be an array of integers");
        return true;
      case At::shape:
        if (std::string e = dims_.add(v); !e.empty()) return fail(item() + ": " + e);
        return true;
      case At::done: break;
    }
    return true;
  }

 private:
  enum class At { start, root, list, item, shape, done };

  std::string item() const {
    std::string s = "tensors[" + std::to_string(index_) + "]";
    if (has_name_) s += " '" + name_ + "'";
    return s;
  }

  OnOpen fail_open(std::string message) {
    fail(std::move(message));
    return OnOpen::fail;
  }

  bool finish_item() {
    const std::string where = item();
    if (!has_name_) return fail(where + ": missing \"name\"");
    if (std::string e = check_tensor_name(name_); !e.empty()) return fail(where + ": " + e);
    if (!dims_.present) return fail(where + ": missing \"shape\"");
    if (!has_dtype_) return fail(where + ": missing \"dtype\"");
    try {
      TensorSpec t;
      t.dtype = parse_dtype(dtype_, where + ": dtype");
      t.shape = dims_.shape(where + ": shape");
      t.name = std::move(name_);
      result.tensors.push_back(std::move(t));
    } catch (const std::invalid_argument& e) {
      return fail(e.what());
    }
    return true;
  }

  At at_ = At::start;
  std::string key_;
  std::size_t index_ = 0;
  std::string name_, dtype_;
  bool has_name_ = false, has_dtype_ = false;
  RawDims dims_;
};

}  // namespace detail

/// Largest JSON inventory file read (256 MiB).
inline constexpr std::uint64_t max_json_inventory_bytes = std::uint64_t{256} << 20;

/// Parses a JSON inventory; `source` names it in errors. Throws InventoryError.
inline Inventory parse_json_inventory(std::string_view text, std::string_view source) {
  detail::JsonInventoryReader reader;
  reader.parse(text, source);
  std::vector<std::string_view> names;
  names.reserve(reader.result.tensors.size());
  for (const TensorSpec& t : reader.result.tensors) names.emplace_back(t.name);
  detail::check_unique_names(std::move(names), source);
  return std::move(reader.result);
}

}  // namespace skewadam::tools
