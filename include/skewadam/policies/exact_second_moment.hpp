#pragma once
// ExactSecondMoment: a per-element fp32 second moment (docs/spec.md §3.2, step 3,
// exact; also every rank-1 tensor under a factored rule).
//
//   V <- beta2 V + (1 - beta2) g^2
//   d  = sqrt(max(V, eps))          (eps is a floor, not an added term)
//
// State: V, fp32, same shape as the parameter: 4 * numel bytes. The paper's
// router tier.
//
// Every second-moment policy provides:
//   factored                  false: element-wise state V with update()/denominator();
//                             true: row/column statistics (see factored_second_moment.hpp)
//   rank1_fallback            the policy used for rank-1 tensors
//   update(v, g2, s) -> v'    element-wise state update (g2 = g*g)
//   denominator(v', s) -> d   element-wise denominator of u

#include "../detail/config.hpp"
#include "../math/step_scalars.hpp"
#include "../math/vmath.hpp"

namespace skewadam {

struct ExactSecondMoment {
  static constexpr bool factored = false;
  using rank1_fallback = ExactSecondMoment;

  template <class V>
  SKEWADAM_HD static V update(const V& v, const V& g2, const StepScalars& s) {
    return vmath::splat<V>(s.beta2) * v + vmath::splat<V>(s.one_minus_beta2) * g2;
  }
  template <class V>
  SKEWADAM_HD static V denominator(const V& v, const StepScalars& s) {
    return vmath::sqrt(vmath::floor_at(v, vmath::splat<V>(s.eps)));
  }
};

}  // namespace skewadam
