// The two 8-bit maps of stored momentum (docs/spec.md E7), measured through
// the optimizer on a heavy-tailed fixture: blocks of 256 whose largest entry
// is one outlier column and whose other entries spread log-uniformly over
// seven decades below it.
//   - the float8 codes' expectation is the rounded value exactly, over every
//     value of the random bits;
//   - the relative RMS error of the stored momentum by decade below the
//     block's largest value: Float8BlockMomentum at most 10 % from 10^-5 to
//     1; the linear map over 100 % at 10^-3 (a value under one code step is
//     stored as 0 or one step);
//   - bias: the mean of err * sign(m) in units of each element's rounding
//     step is below 1e-3 for both maps, and the same statistic on the same
//     values catches truncation toward zero and a 5 % shrink;
//   - NaN and +-inf in m under NonFinitePolicy::unchecked store the bytes E7
//     names, the same on every CPU level.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <skewadam/rules/decode_momentum.hpp>
#include <skewadam/skewadam.hpp>

#include "cpu_archs.hpp"
#include "stored_momentum_fixture.hpp"

namespace test_stored_momentum_maps {

namespace {

using namespace skewadam;

constexpr index_t rows = 512;
constexpr index_t cols = 1024;  // four blocks of 256 per row
constexpr int steps = 8;

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

/// Element i of the fixture: in each block of 256, element 7 is the block's
/// largest (|g| = its row's scale), every other one 10^-u of it for u
/// uniform in [0, 7); random signs; row scales from 1e-3 to 1e3.
float fixture(index_t i) {
  const std::uint64_t h = mix(static_cast<std::uint64_t>(i) + 0x5eed);
  const double row_scale = std::pow(10.0, -3.0 + 6.0 * static_cast<double>(i / cols) / static_cast<double>(rows));
  const double u = static_cast<double>(h >> 11) * 0x1p-53;
  const double mag = i % momentum_block == 7 ? 1.0 : std::pow(10.0, -7.0 * u);
  return static_cast<float>(((h & 1) ? -1.0 : 1.0) * mag * row_scale);
}

/// The stored momentum after each of `steps` steps with beta1 = 0, so that
/// m' is the gradient itself and each step is a fresh rounding of it.
template <class Tiers>
std::vector<std::vector<float>> stored_after_each_step(const std::vector<float>& g) {
  Hyperparameters h;
  h.beta1 = 0.0;
  h.lr = 1e-3;
  Optimizer<Tiers> opt(h, OptimizerOptions{.seed = 7, .threads = 2});
  std::vector<float> p(g.size(), 0.5f);
  const Shape shape{rows, cols};
  const ParamId id = opt.add("blocks.0.attn.q.weight", Tier::backbone, TensorView<float>(p.data(), shape));
  std::vector<std::vector<float>> out;
  for (int t = 0; t < steps; ++t) {
    opt.set_grad(id, TensorView<const float>(g.data(), shape));
    opt.step();
    const OptimizerState s = opt.export_state();
    out.push_back(decode_momentum(Tiers::layout(Tier::backbone).storage, shape.matrices(), s.params[0].state.m));
  }
  return out;
}

std::vector<float> fixture_grads() {
  std::vector<float> g(static_cast<std::size_t>(rows * cols));
  for (index_t i = 0; i < rows * cols; ++i) g[static_cast<std::size_t>(i)] = fixture(i);
  return g;
}

/// |g| / (the largest |g| of its block).
std::vector<double> relative_to_block(const std::vector<float>& g) {
  std::vector<double> rel(g.size());
  for (std::size_t b = 0; b < g.size(); b += momentum_block) {
    double amax = 0;
    for (std::size_t i = b; i < b + momentum_block; ++i) amax = std::max(amax, std::fabs(double(g[i])));
    for (std::size_t i = b; i < b + momentum_block; ++i) rel[i] = std::fabs(double(g[i])) / amax;
  }
  return rel;
}

/// Relative RMS error of the stored values against g, for the entries 10^-d
/// to 10^(1-d) of their block's largest, d = 0 ... 6.
std::vector<double> relative_rms_by_decade(const std::vector<float>& g,
                                           const std::vector<std::vector<float>>& stored) {
  const std::vector<double> rel = relative_to_block(g);
  std::vector<double> sum(7, 0.0), n(7, 0.0);
  for (const auto& m : stored)
    for (std::size_t i = 0; i < g.size(); ++i) {
      const int d = static_cast<int>(std::floor(-std::log10(rel[i])));
      if (d < 0 || d > 6) continue;
      const double e = (double(m[i]) - double(g[i])) / double(g[i]);
      sum[static_cast<std::size_t>(d)] += e * e;
      n[static_cast<std::size_t>(d)] += 1;
    }
  std::vector<double> out(7);
  for (std::size_t d = 0; d < 7; ++d) out[d] = std::sqrt(sum[d] / n[d]);
  return out;
}

/// The spacing of the codes that element i can be stored as: the two
/// neighbours of g[i] on the map's grid (the linear map: its block's scale).
template <class P>
float rounding_step(const std::vector<float>& g, std::size_t i) {
  const std::size_t b = i / momentum_block * momentum_block;
  float amax = 0;
  for (std::size_t j = b; j < b + momentum_block; ++j) amax = std::max(amax, std::fabs(g[j]));
  if constexpr (P::storage == MomentumStorage::int8_blocks) {
    return P::scale(amax);
  } else {
    const std::uint32_t down = P::code_one(std::fabs(g[i]), P::inverse(amax), 0u);
    return (P::unit(down + 1) - P::unit(down)) * P::scale(amax);
  }
}

/// The mean of err * sign(g) / step over every element and step.
template <class P>
double mean_signed_error_in_steps(const std::vector<float>& g, const std::vector<std::vector<float>>& stored,
                                  double shrink = 1.0) {
  double sum = 0, n = 0;
  std::vector<float> step(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) step[i] = rounding_step<P>(g, i);
  for (const auto& m : stored)
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double err = shrink * double(m[i]) - double(g[i]);
      sum += (g[i] < 0 ? -err : err) / double(step[i]);
      n += 1;
    }
  return sum / n;
}

}  // namespace

