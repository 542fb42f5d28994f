#pragma once
// Checkpoints: an optimizer's complete state in one file, and back.
//
//   skewadam::save_checkpoint(opt, "run/optimizer.ckpt");
//   ...
//   skewadam::SkewAdam fresh(hyper);
//   /* register the same parameters, in any order */
//   skewadam::load_checkpoint(fresh, "run/optimizer.ckpt");
//   // steps from here on give the bits an uninterrupted run would have given
//
// A checkpoint holds, per parameter and by name, its tier, dtype, shape,
// step count, rounding stream and state arrays (with their logical shapes);
// per tier the rule's identity (rule_name.hpp), state layout and
// hyperparameters; the optimizer's step count (the lr schedule's position) and
// stochastic-rounding seed; optionally the parameter values, bit for bit; and
// optional metadata strings. Not saved: gradients, the lr schedule functions
// (code: install them again, their position is restored), the thread count,
// the non-finite policy and a pending clip_grad_norm() scale.
// The format (little-endian, versioned, CRC-32C per record) is specified in
// docs/checkpoint-format.md.
//
// Saving writes a temporary file in the target's folder, flushes and fsyncs
// it, then renames it over the target: a crash at any moment leaves either the
// previous checkpoint or the new one, never a mixture.
//
// Loading reads everything into temporaries and checks it all: every name,
// tier, dtype, shape and state array against the registered parameters, every
// tier's rule against the optimizer's, every checksum. Nothing is converted:
// a bf16 parameter does not load from an f32 one. Only then is the state
// swapped in, with no step that can fail. On any error a CheckpointError says
// exactly what is wrong (all mismatches, not just the first) and the optimizer
// and the parameters are unchanged. Until it commits, loading holds a second
// copy of the state (and of the parameter values it loads). A load restores
// the saved hyperparameters and seed; change them afterwards if need be.
//
// Neither saving nor loading may run concurrently with step() on the same
// optimizer.

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <unistd.h>
#define SKEWADAM_CHECKPOINT_POSIX 1
#elif defined(_WIN32)
#include <io.h>
#include <process.h>
#endif

#include "detail/crc32c.hpp"
#include "dtype.hpp"
#include "hyperparameters.hpp"
#include "optimizer.hpp"
#include "optimizer_state.hpp"
#include "rule_name.hpp"
#include "shape.hpp"
#include "state_layout.hpp"
#include "tier.hpp"

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
inline constexpr std::uint32_t format_version = 1;
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
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
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

// ------------------------------------------------------------------- sinks
class MemorySink {
 public:
  explicit MemorySink(std::vector<std::byte>& out) : out_(out) {}
  void write(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }

 private:
  std::vector<std::byte>& out_;
};

/// Writes a temporary file beside the target; commit() flushes, fsyncs and
/// renames it over the target. Without commit() the temporary is removed.
class AtomicFileSink {
 public:
  explicit AtomicFileSink(const std::filesystem::path& target) : target_(target), where_(target.string()) {
    namespace fs = std::filesystem;
    if (target.filename().empty() || target.filename() == "." || target.filename() == "..")
      throw io_error(where_, "does not name a file");
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw io_error(where_, "folder '" + dir.string() + "' does not exist");
    static std::atomic<unsigned> counter{0};
    for (int attempt = 0; attempt < 100 && !f_; ++attempt) {
      std::string name(1, '.');
      name += target.filename().string();
      name += ".tmp-";
      name += std::to_string(process_id());
      name += '-';
      name += std::to_string(counter.fetch_add(1));
      temp_ = dir / name;
      errno = 0;
      f_ = std::fopen(temp_.string().c_str(), "wbx");
      if (!f_ && errno != EEXIST) break;
    }
    if (!f_) throw io_error(where_, "cannot create a temporary file beside it: " + errno_text(errno));
    std::setvbuf(f_, nullptr, _IOFBF, chunk_bytes);
  }
  AtomicFileSink(const AtomicFileSink&) = delete;
  AtomicFileSink& operator=(const AtomicFileSink&) = delete;
  ~AtomicFileSink() {
    if (f_) std::fclose(f_);
    if (!committed_) {
      std::error_code ec;
      std::filesystem::remove(temp_, ec);
    }
  }

