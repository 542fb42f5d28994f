#pragma once
// The handful of operations per-element math needs beyond + - * /.
//
// Policies are written once as templates over a value type V: float (scalar
// code, CUDA device code) or a SIMD batch (the CPU backend specialises
// vmath::ops for xsimd batches in backend/cpu/simd.hpp). Policies call the free
// functions below; the backend that instantiates them supplies the
// specialisation, so the math headers never depend on a SIMD library.

#include <cmath>

#include "config.hpp"

namespace skewadam::vmath {

/// Customisation point: specialise for a value type. The primary template
/// covers float.
template <class V>
struct ops {
  SKEWADAM_HD static float sqrt(float x) { return ::sqrtf(x); }
  /// max(x, floor) that propagates NaN from x (as torch's clamp_min does).
  SKEWADAM_HD static float floor_at(float x, float floor) { return x < floor ? floor : x; }
  SKEWADAM_HD static float broadcast(float x) { return x; }
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

/// A scalar coefficient as a value of type V.
template <class V>
SKEWADAM_HD SKEWADAM_ALWAYS_INLINE V splat(float x) {
  return ops<V>::broadcast(x);
}

}  // namespace skewadam::vmath
