#pragma once
// FullMomentum: an fp32 first moment (docs/spec.md §3.2, step 4, with momentum).
//
//   m <- beta1 m + (1 - beta1) g
//   u = m * sqrt(1 - beta2^t) / (1 - beta1^t)
//
// State: m, fp32, same shape as the parameter: 4 * numel bytes. The paper's
// backbone tier (and the "experts with momentum" and uniform ablations).
// Hooks: see no_momentum.hpp.

#include "../detail/config.hpp"
#include "../math/step_scalars.hpp"
#include "../math/vmath.hpp"

namespace skewadam {

struct FullMomentum {
  static constexpr bool has_state = true;
  static constexpr bool numerator_reads_grad = false;

  template <class V>
  SKEWADAM_HD static V update(const V& m, const V& g, const StepScalars& s) {
    return vmath::splat<V>(s.beta1) * m + vmath::splat<V>(s.one_minus_beta1) * g;
  }
  template <class V>
  SKEWADAM_HD static V numerator(const V& /*g*/, const V& m, const StepScalars& s) {
    return m * vmath::splat<V>(s.momentum_scale);
  }
};

}  // namespace skewadam
