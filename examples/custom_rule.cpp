// Writing a new policy and a new rule without touching the library.
//
// A policy is a struct with the hooks its slot needs (the null policy of each
// slot documents them: policies/no_momentum.hpp, exact_second_moment.hpp,
// no_update_clip.hpp, nearest_rounding.hpp). Its math is a template over the
// value type V, so the same code runs in scalar loops and in SIMD batches.
// A rule is UpdateRule<Momentum, SecondMoment, Clip, Rounding>; an optimizer
// variant is a TierRules alias.

#include <cstdio>
#include <vector>

#include <skewadam/skewadam.hpp>

// Nesterov-style momentum: the numerator looks one step ahead,
//   u = (beta1 m' + (1 - beta1) g) * sqrt(1 - beta2^t) / (1 - beta1^t).
// State: m, like FullMomentum. It needs g in the apply pass too.
struct NesterovMomentum {
  static constexpr bool has_state = true;
  static constexpr bool numerator_reads_grad = true;

  template <class V>
  static V update(const V& m, const V& g, const skewadam::StepScalars& s) {
    return skewadam::vmath::splat<V>(s.beta1) * m + skewadam::vmath::splat<V>(s.one_minus_beta1) * g;
  }
  template <class V>
  static V numerator(const V& g, const V& m, const skewadam::StepScalars& s) {
    using skewadam::vmath::splat;
    return (splat<V>(s.beta1) * m + splat<V>(s.one_minus_beta1) * g) * splat<V>(s.momentum_scale);
  }
};

// A rule from the new policy and the library's factored second moment, and
// an optimizer variant that uses it for the backbone only.
using NesterovBackbone = skewadam::UpdateRule<NesterovMomentum, skewadam::FactoredSecondMoment>;
using MyTiers = skewadam::TierRules<NesterovBackbone, skewadam::ExpertRule, skewadam::RouterRule>;
using MyOptimizer = skewadam::Optimizer<MyTiers>;

// Recombining the library's own parts is one line each, e.g. experts with an
// exact second moment and no clipping:
using ExactExperts = skewadam::UpdateRule<skewadam::NoMomentum, skewadam::ExactSecondMoment, skewadam::NoUpdateClip>;

int main() {
  std::vector<float> w(256 * 64, 0.02f), g(256 * 64);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.001f * static_cast<float>(i % 17) - 0.008f;

  MyOptimizer opt(skewadam::Hyperparameters{.lr = 1e-3, .weight_decay = 0.05});
  opt.add("attn.q", skewadam::Tier::backbone, skewadam::TensorView<float>(w.data(), {256, 64}),
          skewadam::TensorView<const float>(g.data(), {256, 64}));
  for (int step = 0; step < 10; ++step) opt.step();

  std::printf("Nesterov backbone rule: w[1] = %.6f after 10 steps, state %lld bytes (m + R + C)\n",
              static_cast<double>(w[1]), static_cast<long long>(opt.state_bytes()));
  static_assert(ExactExperts::layout == skewadam::StateLayout{false, false});
  return opt.state_bytes() == 4 * (256 * 64 + 256 + 64) ? 0 : 1;
}