TEST_CASE("8-bit momentum maps: relative error by decade below the block's largest value") {
  const std::vector<float> g = fixture_grads();
  const auto f8 = relative_rms_by_decade(g, stored_after_each_step<SkewAdam8bitTiers>(g));
  const auto lin = relative_rms_by_decade(g, stored_after_each_step<SkewAdamLinear8bitTiers>(g));
  for (std::size_t d = 0; d < 7; ++d)
    MESSAGE("entries 1e-", d + 1, " to 1e-", d, " of the block's largest: relative RMS error float8 ",
            100 * f8[d], " %, linear ", 100 * lin[d], " %");
  for (std::size_t d = 0; d < 5; ++d) {  // 1e-5 ... 1
    CAPTURE(d);
    CHECK(f8[d] <= 0.10);
  }
  CHECK(f8[3] <= 0.10);     // the entries at 1e-3 of the block's largest: the target
  CHECK(lin[3] >= 1.0);     // the linear map stores them as 0 or one step of 1/127
  CHECK(lin[0] <= 0.03);    // and keeps the largest ones within a few per cent
}

TEST_CASE("float8 codes: the rounding's expectation is y exactly, over every value of the random bits") {
  // At scale 1 (inv = 1): y from 2^-30 to 1.5 rounds on r's top 21 bits, so
  // the mean of the decoded value over all 2^21 of them must be y, exactly
  // (summed as integers in units of 2^-34: every code value is a multiple);
  // below 2^-30, the lowest r that rounds up, r0, must leave a probability
  // (2^32 - r0) / 2^32 with lo + p * 2^-32 = y, exactly, for y >= 2^-41.
  using F = Float8BlockMomentum;
  std::uint64_t state = 99;
  for (int k = 0; k < 48; ++k) {
    state = mix(state + 1);
    const int e = -1 - static_cast<int>(state % 41);  // binades 2^-41 ... 2^-1, and 1.5 below
    const float y = k == 0 ? 1.5f : std::ldexp(1.0f + static_cast<float>(state >> 41) * 0x1p-23f, e);
    CAPTURE(y);
    if (y >= 0x1p-30f) {
      std::int64_t sum = 0;
      for (std::uint32_t hi = 0; hi < (1u << 21); ++hi)
        sum += static_cast<std::int64_t>(std::ldexp(F::unit(F::code_one(y, 1.0f, hi << 11)), 34));
      CHECK(sum == static_cast<std::int64_t>(std::ldexp(static_cast<double>(y), 34 + 21)));
    } else {
      std::uint64_t lo = 0, hi = 1ull << 32;  // the least r that rounds up, in [lo, hi]
      const std::uint32_t down = F::code_one(y, 1.0f, 0u);
      while (lo < hi) {
        const std::uint64_t mid = (lo + hi) / 2;
        if (F::code_one(y, 1.0f, static_cast<std::uint32_t>(mid)) == down) lo = mid + 1;
        else hi = mid;
      }
      const double p = std::ldexp(static_cast<double>((1ull << 32) - lo), -32);
      CHECK(static_cast<double>(F::unit(down)) + p * 0x1p-32 == static_cast<double>(y));
    }
  }
}

