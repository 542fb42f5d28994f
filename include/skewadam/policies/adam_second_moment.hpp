#pragma once
// AdamSecondMoment: Adam's second moment, eps added to sqrt(v) (not a floor).
//
//   V <- beta2 V + (1 - beta2) g^2
//   d  = sqrt(V) + eps * sqrt(1 - beta2^t)
//
// With FullMomentum's numerator m * sqrt(bc2) / bc1 this is exactly Adam's
//   (m / bc1) / (sqrt(V / bc2) + eps).
// State: V, fp32, 4 * numel bytes. Used by the AdamW baseline rule.
// Hooks: see exact_second_moment.hpp.

#include "../detail/config.hpp"
#include "../math/step_scalars.hpp"
#include "../math/vmath.hpp"
#include "exact_second_moment.hpp"

namespace skewadam {

/// Same state and update as ExactSecondMoment; only the denominator differs.
struct AdamSecondMoment : ExactSecondMoment {
  using rank1_fallback = AdamSecondMoment;

  template <class V>
  SKEWADAM_HD static V denominator(const V& v, const StepScalars& s) {
    return vmath::sqrt(v) + vmath::splat<V>(s.eps_sqrt_bc2);
  }
};

}  // namespace skewadam
