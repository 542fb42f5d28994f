#pragma once
// Float8BlockMomentum: FullMomentum's first moment in 8-bit floating-point
// codes with a power-of-two scale per block of 256 elements (docs/spec.md
// §5, E7): the 8-bit momentum of SkewAdam8bitTiers.
//
//   m' = beta1 m + (1 - beta1) g            (m: the stored value, decoded)
//   a  = max |m'| over the block's finite elements
//   k  = the least integer with a <= 1.5 * 2^k, clamped to [-94, 126]
//   stored: the scale 2^k (fp32) and, per element, a byte: a sign bit and a
//   7-bit magnitude code c, whose value at scale 1 is
//     c = 0            0
//     c = 1 ... 3      c * 2^-32
//     c = 4 ... 126    (1 + (c mod 4) / 4) * 2^(c div 4 - 31)
//     c = 127          infinity
//   and the byte 0x80 (a negative zero) is NaN. m decodes as the byte's
//   value times 2^k.
//
// Two mantissa bits and five exponent bits: 126 finite magnitudes spanning
// 2^-32 ... 1.5, relative spacing 1/8 to 1/4 from the top down to 2^-30 of
// the scale (nine decades), so an entry 10^-5 of the block's largest is
// stored with the same relative precision as the largest.
//
// Rounding. y = |m'| * 2^-k, one fp32 product (exact but where it falls
// below fp32's normal range). y is rounded to one of its two neighbouring
// code values lo <= y < hi, up with probability p = (y - lo) / (hi - lo),
// from the element's 32 random bits r:
//   2^-30 <= y <= 1.5   add r's top 21 bits to y's bits less 96 << 23 and
//                       keep the top 11: p is y's 21 low mantissa bits over
//                       2^21, exactly
//   y < 2^-30           t = y * 2^32, up when r + ceil(2^32 frac(t)) carries
//                       past 2^32: p exactly wherever 2^32 frac(t) is an
//                       integer (y at least 2^-41), else its round-up to a
//                       multiple of 2^-32 (a bias below 2^-64 of the scale)
// So E[decoded] = y * 2^k exactly for every element at least 2^-41 of its
// block's scale. In both cases larger r rounds up: r = 0 gives the code
// below y. Beyond 1.5 (only when k is 126) y stores as infinity; so
// do infinities, with their sign; a NaN stores 0x80; a value rounded to code
// 0 stores 0x00 whatever its sign.
// r: the element's 16 bits from the momentum's stream, then 16 from its
// second stream (stored_momentum.hpp), as r = first << 16 | second.
// State: 1 byte per element and 4 per block, the layout of Int8BlockMomentum.

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../detail/config.hpp"
#include "../math/vmath.hpp"
#include "../state/state_layout.hpp"
#include "stored_momentum.hpp"

namespace skewadam {

struct Float8BlockMomentum : StoredMomentum {
  static constexpr MomentumStorage storage = MomentumStorage::float8_blocks;
  /// Random bits each element's rounding reads (two 16-bit draws).
  static constexpr int random_bits_used = 32;
  /// The largest finite code value, and the range of the scale's exponent.
  static constexpr float top = 1.5f;
  static constexpr int min_exponent = -94;
  static constexpr int max_exponent = 126;

  /// The block's exponent k for its largest finite |m'| amax.
  SKEWADAM_HD static int exponent(float amax) {
    if (!(amax >= 0x1p-94f)) return min_exponent;  // 0, or below: the least scale
    const std::uint32_t b = vmath::to_bits<float>(amax);
    int k = static_cast<int>(b >> 23) - 127;
    if ((b & 0x7fffffu) > 0x400000u) ++k;  // a mantissa above 1.5
    return k < max_exponent ? k : max_exponent;
  }
  /// The stored scale 2^k, and 2^-k.
  SKEWADAM_HD static float scale(float amax) {
    return vmath::from_bits<float>(static_cast<std::uint32_t>(127 + exponent(amax)) << 23);
  }
  SKEWADAM_HD static float inverse(float amax) {
    return vmath::from_bits<float>(static_cast<std::uint32_t>(127 - exponent(amax)) << 23);
  }