  void write(const void* p, std::size_t n) {
    if (n > 0 && std::fwrite(p, 1, n, f_) != n) fail("write failed");
  }

  void commit() {
    if (std::fflush(f_) != 0) fail("write failed");
#if defined(SKEWADAM_CHECKPOINT_POSIX)
    if (::fsync(::fileno(f_)) != 0) fail("fsync failed");
#elif defined(_WIN32)
    if (::_commit(::_fileno(f_)) != 0) fail("flush to disk failed");
#endif
    std::FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) fail("close failed");
    std::error_code ec;
    std::filesystem::rename(temp_, target_, ec);
    if (ec) throw io_error(where_, "cannot replace it with the new file: " + ec.message());
    committed_ = true;
#if defined(SKEWADAM_CHECKPOINT_POSIX)
    // make the rename itself durable (best effort: not every file system can)
    const std::filesystem::path dir = target_.has_parent_path() ? target_.parent_path() : std::filesystem::path(".");
    const int fd = ::open(dir.string().c_str(), O_RDONLY);
    if (fd >= 0) {
      (void)::fsync(fd);
      ::close(fd);
    }
#endif
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    const int e = errno;
    throw io_error(where_, what + (e ? ": " + errno_text(e) : std::string()));
  }
  static long process_id() noexcept {
#if defined(SKEWADAM_CHECKPOINT_POSIX)
    return static_cast<long>(::getpid());
#elif defined(_WIN32)
    return static_cast<long>(::_getpid());
#else
    return 0;
#endif
  }

  std::filesystem::path target_;
  std::filesystem::path temp_;
  std::string where_;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
};

/// Writes records: header, payload, CRC-32C trailer.
template <class Sink>
class RecordWriter {
 public:
  explicit RecordWriter(Sink& sink) : sink_(sink) {}

  void begin(std::uint32_t tag, std::uint64_t length) {
    unsigned char h[record_header_size];
    put_le(h, tag, 4);
    put_le(h + 4, 0, 4);
    put_le(h + 8, length, 8);
    crc_ = crc32c(h, sizeof h);
    left_ = length;
    sink_.write(h, sizeof h);
  }
  void bytes(const void* p, std::size_t n) {
    if (n > left_) throw std::logic_error("checkpoint writer: record longer than declared");
    crc_ = crc32c_update(crc_, p, n);
    sink_.write(p, n);
    left_ -= n;
  }
  /// count elements of elem bytes each, as little-endian.
  void elements(const void* p, std::size_t count, std::size_t elem) {
    const auto* b = static_cast<const unsigned char*>(p);
    const std::size_t per_chunk = chunk_bytes / elem;
    if constexpr (std::endian::native == std::endian::little) {
      for (std::size_t i = 0; i < count; i += per_chunk) bytes(b + i * elem, std::min(per_chunk, count - i) * elem);
    } else {
      std::vector<unsigned char> buf(chunk_bytes);
      for (std::size_t i = 0; i < count; i += per_chunk) {
        const std::size_t n = std::min(per_chunk, count - i);
        std::memcpy(buf.data(), b + i * elem, n * elem);
        swap_elements(buf.data(), n, elem);
        bytes(buf.data(), n * elem);
      }
    }
  }
  void end() {
    if (left_ != 0) throw std::logic_error("checkpoint writer: record shorter than declared");
    unsigned char t[record_trailer_size];
    put_le(t, crc_, 4);
    sink_.write(t, sizeof t);
  }
  void record(std::uint32_t tag, const std::vector<unsigned char>& payload) {
    begin(tag, payload.size());
    bytes(payload.data(), payload.size());
    end();
  }

 private:
  Sink& sink_;
  std::uint32_t crc_ = 0;
  std::uint64_t left_ = 0;
};

