#pragma once
// Int8BlockMomentum: FullMomentum's first moment, stored in 8 bits per element
// with an fp32 scale per block of 256 elements (state_layout.hpp).
//
//   m' = beta1 m + (1 - beta1) g          (m: the stored value, decoded)
//   a  = max |m'| over the block          s = a / 127
//   q  = clamp(floor(m' * (127 / a) + u), -127, 127),  u = r / 2^16
//   stored: q (int8) and s;  decoded: m = q * s
//   u = m * sqrt(1 - beta2^t) / (1 - beta1^t), with m decoded
//
// r is 16 random bits of the element (random.hpp) from a stream of its own
// (momentum_key), so the rounding is unbiased, E[q s] = m' to within
// 2^-16 of s, and independent of the parameter's stochastic rounding. The
// bits depend on (seed, step, tensor, element) alone: any thread count and
// architecture store the same codes. A block whose m' are all 0 stores s = 0
// and zero codes. The decoded value is within s (1 + 2^-16) of m': the
// error of an element is at most 1/127 of its block's largest |m'|.
//
// The update and the numerator are FullMomentum's, read from and written to
// the decoded values: the step after a checkpoint reads exactly what the
// uninterrupted step read. A backend updates m a whole block at a time, before
// anything of the block reads it.
// State: numel bytes of codes (padded to 4) and 4 bytes per block.

#include <cmath>
#include <cstdint>

#include "../config.hpp"
#include "../random.hpp"
#include "../state_layout.hpp"
#include "full_momentum.hpp"

namespace skewadam {

struct Int8BlockMomentum : FullMomentum {
  static constexpr MomentumStorage storage = MomentumStorage::int8_blocks;
  static constexpr float levels = 127.0f;

  /// The stored scale of a block whose largest |m'| is amax.
  SKEWADAM_HD static float scale(float amax) { return amax / levels; }
  /// The factor from m' to code units (0 for an all-zero block).
  SKEWADAM_HD static float inverse(float amax) { return amax > 0.0f ? levels / amax : 0.0f; }
  /// The code of m' = x, rounded stochastically with 16 random bits.
  SKEWADAM_HD static std::int8_t code(float x, float inv, std::uint32_t random_bits) {
    const float u = static_cast<float>(random_bits & 0xffffu) * 0x1p-16f;
    const float q = std::floor(x * inv + u);
    return static_cast<std::int8_t>(std::fmin(std::fmax(q, -levels), levels));
  }
  /// The decoded value of code q in a block of scale s.
  SKEWADAM_HD static float value(std::int8_t q, float s) { return static_cast<float>(q) * s; }
};

/// The momentum codes' random stream: the parameter's rounding key with its
/// seed changed, so the two streams are independent.
SKEWADAM_HD inline RoundingKey momentum_key(RoundingKey k) {
  k.seed ^= 0x6d6f6d656e74756dull;  // "momentum"
  return k;
}

/// How a momentum policy stores m: its `storage` member, or fp32.
template <class M>
constexpr MomentumStorage momentum_storage_of() {
  if constexpr (requires { M::storage; }) return M::storage;
  else return MomentumStorage::f32;
}
template <class M>
inline constexpr MomentumStorage momentum_storage_v = momentum_storage_of<M>();

}  // namespace skewadam
