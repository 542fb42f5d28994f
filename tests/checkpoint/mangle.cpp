// skewadam-ckpt-mangle IN OUT OPERATION
//
// Writes a damaged copy of a checkpoint, for the tests of what loading does
// with it. OPERATION:
//   truncate:N    keep the first N bytes (N%: that share; -N: all but the last N)
//   flip:N        change one bit of byte N (N% and -N as above)
//   version:V     set the format version and fix the header checksum
//   append:N      append N zero bytes
//   random:N      ignore IN; write N pseudo-random bytes
// Exit status 2 with a message on bad arguments or files.

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <skewadam/detail/crc32c.hpp>

namespace {

std::vector<unsigned char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// N, N% or -N as a byte offset into a file of `size` bytes.
std::size_t position(const std::string& arg, std::size_t size) {
  if (arg.empty()) throw std::invalid_argument("empty position");
  if (arg.back() == '%') return static_cast<std::size_t>(static_cast<double>(size) * std::stod(arg) / 100.0);
  const long long v = std::stoll(arg);
  const long long p = v < 0 ? static_cast<long long>(size) + v : v;
  if (p < 0 || static_cast<std::size_t>(p) > size) throw std::invalid_argument(arg + " is outside the file");
  return static_cast<std::size_t>(p);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 4) throw std::invalid_argument("usage: skewadam-ckpt-mangle IN OUT OPERATION");
    const std::string op = argv[3];
    const auto colon = op.find(':');
    if (colon == std::string::npos) throw std::invalid_argument("operation '" + op + "' has no ':'");
    const std::string kind = op.substr(0, colon), arg = op.substr(colon + 1);
    std::vector<unsigned char> b;
    if (kind == "random") {
      std::uint64_t x = 0x243f6a8885a308d3ULL;
      b.resize(static_cast<std::size_t>(std::stoull(arg)));
      for (auto& c : b) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c = static_cast<unsigned char>(x);
      }
    } else {
      b = read_all(argv[1]);
      if (kind == "truncate") {
        b.resize(position(arg, b.size()));
      } else if (kind == "flip") {
        const std::size_t at = position(arg, b.size());
        if (at >= b.size()) throw std::invalid_argument("flip: byte " + arg + " is outside the file");
        b[at] ^= 0x10;
      } else if (kind == "version") {
        if (b.size() < 32) throw std::invalid_argument("version: the file has no header");
        const auto v = static_cast<std::uint32_t>(std::stoul(arg));
        for (int k = 0; k < 4; ++k) b[static_cast<std::size_t>(12 + k)] = static_cast<unsigned char>(v >> (8 * k));
        const std::uint32_t crc = skewadam::detail::crc32c(b.data(), 28);
        for (int k = 0; k < 4; ++k) b[static_cast<std::size_t>(28 + k)] = static_cast<unsigned char>(crc >> (8 * k));
      } else if (kind == "append") {
        b.resize(b.size() + static_cast<std::size_t>(std::stoull(arg)), 0);
      } else {
        throw std::invalid_argument("unknown operation '" + kind + "'");
      }
    }
    std::ofstream out(argv[2], std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    if (!out) throw std::runtime_error(std::string(argv[2]) + ": write failed");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "skewadam-ckpt-mangle: %s\n", e.what());
    return 2;
  }
}
