#pragma once
// skewadam-plan's two outputs: a table for people and a JSON object for
// programs.
//
// The table prints GiB (2^30 bytes) and MB (10^6 bytes), as the paper does:
// sizes of at least 1 GiB in GiB with two decimals, sizes of at least 0.1 MB
// in MB with one decimal, smaller ones in bytes. The JSON object has exactly
// these keys, all integers (bytes or counts):
//
//   {"total_params", "weights_bytes",
//    "tiers": {"backbone"|"experts"|"router": {"params", "state_bytes"}},
//    "state_bytes": {"skewadam", "skewadam_bf16", "skewadam_8bit", "adamw", "adafactor", "uniform",
//                    "expert_momentum", "factored_router", "one_buffer"}}

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <skewadam/detail/config.hpp>
#include <skewadam/plan.hpp>
#include <skewadam/state/state_layout.hpp>
#include <skewadam/types/tier.hpp>

#include "inventory.hpp"

namespace skewadam::tools {

/// 1234567 -> "1,234,567".
inline std::string with_commas(index_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

inline std::string format_fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

/// Bytes as the paper prints them: "12.64 GiB", "12.6 MB", or "96 B".
inline std::string format_bytes(index_t bytes) {
  constexpr double gib = 1024.0 * 1024.0 * 1024.0;
  if (static_cast<double>(bytes) >= gib) return format_fixed(static_cast<double>(bytes) / gib, 2) + " GiB";
  if (bytes >= 100'000) return format_fixed(static_cast<double>(bytes) / 1e6, 1) + " MB";
  return std::to_string(bytes) + " B";
}

/// A parameter count in millions: "6,784.33 M".
inline std::string format_millions(index_t params) {
  const std::string s = format_fixed(static_cast<double>(params) / 1e6, 2);
  const std::size_t dot = s.find('.');
  return with_commas(std::stoll(s.substr(0, dot))) + s.substr(dot) + " M";
}

/// A share in percent: one decimal from 0.1 %, three below ("0.008 %").
inline std::string format_share(index_t part, index_t whole) {
  if (whole <= 0) return "-";
  const double pct = 100.0 * static_cast<double>(part) / static_cast<double>(whole);
  if (part == 0) return "0 %";
  if (pct >= 0.1) return format_fixed(pct, 1) + " %";
  if (pct >= 0.001) return format_fixed(pct, 3) + " %";
  return "<0.001 %";
}

inline std::string describe_layout(StateLayout l) {
  const char* momentum = !l.momentum                                   ? ""
                         : l.storage == MomentumStorage::float8_blocks ? "8-bit momentum + "
                         : l.storage == MomentumStorage::int8_blocks ? "linear 8-bit momentum + "
                         : l.storage == MomentumStorage::bfloat16        ? "bf16 momentum + "
                                                                     : "fp32 momentum + ";
  return std::string(momentum) + (l.factored ? "factored" : "exact");
}

/// The --json object.
inline nlohmann::ordered_json plan_json(const Plan& plan) {
  nlohmann::ordered_json j;
  j["total_params"] = plan.total_params;
  j["weights_bytes"] = plan.weights_bytes;
  nlohmann::ordered_json tiers = nlohmann::ordered_json::object();
  for (Tier t : all_tiers) {
    const TierTotals& tt = plan.tiers[t];
    tiers[std::string(tier_name(t))] = {{"params", tt.params}, {"state_bytes", tt.state_bytes}};
  }
  j["tiers"] = tiers;
  const PolicyStateBytes& s = plan.state_bytes;
  j["state_bytes"] = {{"skewadam", s.skewadam},
                      {"skewadam_bf16", s.skewadam_bf16},
                      {"skewadam_8bit", s.skewadam_8bit},
                      {"adamw", s.adamw},
                      {"adafactor", s.adafactor},
                      {"uniform", s.uniform},
                      {"expert_momentum", s.expert_momentum},
                      {"factored_router", s.factored_router},
                      {"one_buffer", s.one_buffer}};
  return j;
}

namespace detail {

inline std::string pad_left(std::string s, std::size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}
inline std::string pad_right(std::string s, std::size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

}  // namespace detail

/// The readable table. `model` names what was planned; `skipped` lists the
/// tensors left out (integer and boolean buffers).
inline std::string plan_table(const Plan& plan, std::string_view model,
                              const std::vector<SkippedTensor>& skipped = {}) {
  using detail::pad_left;
  using detail::pad_right;
  std::string out;
  out += std::string(model) + ": " + with_commas(plan.tensors) + " tensors, " + with_commas(plan.total_params) +
         " parameters" + (plan.total_params >= 1'000'000 ? " (" + format_millions(plan.total_params) + ")" : "") +
         ", " + format_bytes(plan.weights_bytes) + " of weights\n";
  if (!skipped.empty()) {
    out += "left out: " + with_commas(static_cast<index_t>(skipped.size())) +
           " integer or boolean buffer(s), e.g. '" + skipped.front().name + "' (" + skipped.front().dtype + ")\n";
  }
  out += "\n";

  out += pad_right("tier", 10) + pad_left("tensors", 8) + pad_left("parameters", 16) + pad_left("share", 9) +
         pad_left("weights", 11) + pad_left("SkewAdam state", 16) + "   state kept\n";
  for (Tier t : all_tiers) {
    const TierTotals& tt = plan.tiers[t];
    out += pad_right(std::string(tier_name(t)), 10) + pad_left(with_commas(tt.tensors), 8) +
           pad_left(with_commas(tt.params), 16) + pad_left(format_share(tt.params, plan.total_params), 9) +
           pad_left(format_bytes(tt.weights_bytes), 11) + pad_left(format_bytes(tt.state_bytes), 16) + "   " +
           describe_layout(tier_layouts::skewadam[t]) + "\n";
  }
  out += pad_right("all", 10) + pad_left(with_commas(plan.tensors), 8) + pad_left(with_commas(plan.total_params), 16) +
         pad_left(format_share(plan.total_params, plan.total_params), 9) + pad_left(format_bytes(plan.weights_bytes), 11) +
         pad_left(format_bytes(plan.state_bytes.skewadam), 16) + "\n\n";

  const PolicyStateBytes& s = plan.state_bytes;
  struct Row {
    std::string_view label;
    index_t bytes;
  };
  const Row rows[] = {
      {"SkewAdam", s.skewadam},
      {"SkewAdam, bf16 momentum", s.skewadam_bf16},
      {"SkewAdam, 8-bit momentum", s.skewadam_8bit},
      {"  ablation: experts with momentum", s.expert_momentum},
      {"  ablation: factored router", s.factored_router},
      {"  ablation: uniform (momentum + factored)", s.uniform},
      {"Adafactor-like (factored, no momentum)", s.adafactor},
      {"one fp32 buffer (Lion, Muon)", s.one_buffer},
      {"AdamW (two fp32 buffers)", s.adamw},
  };
  out += pad_right("optimizer state", 42) + pad_left("size", 11) + pad_left("bytes", 18) + pad_left("vs AdamW", 10) + "\n";
  for (const Row& r : rows)
    out += pad_right(std::string(r.label), 42) + pad_left(format_bytes(r.bytes), 11) + pad_left(with_commas(r.bytes), 18) +
           pad_left(format_share(r.bytes, s.adamw), 10) + "\n";
  out += "\nGiB = 2^30 bytes, MB = 10^6 bytes; the step counter is not counted.\n";
  return out;
}

}  // namespace skewadam::tools
