#pragma once
// Where the golden conformance cases are: the folder the build was configured
// with (SKEWADAM_GOLDEN_DIR, a compile definition of the test target), or the
// SKEWADAM_GOLDEN_DIR environment variable.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace skewadam::test {

inline std::filesystem::path golden_dir() {
#if defined(SKEWADAM_GOLDEN_DIR)
  if (std::filesystem::is_directory(SKEWADAM_GOLDEN_DIR)) return SKEWADAM_GOLDEN_DIR;
#endif
  if (const char* env = std::getenv("SKEWADAM_GOLDEN_DIR")) return env;
  return {};
}

/// Every case folder (one holding case.json), sorted; empty when none is found.
inline std::vector<std::filesystem::path> golden_cases() {
  std::vector<std::filesystem::path> out;
  const std::filesystem::path dir = golden_dir();
  if (dir.empty() || !std::filesystem::is_directory(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_directory() && std::filesystem::exists(e.path() / "case.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace skewadam::test
