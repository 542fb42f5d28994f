#pragma once
// Streaming (SAX) reading of the small JSON documents skewadam-plan accepts.
//
// The inventory readers never build a JSON tree: a tree of an adversarial
// 100 MB document ("[[[[..." or "[0,0,0,...") would take gigabytes. Instead a
// reader walks the document once, keeps only what its schema needs, skips
// fields it does not know, and stops at the first problem. Nesting is capped.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace skewadam::tools {

/// A problem with an input file or document. The message starts with the
/// input's name.
class InventoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

/// Offset of the first byte of `s` that is not part of well-formed UTF-8
/// (no overlong forms, no surrogates, nothing above U+10FFFF), or npos.
inline std::size_t first_invalid_utf8(std::string_view s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (n - i < len) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
}

/// A JSON scalar as a reader sees it.
struct JsonScalar {
  enum class Kind { null, boolean, integer, floating, string };
  Kind kind = Kind::null;
  bool negative = false;         ///< integer: below zero
  std::uint64_t magnitude = 0;   ///< integer: absolute value
  const std::string* text = nullptr;  ///< string: the value

  std::string_view kind_name() const noexcept {
    switch (kind) {
      case Kind::null: return "null";
      case Kind::boolean: return "a boolean";
      case Kind::integer: return "an integer";
      case Kind::floating: return "a non-integer number";
      case Kind::string: return "a string";
    }
    return "a value";
  }
};

/// What a reader does with a container that opens.
enum class OnOpen { enter, skip, fail };

/// The SAX interface nlohmann::json expects, reduced to four hooks that a
/// Derived reader provides:
///
///   OnOpen on_open(bool is_object);     a container starts
///   bool   on_close();                  the container entered last ends
///   bool   on_key(const std::string&);  a key in an entered object
///   bool   on_scalar(const JsonScalar&);
///
/// Skipped containers and everything in them never reach the hooks. A hook
/// reports a problem with fail(message), which stops the parse.
template <class Derived>
class JsonReader {
 public:
  static constexpr int max_depth = 64;

  /// Parses `text`; throws InventoryError("<source>: <problem>") on the
  /// first problem, malformed JSON included. `document` names the text in
  /// messages about its encoding and syntax ("the JSON header"); empty for a
  /// whole file.
  void parse(std::string_view text, std::string_view source, std::string_view document = {}) {
    document_ = document.empty() ? std::string("the file") : std::string(document);
    if (const std::size_t bad = first_invalid_utf8(text); bad != std::string_view::npos)
      throw InventoryError(std::string(source) + ": " + document_ + " is not valid UTF-8 (byte " +
                           std::to_string(bad) + "); tensor names and all JSON text must be UTF-8");
    const bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), this);
    if (!ok || !error_.empty())
      throw InventoryError(std::string(source) + ": " +
                           (error_.empty() ? document_ + " is not valid JSON" : error_));
  }

  // ---- nlohmann::json SAX interface
  bool null() { return scalar(JsonScalar{}); }
  bool boolean(bool) {
    JsonScalar s;
    s.kind = JsonScalar::Kind::boolean;
    return scalar(s);
  }
  bool number_integer(std::int64_t v) {
    JsonScalar s;
    s.kind = JsonScalar::Kind::integer;
    s.negative = v < 0;
    s.magnitude = v < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
    return scalar(s);
  }
  bool number_unsigned(std::uint64_t v) {
    JsonScalar s;
    s.kind = JsonScalar::Kind::integer;
    s.magnitude = v;
    return scalar(s);
  }
  bool number_float(double, const std::string&) {
    JsonScalar s;
    s.kind = JsonScalar::Kind::floating;
    return scalar(s);
  }
  bool string(std::string& v) {
    JsonScalar s;
    s.kind = JsonScalar::Kind::string;
    s.text = &v;
    return scalar(s);
  }
  bool binary(nlohmann::json::binary_t&) { return fail("unexpected binary value"); }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) { return skipping_ > 0 ? true : self().on_key(k); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, ..." -> "malformed JSON: parse error at line 1, ..."
    std::string what = e.what();
    if (const std::size_t close_bracket = what.find("] "); what.rfind("[json.exception", 0) == 0 &&
                                                          close_bracket != std::string::npos)
      what.erase(0, close_bracket + 2);
    return fail(document_ + " is not valid JSON: " + what);
  }

 protected:
  bool fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }

  bool scalar(const JsonScalar& s) { return skipping_ > 0 ? true : self().on_scalar(s); }

  bool open(bool is_object) {
    if (++depth_ > max_depth)
      return fail("JSON nested more than " + std::to_string(max_depth) + " levels deep");
    if (skipping_ > 0) {
      ++skipping_;
      return true;
    }
    switch (self().on_open(is_object)) {
      case OnOpen::enter: return true;
      case OnOpen::skip: skipping_ = 1; return true;
      case OnOpen::fail: return fail("unexpected JSON " + std::string(is_object ? "object" : "array"));
    }
    return false;
  }

  bool close() {
    --depth_;
    if (skipping_ > 0) {
      --skipping_;
      return true;
    }
    return self().on_close();
  }

  std::string error_;
  std::string document_ = "the file";
  int depth_ = 0;
  int skipping_ = 0;  // > 0 while inside a skipped container
};

}  // namespace detail
}  // namespace skewadam::tools
