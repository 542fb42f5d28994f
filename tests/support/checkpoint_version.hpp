#pragma once
// A checkpoint's bytes as a build of another format version writes them: the
// version in the header, the optimizer record encoded as that version does
// (optionally edited first), and the sizes and checksums made again. The
// other records are the same in every version.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include <skewadam/checkpoint.hpp>
#include <skewadam/detail/crc32c.hpp>

namespace skewadam::test {

inline std::vector<std::byte> with_format_version(const std::vector<std::byte>& file, std::uint32_t version,
                                                  const std::function<void(CheckpointInfo&)>& edit = {}) {
  using namespace detail::ckpt;
  const auto* b = reinterpret_cast<const unsigned char*>(file.data());
  const std::uint64_t len = get_le(b + header_size + 8, 8);
  const unsigned char* payload = b + header_size + record_header_size;
  CheckpointInfo c;
  const std::uint64_t nparams =
      decode_optimizer(std::vector<unsigned char>(payload, payload + len), "test", format_version, c);
  if (edit) edit(c);
  const std::vector<unsigned char> record = encode_optimizer(c, nparams, version);
  std::vector<unsigned char> out(b, b + header_size);
  put_le(out.data() + 12, version, 4);
  put_le(out.data() + 16, file.size() - len + record.size(), 8);
  put_le(out.data() + 28, detail::crc32c(out.data(), 28), 4);
  unsigned char rh[record_header_size];
  put_le(rh, tag_optimizer, 4);
  put_le(rh + 4, 0, 4);
  put_le(rh + 8, record.size(), 8);
  out.insert(out.end(), rh, rh + record_header_size);
  out.insert(out.end(), record.begin(), record.end());
  unsigned char crc[record_trailer_size];
  put_le(crc, detail::crc32c_update(detail::crc32c(rh, sizeof rh), record.data(), record.size()), 4);
  out.insert(out.end(), crc, crc + record_trailer_size);
  const unsigned char* rest = payload + len + record_trailer_size;
  out.insert(out.end(), rest, b + file.size());
  std::vector<std::byte> bytes(out.size());
  std::memcpy(bytes.data(), out.data(), out.size());
  return bytes;
}

}  // namespace skewadam::test
