#pragma once
// Helpers shared by the unit tests.

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <skewadam/skewadam.hpp>

namespace testutil {

inline std::vector<float> random_vector(std::int64_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

/// Largest |a - b| / (atol + rtol |b|).
inline double worst_fraction(const std::vector<float>& a, const std::vector<double>& b, double rtol, double atol) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double f = std::fabs(static_cast<double>(a[i]) - b[i]) / (atol + rtol * std::fabs(b[i]));
    if (!(f <= worst)) worst = f;
  }
  return worst;
}

inline std::vector<std::uint16_t> bits(const std::vector<skewadam::bf16>& v) {
  std::vector<std::uint16_t> out;
  for (auto x : v) out.push_back(skewadam::bits_of(x));
  return out;
}

}  // namespace testutil
