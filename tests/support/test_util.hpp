#pragma once
// Helpers shared by the unit tests.

#include <cmath>
#include <cstdint>
#include <filesystem>
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

/// The golden folder: SKEWADAM_GOLDEN_DIR from CMake, or the environment.
inline std::filesystem::path golden_dir() {
  if (const char* env = std::getenv("SKEWADAM_GOLDEN_DIR")) return env;
#ifdef SKEWADAM_GOLDEN_DIR
  return SKEWADAM_GOLDEN_DIR;
#else
  return "../shared/golden";
#endif
}

inline std::vector<std::filesystem::path> golden_cases() {
  std::vector<std::filesystem::path> out;
  const auto dir = golden_dir();
  if (!std::filesystem::is_directory(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_directory() && std::filesystem::exists(e.path() / "case.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
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
