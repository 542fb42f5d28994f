#pragma once
// Per-tier hyperparameters and learning-rate schedules: the part of an
// optimizer's interface that Optimizer and dist::ShardedOptimizer share
// (both derive from TierSettings). Every setter validates before it changes
// anything.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "../math/hyperparameters.hpp"
#include "../types/checks.hpp"
#include "../types/tier.hpp"

namespace skewadam {

/// One value per tier.
template <class T>
struct PerTier {
  T backbone{};
  T experts{};
  T router{};
  T& operator[](Tier t) { return t == Tier::backbone ? backbone : (t == Tier::experts ? experts : router); }
  const T& operator[](Tier t) const {
    return t == Tier::backbone ? backbone : (t == Tier::experts ? experts : router);
  }
};

class TierSettings {
 public:
  /// lr of global step t (t counts step() calls from 1).
  using Schedule = std::function<double(std::int64_t)>;

  const Hyperparameters& hyperparameters(Tier t) const { return hyper_[checked_tier(t)]; }
  void set_hyperparameters(Tier t, const Hyperparameters& h) {
    checked_tier(t);
    validate(h, std::string(tier_name(t)));
    hyper_[t] = h;
  }
  /// Sets the learning rate of every tier.
  void set_lr(double lr) {
    for (Tier t : all_tiers) detail::check_lr(lr, std::string(tier_name(t)) + ".lr");
    for (Tier t : all_tiers) hyper_[t].lr = lr;
  }
  void set_lr(Tier t, double lr) {
    checked_tier(t);
    detail::check_lr(lr, std::string(tier_name(t)) + ".lr");
    hyper_[t].lr = lr;
  }
  /// lr of step t comes from `schedule`, overriding the tier's lr. An empty
  /// function removes the schedule.
  void set_lr_schedule(Schedule schedule) {
    for (Tier t : all_tiers) schedules_[t] = schedule;
  }
  void set_lr_schedule(Tier t, Schedule schedule) { schedules_[checked_tier(t)] = std::move(schedule); }

 protected:
  explicit TierSettings(const PerTier<Hyperparameters>& per_tier) {
    for (Tier t : all_tiers) validate(per_tier[t], std::string(tier_name(t)));
    hyper_ = per_tier;
  }

  /// The hyperparameters of global step t: each tier's lr from its schedule,
  /// where it has one (checked: a schedule must give a finite lr >= 0).
  PerTier<Hyperparameters> hyperparameters_at(std::int64_t t_global) const {
    PerTier<Hyperparameters> h = hyper_;
    for (Tier t : all_tiers) {
      if (!schedules_[t]) continue;
      const double lr = schedules_[t](t_global);
      detail::check_lr(lr, "lr schedule of tier " + std::string(tier_name(t)) + " at step " + std::to_string(t_global));
      h[t].lr = lr;
    }
    return h;
  }

  bool has_schedule() const noexcept {
    for (Tier t : all_tiers)
      if (schedules_[t]) return true;
    return false;
  }

  PerTier<Hyperparameters> hyper_;
  PerTier<Schedule> schedules_;
};

}  // namespace skewadam
