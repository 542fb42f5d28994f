#pragma once
// The argument checks every CPU optimizer (Optimizer, dist::ShardedOptimizer)
// makes of what a caller hands it: a parameter view, its gradient, a
// learning rate, a gradient-norm bound. Each throws std::invalid_argument
// naming the argument and the problem, before anything has changed.

#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>

#include "dtype.hpp"
#include "tensor_view.hpp"

namespace skewadam::detail {

inline void check_lr(double lr, const std::string& what) {
  if (!(lr >= 0.0) || !std::isfinite(lr))
    throw std::invalid_argument(what + " = " + std::to_string(lr) + ": must be finite and >= 0");
}

inline void check_param(std::string_view name, const ParamView& p) {
  const std::string who = "param of '" + std::string(name) + "'";
  if (p.shape.rank() < 1) throw std::invalid_argument(who + ": shape has rank 0 (a view must have rank >= 1)");
  if (p.dtype != Dtype::f32 && p.dtype != Dtype::bf16 && p.dtype != Dtype::f16)
    throw std::invalid_argument(who + ": unknown dtype");
  if (p.data == nullptr && p.numel() > 0) throw std::invalid_argument(who + ": null data pointer");
}

inline void check_grad(std::string_view name, const ParamView& p, const GradView& g) {
  if (!g.present()) return;
  const std::string who = "grad of '" + std::string(name) + "'";
  if (!(g.shape == p.shape))
    throw std::invalid_argument(who + ": shape " + g.shape.str() + " does not match the parameter's " +
                                p.shape.str());
  if (g.dtype != Dtype::f32 && g.dtype != p.dtype)
    throw std::invalid_argument(who + ": dtype " + std::string(dtype_name(g.dtype)) +
                                " must be f32 or the parameter's dtype " + std::string(dtype_name(p.dtype)));
  if (g.data == nullptr && g.numel() > 0) throw std::invalid_argument(who + ": null data pointer");
}

/// A gradient-norm bound that every step applies (OptimizerOptions,
/// set_max_grad_norm, the adapters' options): 0 turns it off; anything else
/// must be finite and > 0. The one rule the LibTorch adapter and the Python
/// package hand their argument to.
inline double checked_max_grad_norm(double x, const std::string& what = "max_grad_norm") {
  if (x != 0.0 && (!(x > 0.0) || !std::isfinite(x)))
    throw std::invalid_argument(what + " = " + std::to_string(x) + ": must be finite and > 0 (0: off)");
  return x;
}

inline void check_max_norm(double max_norm) {
  if (!(max_norm > 0.0) || std::isnan(max_norm))
    throw std::invalid_argument("max_norm = " + std::to_string(max_norm) + ": must be > 0");
}

}  // namespace skewadam::detail
