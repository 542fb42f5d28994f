#pragma once
// Int8BlockMomentum: FullMomentum's first moment in 8 bits per element,
// linear codes with an fp32 scale per block of 256 elements (docs/spec.md §5,
// E7). Float8BlockMomentum (float8_block_momentum.hpp) is the 8-bit
// momentum of SkewAdam8bitTiers; this map is kept for the checkpoints that
// hold it and for comparison (SkewAdamLinear8bitTiers).
//
//   m' = beta1 m + (1 - beta1) g            (m: the stored value, decoded)
//   a  = max |m'| over the block's finite elements
//   s  = a / 127,  i = 127 / a
//   q  = clamp(floor(m' i + u), -127, 127),  u = r / 2^16 uniform in [0, 1)
//   stored: q (int8) and s;  decoded: m = q s
//   a NaN m' stores the code -128, which decodes as NaN; an infinite m'
//   stores +-127
//   u = m * sqrt(1 - beta2^t) / (1 - beta1^t), with m decoded
//
// r: 16 random bits of the element from the momentum's own stream
// (stored_momentum.hpp). floor(y + u) rounds y up with probability
// ceil(2^16 frac(y)) / 2^16: unbiased to within 2^-16 of a code step, and
// biased upward (toward +inf) by that much where y's fraction has more than
// 16 bits. The decoded value is within one step s of m' (to rounding), at
// most 1/127 of the block's largest |m'|, so entries much smaller than the
// step are stored as 0 or +-1 step: relative noise sqrt(f (1 - f)) / f at f
// steps. A block of zeros stores s = 0 and zero codes (i = 0); i is capped at
// the largest finite float, so a block of tiny values still codes within
// [-127, 127].
// State: 1 byte per element and 4 per block, in the blocks of
// state_layout.hpp (each block: its scale, then its codes, four to a word).

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
  /// Random bits each element's rounding reads (the low 16 of its word).
  static constexpr int random_bits_used = 16;
  static constexpr float levels = 127.0f;

  /// The stored scale of a block whose largest finite |m'| is amax.
  SKEWADAM_HD static float scale(float amax) { return amax / levels; }
  /// The factor from m' to code units (0 for an all-zero block).
  SKEWADAM_HD static float inverse(float amax) {
    if (!(amax > 0.0f)) return 0.0f;
    const float i = levels / amax;
    return i < FLT_MAX ? i : FLT_MAX;
  }
  /// The stored byte of m' = x (0x80 for NaN), with the element's random
  /// bits r, lane by lane.
  template <class V>
  SKEWADAM_HD static vmath::bits_t<V> code(const V& x, const V& inv, const vmath::bits_t<V>& r) {
    using U = vmath::bits_t<V>;
    // r's low 16 bits as a float, exactly: 2^23 + n has n in its mantissa
    const V u = (vmath::from_bits<V>((r & U(0xffffu)) | U(0x4b000000u)) - vmath::splat<V>(0x1p23f)) *
                vmath::splat<V>(0x1p-16f);
    V y = vmath::mul_rn(x, inv);
    y = vmath::select<V>(vmath::isnan(y), x, y);  // an infinite x in a block whose finite values are all 0 (i = 0)
    V q;
    if constexpr (std::is_same_v<V, float>) {
      q = ::fminf(::fmaxf(::floorf(y + u), -levels), levels);
    } else {  // a SIMD batch: its library's functions, found by argument
      q = fmin(fmax(floor(y + u), vmath::splat<V>(-levels)), vmath::splat<V>(levels));
    }
    q = vmath::select<V>(vmath::isnan(x), vmath::splat<V>(-128.0f), q);
    // the integer q in [-128, 127] in the low byte of 1.5 * 2^23 + q, as two's complement
    return vmath::to_bits<V>(q + vmath::splat<V>(0x1.8p23f)) & U(0xffu);
  }
  /// The decoded value of the stored byte c in a block of scale s.
  SKEWADAM_HD static float decode(std::uint32_t c, float s) {
    if (c == 0x80u) return vmath::from_bits<float>(0x7fc00000u);
    return static_cast<float>(static_cast<std::int32_t>(c ^ 0x80u) - 128) * s;
  }
};

}  // namespace skewadam
