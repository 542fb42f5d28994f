#pragma once
// From run-time facts about a tensor to the compile-time types its kernels are
// instantiated on: the rule its tier follows, its parameter's dtype. The
// front-end (Optimizer::add) picks a tensor's kernels through these functions,
// both gradient dtypes' for its parameter dtype:
//
//   const auto k = visit_rule<Tiers>(tier, rank1, [&]<class Rule>() {
//     return visit_dtype(param_dtype, []<class P>() { return pair{table<Rule, P, P>(), table<Rule, P, float>()}; });
//   });
//
// Each visit instantiates its callable for every alternative: a caller that
// knows a type at compile time passes it instead of visiting.

#include <type_traits>
#include <utility>

#include "../types/dtype.hpp"
#include "../types/tier.hpp"

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

}  // namespace skewadam