// ----------------------------------------------------------------- sources
class MemorySource {
 public:
  MemorySource(std::span<const std::byte> bytes, std::string where) : b_(bytes), where_(std::move(where)) {}
  std::uint64_t size() const noexcept { return b_.size(); }
  std::uint64_t position() const noexcept { return pos_; }
  const std::string& where() const noexcept { return where_; }
  void read(void* dst, std::uint64_t n) {
    if (n > b_.size() - pos_) throw corrupt(where_, "truncated: ends at byte " + std::to_string(b_.size()));
    if (n > 0) std::memcpy(dst, b_.data() + pos_, static_cast<std::size_t>(n));
    pos_ += n;
  }
  void skip(std::uint64_t n) {
    if (n > b_.size() - pos_) throw corrupt(where_, "truncated: ends at byte " + std::to_string(b_.size()));
    pos_ += n;
  }

 private:
  std::span<const std::byte> b_;
  std::uint64_t pos_ = 0;
  std::string where_;
};

class FileSource {
 public:
  explicit FileSource(const std::filesystem::path& file) : where_(file.string()) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status st = fs::status(file, ec);
    if (ec || !fs::exists(st)) throw io_error(where_, "cannot open: no such file");
    if (fs::is_directory(st)) throw io_error(where_, "cannot open: is a directory");
    errno = 0;
    f_ = std::fopen(file.string().c_str(), "rb");
    if (!f_) throw io_error(where_, "cannot open: " + errno_text(errno));
    const std::uintmax_t size = fs::file_size(file, ec);
    if (ec) {
      std::fclose(f_);
      throw io_error(where_, "cannot read its size: " + ec.message());
    }
    size_ = static_cast<std::uint64_t>(size);
  }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;
  ~FileSource() { std::fclose(f_); }

  std::uint64_t size() const noexcept { return size_; }
  std::uint64_t position() const noexcept { return pos_; }
  const std::string& where() const noexcept { return where_; }
  void read(void* dst, std::uint64_t n) {
    if (n > size_ - pos_) throw corrupt(where_, "truncated: ends at byte " + std::to_string(size_));
    auto* d = static_cast<unsigned char*>(dst);
    while (n > 0) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(n, std::uint64_t{1} << 30));
      const std::size_t got = std::fread(d, 1, want, f_);
      pos_ += got;
      d += got;
      n -= got;
      if (got != want) {
        if (std::ferror(f_)) throw io_error(where_, "read failed at byte " + std::to_string(pos_));
        throw corrupt(where_, "truncated: ends at byte " + std::to_string(pos_) + " (did it change while loading?)");
      }
    }
  }
  void skip(std::uint64_t n) {
    if (n > size_ - pos_) throw corrupt(where_, "truncated: ends at byte " + std::to_string(size_));
    pos_ += n;
#if defined(SKEWADAM_CHECKPOINT_POSIX)
    const bool ok = ::fseeko(f_, static_cast<off_t>(pos_), SEEK_SET) == 0;
#elif defined(_WIN32)
    const bool ok = ::_fseeki64(f_, static_cast<long long>(pos_), SEEK_SET) == 0;
#else
    const bool ok = pos_ <= static_cast<std::uint64_t>(std::numeric_limits<long>::max()) &&
                    std::fseek(f_, static_cast<long>(pos_), SEEK_SET) == 0;
#endif
    if (!ok) throw io_error(where_, "seek to byte " + std::to_string(pos_) + " failed");
  }

 private:
  std::FILE* f_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t pos_ = 0;
  std::string where_;
};

// ----------------------------------------------------------------- records
template <class Source>
std::string at_byte(const Source& src) {
  return "at byte " + std::to_string(src.position());
}

struct Header {
  std::uint32_t version = 0;
  std::uint64_t file_size = 0;
  std::uint32_t flags = 0;
};

