#pragma once
// Which tier a parameter belongs to, decided by ordered rules on its name.
//
// A rule is a regular expression (ECMAScript syntax, searched anywhere in the
// name, so anchor it with ^ and $ to match whole names) and a tier. The first
// rule that matches decides. User rules come first; the default rules follow
// unless they are switched off:
//
//   1. `experts`                     -> experts   (`...experts.3.w1.weight`,
//                                                  `...experts.5.gate_proj.weight`,
//                                                  `...shared_experts...` too)
//   2. `router`, or a name component
//      that is exactly `gate`        -> router    (`...block_sparse_moe.gate.weight`,
//                                                  `...mlp.gate.weight`, `...moe.router.weight`)
//   3. anything else                 -> backbone  (embeddings, attention, norms, dense
//                                                  FFN including its `gate_proj`)
//
// A name component is the text between separators `.` or `/`, so `gate_proj`,
// `gate_up_proj` and `shared_expert_gate` are not gates; they fall to the
// backbone unless they live under `experts`. DeepSeek-style `shared_experts`
// contain `experts` and are therefore experts by default; a rule such as
// `shared_expert=backbone` before the defaults moves them.
//
// With the defaults on, every name gets a tier. With them off, a name that no
// rule matches is an error.
//
// This header is shared by skewadam-plan and the LibTorch adapter, so both
// assign tiers the same way.

#include <cstddef>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../detail/config.hpp"
#include "../types/tier.hpp"

namespace skewadam {

/// Names longer than this are rejected before any regular expression runs on
/// them: the standard library's regex engine recurses once per character for
/// patterns such as `.*x` and would exhaust the stack on a huge name.
inline constexpr index_t max_tensor_name_length = 4096;

/// One rule: names in which `pattern` is found belong to `tier`.
struct TierRule {
  std::string pattern;  ///< the regular expression as written (ECMAScript)
  std::regex regex;     ///< compiled from pattern
  Tier tier = Tier::backbone;

  /// Compiles `pattern`; throws std::invalid_argument naming `argument` when
  /// the expression is malformed or empty.
  TierRule(std::string_view pattern_text, Tier rule_tier, std::string_view argument = "rule")
      : pattern(pattern_text), tier(checked_tier(rule_tier, argument)) {
    if (pattern.empty())
      throw std::invalid_argument(std::string(argument) + ": empty regular expression");
    try {
      regex = std::regex(pattern, std::regex::ECMAScript | std::regex::optimize);
    } catch (const std::regex_error& e) {
      throw std::invalid_argument(std::string(argument) + ": bad regular expression '" + pattern +
                                  "': " + e.what());
    }
  }

  bool matches(std::string_view name) const {
    return std::regex_search(name.begin(), name.end(), regex);
  }
};

/// Parses "REGEX=TIER" (as given to `--rule`). The text is split at its last
/// '=', so the expression itself may contain '='.
inline TierRule parse_tier_rule(std::string_view text, std::string_view argument = "rule") {
  const std::string arg = std::string(argument) + " '" + std::string(text) + "'";
  const std::size_t eq = text.rfind('=');
  if (eq == std::string_view::npos)
    throw std::invalid_argument(arg + ": expected REGEX=TIER (TIER is backbone, experts or router)");
  const Tier tier = parse_tier(text.substr(eq + 1), arg);
  return TierRule(text.substr(0, eq), tier, arg);
}

/// The default rules, in order (see the top of this header).
inline std::vector<TierRule> default_tier_rules() {
  std::vector<TierRule> rules;
  rules.emplace_back("experts", Tier::experts, "default rule");
  rules.emplace_back(R"(router|(^|[./])gate([./]|$))", Tier::router, "default rule");
  rules.emplace_back(".*", Tier::backbone, "default rule");
  return rules;
}

/// Assigns tiers by name: user rules first, then (unless disabled) the defaults.
class TierAssigner {
 public:
  /// The default rules only.
  TierAssigner() : TierAssigner(std::vector<TierRule>{}, true) {}

  /// `user_rules` first, in order, then the defaults when `use_defaults`.
  explicit TierAssigner(std::vector<TierRule> user_rules, bool use_defaults = true)
      : rules_(std::move(user_rules)), user_count_(rules_.size()), defaults_(use_defaults) {
    if (defaults_)
      for (TierRule& r : default_tier_rules()) rules_.push_back(std::move(r));
  }

  /// Parses each "REGEX=TIER" of `specs` (see parse_tier_rule).
  static TierAssigner from_strings(const std::vector<std::string>& specs, bool use_defaults = true,
                                   std::string_view argument = "rule") {
    std::vector<TierRule> rules;
    rules.reserve(specs.size());
    for (const std::string& s : specs) rules.push_back(parse_tier_rule(s, argument));
    return TierAssigner(std::move(rules), use_defaults);
  }

  /// Every rule in the order it is tried.
  const std::vector<TierRule>& rules() const noexcept { return rules_; }
  std::size_t user_rule_count() const noexcept { return user_count_; }
  bool uses_defaults() const noexcept { return defaults_; }

  /// The tier of `name`, or nothing when no rule matches (only possible with
  /// the defaults off). Throws std::invalid_argument for an over-long name.
  std::optional<Tier> try_assign(std::string_view name) const {
    check_name(name);
    for (const TierRule& r : rules_)
      if (r.matches(name)) return r.tier;
    return std::nullopt;
  }

  /// The tier of `name`; throws std::invalid_argument when no rule matches.
  Tier assign(std::string_view name) const {
    if (const std::optional<Tier> t = try_assign(name)) return *t;
    throw std::invalid_argument("tensor '" + std::string(name) +
                                "': matches no tier rule (the default rules are off; add a "
                                "rule such as '.*=backbone' as the last one)");
  }

 private:
  static void check_name(std::string_view name) {
    if (static_cast<index_t>(name.size()) > max_tensor_name_length)
      throw std::invalid_argument("tensor name of " + std::to_string(name.size()) +
                                  " bytes: longer than the limit of " +
                                  std::to_string(max_tensor_name_length) + " bytes ('" +
                                  std::string(name.substr(0, 64)) + "...')");
  }

  std::vector<TierRule> rules_;
  std::size_t user_count_ = 0;
  bool defaults_ = true;
};

}  // namespace skewadam
