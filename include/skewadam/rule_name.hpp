#pragma once
// Names of policies and rules: a rule's identity as a checkpoint records it,
// so that state is never loaded into an optimizer whose rule would read it
// differently (AdamW's V is not the router's V, although both are numel
// floats).
//
//   rule_name<BackboneRule>()
//     == "UpdateRule<FullMomentum, FactoredSecondMoment, RmsUpdateClip, StochasticRounding>"
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

#include "rules.hpp"
#include "tier.hpp"
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
SKEWADAM_POLICY_NAME(StochasticRounding);
SKEWADAM_POLICY_NAME(NearestRounding);
#undef SKEWADAM_POLICY_NAME

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