TEST_CASE_TEMPLATE("8-bit momentum maps: unbiased, and the bias statistic sees truncation and shrinking", P,
                   Float8BlockMomentum, Int8BlockMomentum) {
  using Tiers = TierRules<BackboneRule::with_momentum<P>, ExpertRule, RouterRule>;
  const std::vector<float> g = fixture_grads();
  const auto stored = stored_after_each_step<Tiers>(g);
  const double bias = mean_signed_error_in_steps<P>(g, stored);
  MESSAGE(std::string(policy_name<P>::value), ": mean err * sign(m) = ", bias, " steps");
  CHECK(std::fabs(bias) < 1e-3);
  // the same statistic on a 5 % shrink of the same stored values
  const double shrunk = mean_signed_error_in_steps<P>(g, stored, 0.95);
  MESSAGE("a 5 % shrink of them: ", shrunk, " steps");
  CHECK(shrunk < -0.02);
  // and on truncation toward zero: each value's code below |m'|
  std::vector<std::vector<float>> truncated(1, std::vector<float>(g.size()));
  for (std::size_t b = 0; b < g.size(); b += momentum_block) {
    float amax = 0;
    for (std::size_t j = b; j < b + momentum_block; ++j) amax = std::max(amax, std::fabs(g[j]));
    for (std::size_t j = b; j < b + momentum_block; ++j) {
      const float down = P::decode(P::code(std::fabs(g[j]), P::inverse(amax), 0u), P::scale(amax));
      truncated[0][j] = g[j] < 0 ? -down : down;
    }
  }
  const double truncation = mean_signed_error_in_steps<P>(g, truncated);
  MESSAGE("truncation toward zero: ", truncation, " steps");
  CHECK(truncation < -0.1);
}

TEST_CASE_TEMPLATE_DEFINE("8-bit momentum maps: NaN and infinities store the same bytes on every CPU level", Arch,
                          nonfinite_every_arch) {
  // One matrix of 6 blocks (test::stored::nonfinite_gradient): a NaN; a +inf; a
  // -inf among zeros; NaN, +-inf and finite values; two finite blocks.
  // beta1 0, so m' is the gradient.
  const std::vector<float> g = test::stored::nonfinite_gradient(6);
  constexpr float inf = std::numeric_limits<float>::infinity();
  const auto check = [&]<class P>() {
    CAPTURE(std::string(policy_name<P>::value));
    using Tiers = TierRules<BackboneRule::with_momentum<P>, ExpertRule, RouterRule>;
    const auto scalar = test::stored::stored_momentum_bytes<Tiers, backend::CpuBackend<ScalarArch>>(g);
    const auto simd = test::stored::stored_momentum_bytes<Tiers, backend::CpuBackend<Arch>>(g);
    CHECK(scalar == simd);
    // each block: a scale word, then 256 bytes
    const auto code = [&](std::size_t i) { return simd[4 * (65 * (i / 256) + 1) + i % 256]; };
    const auto scale = [&](std::size_t b) {
      float s;
      std::memcpy(&s, simd.data() + 4 * 65 * b, 4);
      return s;
    };
    CHECK(code(5) == 0x80u);        // NaN
    CHECK(code(768 + 1) == 0x80u);
    const bool float8 = P::storage == MomentumStorage::float8_blocks;
    CHECK(code(256 + 9) == 0x7fu);  // float8: infinity; linear: +127
    CHECK(code(768 + 2) == 0x7fu);
    CHECK(code(512) == (float8 ? 0xffu : 0x81u));  // -inf; linear: -127
    CHECK(code(768 + 3) == (float8 ? 0xffu : 0x81u));
    for (std::size_t i = 513; i < 768; ++i) CHECK(code(i) == 0u);
    // the scales come from the finite values alone
    for (std::size_t b : {0u, 1u, 3u}) {
      float amax = 0;
      for (std::size_t i = 256 * b; i < 256 * (b + 1); ++i)
        if (std::isfinite(g[i])) amax = std::max(amax, std::fabs(g[i]));
      CHECK(scale(b) == P::scale(amax));
    }
    CHECK(scale(2) == P::scale(0.0f));
    // decoded: NaN, the infinities (float8) or the block's largest (linear)
    const std::vector<float> m = decode_momentum(P::storage, MatrixGeometry{1, 6, 256},
                                                 std::span<const float>(reinterpret_cast<const float*>(simd.data()),
                                                                        simd.size() / 4));
    CHECK(std::isnan(m[5]));
    CHECK(m[256 + 9] == (float8 ? inf : 127.0f * scale(1)));
  };
  check.template operator()<Float8BlockMomentum>();
  check.template operator()<Int8BlockMomentum>();
}
TEST_CASE_TEMPLATE_APPLY(nonfinite_every_arch, skewadam::test::SimdArchs);

}  // namespace test_stored_momentum_maps
