#pragma once
// Memory planning: how much optimizer state a model needs, per tier and for
// each of the paper's policies and baselines, computed from names, shapes and
// dtypes alone. Nothing is allocated.
//
// Every figure is a sum of state_bytes() (state_layout.hpp) over tensors, so
// the planner, the optimizer's own report and the LibTorch adapter agree by
// construction. The step counter is not counted (as in the paper).
//
// Policies, as per-tier StateLayouts (backbone / experts / router):
//
//   skewadam          momentum+factored / factored        / exact     (the paper)
//   skewadam_bf16     bf16 momentum+factored / factored   / exact     (Bf16Momentum)
//   skewadam_8bit     8-bit momentum+factored / factored  / exact     (Float8BlockMomentum;
//                     Int8BlockMomentum takes the same bytes)
//   expert_momentum   momentum+factored / momentum+factored / exact   (ablation)
//   factored_router   momentum+factored / factored        / factored  (ablation)
//   uniform           momentum+factored everywhere                    (ablation)
//   adafactor         factored, no momentum, everywhere               (Adafactor-like)
//   adamw             momentum + exact everywhere: two fp32 buffers
//   one_buffer        one fp32 buffer per parameter (Lion, Muon): 4 bytes per parameter
//
// Factored layouts fall back to an exact second moment for rank-1 tensors
// (docs/spec.md §2).

#include <cstddef>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "detail/config.hpp"
#include "state/state_layout.hpp"
#include "tiers/tier_assignment.hpp"
#include "types/dtype.hpp"
#include "types/shape.hpp"
#include "types/tier.hpp"

namespace skewadam {

/// A tensor as the planner sees it: no data, just what determines its memory.
struct TensorSpec {
  std::string name;
  Shape shape{};
  Dtype dtype = Dtype::f32;

  index_t numel() const noexcept { return shape.numel(); }
  index_t weights_bytes() const noexcept { return numel() * dtype_size(dtype); }
};

/// The StateLayout each tier gets under one policy.
struct TierLayouts {
  StateLayout backbone{};
  StateLayout experts{};
  StateLayout router{};

  constexpr StateLayout operator[](Tier t) const noexcept {
    switch (t) {
      case Tier::backbone: return backbone;
      case Tier::experts: return experts;
      case Tier::router: return router;
    }
    return backbone;
  }
  friend constexpr bool operator==(const TierLayouts&, const TierLayouts&) = default;
};

/// The paper's policy, its ablations and the baselines (see the top of this header).
namespace tier_layouts {
inline constexpr TierLayouts skewadam{layouts::backbone, layouts::experts, layouts::router};
inline constexpr TierLayouts skewadam_bf16{layouts::backbone_bf16, layouts::experts, layouts::router};
inline constexpr TierLayouts skewadam_8bit{layouts::backbone_8bit, layouts::experts, layouts::router};
inline constexpr TierLayouts expert_momentum{layouts::backbone, layouts::backbone, layouts::router};
inline constexpr TierLayouts factored_router{layouts::backbone, layouts::experts, layouts::experts};
inline constexpr TierLayouts uniform{layouts::backbone, layouts::backbone, layouts::backbone};
inline constexpr TierLayouts adafactor{layouts::adafactor, layouts::adafactor, layouts::adafactor};
inline constexpr TierLayouts adamw{layouts::adamw, layouts::adamw, layouts::adamw};
}  // namespace tier_layouts

/// State of a one-buffer optimizer (Lion, Muon): one fp32 value per parameter.
inline constexpr index_t one_buffer_bytes_per_param = 4;

namespace detail {

/// Largest element count the planner accepts for one tensor (2^56). Two fp32
/// buffers of it stay far below 2^63 bytes; no real tensor comes close.
inline constexpr index_t max_planned_numel = index_t{1} << 56;

/// a + b for non-negative a and b; throws std::overflow_error past 2^63 - 1.
inline index_t checked_add(index_t a, index_t b, std::string_view what) {
  if (b > std::numeric_limits<index_t>::max() - a)
    throw std::overflow_error("plan: " + std::string(what) + " overflows 64 bits");
  return a + b;
}

inline void check_spec(const TensorSpec& t) {
  if (t.shape.rank() < 1)
    throw std::invalid_argument("tensor '" + t.name + "': shape has rank 0");
  if (t.shape.numel() > max_planned_numel)
    throw std::invalid_argument("tensor '" + t.name + "': " + std::to_string(t.shape.numel()) +
                                " elements is more than the planner's limit of 2^56");
  const int d = static_cast<int>(t.dtype);
  if (d < 0 || d > 2)
    throw std::invalid_argument("tensor '" + t.name + "': unknown dtype value " + std::to_string(d));
}

inline void check_tiers(std::span<const TensorSpec> tensors, std::span<const Tier> tiers) {
  if (tiers.size() != tensors.size())
    throw std::invalid_argument("tiers: " + std::to_string(tiers.size()) + " tiers for " +
                                std::to_string(tensors.size()) + " tensors");
  for (std::size_t i = 0; i < tiers.size(); ++i)
    checked_tier(tiers[i], "tier of tensor '" + tensors[i].name + "'");
}

}  // namespace detail

/// The tier of each tensor, in order.
inline std::vector<Tier> assign_tiers(std::span<const TensorSpec> tensors, const TierAssigner& assigner) {
  std::vector<Tier> tiers;
  tiers.reserve(tensors.size());
  for (const TensorSpec& t : tensors) tiers.push_back(assigner.assign(t.name));
  return tiers;
}

/// Optimizer state bytes of `tensors`, tensor i in tier `tiers[i]`, each tier
/// laid out as `layouts` says.
inline index_t state_bytes_for(std::span<const TensorSpec> tensors, std::span<const Tier> tiers,
                               const TierLayouts& layouts) {
  detail::check_tiers(tensors, tiers);
  index_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    detail::check_spec(tensors[i]);
    total = detail::checked_add(total, state_bytes(layouts[tiers[i]], tensors[i].shape), "state bytes");
  }
  return total;
}

