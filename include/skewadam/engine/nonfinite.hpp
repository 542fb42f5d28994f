#pragma once
// Non-finite gradients: what Optimizer::step() does when a gradient holds NaN
// or an infinity.
//
//   NonFinitePolicy::skip_step  (default) the whole step is skipped: no
//       parameter, no state and no step count changes (so the stochastic-
//       rounding stream, keyed by the step count, does not advance either), and
//       step() returns a StepReport naming the first offending tensor in
//       registration order and its first offending element.
//   NonFinitePolicy::raise      the same, then NonFiniteGradientError is thrown
//       carrying that report.
//   NonFinitePolicy::unchecked  no check, as in the reference: NaN and
//       infinities flow into the state and the parameters.
//
// Inside backward (Optimizer::step(ParamId), one tensor at a time) the policy
// applies to each tensor alone: skip_step skips the offending tensor (its
// parameter, state and count do not change) while the tensors stepped before
// it stay updated; raise throws from that tensor's step(ParamId), which has
// changed nothing. finish_step()'s report names the first skipped tensor and
// counts them (StepReport::skipped).
//
// A gradient element "offends" when, after global-norm scaling (E6), it is
// NaN, +-inf, or so large that its square would overflow the float second-
// moment statistics (|g| > sqrt(FLT_MAX / (2 n)), n the longest row or column
// the statistics sum over; about 1e17 for a 4096-wide matrix). Such a step
// would leave non-finite values in the state for good.
//
//
// How a CPU step detects it at almost no cost: engine/backend/cpu/cpu_backend.hpp.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../detail/config.hpp"
#include "../state/param_state.hpp"
#include "../types/shape.hpp"

namespace skewadam {

enum class NonFinitePolicy : int { skip_step = 0, raise = 1, unchecked = 2 };

constexpr std::string_view nonfinite_policy_name(NonFinitePolicy p) noexcept {
  switch (p) {
    case NonFinitePolicy::skip_step: return "skip_step";
    case NonFinitePolicy::raise: return "raise";
    case NonFinitePolicy::unchecked: return "unchecked";
  }
  return "unknown";
}

/// The first offending gradient of a rejected step.
struct NonFiniteGradient {
  ParamId param{};
  std::string name;   ///< the parameter's name
  Shape shape{};      ///< the parameter's shape
  index_t element = -1;  ///< flat index of its first offending element; -1 when no
                         ///< gradient element offends but the statistics came out
                         ///< non-finite (the state was not finite before the step)
  float value = 0;    ///< that element after global-norm scaling

  /// One line, e.g. "gradient of 'w1' is NaN at element 17 ([0, 17])".
  std::string describe() const {
    std::string s = "gradient of '" + name + "' ";
    if (element < 0) return s + "gives non-finite second-moment statistics (the state was not finite)";
    if (std::isnan(value)) s += "is NaN";
    else if (std::isinf(value)) s += value > 0 ? "is +inf" : "is -inf";
    else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(value));
      s += "is " + std::string(buf) + ", whose square overflows the float statistics,";
    }
    s += " at element " + std::to_string(element);
    if (shape.rank() > 1) {
      std::string at;
      index_t rest = element;
      for (int d = shape.rank() - 1; d >= 0; --d) {
        const index_t n = shape[d] > 0 ? shape[d] : 1;
        at = std::to_string(rest % n) + (at.empty() ? "" : ", ") + at;
        rest /= n;
      }
      s += " ([" + at + "])";
    }
    return s;
  }
};

/// What step() did.
struct StepReport {
  bool applied = true;                          ///< false: skipped, nothing changed
  std::optional<NonFiniteGradient> nonfinite;   ///< why, when skipped
  /// Tensors skipped alone: a step taken inside backward (Optimizer::
  /// step(ParamId), finish_step()) skips only the tensors whose gradient
  /// offends, as the others are already updated; applied is then false and
  /// nonfinite names the first of them. 0 for a whole step.
  index_t skipped = 0;
  /// A step taken inside backward whose backward ended early (an exception
  /// part way; finish_step(StepEnd::interrupted)). Its stepped tensors stay
  /// stepped and it counts as a step; not_stepped names what it left alone.
  bool interrupted = false;
  /// Tensors the step took (updated, or skipped alone for a non-finite
  /// gradient); of a whole step, those that had a gradient.
  index_t stepped = 0;
  /// A step taken inside backward: the registered parameters it did not
  /// step (no gradient reached them, as an idle expert's, or the backward
  /// that would have was cut off), in registration order. Empty for a whole
  /// step.
  std::vector<std::string> not_stepped;
  /// A step that only measured the global gradient norm, clipping by the
  /// previous step's norm (ClipNorm::previous) with none before it: nothing
  /// was updated or counted (applied is false, nonfinite empty), and the next
  /// step is clipped by the norm it measured.
  bool measured = false;
  explicit operator bool() const noexcept { return applied; }
};

/// How an optimizer step taken inside backward ends (Optimizer::finish_step).
enum class StepEnd : std::uint8_t {
  completed,    ///< backward ran to its end
  interrupted,  ///< backward raised part way; what it stepped stays stepped
};

/// Thrown by step() under NonFinitePolicy::raise; nothing has changed.
class NonFiniteGradientError : public std::runtime_error {
 public:
  explicit NonFiniteGradientError(NonFiniteGradient report)
      : std::runtime_error("step rejected: " + report.describe()), report_(std::move(report)) {}
  const NonFiniteGradient& report() const noexcept { return report_; }

 private:
  NonFiniteGradient report_;
};

namespace detail {
inline NonFinitePolicy checked_policy(NonFinitePolicy p) {
  if (p != NonFinitePolicy::skip_step && p != NonFinitePolicy::raise && p != NonFinitePolicy::unchecked)
    throw std::invalid_argument("nonfinite policy: unknown value " + std::to_string(static_cast<int>(p)));
  return p;
}
}  // namespace detail

}  // namespace skewadam
