#pragma once
// CRC-32C (Castagnoli; reflected polynomial 0x82F63B78), the checksum of the
// checkpoint format. Table-driven, eight bytes per step ("slicing-by-8"), no
// dependencies, identical on every platform.
//
//   std::uint32_t crc = 0;
//   crc = crc32c_update(crc, first_part, n1);
//   crc = crc32c_update(crc, second_part, n2);   // == crc32c of both parts
//
// Check value: crc32c of the nine ASCII bytes "123456789" is 0xE3069283.

#include <array>
#include <cstddef>
#include <cstdint>

namespace skewadam::detail {

inline constexpr std::uint32_t crc32c_polynomial = 0x82F63B78u;

using Crc32cTables = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr Crc32cTables make_crc32c_tables() noexcept {
  Crc32cTables t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ crc32c_polynomial : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t s = 1; s < 8; ++s)
    for (std::size_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
  return t;
}

inline constexpr Crc32cTables crc32c_tables = make_crc32c_tables();

/// Continues a CRC-32C over `size` more bytes; start from 0.
inline std::uint32_t crc32c_update(std::uint32_t crc, const void* data, std::size_t size) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  const Crc32cTables& t = crc32c_tables;
  crc = ~crc;
  while (size >= 8) {
    const std::uint32_t lo = crc ^ (static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
                                    static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24);
    const std::uint32_t hi = static_cast<std::uint32_t>(p[4]) | static_cast<std::uint32_t>(p[5]) << 8 |
                             static_cast<std::uint32_t>(p[6]) << 16 | static_cast<std::uint32_t>(p[7]) << 24;
    crc = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^
          t[3][hi & 0xffu] ^ t[2][(hi >> 8) & 0xffu] ^ t[1][(hi >> 16) & 0xffu] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
  return ~crc;
}

/// CRC-32C of one buffer.
inline std::uint32_t crc32c(const void* data, std::size_t size) noexcept { return crc32c_update(0, data, size); }

}  // namespace skewadam::detail
