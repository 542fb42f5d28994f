#pragma once
// Int8BlockMomentum: FullMomentum's first moment in 8 bits per element, with
// an fp32 scale per block of 256 elements (docs/spec.md §5, E7).
//
//   m' = beta1 m + (1 - beta1) g            (m: the stored value, decoded)
//   a  = max |m'| over the block            s = a / 127,  i = 127 / a
//   q  = clamp(floor(m' i + u), -127, 127),  u = r / 2^16 uniform in [0, 1)
//   stored: q (int8) and s;  decoded: m = q s
//   u = m * sqrt(1 - beta2^t) / (1 - beta1^t), with m decoded
//
// r: 16 random bits of the element from the momentum's own stream
// (stored_momentum.hpp), so the rounding is unbiased: E[q] = m' i, and the
// decoded value is within one step s of m' (to rounding), at most 1/127 of
// the block's largest |m'|. A block of zeros stores s = 0 and zero codes
// (i = 0); i is capped at the largest finite float, so a block of tiny
// values still codes within [-127, 127].
// State: 1 byte per element and 4 per block, in the blocks of
// state_layout.hpp (each block: its scale, then its codes, four to a word).
// The backbone's momentum in a little over a quarter of its fp32 bytes.

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../detail/config.hpp"
#include "../math/vmath.hpp"
#include "../state/state_layout.hpp"
#include "stored_momentum.hpp"

namespace skewadam {

struct Int8BlockMomentum : StoredMomentum {
  static constexpr MomentumStorage storage = MomentumStorage::int8_blocks;
  static constexpr float levels = 127.0f;

  /// The stored scale of a block whose largest |m'| is amax.
  SKEWADAM_HD static float scale(float amax) { return amax / levels; }
  /// The factor from m' to code units (0 for an all-zero block).
  SKEWADAM_HD static float inverse(float amax) {
    if (!(amax > 0.0f)) return 0.0f;
    const float i = levels / amax;
    return i < FLT_MAX ? i : FLT_MAX;
  }
  /// The code of m' = x as a float in [-127, 127]: x i rounded down or up,
  /// up with probability its fractional part (u uniform in [0, 1)).
  template <class V>
  SKEWADAM_HD static V code(const V& x, const V& inv, const V& u) {
    if constexpr (std::is_same_v<V, float>) {
      const float q = ::floorf(vmath::mul_rn(x, inv) + u);
      return ::fminf(::fmaxf(q, -levels), levels);
    } else {  // a SIMD batch: its library's functions, found by argument
      const V q = floor(vmath::mul_rn(x, inv) + u);
      return fmin(fmax(q, vmath::splat<V>(-levels)), vmath::splat<V>(levels));
    }
  }
  /// The decoded value of code q in a block of scale s.
  template <class V>
  SKEWADAM_HD static V value(const V& q, const V& s) {
    return q * s;
  }
};

}  // namespace skewadam
