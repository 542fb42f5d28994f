#pragma once
// From run-time facts about a tensor to the compile-time types its kernels are
// instantiated on: the rule its tier follows, its parameter and gradient
// dtypes. The engine picks every backend's kernels through these functions.
//
//   const Table* k = visit_rule<Tiers>(tier, rank1, [&]<class Rule>() {
//     return visit_dtypes(param_dtype, grad_dtype, []<class P, class G>() { return table<Rule, P, G>(); });
//   });
//
// Each visit instantiates its callable for every alternative: a caller that
// knows a type at compile time passes it instead of visiting.

#include <type_traits>
#include <utility>

#include "dtype.hpp"
#include "tier.hpp"

namespace skewadam {

/// Calls f.template operator()<Rule>() with the rule Tiers gives tier t, or
/// that rule's rank1_rule for a rank-1 tensor (a vector is never factored).
template <class Tiers, class F>
decltype(auto) visit_rule(Tier t, bool rank1, F&& f) {
  auto with = [&]<class Rule>() -> decltype(auto) {
    if constexpr (!std::is_same_v<Rule, typename Rule::rank1_rule>) {
      if (rank1) return f.template operator()<typename Rule::rank1_rule>();
    }
    return f.template operator()<Rule>();
  };
  switch (t) {
    case Tier::experts: return with.template operator()<typename Tiers::experts>();
    case Tier::router: return with.template operator()<typename Tiers::router>();
    case Tier::backbone: break;
  }
  return with.template operator()<typename Tiers::backbone>();
}

/// Calls f.template operator()<T>() with the element type of dtype d.
template <class F>
decltype(auto) visit_dtype(Dtype d, F&& f) {
  switch (d) {
    case Dtype::bf16: return f.template operator()<bf16>();
    case Dtype::f16: return f.template operator()<f16>();
    case Dtype::f32: break;
  }
  return f.template operator()<float>();
}

/// Calls f.template operator()<P, G>() with the element types of a parameter
/// of dtype p and its gradient of dtype g (f32, or p itself).
template <class F>
decltype(auto) visit_dtypes(Dtype p, Dtype g, F&& f) {
  switch (p) {
    case Dtype::bf16:
      if (g == Dtype::f32) return f.template operator()<bf16, float>();
      return f.template operator()<bf16, bf16>();
    case Dtype::f16:
      if (g == Dtype::f32) return f.template operator()<f16, float>();
      return f.template operator()<f16, f16>();
    case Dtype::f32: break;
  }
  return f.template operator()<float, float>();
}

}  // namespace skewadam
