#pragma once
// The three parameter populations of a Mixture-of-Experts model.

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>

namespace skewadam {

/// A parameter population. Each tier is updated by the rule its optimizer
/// assigns to it (see tier_rules.hpp); the defaults are the paper's:
/// backbone = momentum + factored, experts = factored, router = exact.
enum class Tier : int { backbone = 0, experts = 1, router = 2 };

inline constexpr int tier_count = 3;
inline constexpr std::array<Tier, tier_count> all_tiers{Tier::backbone, Tier::experts, Tier::router};

constexpr std::string_view tier_name(Tier t) noexcept {
  switch (t) {
    case Tier::backbone: return "backbone";
    case Tier::experts: return "experts";
    case Tier::router: return "router";
  }
  return "unknown";
}

constexpr int tier_index(Tier t) noexcept { return static_cast<int>(t); }

/// Parses "backbone", "experts" or "router"; throws std::invalid_argument
/// naming the argument otherwise.
inline Tier parse_tier(std::string_view name, std::string_view argument = "tier") {
  for (Tier t : all_tiers)
    if (tier_name(t) == name) return t;
  throw std::invalid_argument(std::string(argument) + ": unknown tier '" + std::string(name) +
                              "' (expected backbone, experts or router)");
}

/// Checks a tier received as a number or cast from user data.
inline Tier checked_tier(Tier t, std::string_view argument = "tier") {
  const int i = static_cast<int>(t);
  if (i < 0 || i >= tier_count)
    throw std::invalid_argument(std::string(argument) + ": unknown tier value " + std::to_string(i));
  return t;
}

}  // namespace skewadam
