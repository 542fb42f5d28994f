#pragma once
// Which global gradient norm max_grad_norm clips by (docs/spec.md E6, E8),
// and the norm a step leaves for the next one.
//
//   ClipNorm::current   the norm of this step's gradients (E6): exact, and
//                       so it needs every gradient before the first update,
//                       which the step inside backward cannot wait for.
//   ClipNorm::previous  the norm of the previous step's gradients (E8): each
//                       tensor's sum of g^2 is taken as it is stepped, and
//                       the step's norm clips the next step; a step with no
//                       norm before it only measures it. It works inside
//                       backward, with the same bits as the whole step.
//
// CarriedNorm keeps that norm between steps: a checkpoint and export_state()
// carry it, so that a resumed run clips as the uninterrupted one.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../math/step_scalars.hpp"

namespace skewadam {

enum class ClipNorm : std::uint8_t { current = 0, previous = 1 };

constexpr std::string_view clip_norm_name(ClipNorm c) noexcept {
  return c == ClipNorm::previous ? "previous" : "current";
}

/// "current" or "previous"; std::invalid_argument naming `argument` otherwise.
inline ClipNorm parse_clip_norm(std::string_view s, std::string_view argument = "clip_norm") {
  if (s == "current") return ClipNorm::current;
  if (s == "previous") return ClipNorm::previous;
  throw std::invalid_argument(std::string(argument) + ": unknown value '" + std::string(s) +
                              "' (expected current or previous)");
}

namespace detail {
inline ClipNorm checked_clip_norm(ClipNorm c, std::string_view argument = "clip_norm") {
  if (c != ClipNorm::current && c != ClipNorm::previous)
    throw std::invalid_argument(std::string(argument) + ": unknown value " +
                                std::to_string(static_cast<unsigned>(c)) + " (expected current or previous)");
  return c;
}
}  // namespace detail

/// The global gradient norm one step leaves for the next under
/// ClipNorm::previous (E8). A step records each tensor it updates with that
/// tensor's sum of g^2 (tensors skipped for a non-finite gradient are not
/// recorded); when it ends, the norm becomes the square root of the recorded
/// sums added in the order of the parameters' names (so that it does not
/// depend on the order of registration, which a checkpoint does not fix),
/// in double (NaN when they are not finite, under NonFinitePolicy::unchecked).
/// A step that updated no tensor, and a rejected one, leave it as it was.
/// NaN: none (before the first such step); the next step then only measures
/// it (the optimizer front-end's part: StepReport::measured).
class CarriedNorm {
 public:
  static constexpr double none = std::numeric_limits<double>::quiet_NaN();

  /// The norm the next step clips by; NaN when there is none.
  double norm() const noexcept { return norm_; }
  /// The factor the next step reads its gradients with (E6's, from norm()).
  double scale(double max_norm) const noexcept {
    return std::isnan(norm_) ? 1.0 : grad_clip_scale(norm_, max_norm);
  }

  /// A step begins over `tensors` registered parameters.
  void begin(std::size_t tensors) {
    sums_.assign(tensors, 0.0);
    recorded_.assign(tensors, 0);
    any_ = false;
  }
  /// Tensor i (by ParamId) was updated in it, with this sum of g^2.
  void record(std::size_t i, double sum_squares) noexcept {
    sums_[i] = sum_squares;
    recorded_[i] = 1;
    any_ = true;
  }
  /// The step is over: its norm is the next step's. `order`: every tensor
  /// index once, in the order the sums are added.
  void end(std::span<const std::size_t> order) noexcept {
    if (any_) {
      double total = 0.0;
      for (std::size_t i : order)
        if (i < recorded_.size() && recorded_[i]) total += sums_[i];
      norm_ = std::isfinite(total) ? std::sqrt(total) : none;  // E6 scales by 1 for a non-finite norm
    }
    discard();
  }
  /// The step is over and leaves the norm as it was (rejected).
  void discard() noexcept {
    sums_.clear();
    recorded_.clear();
    any_ = false;
  }
  /// No norm: the next step only measures it (after a step taken without E8).
  void clear() noexcept {
    discard();
    norm_ = none;
  }
  /// Sets the norm (import): NaN or finite and >= 0, else
  /// std::invalid_argument naming `what` and nothing changes.
  void restore(double norm, const std::string& what = "state.previous_grad_norm") {
    check(norm, what);
    discard();
    norm_ = norm;
  }
  static void check(double norm, const std::string& what) {
    if (!std::isnan(norm) && !(norm >= 0.0 && std::isfinite(norm)))
      throw std::invalid_argument(what + " = " + std::to_string(norm) + ": must be finite and >= 0 (NaN: none)");
  }

 private:
  double norm_ = none;
  std::vector<double> sums_;
  std::vector<char> recorded_;
  bool any_ = false;
};

}  // namespace skewadam