template <class Source>
Header read_header(Source& src) {
  const std::string& where = src.where();
  unsigned char h[header_size] = {};
  if (src.size() < magic.size()) {
    if (src.size() == 0) throw CheckpointError(CheckpointError::Kind::not_a_checkpoint, where + ": empty file, not a checkpoint");
    throw CheckpointError(CheckpointError::Kind::not_a_checkpoint,
                          where + ": not a skewadam checkpoint (too short for its signature)");
  }
  src.read(h, magic.size());
  if (!std::equal(magic.begin(), magic.end(), h))
    throw CheckpointError(CheckpointError::Kind::not_a_checkpoint,
                          where + ": not a skewadam checkpoint (unknown signature)");
  if (src.size() < header_size) throw corrupt(where, "truncated inside the file header");
  src.read(h + magic.size(), header_size - magic.size());
  if (crc32c(h, 28) != static_cast<std::uint32_t>(get_le(h + 28, 4)))
    throw corrupt(where, "file header checksum mismatch");
  Header r;
  r.version = static_cast<std::uint32_t>(get_le(h + 12, 4));
  r.file_size = get_le(h + 16, 8);
  r.flags = static_cast<std::uint32_t>(get_le(h + 24, 4));
  if (r.version != format_version)
    throw CheckpointError(CheckpointError::Kind::unsupported_version,
                          where + ": checkpoint format version " + std::to_string(r.version) +
                              "; this build reads version " + std::to_string(format_version));
  if (r.file_size != src.size()) {
    if (src.size() < r.file_size)
      throw corrupt(where, "truncated: " + std::to_string(src.size()) + " bytes, the header says " +
                               std::to_string(r.file_size));
    throw corrupt(where, bytes_text(src.size() - r.file_size) + " after the end (" +
                             std::to_string(src.size()) + " bytes, the header says " + std::to_string(r.file_size) + ")");
  }
  if (r.flags & ~known_flags) throw corrupt(where, "unknown header flags " + std::to_string(r.flags));
  return r;
}

struct RecordHead {
  std::uint64_t at = 0;      ///< offset of the record
  std::uint64_t length = 0;  ///< payload bytes
  std::uint32_t crc = 0;     ///< CRC-32C of the record header
};

template <class Source>
RecordHead read_record_head(Source& src, std::uint32_t tag, const std::string& what) {
  RecordHead r;
  r.at = src.position();
  if (src.size() - src.position() < record_header_size + record_trailer_size)
    throw corrupt(src.where(), "truncated: no room for the " + what + " record " + at_byte(src));
  unsigned char h[record_header_size];
  src.read(h, sizeof h);
  const auto got = static_cast<std::uint32_t>(get_le(h, 4));
  if (got != tag)
    throw corrupt(src.where(), "expected the " + what + " record (" + tag_text(tag) + ") at byte " +
                                   std::to_string(r.at) + ", found " + tag_text(got));
  if (get_le(h + 4, 4) != 0) throw corrupt(src.where(), "the " + what + " record at byte " + std::to_string(r.at) + " has a non-zero reserved field");
  r.length = get_le(h + 8, 8);
  if (r.length > src.size() - src.position() - record_trailer_size)
    throw corrupt(src.where(), "the " + what + " record at byte " + std::to_string(r.at) + " claims " +
                                   std::to_string(r.length) + " bytes, more than the file holds (truncated?)");
  r.crc = crc32c(h, sizeof h);
  return r;
}

template <class Source>
void check_trailer(Source& src, const RecordHead& r, std::uint32_t crc, const std::string& what) {
  unsigned char t[record_trailer_size];
  src.read(t, sizeof t);
  if (static_cast<std::uint32_t>(get_le(t, 4)) != crc)
    throw corrupt(src.where(), "checksum mismatch in the " + what + " record at byte " + std::to_string(r.at));
}

template <class Source>
std::vector<unsigned char> read_small_record(Source& src, std::uint32_t tag, const std::string& what) {
  const RecordHead r = read_record_head(src, tag, what);
  if (r.length > max_small_record)
    throw corrupt(src.where(), "the " + what + " record at byte " + std::to_string(r.at) + " claims " +
                                   std::to_string(r.length) + " bytes (at most " + std::to_string(max_small_record) + ")");
  std::vector<unsigned char> payload(static_cast<std::size_t>(r.length));
  src.read(payload.data(), r.length);
  check_trailer(src, r, crc32c_update(r.crc, payload.data(), payload.size()), what);
  return payload;
}

