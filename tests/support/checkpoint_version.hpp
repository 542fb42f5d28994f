#pragma once
// A checkpoint's bytes with another format version in its header (and the
// header's checksum made again): a file as a build of that version writes
// it, where the records are the same.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <skewadam/checkpoint.hpp>
#include <skewadam/detail/crc32c.hpp>

namespace skewadam::test {

inline std::vector<std::byte> with_format_version(std::vector<std::byte> file, std::uint32_t version) {
  auto* h = reinterpret_cast<unsigned char*>(file.data());
  detail::ckpt::put_le(h + 12, version, 4);
  detail::ckpt::put_le(h + 28, detail::crc32c(h, 28), 4);
  return file;
}

}  // namespace skewadam::test
