#pragma once
// FactoredSecondMoment: row + column statistics per matrix (docs/spec.md §3.2,
// step 3, factored; Adafactor, Shazeer & Stern 2018, as used by SkewAdam,
// arXiv 2607.19058).
//
// For each matrix G (r x c) of the last two dimensions of g:
//   R_i <- beta2 R_i + (1 - beta2) mean_j G_ij^2
//   C_j <- beta2 C_j + (1 - beta2) mean_i G_ij^2
//   vbar  = max(mean_i R_i, 1e-15)
//   row_i = sqrt(max(R_i / vbar, eps)),  col_j = sqrt(max(C_j, eps))
//   d_ij  = row_i * col_j
//
// State: R and C, fp32, 4 * B * (r + c) bytes for B matrices (rank >= 2, and
// rank >= 4 tensors factor their last two dimensions, extension E4). Rank-1
// tensors fall back to ExactSecondMoment. The paper's backbone and expert
// tiers.
//
// A factored policy provides scalar hooks for the statistics (the backend owns
// the reductions) and an element-wise denominator from the two factors.

#include "../detail/config.hpp"
#include "../math/step_scalars.hpp"
#include "../math/vmath.hpp"
#include "exact_second_moment.hpp"

namespace skewadam {

struct FactoredSecondMoment {
  static constexpr bool factored = true;
  using rank1_fallback = ExactSecondMoment;

  /// Floor under the mean of the row statistics; keeps 0/0 away when a whole
  /// matrix has never had a gradient.
  static constexpr float row_mean_floor = 1e-15f;

  /// R_i or C_j from its old value and the mean of g^2 over its row/column.
  SKEWADAM_HD static float update_statistic(float old, float mean_g2, const StepScalars& s) {
    return s.beta2 * old + s.one_minus_beta2 * mean_g2;
  }
  // (a copy of the constant: binding the member itself to floor_at's
  // reference parameter would odr-use it, which CUDA device code cannot)
  SKEWADAM_HD static float vbar(float mean_r) { return vmath::floor_at(mean_r, static_cast<float>(row_mean_floor)); }
  SKEWADAM_HD static float row_factor(float r, float vbar, const StepScalars& s) {
    return vmath::sqrt(vmath::floor_at(r / vbar, s.eps));
  }
  /// True when the eps floor binds on this row (row_factor is sqrt(eps)).
  SKEWADAM_HD static bool row_floored(float r, float vbar, const StepScalars& s) { return !(r / vbar >= s.eps); }
  template <class V>
  SKEWADAM_HD static V col_factor(const V& c, const StepScalars& s) {
    return vmath::sqrt(vmath::floor_at(c, vmath::splat<V>(s.eps)));
  }
  template <class V>
  SKEWADAM_HD static V denominator(const V& row, const V& col) {
    return row * col;
  }
};

}  // namespace skewadam