/// Reads a DATA record of exactly `bytes` bytes into dst (count elements of
/// elem bytes each); on a null dst skips it without reading.
template <class Source>
void read_data_record(Source& src, void* dst, std::uint64_t count, std::size_t elem, const std::string& what) {
  const RecordHead r = read_record_head(src, tag_data, what);
  if (count > std::numeric_limits<std::uint64_t>::max() / elem || r.length != count * elem)
    throw corrupt(src.where(), "the " + what + " record at byte " + std::to_string(r.at) + " holds " +
                                   std::to_string(r.length) + " bytes, its shape needs " +
                                   std::to_string(count) + " x " + std::to_string(elem));
  if (!dst) {
    src.skip(r.length + record_trailer_size);
    return;
  }
  auto* d = static_cast<unsigned char*>(dst);
  std::uint32_t crc = r.crc;
  for (std::uint64_t done = 0; done < r.length;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes, r.length - done));
    src.read(d + done, n);
    crc = crc32c_update(crc, d + done, n);
    done += n;
  }
  check_trailer(src, r, crc, what);
  if constexpr (std::endian::native != std::endian::little)
    swap_elements(d, static_cast<std::size_t>(count), elem);
}

// ----------------------------------------------------- what is in a record
inline const char* const state_array_names[] = {"m", "v", "v_row", "v_col"};
inline constexpr std::string_view values_array = "param";

