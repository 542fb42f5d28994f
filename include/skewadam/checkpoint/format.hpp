#pragma once
// The checkpoint format (docs/checkpoint-format.md) as types and bytes: what
// a caller sees (CheckpointError, SaveOptions, LoadOptions, CheckpointInfo),
// the constants of the format, little-endian encoding, and what the
// optimizer and parameter records hold. No file access here (file_io.hpp)
// and no optimizer (writer.hpp, reader.hpp).

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "../detail/crc32c.hpp"
#include "../math/hyperparameters.hpp"
#include "../state/state_layout.hpp"
#include "../types/dtype.hpp"
#include "../types/shape.hpp"
#include "../types/tier.hpp"

namespace skewadam {

class CheckpointError : public std::runtime_error {
 public:
  enum class Kind {
    io,                   ///< the file cannot be opened, read or written
    not_a_checkpoint,     ///< a foreign file (wrong signature)
    unsupported_version,  ///< a format version this build does not read
    corrupt,              ///< truncated, a checksum mismatch, or malformed
    mismatch,             ///< intact, but for other parameters or rules
  };
  CheckpointError(Kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  Kind kind() const noexcept { return kind_; }

 private:
  Kind kind_;
};

struct SaveOptions {
  /// Also store every parameter's values, in its own dtype, bit for bit.
  bool include_params = false;
  /// Free-form strings, returned by read_checkpoint_info().
  std::vector<std::pair<std::string, std::string>> metadata{};
};

enum class ParamValues {
  load_if_present,  ///< load them when the checkpoint has them
  require,          ///< fail unless the checkpoint has them
  ignore,           ///< never touch the parameters
};

struct LoadOptions {
  ParamValues params = ParamValues::load_if_present;
};

/// What a checkpoint holds, without its arrays.
struct CheckpointInfo {
  struct TierInfo {
    std::string name;
    std::string rule;
    StateLayout layout{};
    Hyperparameters hyperparameters{};
  };
  struct Array {
    std::string name;  ///< m, v, v_row, v_col, or param (the values)
    Dtype dtype = Dtype::f32;
    Shape shape{};
  };
  struct Param {
    std::string name;
    Tier tier = Tier::backbone;
    Dtype dtype = Dtype::f32;
    Shape shape{};
    std::int64_t step = 0;
    std::uint32_t rounding_stream = 0;
    std::vector<Array> arrays;
  };

  std::uint32_t format_version = 0;
  std::uint64_t file_size = 0;
  bool has_param_values = false;
  std::int64_t steps = 0;
  std::uint64_t seed = 0;
  /// The global gradient norm the next step clips by under ClipNorm::previous
  /// (docs/spec.md E8): NaN when there is none (and in files before version 3).
  double previous_grad_norm = std::numeric_limits<double>::quiet_NaN();
  std::array<TierInfo, tier_count> tiers{};
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<Param> params;

