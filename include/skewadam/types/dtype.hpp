#pragma once
// Element types: fp32, bf16 and fp16 parameters and gradients; state is fp32.
//
// The 16-bit types are Eigen's (Eigen::bfloat16, Eigen::half): two bytes,
// the IEEE / bfloat16 layouts, conversions usable on host and device. Buffers
// from other frameworks (LibTorch's at::BFloat16, CUDA's __nv_bfloat16, raw
// uint16_t) have the same layout and can be viewed through these types.

#include <Eigen/Core>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "../detail/config.hpp"

namespace skewadam {

using bf16 = Eigen::bfloat16;
using f16 = Eigen::half;

// The enumerators share their names with the element types above; that is
// intended (Dtype::bf16 is the dtype of skewadam::bf16).
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif
enum class Dtype : int { f32 = 0, bf16 = 1, f16 = 2 };
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

constexpr std::string_view dtype_name(Dtype d) noexcept {
  switch (d) {
    case Dtype::f32: return "f32";
    case Dtype::bf16: return "bf16";
    case Dtype::f16: return "f16";
  }
  return "unknown";
}

constexpr index_t dtype_size(Dtype d) noexcept { return d == Dtype::f32 ? 4 : 2; }

/// Parses "f32", "bf16" or "f16" (also "float32", "bfloat16", "float16").
inline Dtype parse_dtype(std::string_view s, std::string_view argument = "dtype") {
  if (s == "f32" || s == "float32" || s == "F32") return Dtype::f32;
  if (s == "bf16" || s == "bfloat16" || s == "BF16") return Dtype::bf16;
  if (s == "f16" || s == "float16" || s == "F16") return Dtype::f16;
  throw std::invalid_argument(std::string(argument) + ": unknown dtype '" + std::string(s) +
                              "' (expected f32, bf16 or f16)");
}

template <class T>
inline constexpr bool is_element_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <class T>
constexpr Dtype dtype_of() noexcept {
  static_assert(is_element_type_v<std::remove_const_t<T>>,
                "skewadam: element type must be float, skewadam::bf16 or skewadam::f16");
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, float>) return Dtype::f32;
  else if constexpr (std::is_same_v<U, bf16>) return Dtype::bf16;
  else return Dtype::f16;
}

/// Widening conversion to fp32 (exact for every type).
SKEWADAM_HD inline float to_float(float x) { return x; }
SKEWADAM_HD inline float to_float(bf16 x) { return static_cast<float>(x); }
SKEWADAM_HD inline float to_float(f16 x) { return static_cast<float>(x); }

/// The 16 bits of a 16-bit value, and back.
SKEWADAM_HD inline std::uint16_t bits_of(bf16 x) { return Eigen::numext::bit_cast<std::uint16_t>(x); }
SKEWADAM_HD inline std::uint16_t bits_of(f16 x) { return Eigen::numext::bit_cast<std::uint16_t>(x); }
template <class T>
SKEWADAM_HD inline T from_bits(std::uint16_t b) {
  return Eigen::numext::bit_cast<T>(b);
}

SKEWADAM_HD inline std::uint32_t float_bits(float x) { return Eigen::numext::bit_cast<std::uint32_t>(x); }
SKEWADAM_HD inline float bits_float(std::uint32_t b) { return Eigen::numext::bit_cast<float>(b); }

/// Round-to-nearest-even narrowing.
template <class T>
SKEWADAM_HD inline T round_nearest(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return T(x);
}

}  // namespace skewadam
