#pragma once
// The handful of operations per-element math needs beyond + - * /.
//
// Policies are written once as templates over a value type V: float (scalar
// code, CUDA device code) or a SIMD batch (the CPU backend specialises
// vmath::ops for xsimd batches in engine/backend/cpu/simd.hpp). Policies call the free
// functions below; the backend that instantiates them supplies the
// specialisation, so the math headers never depend on a SIMD library.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../detail/config.hpp"

namespace skewadam::vmath {

/// Customisation point: specialise for a value type. The primary template
/// covers float.
template <class V>
struct ops {
  /// The value type's lanes as 32-bit unsigned integers, and its lane count.
  using bits = std::uint32_t;
  static constexpr int width = 1;
  SKEWADAM_HD static float sqrt(float x) { return ::sqrtf(x); }
  /// max(x, floor) that propagates NaN from x (as torch's clamp_min does).
  SKEWADAM_HD static float floor_at(float x, float floor) { return x < floor ? floor : x; }
  SKEWADAM_HD static float broadcast(float x) { return x; }
  /// a * b rounded to fp32 on its own (see vmath::mul_rn).
  SKEWADAM_HD static float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    float p = a * b;
    SKEWADAM_OPAQUE_FLOAT(p);
    return p;
#endif
  }
  SKEWADAM_HD static bits to_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    bits b;
    std::memcpy(&b, &x, 4);
    return b;
#endif
  }
  SKEWADAM_HD static float from_bits(bits b) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(b);
#else
    float x;
    std::memcpy(&x, &b, 4);
    return x;
#endif
  }
  SKEWADAM_HD static float select(bool m, float a, float b) { return m ? a : b; }
  SKEWADAM_HD static bool isnan(float x) { return x != x; }
  SKEWADAM_HD static bool any(bool m) { return m; }
  SKEWADAM_HD static void store(float x, float* out) { *out = x; }
  SKEWADAM_HD static void store_bits(bits x, std::uint32_t* out) { *out = x; }
  SKEWADAM_HD static bits load_bits(const std::uint32_t* in) { return *in; }
};

/// The lanes of V as 32-bit unsigned integers (std::uint32_t for float).
template <class V>
using bits_t = typename ops<V>::bits;
/// Lanes of V (1 for float).
template <class V>
inline constexpr int width = ops<V>::width;

template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE V sqrt(const V& x) {
  return ops<V>::sqrt(x);
}

/// max(x, floor) propagating NaN from x.
template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE V floor_at(const V& x, const V& floor) {
  return ops<V>::floor_at(x, floor);
}

/// a * b rounded to fp32 on its own: never fused with an addition that
/// follows into a fused multiply-add, whatever the compiler's contraction
/// setting, so that every architecture and the device form the same bits.
template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE V mul_rn(const V& a, const V& b) {
  return ops<V>::mul_rn(a, b);
}

/// x's bit pattern, lane by lane, and back.
template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE bits_t<V> to_bits(const V& x) {
  return ops<V>::to_bits(x);
}
template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE V from_bits(const bits_t<V>& b) {
  return ops<V>::from_bits(b);
}
/// a where the mask m holds, else b (m: a comparison of V values).
template <class V, class Mask>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE V select(const Mask& m, const V& a, const V& b) {
  return ops<V>::select(m, a, b);
}
/// A mask of the NaN lanes of x (a comparison of a vector with itself
/// depends on the predicate a SIMD library picks).
template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE auto isnan(const V& x) {
  return ops<V>::isnan(x);
}
/// Whether the mask holds in any lane.
template <class V, class Mask>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE bool any(const Mask& m) {
  return ops<V>::any(m);
}
/// The lanes to memory and back (width<V> values).
template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE void store(const V& x, float* out) {
  ops<V>::store(x, out);
}
template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE void store_bits(const bits_t<V>& x, std::uint32_t* out) {
  ops<V>::store_bits(x, out);
}
template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE bits_t<V> load_bits(const std::uint32_t* in) {
  return ops<V>::load_bits(in);
}

/// A scalar coefficient as a value of type V.
template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE V splat(float x) {
  return ops<V>::broadcast(x);
}

}  // namespace skewadam::vmath
