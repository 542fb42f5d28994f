#pragma once
// The handful of operations per-element math needs beyond + - * /.
//
// Policies are written once as templates over a value type V: float (scalar
// code, CUDA device code) or a SIMD batch (the CPU backend specialises
// vmath::ops for xsimd batches in engine/backend/cpu/simd.hpp). Policies call the free
// functions below; the backend that instantiates them supplies the
// specialisation, so the math headers never depend on a SIMD library.

#include <cmath>

#include "../detail/config.hpp"

namespace skewadam::vmath {

/// Customisation point: specialise for a value type. The primary template
/// covers float.
template <class V>
struct ops {
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
};

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

/// A scalar coefficient as a value of type V.
template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE V splat(float x) {
  return ops<V>::broadcast(x);
}

}  // namespace skewadam::vmath
