#pragma once
// The optimizer variants the library names, listed once. Everything that
// names them is made from this list: the aliases skewadam::SkewAdam, ...
// (optimizer.hpp) and skewadam::libtorch::SkewAdam, ... (torch/optimizer.hpp),
// the Python classes (python/src/module.cpp), the CUDA engines LibTorch and
// Python register (torch/cuda.cuh) and the emulated ones of the tests. A
// variant added here is one everywhere, on every backend.

#include <string_view>

#include "tier_rules.hpp"

namespace skewadam {

/// X(Name, Tiers, Doc) for every variant, in the order the Python package
/// lists them: Name is the alias's name in every language, Tiers its
/// TierRules, Doc one sentence saying what it is.
#define SKEWADAM_VARIANTS(X)                                                                                          \
  X(SkewAdam, SkewAdamTiers,                                                                                          \
    "SkewAdam: backbone momentum + factored second moment, experts factored only, router exact.")                     \
  X(SkewAdamBf16Momentum, SkewAdamBf16Tiers,                                                                          \
    "SkewAdam with the backbone's momentum stored in bf16, stochastically rounded (half its bytes); its "             \
    "param_state's m holds the stored words, flat.")                                                                  \
  X(SkewAdam8bit, SkewAdam8bitTiers,                                                                                  \
    "SkewAdam with the backbone's momentum stored in 8 bits, an fp32 scale per block of 256 elements (a little "      \
    "over a quarter of its bytes); its param_state's m holds the stored words, flat.")                                \
  X(ExpertMomentumAblation, ExpertMomentumTiers, "The paper's ablation: the experts keep momentum too.")              \
  X(FactoredRouterAblation, FactoredRouterTiers, "The paper's ablation: the router's second moment is factored.")     \
  X(ExactExpertsAblation, ExactExpertsTiers,                                                                          \
    "The experts keep momentum and an exact second moment (AdamW's state).")                                          \
  X(UniformAblation, UniformTiers, "The paper's ablation: momentum + factored second moment everywhere.")             \
  X(AdafactorLike, AdafactorTiers, "No momentum anywhere, factored second moment (Adafactor-like).")                  \
  X(AdamW, AdamWTiers,                                                                                                \
    "AdamW from the library's parts: momentum, exact second moment, eps added to sqrt(v), no update clipping "        \
    "(clip_threshold is ignored).")

/// A list of TierRules variants.
template <class... Tiers>
struct VariantList {
  /// f.template operator()<Tiers>() for each, in order.
  template <class F>
  static constexpr void for_each(F&& f) {
    (f.template operator()<Tiers>(), ...);
  }
};

/// What the list says of one variant: its name and what it is.
template <class Tiers>
struct Variant;

#define SKEWADAM_VARIANT_(NAME, TIERS, DOC)            \
  template <>                                          \
  struct Variant<TIERS> {                              \
    static constexpr std::string_view name = #NAME;    \
    static constexpr std::string_view doc = DOC;       \
  };
SKEWADAM_VARIANTS(SKEWADAM_VARIANT_)
#undef SKEWADAM_VARIANT_

namespace detail {
template <class List>
struct drop_first;
template <class First, class... Rest>
struct drop_first<VariantList<First, Rest...>> {
  using type = VariantList<Rest...>;
};
}  // namespace detail

/// Every variant the library names.
#define SKEWADAM_VARIANT_TIERS_(NAME, TIERS, DOC) , TIERS
using Variants = detail::drop_first<VariantList<void SKEWADAM_VARIANTS(SKEWADAM_VARIANT_TIERS_)>>::type;
#undef SKEWADAM_VARIANT_TIERS_

}  // namespace skewadam

/// `using Name = Optimizer<Tiers>;` for every variant, where it is expanded:
/// the aliases of the optimizer front-end of that namespace.
#define SKEWADAM_VARIANT_ALIAS_(NAME, TIERS, DOC) using NAME = Optimizer<TIERS>;
#define SKEWADAM_VARIANT_ALIASES() SKEWADAM_VARIANTS(SKEWADAM_VARIANT_ALIAS_)