/// Optimizer state bytes of `tensors`, tiers assigned by name.
inline index_t state_bytes_for(std::span<const TensorSpec> tensors, const TierAssigner& assigner,
                               const TierLayouts& layouts) {
  const std::vector<Tier> tiers = assign_tiers(tensors, assigner);
  return state_bytes_for(tensors, tiers, layouts);
}

/// One tier's share of a model.
struct TierTotals {
  index_t tensors = 0;        ///< how many tensors
  index_t params = 0;         ///< how many parameters (elements)
  index_t weights_bytes = 0;  ///< the parameters themselves, in their own dtypes
  index_t state_bytes = 0;    ///< SkewAdam state of this tier (tier_layouts::skewadam)
};

struct PlanTiers {
  TierTotals backbone{};
  TierTotals experts{};
  TierTotals router{};

  TierTotals& operator[](Tier t) noexcept {
    return t == Tier::experts ? experts : t == Tier::router ? router : backbone;
  }
  const TierTotals& operator[](Tier t) const noexcept {
    return t == Tier::experts ? experts : t == Tier::router ? router : backbone;
  }
};

/// Total optimizer state bytes under each policy.
struct PolicyStateBytes {
  index_t skewadam = 0;
  index_t skewadam_bf16 = 0;  ///< the backbone's momentum in bf16 (SkewAdamBf16Tiers)
  index_t skewadam_8bit = 0;  ///< the backbone's momentum in 8 bits (SkewAdam8bitTiers)
  index_t adamw = 0;
  index_t adafactor = 0;
  index_t uniform = 0;
  index_t expert_momentum = 0;
  index_t factored_router = 0;
  index_t one_buffer = 0;
};

/// What a model needs: parameters, weights and optimizer state.
struct Plan {
  index_t tensors = 0;
  index_t total_params = 0;
  index_t weights_bytes = 0;
  PlanTiers tiers{};
  PolicyStateBytes state_bytes{};
};

/// Plans `tensors`, tensor i in tier `tiers[i]`.
inline Plan make_plan(std::span<const TensorSpec> tensors, std::span<const Tier> tiers) {
  detail::check_tiers(tensors, tiers);
  using detail::checked_add;
  Plan p;
  auto add_state = [&](index_t& total, const TierLayouts& l, Tier tier, const Shape& shape) {
    total = checked_add(total, state_bytes(l[tier], shape), "state bytes");
  };
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    detail::check_spec(t);
    const Tier tier = tiers[i];
    const index_t n = t.numel();

    TierTotals& tt = p.tiers[tier];
    tt.tensors += 1;
    tt.params = checked_add(tt.params, n, "parameter count");
    tt.weights_bytes = checked_add(tt.weights_bytes, t.weights_bytes(), "weights bytes");
    add_state(tt.state_bytes, tier_layouts::skewadam, tier, t.shape);

    p.tensors += 1;
    p.total_params = checked_add(p.total_params, n, "parameter count");
    p.weights_bytes = checked_add(p.weights_bytes, t.weights_bytes(), "weights bytes");

    PolicyStateBytes& s = p.state_bytes;
    add_state(s.skewadam, tier_layouts::skewadam, tier, t.shape);
    add_state(s.skewadam_bf16, tier_layouts::skewadam_bf16, tier, t.shape);
    add_state(s.skewadam_8bit, tier_layouts::skewadam_8bit, tier, t.shape);
    add_state(s.adamw, tier_layouts::adamw, tier, t.shape);
    add_state(s.adafactor, tier_layouts::adafactor, tier, t.shape);
    add_state(s.uniform, tier_layouts::uniform, tier, t.shape);
    add_state(s.expert_momentum, tier_layouts::expert_momentum, tier, t.shape);
    add_state(s.factored_router, tier_layouts::factored_router, tier, t.shape);
    s.one_buffer = checked_add(s.one_buffer, one_buffer_bytes_per_param * n, "state bytes");
  }
  return p;
}

/// Plans `tensors`, tiers assigned by name (the default rules unless `assigner` says otherwise).
inline Plan make_plan(std::span<const TensorSpec> tensors, const TierAssigner& assigner = TierAssigner{}) {
  const std::vector<Tier> tiers = assign_tiers(tensors, assigner);
  return make_plan(tensors, tiers);
}

}  // namespace skewadam
