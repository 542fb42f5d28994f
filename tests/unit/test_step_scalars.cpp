// The per-step scalars (step_scalars.hpp): beta^t by binary powering, the
// same bits on the host and the device, and std::pow's fp32 scalars.
//
// This file is compiled with the tests' flags (-march=native, GCC's default
// -ffp-contract=fast): the scalars must not depend on contraction either.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <skewadam/math/step_scalars.hpp>

namespace test_step_scalars {

using namespace skewadam;

/// The scalars as they were formed with the C library's pow.
StepScalars with_pow(const Hyperparameters& h, std::int64_t t) {
  StepScalars s = make_step_scalars(h, t);
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
  s.momentum_scale = static_cast<float>(std::sqrt(bc2) / bc1);
  s.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  s.eps_sqrt_bc2 = static_cast<float>(h.eps * std::sqrt(bc2));
  return s;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST_CASE("step scalars: beta^t by binary powering, exact for powers of two and small integers") {
  CHECK(detail::power(0.9, 0) == 1.0);
  CHECK(detail::power(0.9, 1) == 0.9);
  CHECK(detail::power(0.5, 60) == std::ldexp(1.0, -60));
  CHECK(detail::power(3.0, 33) == 5559060566555523.0);  // 3^33 < 2^53: exact
  CHECK(detail::power(-2.0, 7) == -128.0);
  CHECK(detail::power(0.999, std::int64_t{1} << 40) == 0.0);  // underflows, no endless loop
}

TEST_CASE("step scalars: std::pow's fp32 scalars for every t in 1..10^6 and the usual betas") {
  // Where 1 - beta^t is the same double both ways, everything formed from it
  // is too (the same operations follow). So: find every (beta, t) where it
  // is not, and compare the scalars of every (beta1, beta2) pair there. Over
  // this grid the doubles differ at a handful of points, by one unit in the
  // last place of beta^t; the fp32 scalars at none.
  const double betas[] = {0.9, 0.95, 0.98, 0.99, 0.999, 0.9999};
  constexpr std::int64_t last = 1'000'000;
  std::vector<std::int64_t> differ;  // steps where some beta's 1 - beta^t differs
  long doubles_differ = 0;
  for (std::int64_t t = 1; t <= last; ++t) {
    bool any = false;
    for (double b : betas) {
      const double mine = 1.0 - detail::power(b, t);
      const double theirs = 1.0 - std::pow(b, static_cast<double>(t));
      if (mine != theirs) {
        any = true;
        ++doubles_differ;
        // beta^t in [0, 1) differs by at most one unit in its last place,
        // 2^-53, which 1 - beta^t keeps exactly
        CHECK(std::fabs(mine - theirs) <= std::ldexp(1.0, -53));
      }
    }
    if (any) differ.push_back(t);
  }
  MESSAGE(doubles_differ, " (beta, t) of 6,000,000 where 1 - beta^t differs from std::pow's (by one ulp of beta^t)");
  CHECK(doubles_differ < 1000);
  long compared = 0;
  for (std::int64_t t : differ)
    for (double b1 : betas)
      for (double b2 : betas)
        for (double eps : {1e-8, 1e-30}) {
          const Hyperparameters h{.lr = 1e-3, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = 0.1};
          const StepScalars a = make_step_scalars(h, t), b = with_pow(h, t);
          CAPTURE(t);
          CAPTURE(b1);
          CAPTURE(b2);
          CHECK(same_bits(a.momentum_scale, b.momentum_scale));
          CHECK(same_bits(a.sqrt_bc2, b.sqrt_bc2));
          CHECK(same_bits(a.eps_sqrt_bc2, b.eps_sqrt_bc2));
          ++compared;
        }
  CHECK(compared == static_cast<long>(differ.size()) * 72);
  // and a sample of every pair elsewhere, the whole struct
  for (std::int64_t t = 1; t <= last; t += 997)
    for (double b1 : betas)
      for (double b2 : betas) {
        const Hyperparameters h{.beta1 = b1, .beta2 = b2};
        const StepScalars a = make_step_scalars(h, t), b = with_pow(h, t);
        CHECK(std::memcmp(&a, &b, sizeof a) == 0);
      }
}

TEST_CASE("step scalars: the weight-decay factor is never contracted into a fused multiply-add") {
  // 1 - lr * wd with lr * wd rounded first, as the device forms it
  // (-fmad=false, __dmul_rn), whatever this file's contraction setting; a
  // fused 1 - lr * wd differs in the last place for some of these values
  long fused_differs = 0;
  for (int k = 1; k <= 20000; ++k) {
    const double lr = 1e-4 * (1.0 + k * 1e-3), wd = 0.1 + k * 1e-5;
    volatile double p = lr * wd;
    const double unfused = 1.0 - p;
    CHECK(1.0 - detail::rounded_product(lr, wd) == unfused);
    if (std::fma(-lr, wd, 1.0) != unfused) ++fused_differs;
  }
  CHECK(fused_differs > 0);  // so the check above can fail
}

}  // namespace test_step_scalars