  /// The byte of one element (see the top of this file).
  SKEWADAM_HD static std::uint32_t code_one(float x, float inv, std::uint32_t r) {
    if (x != x) return 0x80u;
    const std::uint32_t sign = (vmath::to_bits<float>(x) >> 24) & 0x80u;
    const float y = vmath::mul_rn(::fabsf(x), inv);
    std::uint32_t c;
    if (!(y <= top)) {
      c = 127u;
    } else if (y >= 0x1p-30f) {
      c = (vmath::to_bits<float>(y) - (96u << 23) + (r >> 11)) >> 21;
    } else {
      const float t = y * 0x1p32f;  // exact: a power of two, t < 4
      const float lo = ::floorf(t);
      const auto threshold = static_cast<std::uint32_t>(::ceilf((t - lo) * 0x1p32f));  // below 2^32
      c = static_cast<std::uint32_t>(lo) + (threshold != 0u && r >= 0u - threshold ? 1u : 0u);
    }
    return c == 0u ? 0u : (sign | c);
  }

  /// The byte of m' = x with scale factor inv = 2^-k and the element's random
  /// bits r, lane by lane: the integer path of the top of this file on every
  /// lane, and code_one on each lane of a vector holding a nonzero y below
  /// 2^-30.
  template <class V>
  SKEWADAM_HD static vmath::bits_t<V> code(const V& x, const V& inv, const vmath::bits_t<V>& r) {
    if constexpr (std::is_same_v<V, float>) {
      return code_one(x, inv, r);
    } else {
      using U = vmath::bits_t<V>;
      const V y = vmath::mul_rn(abs(x), inv);  // a SIMD batch: its library's abs, found by argument
      if (vmath::any<V>(y < vmath::splat<V>(0x1p-30f) && y > vmath::splat<V>(0.0f))) [[unlikely]] {
        constexpr int w = vmath::width<V>;
        alignas(64) float xs[w];
        alignas(64) float is[w];
        alignas(64) std::uint32_t rs[w];
        vmath::store(x, xs);
        vmath::store(inv, is);
        vmath::store_bits<V>(r, rs);
        for (int l = 0; l < w; ++l) rs[l] = code_one(xs[l], is[l], rs[l]);
        return vmath::load_bits<V>(rs);
      }
      const U sign = (vmath::to_bits<V>(x) >> 24) & U(0x80u);
      const U c = sign | ((vmath::to_bits<V>(y) - U(96u << 23) + (r >> 11)) >> 21);
      V out = vmath::from_bits<V>(c);
      out = vmath::select<V>(y <= vmath::splat<V>(top), out, vmath::from_bits<V>(sign | U(127u)));
      out = vmath::select<V>(y == vmath::splat<V>(0.0f), vmath::splat<V>(0.0f), out);
      out = vmath::select<V>(vmath::isnan(x), vmath::from_bits<V>(U(0x80u)), out);
      return vmath::to_bits<V>(out);
    }
  }

  /// The value of magnitude code c (0 ... 127) at scale 1.
  SKEWADAM_HD static float unit(std::uint32_t c) {
    if (c >= 127u) return vmath::from_bits<float>(0x7f800000u);
    if (c >= 4u) return vmath::from_bits<float>((c << 21) + (96u << 23));
    return static_cast<float>(c) * 0x1p-32f;
  }
  /// The decoded value of the stored byte c in a block of scale s.
  SKEWADAM_HD static float decode(std::uint32_t c, float s) {
    if (c == 0x80u) return vmath::from_bits<float>(0x7fc00000u);
    const float v = unit(c & 0x7fu) * s;
    return (c & 0x80u) ? -v : v;
  }
};

}  // namespace skewadam
