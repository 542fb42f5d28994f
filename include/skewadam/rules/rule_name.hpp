#pragma once
// Names of policies and rules: a rule's identity as a checkpoint records it,
// so that state is never loaded into an optimizer whose rule would read it
// differently (AdamW's V is not the router's V, although both are numel
// floats).
//
//   rule_name<BackboneRule>()
//     == "UpdateRule<FullMomentum, FactoredSecondMoment, RmsUpdateClip, StochasticRounding16>"
//
// A rule with a custom policy is named by specialising policy_name:
//
//   template <> struct skewadam::policy_name<MyMomentum> {
//     static constexpr std::string_view value = "MyMomentum";
//   };
//
// Only checkpointing needs the names; a rule with an unnamed policy still
// steps, and fails to compile only where it is saved or loaded.

#include <concepts>
#include <string>
#include <string_view>

#include "../types/tier.hpp"
#include "rules.hpp"
#include "update_rule.hpp"

namespace skewadam {

/// The stable name of a policy; specialise for custom policies.
template <class Policy>
struct policy_name {};

template <class Policy>
concept NamedPolicy = requires {
  { policy_name<Policy>::value } -> std::convertible_to<std::string_view>;
};

#define SKEWADAM_POLICY_NAME(P)                            \
  template <>                                              \
  struct policy_name<P> {                                  \
    static constexpr std::string_view value = #P;          \
  }
SKEWADAM_POLICY_NAME(FullMomentum);
SKEWADAM_POLICY_NAME(NoMomentum);
SKEWADAM_POLICY_NAME(FactoredSecondMoment);
SKEWADAM_POLICY_NAME(ExactSecondMoment);
SKEWADAM_POLICY_NAME(AdamSecondMoment);
SKEWADAM_POLICY_NAME(RmsUpdateClip);
SKEWADAM_POLICY_NAME(NoUpdateClip);
SKEWADAM_POLICY_NAME(NearestRounding);
SKEWADAM_POLICY_NAME(Bf16Momentum);
#undef SKEWADAM_POLICY_NAME
/// Named with its block size.
template <>
struct policy_name<Int8BlockMomentum> {
  static constexpr std::string_view value = "Int8BlockMomentum256";
};
template <>
struct policy_name<Float8BlockMomentum> {
  static constexpr std::string_view value = "Float8BlockMomentum256";
};
/// Named for its random stream: 16 bits per element, eight elements per
/// Philox block (random.hpp). Checkpoints of earlier versions name the
/// policy StochasticRounding (32 bits per element, four per block); see
/// same_saved_rule().
template <>
struct policy_name<StochasticRounding> {
  static constexpr std::string_view value = "StochasticRounding16";
};

/// Whether every policy of Rule has a name (rule_name<Rule>() compiles).
template <class Rule>
inline constexpr bool named_rule_v = NamedPolicy<typename Rule::momentum> && NamedPolicy<typename Rule::second_moment> &&
                                     NamedPolicy<typename Rule::clip> && NamedPolicy<typename Rule::rounding>;
/// Whether every rule of a TierRules alias has a name.
template <class Tiers>
inline constexpr bool named_tiers_v =
    named_rule_v<typename Tiers::backbone> && named_rule_v<typename Tiers::experts> && named_rule_v<typename Tiers::router>;

/// "UpdateRule<Momentum, SecondMoment, Clip, Rounding>" with each policy's name.
template <class Rule>
std::string rule_name() {
  static_assert(is_update_rule_v<Rule>, "skewadam::rule_name: Rule must be an UpdateRule<...>");
  using M = typename Rule::momentum;
  using S = typename Rule::second_moment;
  using C = typename Rule::clip;
  using R = typename Rule::rounding;
  static_assert(NamedPolicy<M> && NamedPolicy<S> && NamedPolicy<C> && NamedPolicy<R>,
                "skewadam::rule_name: every policy of a checkpointed rule needs a name; specialise "
                "skewadam::policy_name<P> (see rule_name.hpp) for a custom policy");
  std::string s = "UpdateRule<";
  s += policy_name<M>::value;
  s += ", ";
  s += policy_name<S>::value;
  s += ", ";
  s += policy_name<C>::value;
  s += ", ";
  s += policy_name<R>::value;
  s += ">";
  return s;
}

/// Whether a checkpoint's rule name `saved` names the rule `mine`: equal, or
/// equal once the rounding policy StochasticRounding16 is read as the
/// StochasticRounding of earlier versions. That policy keeps no state, so
/// such a checkpoint's state means what it meant when saved; only the
/// rounding bits of the steps after loading come from the current stream.
inline bool same_saved_rule(std::string_view saved, std::string_view mine) {
  if (saved == mine) return true;
  constexpr std::string_view now = ", StochasticRounding16>", before = ", StochasticRounding>";
  return mine.ends_with(now) && saved.ends_with(before) &&
         saved.substr(0, saved.size() - before.size()) == mine.substr(0, mine.size() - now.size());
}

/// The name of the rule that a TierRules<...> assigns to tier t.
template <class Tiers>
std::string tier_rule_name(Tier t) {
  switch (checked_tier(t)) {
    case Tier::backbone: return rule_name<typename Tiers::backbone>();
    case Tier::experts: return rule_name<typename Tiers::experts>();
    case Tier::router: return rule_name<typename Tiers::router>();
  }
  return {};
}

}  // namespace skewadam