  /// The value of a metadata key, or null.
  const std::string* find_metadata(std::string_view key) const {
    for (const auto& [k, v] : metadata)
      if (k == key) return &v;
    return nullptr;
  }
};

namespace detail::ckpt {

inline constexpr std::array<unsigned char, 12> magic{0x89, 'S', 'K', 'E', 'W', 'A', 'D', 'A', 'M', '\r', '\n', 0x1a};
/// The version this build writes, and the oldest it reads. Version 2 added
/// the momentum code 4 (Float8BlockMomentum); version 3 the previous step's
/// global gradient norm (E8) at the end of the optimizer record. Older files
/// read as they always did, with no such norm.
inline constexpr std::uint32_t format_version = 3;
inline constexpr std::uint32_t oldest_format_version = 1;
inline constexpr std::uint64_t header_size = 32;
inline constexpr std::uint64_t record_header_size = 16;
inline constexpr std::uint64_t record_trailer_size = 4;
inline constexpr std::uint32_t flag_param_values = 1u;
inline constexpr std::uint32_t known_flags = flag_param_values;
/// Largest OPTM or PARM payload a reader accepts (names, metadata).
inline constexpr std::uint64_t max_small_record = std::uint64_t{1} << 26;
/// Bytes moved (and checksummed) at a time for arrays.
inline constexpr std::size_t chunk_bytes = std::size_t{1} << 20;

constexpr std::uint32_t fourcc(const char (&s)[5]) noexcept {
  return static_cast<std::uint32_t>(static_cast<unsigned char>(s[0])) |
         static_cast<std::uint32_t>(static_cast<unsigned char>(s[1])) << 8 |
         static_cast<std::uint32_t>(static_cast<unsigned char>(s[2])) << 16 |
         static_cast<std::uint32_t>(static_cast<unsigned char>(s[3])) << 24;
}
inline constexpr std::uint32_t tag_optimizer = fourcc("OPTM");
inline constexpr std::uint32_t tag_param = fourcc("PARM");
inline constexpr std::uint32_t tag_data = fourcc("DATA");
inline constexpr std::uint32_t tag_end = fourcc("END ");

inline std::string tag_text(std::uint32_t tag) {
  std::string s;
  for (int i = 0; i < 4; ++i) {
    const auto c = static_cast<unsigned char>(tag >> (8 * i));
    s += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  return "'" + s + "'";
}

inline CheckpointError corrupt(const std::string& where, const std::string& what) {
  return CheckpointError(CheckpointError::Kind::corrupt, where + ": " + what);
}
inline CheckpointError io_error(const std::string& where, const std::string& what) {
  return CheckpointError(CheckpointError::Kind::io, where + ": " + what);
}
inline std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }
inline std::string bytes_text(std::uint64_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); }

// ------------------------------------------------------------ little endian
inline void put_le(unsigned char* p, std::uint64_t v, int bytes) noexcept {
  for (int i = 0; i < bytes && i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline std::uint64_t get_le(const unsigned char* p, int bytes) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

/// Reverses the bytes of each element in place (big-endian hosts only).
inline void swap_elements(unsigned char* p, std::size_t count, std::size_t elem) noexcept {
  for (std::size_t i = 0; i < count; ++i, p += elem) std::reverse(p, p + elem);
}

/// Builds a small record's payload.
class Encoder {
 public:
  void u8(unsigned v) { buf_.push_back(static_cast<unsigned char>(v)); }
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void i64(std::int64_t v) { put(static_cast<std::uint64_t>(v), 8); }
  void f64(double v) { put(std::bit_cast<std::uint64_t>(v), 8); }
  void str(std::string_view s) {
    if (s.size() > max_small_record) throw std::invalid_argument("checkpoint: a string of " + std::to_string(s.size()) + " bytes is too long");
    u32(static_cast<std::uint32_t>(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  void shape(const Shape& s) {
    u32(static_cast<std::uint32_t>(s.rank()));
    for (index_t d : s) u64(static_cast<std::uint64_t>(d));
  }
  const std::vector<unsigned char>& bytes() const noexcept { return buf_; }

 private:
  void put(std::uint64_t v, int n) {
    unsigned char b[8];
    put_le(b, v, n);
    buf_.insert(buf_.end(), b, b + n);
  }
  std::vector<unsigned char> buf_;
};

/// Reads a small record's payload; every read is bounds-checked.
class Decoder {
 public:
  Decoder(const std::vector<unsigned char>& bytes, std::string where) : b_(bytes), where_(std::move(where)) {}
  unsigned u8() { return *take(1); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(get_le(take(4), 4)); }
  std::uint64_t u64() { return get_le(take(8), 8); }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  double f64() { return std::bit_cast<double>(u64()); }
  std::string str() {
    const std::uint32_t n = u32();
    const unsigned char* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  Shape shape() {
    const std::uint32_t rank = u32();
    if (rank < 1 || rank > static_cast<std::uint32_t>(max_rank))
      throw corrupt(where_, "a shape of rank " + std::to_string(rank) + " (1.." + std::to_string(max_rank) + " expected)");
    std::array<index_t, max_rank> dims{};
    for (std::uint32_t i = 0; i < rank; ++i) {
      const std::uint64_t d = u64();
      if (d > (std::uint64_t{1} << 62)) throw corrupt(where_, "a dimension of " + std::to_string(d));
      dims[i] = static_cast<index_t>(d);
    }
    try {
      return Shape(dims.begin(), static_cast<index_t>(rank));
    } catch (const std::invalid_argument& e) {
      throw corrupt(where_, e.what());
    }
  }
  void finish() const {
    if (pos_ != b_.size())
      throw corrupt(where_, bytes_text(b_.size() - pos_) + " left over at the end of the record");
  }
  const std::string& where() const noexcept { return where_; }

 private:
  const unsigned char* take(std::size_t n) {
    if (n > b_.size() - pos_) throw corrupt(where_, "the record ends early");
    const unsigned char* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }
  const std::vector<unsigned char>& b_;
  std::size_t pos_ = 0;
  std::string where_;
};

// ----------------------------------------------------- what is in a record
inline const char* const state_array_names[] = {"m", "v", "v_row", "v_col"};
inline constexpr std::string_view values_array = "param";

/// The state arrays (name, logical shape) the rule with `layout` keeps for a
/// parameter of `shape`: exactly what Optimizer::add() allocates (nothing
/// for an empty tensor).
inline std::vector<CheckpointInfo::Array> state_arrays(StateLayout layout, const Shape& shape) {
  std::vector<CheckpointInfo::Array> a;
  if (shape.numel() == 0) return a;
  if (layout.momentum && layout.storage != MomentumStorage::f32)  // its blocks' words, copied as they are
    a.push_back({"m", Dtype::f32, Shape{momentum_words(layout, shape.matrices())}});
  else if (layout.momentum)
    a.push_back({"m", Dtype::f32, shape});
  if (factors(layout, shape)) {
    std::array<index_t, max_rank> d{};
    std::copy(shape.begin(), shape.end(), d.begin());
    const int r = shape.rank();
    a.push_back({"v_row", Dtype::f32, Shape(d.begin(), r - 1)});  // [..., rows]
    d[static_cast<std::size_t>(r - 2)] = d[static_cast<std::size_t>(r - 1)];
    a.push_back({"v_col", Dtype::f32, Shape(d.begin(), r - 1)});  // [..., cols]
  } else {
    a.push_back({"v", Dtype::f32, shape});
  }
  return a;
}

inline std::string arrays_text(const std::vector<CheckpointInfo::Array>& arrays) {
  std::string s;
  for (const auto& a : arrays) {
    if (a.name == values_array) continue;
    s += (s.empty() ? "" : ", ") + a.name + " " + a.shape.str();
  }
  return "{" + s + "}";
}

inline bool same_arrays(const std::vector<CheckpointInfo::Array>& file, const std::vector<CheckpointInfo::Array>& want) {
  std::vector<const CheckpointInfo::Array*> state;
  for (const auto& a : file)
    if (a.name != values_array) state.push_back(&a);
  if (state.size() != want.size()) return false;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (state[i]->name != want[i].name || state[i]->dtype != want[i].dtype || !(state[i]->shape == want[i].shape))
      return false;
  return true;
}

/// A tier's momentum as the OPTM record stores it: 0 none, 1 fp32, 2 linear
/// int8 codes with a scale per block, 3 bf16, 4 float8 codes with a scale
/// per block (format version 2 on).
inline std::uint8_t momentum_code(StateLayout layout) noexcept {
  if (!layout.momentum) return 0;
  switch (layout.storage) {
    case MomentumStorage::int8_blocks: return 2;
    case MomentumStorage::float8_blocks: return 4;
    case MomentumStorage::bfloat16: return 3;
    case MomentumStorage::f32: break;
  }
  return 1;
}

/// The optimizer record of `c` as format `version` writes it (this build's
/// by default; an older one leaves out what it did not hold).
inline std::vector<unsigned char> encode_optimizer(const CheckpointInfo& c, std::uint64_t nparams,
                                                   std::uint32_t version = format_version) {
  Encoder e;
  e.i64(c.steps);
  e.u64(c.seed);
  e.u32(static_cast<std::uint32_t>(tier_count));
  for (const auto& t : c.tiers) {
    e.str(t.name);
    e.u8(momentum_code(t.layout));
    e.u8(t.layout.factored ? 1 : 0);
    e.str(t.rule);
    const Hyperparameters& h = t.hyperparameters;
    e.f64(h.lr);
    e.f64(h.beta1);
    e.f64(h.beta2);
    e.f64(h.eps);
    e.f64(h.weight_decay);
    e.f64(h.clip_threshold);
    e.u32(static_cast<std::uint32_t>(h.clip_scope));
  }
  e.u64(nparams);
  e.u32(static_cast<std::uint32_t>(c.metadata.size()));
  for (const auto& [k, v] : c.metadata) {
    e.str(k);
    e.str(v);
  }
  if (version >= 3) e.f64(c.previous_grad_norm);
  return e.bytes();
}

inline std::uint64_t decode_optimizer(const std::vector<unsigned char>& payload, const std::string& where,
                                      std::uint32_t version, CheckpointInfo& c) {
  Decoder d(payload, where + ": optimizer record");
  c.steps = d.i64();
  if (c.steps < 0) throw corrupt(where, "negative step count " + std::to_string(c.steps));
  c.seed = d.u64();
  const std::uint32_t ntiers = d.u32();
  if (ntiers != static_cast<std::uint32_t>(tier_count))
    throw corrupt(where, std::to_string(ntiers) + " tiers recorded (" + std::to_string(tier_count) + " expected)");
  for (Tier t : all_tiers) {
    CheckpointInfo::TierInfo& ti = c.tiers[static_cast<std::size_t>(tier_index(t))];
    ti.name = d.str();
    if (ti.name != tier_name(t))
      throw corrupt(where, "tier " + std::to_string(tier_index(t)) + " is named '" + ti.name + "', expected '" +
                               std::string(tier_name(t)) + "'");
    const unsigned mom = d.u8();
    const unsigned fac = d.u8();
    if (mom > (version >= 2 ? 4u : 3u) || fac > 1)
      throw corrupt(where, "tier '" + ti.name + "': malformed state layout");
    ti.layout = StateLayout{mom >= 1, fac == 1,
                            mom == 2   ? MomentumStorage::int8_blocks
                            : mom == 3 ? MomentumStorage::bfloat16
                            : mom == 4 ? MomentumStorage::float8_blocks
                                       : MomentumStorage::f32};
    ti.rule = d.str();
    Hyperparameters& h = ti.hyperparameters;
    h.lr = d.f64();
    h.beta1 = d.f64();
    h.beta2 = d.f64();
    h.eps = d.f64();
    h.weight_decay = d.f64();
    h.clip_threshold = d.f64();
    const std::uint32_t scope = d.u32();
    if (scope > 1) throw corrupt(where, "tier '" + ti.name + "': unknown clip scope " + std::to_string(scope));
    h.clip_scope = static_cast<ClipScope>(scope);
    try {
      validate(h, "tier '" + ti.name + "' hyperparameters");
    } catch (const std::invalid_argument& e) {
      throw corrupt(where, e.what());
    }
  }
  const std::uint64_t nparams = d.u64();
  const std::uint32_t nmeta = d.u32();
  for (std::uint32_t i = 0; i < nmeta; ++i) {
    std::string k = d.str();
    std::string v = d.str();
    c.metadata.emplace_back(std::move(k), std::move(v));
  }
  if (version >= 3) {
    c.previous_grad_norm = d.f64();
    if (!std::isnan(c.previous_grad_norm) && !(c.previous_grad_norm >= 0 && std::isfinite(c.previous_grad_norm)))
      throw corrupt(where, "previous gradient norm " + std::to_string(c.previous_grad_norm) +
                               " (expected NaN or finite and >= 0)");
  }
  d.finish();
  return nparams;
}

inline std::vector<unsigned char> encode_param(const CheckpointInfo::Param& p) {
  Encoder e;
  e.str(p.name);
  e.u32(static_cast<std::uint32_t>(tier_index(p.tier)));
  e.u32(static_cast<std::uint32_t>(p.dtype));
  e.shape(p.shape);
  e.i64(p.step);
  e.u32(p.rounding_stream);
  e.u32(static_cast<std::uint32_t>(p.arrays.size()));
  for (const auto& a : p.arrays) {
    e.str(a.name);
    e.u32(static_cast<std::uint32_t>(a.dtype));
    e.shape(a.shape);
  }
  return e.bytes();
}

inline CheckpointInfo::Param decode_param(const std::vector<unsigned char>& payload, const std::string& where,
                                          std::int64_t steps, bool has_values) {
  Decoder d(payload, where);
  CheckpointInfo::Param p;
  p.name = d.str();
  const std::string who = "parameter '" + p.name + "'";
  const std::uint32_t tier = d.u32();
  if (tier >= static_cast<std::uint32_t>(tier_count)) throw corrupt(where, who + ": unknown tier " + std::to_string(tier));
  p.tier = static_cast<Tier>(tier);
  const std::uint32_t dtype = d.u32();
  if (dtype > 2) throw corrupt(where, who + ": unknown dtype " + std::to_string(dtype));
  p.dtype = static_cast<Dtype>(dtype);
  p.shape = d.shape();
  p.step = d.i64();
  if (p.step < 0 || p.step > steps)
    throw corrupt(where, who + ": step count " + std::to_string(p.step) + " is outside 0.." + std::to_string(steps));
  p.rounding_stream = d.u32();
  const std::uint32_t n = d.u32();
  if (n > 5) throw corrupt(where, who + ": " + std::to_string(n) + " arrays");
  bool values = false;
  for (std::uint32_t i = 0; i < n; ++i) {
    CheckpointInfo::Array a;
    a.name = d.str();
    const std::uint32_t adt = d.u32();
    if (adt > 2) throw corrupt(where, who + ": array '" + a.name + "' has unknown dtype " + std::to_string(adt));
    a.dtype = static_cast<Dtype>(adt);
    a.shape = d.shape();
    for (const auto& b : p.arrays)
      if (b.name == a.name) throw corrupt(where, who + ": array '" + a.name + "' appears twice");
    if (a.name == values_array) {
      if (a.dtype != p.dtype || !(a.shape == p.shape))
        throw corrupt(where, who + ": its values are not of its dtype and shape");
      values = true;
    } else if (std::find(std::begin(state_array_names), std::end(state_array_names), a.name) ==
               std::end(state_array_names)) {
      throw corrupt(where, who + ": unknown array '" + a.name + "'");
    } else if (a.dtype != Dtype::f32) {
      throw corrupt(where, who + ": state array '" + a.name + "' is not f32");
    }
    p.arrays.push_back(std::move(a));
  }
  if (values != has_values)
    throw corrupt(where, who + (has_values ? ": its values are missing" : ": holds values the header does not announce"));
  d.finish();
  return p;
}

}  // namespace detail::ckpt
}  // namespace skewadam
