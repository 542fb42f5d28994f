// Rule aliases: tier presets, ablations, AdamW; and a user-defined policy
// plugged in without touching the library.

#include <doctest/doctest.h>

#include <cmath>

#include "test_util.hpp"

namespace test_rules {

using namespace skewadam;

static_assert(BackboneRule::layout == layouts::backbone);
static_assert(ExpertRule::layout == layouts::experts);
static_assert(RouterRule::layout == layouts::router);
static_assert(AdamWRule::layout == layouts::adamw);
static_assert(std::is_same_v<ExpertMomentumTiers::experts, BackboneRule>);
static_assert(std::is_same_v<FactoredRouterTiers::router, AdafactorRule>);
static_assert(UniformTiers::layout(Tier::router) == layouts::backbone);
static_assert(AdafactorTiers::layout(Tier::backbone) == layouts::adafactor);
static_assert(ExactExpertsTiers::layout(Tier::experts) == layouts::adamw);
static_assert(std::is_same_v<ExpertRule::rank1_rule, RouterRule>);
static_assert(std::is_same_v<BackboneRule::with_rounding<NearestRounding>::rounding, NearestRounding>);

namespace {

// One hand-checked first step on a 2 x 2 matrix with g = [[1, 2], [3, 4]],
// beta1 0.9, beta2 0.999, eps 1e-8, lr 0.1, no weight decay, no clipping
// (clip threshold large).
//
// Factored: R = 0.001 * [2.5, 12.5], C = 0.001 * [5, 10], vbar = 0.0075,
// row = sqrt(R / vbar) = [sqrt(1/3), sqrt(5/3)], col = sqrt(C).
// Numerator without momentum: g * sqrt(0.001); with momentum at t = 1 the
// same (m = 0.1 g, scaled by sqrt(0.001) / 0.1).
double factored_update(int i, int j) {
  const double g[2][2] = {{1, 2}, {3, 4}};
  const double row[2] = {std::sqrt(1.0 / 3.0), std::sqrt(5.0 / 3.0)};
  const double col[2] = {std::sqrt(0.005), std::sqrt(0.010)};
  return g[i][j] * std::sqrt(0.001) / (row[i] * col[j]);
}
// Exact: V = 0.001 g^2, d = sqrt(0.001) |g|, u = sign(g) = 1.
// AdamW: u = (0.1 g / 0.1) / (sqrt(0.001 g^2 / 0.001) + eps) = g / (|g| + eps).

template <class Rule>
std::vector<float> one_step() {
  std::vector<float> p = {0, 0, 0, 0};
  const std::vector<float> g = {1, 2, 3, 4};
  Optimizer<TierRules<Rule, Rule, Rule>> opt(Hyperparameters{.lr = 0.1, .clip_threshold = 1e6});
  opt.add("p", Tier::backbone, TensorView<float>(p.data(), {2, 2}), TensorView<const float>(g.data(), {2, 2}));
  opt.step();
  return p;
}

}  // namespace

TEST_CASE("every rule alias on a hand-checked step") {
  for (auto p : {one_step<BackboneRule>(), one_step<ExpertRule>(), one_step<UniformRule>(), one_step<AdafactorRule>()})
    for (int k = 0; k < 4; ++k) CHECK(p[static_cast<std::size_t>(k)] == doctest::Approx(-0.1 * factored_update(k / 2, k % 2)).epsilon(1e-5));
  for (auto p : {one_step<RouterRule>(), one_step<ExactMomentumRule>()})
    for (float x : p) CHECK(x == doctest::Approx(-0.1).epsilon(1e-5));
  const auto a = one_step<AdamWRule>();
  for (int k = 0; k < 4; ++k) CHECK(a[static_cast<std::size_t>(k)] == doctest::Approx(-0.1 * (k + 1) / (k + 1 + 1e-8)).epsilon(1e-6));
}

TEST_CASE("update clipping caps the update RMS at the threshold") {
  std::vector<float> p(64, 0.0f);
  const auto g = testutil::random_vector(64, 5);
  Optimizer<TierRules<RouterRule, RouterRule, RouterRule>> opt(Hyperparameters{.lr = 1.0, .clip_threshold = 0.25});
  opt.add("p", Tier::router, TensorView<float>(p.data(), {8, 8}), TensorView<const float>(g.data(), {8, 8}));
  opt.step();
  double ss = 0;
  for (float x : p) ss += static_cast<double>(x) * x;
  CHECK(std::sqrt(ss / 64) == doctest::Approx(0.25).epsilon(1e-5));  // |u| = 1 everywhere, clipped to RMS 0.25
}

// A new policy written outside the library: sign-momentum numerator (Lion-like).
struct SignMomentum {
  static constexpr bool has_state = true;
  static constexpr bool numerator_reads_grad = false;
  template <class V>
  static V update(const V& m, const V& g, const StepScalars& s) {
    return vmath::splat<V>(s.beta1) * m + vmath::splat<V>(s.one_minus_beta1) * g;
  }
  template <class V>
  static V numerator(const V& /*g*/, const V& m, const StepScalars& /*s*/) {
    // |m| / m without branches: m / sqrt(m^2), with a floor against 0/0
    return m / vmath::sqrt(vmath::floor_at(m * m, vmath::splat<V>(1e-30f)));
  }
};

TEST_CASE("a user-defined policy plugs into a rule") {
  using SignRule = UpdateRule<SignMomentum, ExactSecondMoment, NoUpdateClip>;
  static_assert(MomentumPolicy<SignMomentum>);
  std::vector<float> p = {0, 0, 0, 0};
  const std::vector<float> g = {1, -2, 3, -4};
  Optimizer<TierRules<SignRule, SignRule, SignRule>> opt(Hyperparameters{.lr = 0.5, .eps = 1.0});
  opt.add("p", Tier::backbone, TensorView<float>(p.data(), {4}), TensorView<const float>(g.data(), {4}));
  opt.step();
  // V = 0.001 g^2 < eps = 1, so d = 1 and u = sign(g)
  CHECK(p == std::vector<float>{-0.5f, 0.5f, -0.5f, 0.5f});
  CHECK(opt.state_bytes() == 4 * 4 * 2);
}

}  // namespace test_rules
