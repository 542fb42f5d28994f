#pragma once
// Reading and writing .npy arrays of little-endian float32 (format 1.0-3.0),
// C order, no pickles. Every error names the file and the problem.

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace skewadam::tools {

struct NpyArray {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

class NpyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

inline std::string dict_value(const std::string& header, const std::string& key, const std::string& file) {
  const std::string k = "'" + key + "'";
  const auto p = header.find(k);
  if (p == std::string::npos) throw NpyError(file + ": header has no " + k);
  auto q = header.find(':', p + k.size());
  if (q == std::string::npos) throw NpyError(file + ": malformed header near " + k);
  ++q;
  while (q < header.size() && header[q] == ' ') ++q;
  if (q >= header.size()) throw NpyError(file + ": malformed header near " + k);
  if (header[q] == '(') {
    const auto e = header.find(')', q);
    if (e == std::string::npos) throw NpyError(file + ": unterminated shape tuple");
    return header.substr(q, e - q + 1);
  }
  auto e = header.find_first_of(",}", q);
  if (e == std::string::npos) throw NpyError(file + ": malformed header near " + k);
  std::string v = header.substr(q, e - q);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

}  // namespace detail

/// Reads a float32 .npy file; throws NpyError naming the file on any problem.
inline NpyArray read_npy(const std::filesystem::path& path) {
  const std::string file = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NpyError(file + ": cannot open");
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<std::int64_t>(in.tellg());
  in.seekg(0);
  char magic[8];
  if (file_size < 10 || !in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw NpyError(file + ": not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  std::uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) throw NpyError(file + ": truncated header");
    header_len = static_cast<std::uint32_t>(b[0] | (b[1] << 8));
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) throw NpyError(file + ": truncated header");
    header_len = static_cast<std::uint32_t>(b[0] | (b[1] << 8) | (b[2] << 16)) | (static_cast<std::uint32_t>(b[3]) << 24);
  } else {
    throw NpyError(file + ": unsupported .npy version " + std::to_string(major));
  }
  const std::int64_t data_start = (major == 1 ? 10 : 12) + static_cast<std::int64_t>(header_len);
  if (header_len > (1u << 20) || data_start > file_size) throw NpyError(file + ": header length exceeds the file");
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) throw NpyError(file + ": truncated header");

  const std::string descr = detail::dict_value(header, "descr", file);
  if (descr != "'<f4'" && descr != "'float32'")
    throw NpyError(file + ": dtype " + descr + " is not little-endian float32 ('<f4')");
  if (detail::dict_value(header, "fortran_order", file) != "False")
    throw NpyError(file + ": Fortran-order arrays are not supported");
  const std::string tuple = detail::dict_value(header, "shape", file);
  NpyArray a;
  std::string num;
  for (char ch : tuple.substr(1)) {
    if (ch >= '0' && ch <= '9') {
      num += ch;
    } else if (ch == ',' || ch == ')') {
      if (!num.empty()) {
        if (num.size() > 15) throw NpyError(file + ": absurd dimension in shape " + tuple);
        a.shape.push_back(std::stoll(num));
        num.clear();
      }
    } else if (ch != ' ') {
      throw NpyError(file + ": malformed shape " + tuple);
    }
  }
  std::int64_t n = 1;
  for (auto d : a.shape) {
    if (d > 0 && n > (std::int64_t{1} << 40) / d) throw NpyError(file + ": shape " + tuple + " is too large");
    n *= d;
  }
  if (data_start + 4 * n != file_size)
    throw NpyError(file + ": file holds " + std::to_string(file_size - data_start) + " data bytes, shape " + tuple +
                   " needs " + std::to_string(4 * n));
  a.data.resize(static_cast<std::size_t>(n));
  if (n > 0 && !in.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(4 * n)))
    throw NpyError(file + ": truncated data");
  return a;
}

/// Writes a float32 .npy file (version 1.0).
inline void write_npy(const std::filesystem::path& path, const std::vector<std::int64_t>& shape, const float* data) {
  std::string dims;
  std::int64_t n = 1;
  for (auto d : shape) {
    dims += std::to_string(d) + ", ";
    n *= d;
  }
  if (shape.size() > 1) dims.erase(dims.size() - 2);
  else if (shape.size() == 1) dims.erase(dims.size() - 1);
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw NpyError(path.string() + ": cannot create");
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(magic, 8);
  const auto len = static_cast<std::uint16_t>(header.size());
  const char lb[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(lb, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(4 * n));
  if (!out) throw NpyError(path.string() + ": write failed");
}

}  // namespace skewadam::tools
