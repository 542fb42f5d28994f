#pragma once
// Where checkpoint bytes go and come from: memory, or a file. A file is
// written as a temporary beside the target that commit() flushes, fsyncs and
// renames over it, so a crash leaves the old checkpoint or the new one.

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
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

#include "format.hpp"

namespace skewadam::detail::ckpt {

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

}  // namespace skewadam::detail::ckpt
