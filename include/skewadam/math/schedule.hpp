#pragma once
// Learning-rate schedules (extension E5).

#include <cmath>
#include <cstdint>
#include <numbers>
#include <stdexcept>
#include <string>

namespace skewadam {

/// The paper's schedule: linear warm-up to peak_lr over warmup_steps, then
/// cosine decay to final_lr at total_steps (and final_lr after). Step t
/// counts from 1:
///   t <= W:      peak * t / W
///   W < t <= T:  final + (peak - final) * (1 + cos(pi * (t - W) / (T - W))) / 2
struct WarmupCosine {
  double peak_lr = 3e-4;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
  double final_lr = 0.0;

  void validate() const {
    if (!(peak_lr >= 0.0) || !std::isfinite(peak_lr))
      throw std::invalid_argument("WarmupCosine.peak_lr: must be finite and >= 0");
    if (!(final_lr >= 0.0) || !std::isfinite(final_lr))
      throw std::invalid_argument("WarmupCosine.final_lr: must be finite and >= 0");
    if (warmup_steps < 0) throw std::invalid_argument("WarmupCosine.warmup_steps: must be >= 0");
    if (total_steps < 1 || total_steps < warmup_steps)
      throw std::invalid_argument("WarmupCosine.total_steps = " + std::to_string(total_steps) +
                                  ": must be >= 1 and >= warmup_steps");
  }

  double operator()(std::int64_t t) const {
    if (t <= 0) return 0.0;
    if (t <= warmup_steps) return peak_lr * static_cast<double>(t) / static_cast<double>(warmup_steps);
    if (t >= total_steps) return final_lr;
    const double progress =
        static_cast<double>(t - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    return final_lr + (peak_lr - final_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
};

}  // namespace skewadam
