#pragma once
// Helpers shared by the planner's tests: checking error messages, building
// safetensors bytes, and temporary folders.

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <string_view>

namespace skewadam_plan_test {

/// The message of the E that `f` throws, or "<nothing thrown>".
template <class E, class F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<nothing thrown>";
}

/// Checks that `expr` throws an E whose message contains `fragment`.
#define SKEWADAM_CHECK_ERROR(E, expr, fragment)                                                       \
  do {                                                                                                \
    const std::string skewadam_msg_ = ::skewadam_plan_test::thrown_message<E>([&] { (void)(expr); }); \
    CHECK_MESSAGE(skewadam_msg_.find(fragment) != std::string::npos, "message: ", skewadam_msg_);     \
  } while (0)

/// A safetensors file: 8-byte little-endian length (the header's own unless
/// `length` is given), the header, `data_size` zero bytes.
inline std::string safetensors_bytes(std::string_view header, std::uint64_t data_size,
                                     std::optional<std::uint64_t> length = std::nullopt) {
  const std::uint64_t n = length.value_or(header.size());
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xFF);
  out += header;
  out.append(static_cast<std::size_t>(data_size), '\0');
  return out;
}

/// A fresh folder under the system's temporary folder, removed at the end of scope.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("skewadam-plan-test-" + std::to_string(rd()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

  std::filesystem::path write(const std::string& name, std::string_view bytes) const {
    const std::filesystem::path p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace skewadam_plan_test
