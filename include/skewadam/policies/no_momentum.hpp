#pragma once
// NoMomentum: the null first-moment policy (docs/spec.md §3.2, step 4, no momentum).
//
//   u = g * sqrt(1 - beta2^t)
//
// State: none (0 bytes). Used by the paper's expert and router tiers.
//
// Every momentum policy provides what this one does:
//   has_state                      whether a first moment m is kept (fp32 of
//                                  the parameter's shape, unless `storage`
//                                  says otherwise: stored_momentum.hpp)
//   update(m, g, s) -> m'          the new first moment (identity here)
//   numerator(g, m', s) -> u       the update before division by the
//                                  second-moment denominator
//   numerator_reads_grad           whether numerator() needs g (a backend then
//                                  re-reads the gradient in the apply pass,
//                                  otherwise it reads m')
//   storage (optional)             how m is stored (MomentumStorage,
//                                  state_layout.hpp): fp32 when absent;
//                                  the other storages' hooks are in
//                                  stored_momentum.hpp

#include "../detail/config.hpp"
#include "../math/step_scalars.hpp"
#include "../math/vmath.hpp"

namespace skewadam {

struct NoMomentum {
  static constexpr bool has_state = false;
  static constexpr bool numerator_reads_grad = true;

  template <class V>
  SKEWADAM_HD static V update(const V& m, const V& /*g*/, const StepScalars& /*s*/) {
    return m;
  }
  template <class V>
  SKEWADAM_HD static V numerator(const V& g, const V& /*m*/, const StepScalars& s) {
    return g * vmath::splat<V>(s.sqrt_bc2);
  }
};

}  // namespace skewadam
