#pragma once
// NoUpdateClip: the null clip policy (AdamW has no update clipping).
// Hooks: see rms_update_clip.hpp. State: none.

#include "../detail/config.hpp"
#include "../math/step_scalars.hpp"

namespace skewadam {

struct NoUpdateClip {
  static constexpr bool active = false;
  SKEWADAM_HD static float divisor(double /*sum_u2*/, index_t /*count*/, const StepScalars& /*s*/) { return 1.0f; }
};

}  // namespace skewadam
