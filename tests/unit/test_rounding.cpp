// Stochastic rounding (E1): unbiased, reproducible, independent of threads.

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "test_util.hpp"

namespace test_rounding {

using namespace skewadam;

namespace {

template <class T>
void check_unbiased(float x) {
  const RoundingKey key{42, 7, 1};
  const T lo = round_nearest<T>(x);  // one of the neighbours
  double sum = 0;
  const int n = 200000;
  float a = NAN, b = NAN;
  for (int i = 0; i < n; ++i) {
    const float y = to_float(StochasticRounding::store<T>(x, random_bits(key, i)));
    if (std::isnan(a) || y == a) a = y;
    else if (std::isnan(b) || y == b) b = y;
    else FAIL("more than two rounding results");
    sum += y;
  }
  (void)lo;
  const double mean = sum / n;
  const double spacing = std::fabs(static_cast<double>(a) - static_cast<double>(std::isnan(b) ? a : b));
  CAPTURE(x);
  // E[round(x)] = x: the sample mean is within 5 standard errors.
  CHECK(std::fabs(mean - x) <= 5 * spacing / (2 * std::sqrt(static_cast<double>(n))) + 1e-12);
  CHECK(std::min(a, std::isnan(b) ? a : b) <= x);
  CHECK(std::max(a, std::isnan(b) ? a : b) >= x);
}

}  // namespace

TEST_CASE("stochastic rounding is unbiased for bf16 and fp16") {
  for (float x : {1.00390625f + 1e-3f, -3.14159f, 1e-3f, 123.456f, 1e-30f})
    check_unbiased<bf16>(x);
  for (float x : {1.0f + 3e-4f, -3.14159f, 1e-3f, 1000.1f, 3e-6f /* fp16 subnormal */, -2e-7f})
    check_unbiased<f16>(x);
}

TEST_CASE("stochastic rounding keeps representable values, NaN and infinities") {
  for (std::uint32_t r : {0u, 0x7fffu, 0xffffu}) {
    CHECK(to_float(StochasticRounding::store<bf16>(1.5f, r)) == 1.5f);
    CHECK(to_float(StochasticRounding::store<f16>(-0.25f, r)) == -0.25f);
    CHECK(std::isnan(to_float(StochasticRounding::store<bf16>(NAN, r))));
    CHECK(std::isnan(to_float(StochasticRounding::store<f16>(NAN, r))));
    CHECK(to_float(StochasticRounding::store<bf16>(INFINITY, r)) == INFINITY);
    CHECK(to_float(StochasticRounding::store<f16>(-INFINITY, r)) == -INFINITY);
    CHECK(to_float(StochasticRounding::store<f16>(1e6f, r)) == 65504.0f);  // saturates beyond the largest finite
    CHECK(StochasticRounding::store<float>(0.1f, r) == 0.1f);
  }
}

TEST_CASE("one Philox block serves eight elements, 16 bits each") {
  const RoundingKey k{0x0123456789abcdefULL, tensor_id("experts.w1"), (std::uint64_t{5} << 32) + 17};
  for (index_t block : {index_t{0}, index_t{1}, index_t{1000}, (index_t{1} << 33) + 3}) {
    r123::Philox4x32 gen;
    const r123::Philox4x32::ctr_type ctr = {{static_cast<std::uint32_t>(block),
                                            static_cast<std::uint32_t>(static_cast<std::uint64_t>(block) >> 32), 17u,
                                            tensor_id("experts.w1") ^ 5u}};
    const r123::Philox4x32::ctr_type w = gen(ctr, {{0x89abcdefu, 0x01234567u}});
    CAPTURE(block);
    for (index_t e = 0; e < 8; ++e) {
      const std::uint32_t word = w.v[e % 4];
      CHECK(random_bits(k, 8 * block + e) == (e < 4 ? word & 0xffffu : word >> 16));
    }
  }
  // the 16 bits are uniform: every bit position is set about half the time
  std::array<int, 16> ones{};
  const int n = 1 << 16;
  for (index_t e = 0; e < n; ++e)
    for (int b = 0; b < 16; ++b) ones[b] += (random_bits(k, e) >> b) & 1u;
  for (int b = 0; b < 16; ++b) {
    CAPTURE(b);
    CHECK(std::abs(ones[b] - n / 2) < 5 * 128);  // 5 standard deviations (sqrt(n / 4) = 128)
  }
  bool below = true;
  for (index_t e = 0; e < 4096; ++e) below = below && random_bits(k, e) < 0x10000u;
  CHECK(below);
}

TEST_CASE("random bits depend only on seed, tensor, step and element") {
  const RoundingKey k{1, 2, 3};
  CHECK(random_bits(k, 5) == random_bits(k, 5));
  CHECK(random_bits(k, 5) != random_bits(k, 6));
  CHECK(random_bits(k, 5) != random_bits(RoundingKey{1, 2, 4}, 5));
  CHECK(random_bits(k, 5) != random_bits(RoundingKey{1, 9, 3}, 5));
  CHECK(random_bits(k, 5) != random_bits(RoundingKey{8, 2, 3}, 5));
  RandomStream s(k);
  for (index_t e : {0, 1, 2, 3, 4, 9, 10, 3}) CHECK(s(e) == random_bits(k, e));
  // 64-bit element indices
  const index_t big = (index_t{1} << 33) + 5;
  CHECK(random_bits(k, big) != random_bits(k, 5));
  CHECK(tensor_id("experts.w1") == tensor_id("experts.w1"));
  CHECK(tensor_id("experts.w1") != tensor_id("experts.w2"));
}

TEST_CASE("nearest rounding is round-to-nearest-even") {
  CHECK(bits_of(NearestRounding::store<bf16>(1.00390625f, 0)) == 0x3f80);  // tie to even
  CHECK(bits_of(NearestRounding::store<bf16>(1.01171875f, 0)) == 0x3f82);  // tie to even (up)
}

TEST_CASE("bf16 steps are bit-identical for 1, 2 and 3 threads") {
  auto run = [](int threads) {
    std::vector<bf16> w(70000), e(3 * 64 * 48);
    const auto r1 = testutil::random_vector(static_cast<index_t>(w.size()), 3);
    const auto r2 = testutil::random_vector(static_cast<index_t>(e.size()), 4);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = bf16(r1[i]);
    for (std::size_t i = 0; i < e.size(); ++i) e[i] = bf16(r2[i]);
    std::vector<bf16> gw(w.size()), ge(e.size());
    SkewAdam opt(Hyperparameters{.lr = 1e-2, .weight_decay = 0.05}, OptimizerOptions{.seed = 9, .threads = threads});
    opt.add("backbone.w", Tier::backbone, TensorView<bf16>(w.data(), {350, 200}), TensorView<const bf16>(gw.data(), {350, 200}));
    opt.add("experts.w", Tier::experts, TensorView<bf16>(e.data(), {3, 64, 48}), TensorView<const bf16>(ge.data(), {3, 64, 48}));
    for (int k = 0; k < 3; ++k) {
      const auto g1 = testutil::random_vector(static_cast<index_t>(w.size()), 10 + static_cast<std::uint32_t>(k));
      const auto g2 = testutil::random_vector(static_cast<index_t>(e.size()), 20 + static_cast<std::uint32_t>(k));
      for (std::size_t i = 0; i < w.size(); ++i) gw[i] = bf16(g1[i]);
      for (std::size_t i = 0; i < e.size(); ++i) ge[i] = bf16(g2[i]);
      opt.step();
    }
    auto out = testutil::bits(w);
    auto more = testutil::bits(e);
    out.insert(out.end(), more.begin(), more.end());
    return out;
  };
  const auto one = run(1);
  CHECK(run(2) == one);
  CHECK(run(3) == one);
}

TEST_CASE("fused weight decay decays bf16 parameters where a separate bf16 decay is a no-op") {
  // lr * wd = 1.5e-5 is far below bf16's resolution (2^-8 relative at 1.0):
  // decaying in bf16 then rounding to nearest leaves the weight unchanged.
  const float lr = 3e-4f, wd = 0.05f;
  const bf16 w0(1.0f);
  CHECK(to_float(bf16(to_float(w0) * (1.0f - lr * wd))) == 1.0f);

  // With zero gradients, the library's step is pure decay, fused before one
  // stochastic rounding: over many elements the mean follows the fp32 decay.
  const index_t n = 1 << 16;
  std::vector<bf16> w(static_cast<std::size_t>(n), w0);
  std::vector<float> g(static_cast<std::size_t>(n), 0.0f);
  SkewAdam opt(Hyperparameters{.lr = lr, .weight_decay = wd});
  opt.add("experts.w", Tier::experts, TensorView<bf16>(w.data(), {256, 256}), TensorView<const float>(g.data(), {256, 256}));
  const int steps = 20;
  for (int k = 0; k < steps; ++k) opt.step();
  double mean = 0;
  for (auto x : w) mean += to_float(x);
  mean /= static_cast<double>(n);
  const double expected = std::pow(1.0 - static_cast<double>(lr) * wd, steps);
  CHECK(mean < 1.0);
  CHECK(std::fabs(mean - expected) < 2e-5);

  // The same with round-to-nearest on store: decay is lost entirely.
  using NearestExperts = ExpertRule::with_rounding<NearestRounding>;
  Optimizer<TierRules<BackboneRule, NearestExperts, RouterRule>> nearest(Hyperparameters{.lr = lr, .weight_decay = wd});
  std::vector<bf16> w2(static_cast<std::size_t>(n), w0);
  nearest.add("experts.w", Tier::experts, TensorView<bf16>(w2.data(), {256, 256}), TensorView<const float>(g.data(), {256, 256}));
  for (int k = 0; k < steps; ++k) nearest.step();
  CHECK(to_float(w2[0]) == 1.0f);
}

}  // namespace test_rounding
