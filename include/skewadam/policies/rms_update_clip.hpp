#pragma once
// RmsUpdateClip: update clipping by RMS (docs/spec.md §3.2, step 6).
//
//   s = sqrt(mean(u^2)) over the clip scope;  u <- u / max(s / clip_threshold, 1)
//
// The scope is the whole tensor (reference) or each matrix (ClipScope::matrix,
// extension E3). The backend accumulates sum(u^2) during its statistics pass;
// this policy turns it into the divisor. State: none.
//
// Every clip policy provides:
//   active                         whether sum(u^2) is needed at all
//   divisor(sum_u2, count, s)      what u is divided by in the apply pass

#include <cmath>
#include <math.h>

#include "../detail/config.hpp"
#include "../math/step_scalars.hpp"

namespace skewadam {

struct RmsUpdateClip {
  static constexpr bool active = true;

  SKEWADAM_HD static float divisor(double sum_u2, index_t count, const StepScalars& s) {
    if (count <= 0) return 1.0f;
    const double rms = ::sqrt(sum_u2 / static_cast<double>(count));
    const double d = rms / static_cast<double>(s.clip_threshold);
    return d > 1.0 ? static_cast<float>(d) : (d <= 1.0 ? 1.0f : static_cast<float>(d));  // NaN passes through
  }
};

}  // namespace skewadam
