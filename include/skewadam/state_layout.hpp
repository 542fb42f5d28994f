#pragma once
// What optimizer state a rule keeps for a tensor, and how many bytes it is.
//
// This is the one place where docs/spec.md §2's formulas live. The optimizer's
// state report, the planner (skewadam-plan) and the LibTorch adapter all call
// state_bytes(), so they cannot disagree.
//
//   FullMomentum                     m: 4 * numel
//   FactoredSecondMoment, rank >= 2  R, C: 4 * B * (r + c)   (B matrices r x c)
//   FactoredSecondMoment, rank 1     falls back to exact: 4 * numel
//   ExactSecondMoment                V: 4 * numel
//   step counter                     not counted (as in the paper)

#include "config.hpp"
#include "shape.hpp"

namespace skewadam {

struct StateLayout {
  bool momentum = false;  ///< keeps an fp32 first moment m
  bool factored = false;  ///< second moment factored into row + column statistics (rank >= 2)
  friend constexpr bool operator==(StateLayout, StateLayout) = default;
};

/// Named layouts of the paper's policies and baselines.
namespace layouts {
inline constexpr StateLayout backbone{true, true};    ///< momentum + factored
inline constexpr StateLayout experts{false, true};    ///< factored only
inline constexpr StateLayout router{false, false};    ///< exact only
inline constexpr StateLayout adamw{true, false};      ///< m and v: two fp32 buffers
inline constexpr StateLayout adafactor{false, true};  ///< factored, no momentum
}  // namespace layouts

/// True when a factored second moment applies to this shape (rank >= 2).
constexpr bool factors(StateLayout layout, const Shape& shape) noexcept {
  return layout.factored && shape.rank() >= 2;
}

constexpr index_t momentum_bytes(StateLayout layout, const Shape& shape) noexcept {
  return layout.momentum ? 4 * shape.numel() : 0;
}

constexpr index_t second_moment_bytes(StateLayout layout, const Shape& shape) noexcept {
  if (factors(layout, shape)) {
    const MatrixGeometry g = shape.matrices();
    return 4 * g.batch * (g.rows + g.cols);
  }
  return 4 * shape.numel();
}

/// Optimizer state bytes of one tensor (docs/spec.md §2).
constexpr index_t state_bytes(StateLayout layout, const Shape& shape) noexcept {
  if (shape.numel() == 0) return 0;
  return momentum_bytes(layout, shape) + second_moment_bytes(layout, shape);
}

}  // namespace skewadam
