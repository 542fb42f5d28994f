#pragma once
// Where the golden conformance cases are (docs/conformance.md).
//
// The project's own cases are in tests/golden: SKEWADAM_GOLDEN_CASES_DIR, a
// compile definition of every test target that reads cases. An external
// folder, given at configure time by the CMake cache variable
// SKEWADAM_GOLDEN_DIR (which the environment variable of that name
// initialises), defines SKEWADAM_GOLDEN_EXTERNAL_DIR; its cases run in
// addition to the project's, in test cases named "golden-external: ...".

#include <algorithm>
#include <filesystem>
#include <vector>

#if !defined(SKEWADAM_GOLDEN_CASES_DIR)
#error "SKEWADAM_GOLDEN_CASES_DIR (the folder of the project's golden cases) must be defined by the build"
#endif

namespace skewadam::test {

/// The project's own cases: tests/golden.
inline std::filesystem::path golden_dir() { return SKEWADAM_GOLDEN_CASES_DIR; }

/// The external folder the build was configured with; empty when none.
inline std::filesystem::path external_golden_dir() {
#if defined(SKEWADAM_GOLDEN_EXTERNAL_DIR)
  return SKEWADAM_GOLDEN_EXTERNAL_DIR;
#else
  return {};
#endif
}

/// Every case folder (one holding case.json) directly in `dir`, sorted; empty
/// when there is none (the tests that need cases then fail: an empty folder is
/// a fault, never a pass).
inline std::vector<std::filesystem::path> golden_cases_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  if (dir.empty() || !std::filesystem::is_directory(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_directory() && std::filesystem::exists(e.path() / "case.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

inline std::vector<std::filesystem::path> golden_cases() { return golden_cases_in(golden_dir()); }
inline std::vector<std::filesystem::path> external_golden_cases() { return golden_cases_in(external_golden_dir()); }

}  // namespace skewadam::test