/// The state arrays (name, logical shape) the rule with `layout` keeps for a
/// parameter of `shape`: exactly what Optimizer::add() allocates (nothing
/// for an empty tensor).
inline std::vector<CheckpointInfo::Array> state_arrays(StateLayout layout, const Shape& shape) {
  std::vector<CheckpointInfo::Array> a;
  if (shape.numel() == 0) return a;
  if (layout.momentum) a.push_back({"m", Dtype::f32, shape});
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

inline std::vector<unsigned char> encode_optimizer(const CheckpointInfo& c, std::uint64_t nparams) {
  Encoder e;
  e.i64(c.steps);
  e.u64(c.seed);
  e.u32(static_cast<std::uint32_t>(tier_count));
  for (const auto& t : c.tiers) {
    e.str(t.name);
    e.u8(t.layout.momentum ? 1 : 0);
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
  return e.bytes();
}

inline std::uint64_t decode_optimizer(const std::vector<unsigned char>& payload, const std::string& where,
                                      CheckpointInfo& c) {
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
    if (mom > 1 || fac > 1) throw corrupt(where, "tier '" + ti.name + "': malformed state layout");
    ti.layout = StateLayout{mom == 1, fac == 1};
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

/// Walks a checkpoint: header, optimizer record, every parameter record and
/// its arrays, end record. `on_optimizer(info)` sees the header and optimizer
/// record; `on_param(param)` returns, per array, where to read it (null:
/// skip). Every structural problem throws CheckpointError.
template <class Source, class OnOptimizer, class OnParam>
void walk(Source& src, CheckpointInfo& info, OnOptimizer&& on_optimizer, OnParam&& on_param) {
  const std::string& where = src.where();
  const Header h = read_header(src);
  info.format_version = h.version;
  info.file_size = h.file_size;
  info.has_param_values = (h.flags & flag_param_values) != 0;
  const std::uint64_t nparams = decode_optimizer(read_small_record(src, tag_optimizer, "optimizer"), where, info);
  on_optimizer(static_cast<const CheckpointInfo&>(info));
  for (std::uint64_t k = 0; k < nparams; ++k) {
    const std::string what = "parameter #" + std::to_string(k);
    CheckpointInfo::Param p = decode_param(read_small_record(src, tag_param, what), where + ": " + what,
                                           info.steps, info.has_param_values);
    const std::vector<void*> dst = on_param(static_cast<const CheckpointInfo::Param&>(p));
    for (std::size_t i = 0; i < p.arrays.size(); ++i) {
      const auto& a = p.arrays[i];
      read_data_record(src, i < dst.size() ? dst[i] : nullptr, static_cast<std::uint64_t>(a.shape.numel()),
                       static_cast<std::size_t>(dtype_size(a.dtype)), "'" + p.name + "' " + a.name + " data");
    }
    info.params.push_back(std::move(p));
  }
  const std::vector<unsigned char> end = read_small_record(src, tag_end, "end");
  Decoder d(end, where + ": end record");
  const std::uint64_t count = d.u64();
  d.finish();
  if (count != nparams)
    throw corrupt(where, "the end record counts " + std::to_string(count) + " parameters, the optimizer record " +
                             std::to_string(nparams));
  if (src.position() != src.size()) throw corrupt(where, "unexpected bytes after the end record");
}

// ------------------------------------------------------------------ saving
template <class Tiers, class Backend, class Sink>
void save(const Optimizer<Tiers, Backend, Local>& opt, Sink& sink, const SaveOptions& options) {
  CheckpointInfo info;
  info.steps = opt.steps();
  info.seed = opt.seed();
  for (Tier t : all_tiers) {
    auto& ti = info.tiers[static_cast<std::size_t>(tier_index(t))];
    ti.name = std::string(tier_name(t));
    ti.rule = tier_rule_name<Tiers>(t);
    ti.layout = Tiers::layout(t);
    ti.hyperparameters = opt.hyperparameters(t);
  }
  info.metadata = options.metadata;
  const auto n = static_cast<std::size_t>(opt.size());
  const std::vector<unsigned char> optimizer = encode_optimizer(info, n);
  if (optimizer.size() > max_small_record) throw std::invalid_argument("save_checkpoint: metadata too large");

  std::vector<std::vector<unsigned char>> records(n);
  std::uint64_t total = header_size + record_header_size + optimizer.size() + record_trailer_size;
  for (std::size_t i = 0; i < n; ++i) {
    const ParamId id{static_cast<index_t>(i)};
    const ParamView& pv = opt.param(id);
    CheckpointInfo::Param p;
    p.name = opt.name(id);
    p.tier = opt.tier(id);
    p.dtype = pv.dtype;
    p.shape = pv.shape;
    p.step = opt.state(id).step;
    p.rounding_stream = opt.rounding_stream(id);
    p.arrays = state_arrays(Tiers::layout(p.tier), p.shape);
    if (options.include_params) p.arrays.push_back({std::string(values_array), p.dtype, p.shape});
    records[i] = encode_param(p);
    if (records[i].size() > max_small_record)
      throw std::invalid_argument("save_checkpoint: the name of parameter #" + std::to_string(i) + " is too long");
    total += record_header_size + records[i].size() + record_trailer_size;
    for (const auto& a : p.arrays)
      total += record_header_size + static_cast<std::uint64_t>(a.shape.numel() * dtype_size(a.dtype)) +
               record_trailer_size;
  }
  total += record_header_size + 8 + record_trailer_size;

  unsigned char h[header_size] = {};
  std::copy(magic.begin(), magic.end(), h);
  put_le(h + 12, format_version, 4);
  put_le(h + 16, total, 8);
  put_le(h + 24, options.include_params ? flag_param_values : 0u, 4);
  put_le(h + 28, crc32c(h, 28), 4);
  sink.write(h, sizeof h);

  RecordWriter<Sink> w(sink);
  w.record(tag_optimizer, optimizer);
  for (std::size_t i = 0; i < n; ++i) {
    const ParamId id{static_cast<index_t>(i)};
    w.record(tag_param, records[i]);
    const ParamStateView s = opt.state(id);
    for (const auto& a : state_arrays(Tiers::layout(opt.tier(id)), opt.param(id).shape)) {
      const std::span<const float> data = a.name == "m" ? s.m : a.name == "v" ? s.v : a.name == "v_row" ? s.v_row : s.v_col;
      if (static_cast<index_t>(data.size()) != a.shape.numel())
        throw std::logic_error("save_checkpoint: state array " + a.name + " of '" + opt.name(id) + "' has an unexpected size");
      w.begin(tag_data, data.size() * 4);
      w.elements(data.data(), data.size(), 4);
      w.end();
    }
    if (options.include_params) {
      const ParamView& pv = opt.param(id);
      const auto count = static_cast<std::size_t>(pv.numel());
      const auto elem = static_cast<std::size_t>(dtype_size(pv.dtype));
      w.begin(tag_data, count * elem);
      w.elements(pv.data, count, elem);
      w.end();
    }
  }
  Encoder end;
  end.u64(n);
  w.record(tag_end, end.bytes());
}

// ----------------------------------------------------------------- loading
template <class Tiers, class Backend, class Source>
void load(Optimizer<Tiers, Backend, Local>& opt, Source& src, const LoadOptions& options) {
  const std::string& where = src.where();
  const auto n = static_cast<std::size_t>(opt.size());
  std::vector<std::string> problems;
  OptimizerState next;
  next.params.resize(n);
  std::vector<char> found(n, 0);
  std::vector<std::vector<unsigned char>> values;
  bool load_values = false;
  std::array<bool, tier_count> rule_ok{};

  CheckpointInfo info;
  walk(
      src, info,
      [&](const CheckpointInfo& c) {
        if (!c.has_param_values && options.params == ParamValues::require)
          throw CheckpointError(CheckpointError::Kind::mismatch,
                                where + ": holds no parameter values (it was saved without include_params)");
        load_values = c.has_param_values && options.params != ParamValues::ignore;
        if (load_values) values.resize(n);
        for (Tier t : all_tiers) {
          const auto i = static_cast<std::size_t>(tier_index(t));
          const std::string mine = tier_rule_name<Tiers>(t);
          rule_ok[i] = c.tiers[i].rule == mine && c.tiers[i].layout == Tiers::layout(t);
          if (!rule_ok[i])
            problems.push_back("tier " + c.tiers[i].name + ": rule " + c.tiers[i].rule +
                               " in the checkpoint, " + mine + " in this optimizer");
          next.hyperparameters[i] = c.tiers[i].hyperparameters;
        }
        next.seed = c.seed;
        next.steps = c.steps;
      },
      [&](const CheckpointInfo::Param& p) -> std::vector<void*> {
        std::vector<void*> dst;
        const std::optional<ParamId> id = opt.find(p.name);
        if (!id) {
          problems.push_back("'" + p.name + "': in the checkpoint, not registered");
          return dst;
        }
        const auto i = static_cast<std::size_t>(id->index);
        if (found[i]) throw corrupt(where, "parameter '" + p.name + "' appears twice");
        found[i] = 1;
        const ParamView& pv = opt.param(*id);
        const Tier tier = opt.tier(*id);
        const std::size_t before = problems.size();
        if (p.tier != tier)
          problems.push_back("'" + p.name + "': tier " + std::string(tier_name(p.tier)) + " in the checkpoint, " +
                             std::string(tier_name(tier)) + " registered");
        if (p.dtype != pv.dtype)
          problems.push_back("'" + p.name + "': dtype " + std::string(dtype_name(p.dtype)) + " in the checkpoint, " +
                             std::string(dtype_name(pv.dtype)) + " registered (nothing is converted)");
        if (!(p.shape == pv.shape))
          problems.push_back("'" + p.name + "': shape " + p.shape.str() + " in the checkpoint, " + pv.shape.str() +
                             " registered");
        if (problems.size() != before || !rule_ok[static_cast<std::size_t>(tier_index(tier))]) return dst;
        const std::vector<CheckpointInfo::Array> want = state_arrays(Tiers::layout(tier), pv.shape);
        if (!same_arrays(p.arrays, want)) {
          problems.push_back("'" + p.name + "': state arrays " + arrays_text(p.arrays) + " in the checkpoint, " +
                             arrays_text(want) + " kept by this optimizer");
          return dst;
        }
        OptimizerState::Param& np = next.params[i];
        np.state.step = p.step;
        np.rounding_stream = p.rounding_stream;
        for (const auto& a : p.arrays) {
          if (a.name == values_array) {
            if (!load_values) {
              dst.push_back(nullptr);
              continue;
            }
            values[i].resize(static_cast<std::size_t>(pv.bytes()));
            dst.push_back(values[i].data());
            continue;
          }
          std::vector<float>& v = a.name == "m" ? np.state.m : a.name == "v" ? np.state.v : a.name == "v_row" ? np.state.v_row : np.state.v_col;
          v.resize(static_cast<std::size_t>(a.shape.numel()));
          dst.push_back(v.data());
        }
        return dst;
      });

  for (std::size_t i = 0; i < n; ++i)
    if (!found[i]) problems.push_back("'" + opt.name(ParamId{static_cast<index_t>(i)}) + "': registered, not in the checkpoint");
  if (!problems.empty()) {
    constexpr std::size_t shown = 40;
    std::string msg = where + ": does not match the optimizer (" + std::to_string(problems.size()) +
                      (problems.size() == 1 ? " problem" : " problems") + "):";
    for (std::size_t i = 0; i < std::min(shown, problems.size()); ++i) msg += "\n  " + problems[i];
    if (problems.size() > shown) msg += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
    throw CheckpointError(CheckpointError::Kind::mismatch, msg);
  }
  try {
    opt.import_state(std::move(next));
  } catch (const std::invalid_argument& e) {
    throw corrupt(where, e.what());
  }
  // cannot fail: sizes were checked against the registered parameters
  if (load_values)
    for (std::size_t i = 0; i < n; ++i) {
      const ParamView& pv = opt.param(ParamId{static_cast<index_t>(i)});
      if (!values[i].empty()) std::memcpy(pv.data, values[i].data(), values[i].size());
    }
}

}  // namespace detail::ckpt

// ------------------------------------------------------------------ the API

/// Saves `opt` to `file` atomically (temporary file, fsync, rename).
template <class Tiers, class Backend>
void save_checkpoint(const Optimizer<Tiers, Backend, Local>& opt, const std::filesystem::path& file,
                     const SaveOptions& options = {}) {
  detail::ckpt::AtomicFileSink sink(file);
  detail::ckpt::save(opt, sink, options);
  sink.commit();
}

/// The bytes save_checkpoint() would write.
template <class Tiers, class Backend>
std::vector<std::byte> checkpoint_bytes(const Optimizer<Tiers, Backend, Local>& opt, const SaveOptions& options = {}) {
  std::vector<std::byte> out;
  detail::ckpt::MemorySink sink(out);
  detail::ckpt::save(opt, sink, options);
  return out;
}

/// Loads `file` into `opt`, whose parameters must be those saved (by name,
/// in any order). All or nothing: see the top of this file.
template <class Tiers, class Backend>
void load_checkpoint(Optimizer<Tiers, Backend, Local>& opt, const std::filesystem::path& file,
                     const LoadOptions& options = {}) {
  detail::ckpt::FileSource src(file);
  detail::ckpt::load(opt, src, options);
}

/// Loads a checkpoint held in memory.
template <class Tiers, class Backend>
void load_checkpoint(Optimizer<Tiers, Backend, Local>& opt, std::span<const std::byte> bytes,
                     const LoadOptions& options = {}) {
  detail::ckpt::MemorySource src(bytes, "checkpoint in memory");
  detail::ckpt::load(opt, src, options);
}

/// Reads what a checkpoint holds (checking its structure and every record
/// checksum except those of the arrays, which are skipped).
inline CheckpointInfo read_checkpoint_info(const std::filesystem::path& file) {
  detail::ckpt::FileSource src(file);
  CheckpointInfo info;
  detail::ckpt::walk(src, info, [](const CheckpointInfo&) {}, [](const CheckpointInfo::Param&) { return std::vector<void*>{}; });
  return info;
}

inline CheckpointInfo read_checkpoint_info(std::span<const std::byte> bytes) {
  detail::ckpt::MemorySource src(bytes, "checkpoint in memory");
  CheckpointInfo info;
  detail::ckpt::walk(src, info, [](const CheckpointInfo&) {}, [](const CheckpointInfo::Param&) { return std::vector<void*>{}; });
  return info;
}

}  // namespace skewadam
