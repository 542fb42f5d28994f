#pragma once
// StochasticRounding: unbiased stochastic rounding on store (docs/spec.md §4, extension E1).
//
// The fp32 result x is rounded to one of its two neighbours in the parameter's
// dtype with probability proportional to proximity, so E[round(x)] = x:
//   bf16: x's low 16 bits L decide; it rounds away from zero with probability
//         L / 2^16 (add 16 random bits, truncate) - exact proportion, since the
//         spacing of bf16 values in one binade is uniform in fp32's bits.
//   fp16: neighbours lo < x < hi; rounds to hi with probability
//         (x - lo) / (hi - lo), computed exactly in fp32, compared against 16
//         random bits: exact wherever x is a normal fp16 value (the proportion
//         has at most 13 bits); on fp16's subnormals the proportion can have
//         more, and the probability is its round-up to a multiple of 2^-16
//         (a bias below 2^-16 of the subnormal spacing, 2^-24). Beyond the
//         largest finite value it saturates to it.
// NaN and infinities are stored as round-to-nearest does. fp32 parameters are
// not rounded. The 16 random bits per element (the low half of random_bits)
// come from random.hpp.
// Cost: no state.

#include <cstdint>
#include <type_traits>

#include "../types/dtype.hpp"

namespace skewadam {

struct StochasticRounding {
  static constexpr bool uses_random_bits = true;

  template <class T>
  SKEWADAM_HD static T store(float x, std::uint32_t random_bits) {
    if constexpr (std::is_same_v<T, float>) {
      return x;
    } else if constexpr (std::is_same_v<T, bf16>) {
      const std::uint32_t b = float_bits(x);
      if ((b & 0x7f800000u) == 0x7f800000u) return round_nearest<bf16>(x);  // NaN, Inf
      const std::uint32_t r = (b + (random_bits & 0xffffu)) & 0xffff0000u;
      return from_bits<bf16>(static_cast<std::uint16_t>(r >> 16));
    } else {
      const std::uint32_t b = float_bits(x);
      if ((b & 0x7f800000u) == 0x7f800000u) return round_nearest<f16>(x);
      const std::uint16_t sign = static_cast<std::uint16_t>((b >> 16) & 0x8000u);
      const float ax = bits_float(b & 0x7fffffffu);
      const std::uint16_t near_bits = bits_of(round_nearest<f16>(ax));
      const float near = to_float(from_bits<f16>(near_bits));
      if (near == ax) return from_bits<f16>(static_cast<std::uint16_t>(near_bits | sign));
      const std::uint16_t other_bits =
          static_cast<std::uint16_t>(near < ax ? near_bits + 1 : near_bits - 1);
      const float other = to_float(from_bits<f16>(other_bits));
      const bool near_is_lo = near < ax;
      const float lo = near_is_lo ? near : other;
      const float hi = near_is_lo ? other : near;
      const std::uint16_t lo_bits = near_is_lo ? near_bits : other_bits;
      const std::uint16_t hi_bits = near_is_lo ? other_bits : near_bits;
      if (hi_bits >= 0x7c00u) return from_bits<f16>(static_cast<std::uint16_t>(lo_bits | sign));
      const float p_up = (ax - lo) / (hi - lo);                            // exact
      const float u = static_cast<float>(random_bits & 0xffffu) * 0x1p-16f;  // [0, 1), 16 bits
      const std::uint16_t pick = u < p_up ? hi_bits : lo_bits;
      return from_bits<f16>(static_cast<std::uint16_t>(pick | sign));
    }
  }
};

}  // namespace skewadam
