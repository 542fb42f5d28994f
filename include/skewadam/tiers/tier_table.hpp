#pragma once
// TierTable: what a TierRules alias (tier_rules.hpp) tells the optimizer at
// run time, tier by tier: the state its rule keeps, the rule's name (what a
// checkpoint records), and its update clipping. Everything of the optimizer
// but the choice of kernels works from this table, so that the front-end
// (OptimizerBase, optimizer.hpp), the engine and the checkpoints are compiled
// once for every alias of a backend and placement, not once per alias.

#include <array>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "../detail/config.hpp"
#include "../engine/engine_types.hpp"
#include "../rules/rule_dispatch.hpp"
#include "../rules/rule_name.hpp"
#include "../state/state_layout.hpp"
#include "../types/tier.hpp"

namespace skewadam {

/// One tier's rule, as data.
struct TierFacts {
  StateLayout layout{};  ///< the state its rule keeps
  /// rule_name<Rule>(), as checkpoints record it; empty where a policy has
  /// no name (a custom one: such a rule steps, and cannot be checkpointed)
  std::string rule;
  UpdateClip clip{};     ///< its update clipping (a rank-1 rule clips alike)
};

class TierTable {
 public:
  /// The table of a TierRules alias (one per alias, built once).
  template <class Tiers>
  static const TierTable& of() {
    static const TierTable table{{facts<Tiers>(Tier::backbone), facts<Tiers>(Tier::experts), facts<Tiers>(Tier::router)}};
    return table;
  }

  const TierFacts& operator[](Tier t) const { return tiers_[static_cast<std::size_t>(tier_index(checked_tier(t)))]; }

 private:
  /// By tier_index (all_tiers' order).
  static_assert(tier_index(Tier::backbone) == 0 && tier_index(Tier::experts) == 1 && tier_index(Tier::router) == 2);
  std::array<TierFacts, tier_count> tiers_{};

  explicit TierTable(std::array<TierFacts, tier_count> tiers) : tiers_(std::move(tiers)) {}
  template <class Tiers>
  static TierFacts facts(Tier tier) {
    TierFacts f;
    f.layout = Tiers::layout(tier);
    if constexpr (named_tiers_v<Tiers>) f.rule = tier_rule_name<Tiers>(tier);
    f.clip = visit_rule<Tiers>(tier, false, []<class Rule>() {
      using C = typename Rule::clip;
      static_assert(std::is_same_v<C, typename Rule::rank1_rule::clip>,
                    "TierTable: a rule's rank-1 rule clips as the rule does");
      return UpdateClip{C::active, &C::divisor};
    });
    return f;
  }
};

}  // namespace skewadam
