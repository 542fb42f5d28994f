#pragma once
// Which rule updates which tier. An optimizer variant is a TierRules alias.

#include "../rules/rules.hpp"
#include "../rules/update_rule.hpp"
#include "../types/tier.hpp"

namespace skewadam {

template <class Backbone, class Experts, class Router>
struct TierRules {
  static_assert(is_update_rule_v<Backbone> && is_update_rule_v<Experts> && is_update_rule_v<Router>,
                "TierRules: each tier needs an UpdateRule<...>");
  using backbone = Backbone;
  using experts = Experts;
  using router = Router;

  static constexpr StateLayout layout(Tier t) noexcept {
    switch (t) {
      case Tier::backbone: return Backbone::layout;
      case Tier::experts: return Experts::layout;
      case Tier::router: return Router::layout;
    }
    return {};
  }
};

/// SkewAdam as in the paper.
using SkewAdamTiers = TierRules<BackboneRule, ExpertRule, RouterRule>;
/// SkewAdam with the backbone's momentum in bf16: half its momentum's bytes.
using SkewAdamBf16Tiers = TierRules<BackboneBf16Rule, ExpertRule, RouterRule>;
/// SkewAdam with the backbone's momentum in 8-bit floating-point codes (a
/// power-of-two scale per block of 256): about a quarter of its momentum's
/// bytes.
using SkewAdam8bitTiers = TierRules<Backbone8bitRule, ExpertRule, RouterRule>;
/// The same with linear 8-bit codes (an fp32 scale per block of 256): the
/// 8-bit momentum of releases before 0.3.0, whose checkpoints it reads.
using SkewAdamLinear8bitTiers = TierRules<BackboneLinear8bitRule, ExpertRule, RouterRule>;
/// Ablation: the experts also keep momentum.
using ExpertMomentumTiers = TierRules<BackboneRule, UniformRule, RouterRule>;
/// Ablation: the router's second moment is factored.
using FactoredRouterTiers = TierRules<BackboneRule, ExpertRule, AdafactorRule>;
/// Ablation: momentum + factored everywhere.
using UniformTiers = TierRules<UniformRule, UniformRule, UniformRule>;
/// Ablation: no momentum anywhere (Adafactor-like).
using AdafactorTiers = TierRules<AdafactorRule, AdafactorRule, AdafactorRule>;
/// Ablation: the experts keep momentum and an exact second moment (AdamW's
/// state, with the reference's eps floor and update clipping).
using ExactExpertsTiers = TierRules<BackboneRule, ExactMomentumRule, RouterRule>;
/// Baseline: AdamW everywhere.
using AdamWTiers = TierRules<AdamWRule, AdamWRule, AdamWRule>;

}  // namespace skewadam
