// Each policy's math on hand-checked values, and the per-step scalars.

#include <doctest/doctest.h>

#include <cmath>

#include <skewadam/skewadam.hpp>

namespace test_policies {

using namespace skewadam;

TEST_CASE("step scalars are formed in double and rounded once") {
  const Hyperparameters h{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.9999, .eps = 1e-8, .weight_decay = 0.05};
  const StepScalars s = make_step_scalars(h, 3);
  CHECK(s.step == 3);
  CHECK(s.one_minus_beta2 == static_cast<float>(1.0 - 0.9999));
  // Forming 1 - beta2 in fp32 from beta2 = 0.9999f is off by about 1.7e-4 relative.
  CHECK(std::fabs(1.0f - 0.9999f - s.one_minus_beta2) / s.one_minus_beta2 > 1e-4);
  const double bc1 = 1 - std::pow(0.9, 3), bc2 = 1 - std::pow(0.9999, 3);
  CHECK(s.momentum_scale == static_cast<float>(std::sqrt(bc2) / bc1));
  CHECK(s.sqrt_bc2 == static_cast<float>(std::sqrt(bc2)));
  CHECK(s.decay == static_cast<float>(1.0 - 0.01 * 0.05));
  CHECK(make_step_scalars(Hyperparameters{}, 1).decay == 1.0f);  // weight_decay 0: exact identity
}

TEST_CASE("momentum policies") {
  const StepScalars s = make_step_scalars(Hyperparameters{.beta1 = 0.9, .beta2 = 0.999}, 1);
  // t = 1: m = 0.1 g, u = m * sqrt(1 - 0.999) / (1 - 0.9) = g * sqrt(0.001)
  const float m = FullMomentum::update(0.0f, 2.0f, s);
  CHECK(m == doctest::Approx(0.2f));
  CHECK(FullMomentum::numerator(99.0f, m, s) == doctest::Approx(2.0 * std::sqrt(0.001)).epsilon(1e-6));
  CHECK(FullMomentum::update(1.0f, 0.0f, s) == doctest::Approx(0.9f));
  CHECK(NoMomentum::numerator(2.0f, 99.0f, s) == doctest::Approx(2.0 * std::sqrt(0.001)).epsilon(1e-6));
  CHECK(NoMomentum::update(5.0f, 2.0f, s) == 5.0f);
  CHECK_FALSE(NoMomentum::has_state);
  CHECK(FullMomentum::has_state);
}

TEST_CASE("exact second moment: update and eps as a floor") {
  const StepScalars s = make_step_scalars(Hyperparameters{.beta2 = 0.99, .eps = 1e-8}, 1);
  CHECK(ExactSecondMoment::update(1.0f, 4.0f, s) == doctest::Approx(0.99 + 0.04));
  CHECK(ExactSecondMoment::denominator(4.0f, s) == 2.0f);
  CHECK(ExactSecondMoment::denominator(0.0f, s) == doctest::Approx(1e-4));  // sqrt(eps)
  CHECK(std::isnan(ExactSecondMoment::denominator(NAN, s)));                // NaN is not hidden by the floor
}

TEST_CASE("Adam second moment adds eps to sqrt(v)") {
  const StepScalars s = make_step_scalars(Hyperparameters{.beta2 = 0.999, .eps = 1e-3}, 1);
  CHECK(AdamSecondMoment::denominator(4.0f, s) == doctest::Approx(2.0 + 1e-3 * std::sqrt(0.001)));
  CHECK(AdamSecondMoment::denominator(0.0f, s) == doctest::Approx(1e-3 * std::sqrt(0.001)));
}

TEST_CASE("factored second moment statistics and factors") {
  const StepScalars s = make_step_scalars(Hyperparameters{.beta2 = 0.5, .eps = 1e-8}, 1);
  CHECK(FactoredSecondMoment::update_statistic(2.0f, 4.0f, s) == 3.0f);
  CHECK(FactoredSecondMoment::vbar(0.0f) == 1e-15f);
  CHECK(FactoredSecondMoment::vbar(2.0f) == 2.0f);
  CHECK(FactoredSecondMoment::row_factor(8.0f, 2.0f, s) == 2.0f);
  CHECK(FactoredSecondMoment::row_factor(0.0f, 2.0f, s) == doctest::Approx(1e-4));
  CHECK(FactoredSecondMoment::row_floored(1e-9f, 1.0f, s));
  CHECK_FALSE(FactoredSecondMoment::row_floored(1e-7f, 1.0f, s));
  CHECK(FactoredSecondMoment::col_factor(9.0f, s) == 3.0f);
  CHECK(FactoredSecondMoment::denominator(2.0f, 3.0f) == 6.0f);
}

TEST_CASE("RMS update clip divisor") {
  const StepScalars s = make_step_scalars(Hyperparameters{.clip_threshold = 0.5}, 1);
  // rms = sqrt(16 / 4) = 2, divisor = 2 / 0.5 = 4
  CHECK(RmsUpdateClip::divisor(16.0, 4, s) == 4.0f);
  CHECK(RmsUpdateClip::divisor(0.04, 4, s) == 1.0f);  // rms 0.1 < 0.5: no clipping
  CHECK(std::isnan(RmsUpdateClip::divisor(NAN, 4, s)));
  CHECK(NoUpdateClip::divisor(1e9, 1, s) == 1.0f);
}

TEST_CASE("warm-up + cosine schedule") {
  const WarmupCosine w{.peak_lr = 3e-2, .warmup_steps = 4, .total_steps = 40};
  CHECK(w(1) == doctest::Approx(0.0075));
  CHECK(w(4) == doctest::Approx(0.03));
  CHECK(w(22) == doctest::Approx(0.015));
  CHECK(w(40) == 0.0);
  CHECK(w(50) == 0.0);
  CHECK_THROWS_WITH_AS((WarmupCosine{.warmup_steps = 5, .total_steps = 4}.validate()),
                       doctest::Contains("total_steps"), std::invalid_argument);
}

}  // namespace test_policies
