#pragma once
// Hyperparameters of one tier (docs/spec.md §3 and §5, extensions E3, E5).

#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>

namespace skewadam {

/// Scope of the update-RMS clip. `tensor` is the reference's (one RMS over the
/// whole tensor, for [E, r, c] all experts together); `matrix` (extension E3)
/// clips each [r, c] matrix by its own RMS, so a stacked bank behaves exactly
/// like E separate tensors.
enum class ClipScope : int { tensor = 0, matrix = 1 };

inline ClipScope parse_clip_scope(std::string_view s, std::string_view argument = "clip_scope") {
  if (s == "tensor") return ClipScope::tensor;
  if (s == "matrix" || s == "per_matrix") return ClipScope::matrix;
  throw std::invalid_argument(std::string(argument) + ": unknown clip scope '" + std::string(s) +
                              "' (expected tensor or matrix)");
}

/// Plain aggregate; reads well with designated initialisers:
///   skewadam::Hyperparameters{.lr = 3e-4, .weight_decay = 0.05}
/// Values are double: per-step coefficients are formed in double and rounded
/// to fp32 once, as the reference does.
struct Hyperparameters {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;  ///< floor under the second-moment estimate (AdamW: added to sqrt(v))
  double weight_decay = 0.0;
  double clip_threshold = 1.0;
  ClipScope clip_scope = ClipScope::tensor;
};

/// Throws std::invalid_argument naming the offending field (prefixed by
/// `where`, e.g. "experts.lr") when a value is NaN or out of range.
inline void validate(const Hyperparameters& h, std::string_view where = "hyperparameters") {
  auto fail = [&](std::string_view field, double value, std::string_view rule) {
    throw std::invalid_argument(std::string(where) + "." + std::string(field) + " = " +
                                std::to_string(value) + ": " + std::string(rule));
  };
  if (!(h.lr >= 0.0) || !std::isfinite(h.lr)) fail("lr", h.lr, "must be finite and >= 0");
  if (!(h.beta1 >= 0.0 && h.beta1 < 1.0)) fail("beta1", h.beta1, "must be in [0, 1)");
  if (!(h.beta2 >= 0.0 && h.beta2 < 1.0)) fail("beta2", h.beta2, "must be in [0, 1)");
  if (!(h.eps > 0.0) || !std::isfinite(h.eps)) fail("eps", h.eps, "must be finite and > 0");
  if (!(h.weight_decay >= 0.0) || !std::isfinite(h.weight_decay))
    fail("weight_decay", h.weight_decay, "must be finite and >= 0");
  if (!(h.clip_threshold > 0.0) || std::isnan(h.clip_threshold))
    fail("clip_threshold", h.clip_threshold, "must be > 0");
  if (h.clip_scope != ClipScope::tensor && h.clip_scope != ClipScope::matrix)
    throw std::invalid_argument(std::string(where) + ".clip_scope: unknown value");
}

}  // namespace skewadam
