#pragma once
// UpdateRule: a rule is four named policy slots, fixed at compile time so that
// one rule compiles to one fused pass structure (no per-element mode flags).
//
//   UpdateRule<Momentum, SecondMoment, Clip = RmsUpdateClip, Rounding = StochasticRounding>
//
// Slot contracts are documented by the null policies (no_momentum.hpp,
// exact_second_moment.hpp, no_update_clip.hpp, nearest_rounding.hpp) and are
// checked here, where the rule is formed, with readable messages.
// Decoupled weight decay (docs/spec.md §3.2, step 1) is part of every rule:
// it is fused into the store, p_new = round(p * (1 - lr*wd) - lr * u), and is
// the identity when weight_decay is 0.

#include <concepts>
#include <cstdint>

#include "../detail/config.hpp"
#include "../math/step_scalars.hpp"
#include "../policies/no_update_clip.hpp"
#include "../policies/rms_update_clip.hpp"
#include "../policies/stochastic_rounding.hpp"
#include "../policies/stored_momentum.hpp"
#include "../state/state_layout.hpp"

namespace skewadam {

template <class P>
concept MomentumPolicy = requires(float x, const StepScalars& s) {
  { P::has_state } -> std::convertible_to<bool>;
  { P::numerator_reads_grad } -> std::convertible_to<bool>;
  { P::update(x, x, s) } -> std::convertible_to<float>;
  { P::numerator(x, x, s) } -> std::convertible_to<float>;
};

template <class P>
concept ElementwiseSecondMoment = requires(float x, const StepScalars& s) {
  { P::update(x, x, s) } -> std::convertible_to<float>;
  { P::denominator(x, s) } -> std::convertible_to<float>;
};

template <class P>
concept FactoredStatistics = requires(float x, const StepScalars& s) {
  { P::update_statistic(x, x, s) } -> std::convertible_to<float>;
  { P::vbar(x) } -> std::convertible_to<float>;
  { P::row_factor(x, x, s) } -> std::convertible_to<float>;
  { P::row_floored(x, x, s) } -> std::convertible_to<bool>;
  { P::col_factor(x, s) } -> std::convertible_to<float>;
  { P::denominator(x, x) } -> std::convertible_to<float>;
};

template <class P>
concept SecondMomentPolicy = requires {
  { P::factored } -> std::convertible_to<bool>;
  typename P::rank1_fallback;
} && (P::factored ? FactoredStatistics<P> : ElementwiseSecondMoment<P>) &&
    ElementwiseSecondMoment<typename P::rank1_fallback> && !P::rank1_fallback::factored;

template <class P>
concept ClipPolicy = requires(double d, index_t n, const StepScalars& s) {
  { P::active } -> std::convertible_to<bool>;
  { P::divisor(d, n, s) } -> std::convertible_to<float>;
};

template <class P>
concept RoundingPolicy = requires(float x, std::uint32_t r) {
  { P::uses_random_bits } -> std::convertible_to<bool>;
  { P::template store<float>(x, r) } -> std::convertible_to<float>;
  { P::template store<bf16>(x, r) } -> std::convertible_to<bf16>;
  { P::template store<f16>(x, r) } -> std::convertible_to<f16>;
};

template <class Momentum, class SecondMoment, class Clip = RmsUpdateClip, class Rounding = StochasticRounding>
struct UpdateRule {
  static_assert(MomentumPolicy<Momentum>,
                "UpdateRule: the first slot must be a momentum policy (see policies/no_momentum.hpp for the hooks)");
  static_assert(SecondMomentPolicy<SecondMoment>,
                "UpdateRule: the second slot must be a second-moment policy (see policies/exact_second_moment.hpp "
                "and policies/factored_second_moment.hpp for the hooks)");
  static_assert(ClipPolicy<Clip>,
                "UpdateRule: the third slot must be a clip policy (see policies/rms_update_clip.hpp for the hooks)");
  static_assert(RoundingPolicy<Rounding>,
                "UpdateRule: the fourth slot must be a rounding policy (see policies/nearest_rounding.hpp)");

  using momentum = Momentum;
  using second_moment = SecondMoment;
  using clip = Clip;
  using rounding = Rounding;

  /// The state this rule keeps; state_bytes(layout, shape) is its size.
  static constexpr StateLayout layout{Momentum::has_state, SecondMoment::factored, momentum_storage_v<Momentum>};

  /// The same rule with one slot replaced.
  template <class M>
  using with_momentum = UpdateRule<M, SecondMoment, Clip, Rounding>;
  template <class S>
  using with_second_moment = UpdateRule<Momentum, S, Clip, Rounding>;
  template <class C>
  using with_clip = UpdateRule<Momentum, SecondMoment, C, Rounding>;
  template <class R>
  using with_rounding = UpdateRule<Momentum, SecondMoment, Clip, R>;

  /// The rule applied to a rank-1 tensor (factored falls back to exact).
  using rank1_rule = UpdateRule<Momentum, typename SecondMoment::rank1_fallback, Clip, Rounding>;
};

template <class T>
inline constexpr bool is_update_rule_v = false;
template <class M, class S, class C, class R>
inline constexpr bool is_update_rule_v<UpdateRule<M, S, C, R>> = true;

}  // namespace skewadam
