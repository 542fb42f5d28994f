// Every golden conformance case through every code path of the CPU backend:
// the scalar fallback (CpuBackend<ScalarArch>) and each SIMD architecture
// this translation unit is compiled for, at 1 and 2 threads.
//
// The cases are read at run time from tests/golden and, when the build was
// configured with one, from the external folder (support/golden_dirs.hpp).

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <skewadam/skewadam.hpp>
#include <skewadam_tools/golden_case.hpp>

#include "golden_dirs.hpp"

#include "cpu_archs.hpp"

namespace test_cpu_arch_conformance {

namespace {

namespace fs = std::filesystem;

using skewadam::test::golden_cases;
using skewadam::test::golden_dir;

}  // namespace

template <class Arch>
void check_every_case(const std::vector<fs::path>& cases, const fs::path& folder) {
  using Backend = skewadam::backend::CpuBackend<Arch>;
  INFO("golden folder: ", folder.string());
  REQUIRE_MESSAGE(!cases.empty(), "no golden cases found");
  for (const fs::path& dir : cases) {
    const auto c = skewadam::tools::load_golden_case(dir);
    for (int threads : {1, 2}) {
      CAPTURE(Backend::arch_name());
      CAPTURE(c.name);
      CAPTURE(threads);
      const auto run = skewadam::tools::run_golden_case<Backend>(c, threads);
      for (const auto& check : skewadam::tools::check_golden_case(c, run)) {
        CAPTURE(check.array);
        CAPTURE(check.worst);
        CAPTURE(check.detail);
        CHECK(check.problem.empty());
        CHECK(check.ok);
      }
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("golden: every case passes on every CPU code path", Arch, golden_every_arch) {
  check_every_case<Arch>(golden_cases(), golden_dir());
}
TEST_CASE_TEMPLATE_APPLY(golden_every_arch, skewadam::test::CpuArchs);

#if defined(SKEWADAM_GOLDEN_EXTERNAL_DIR)
TEST_CASE_TEMPLATE_DEFINE("golden-external: every case passes on every CPU code path", Arch, external_every_arch) {
  check_every_case<Arch>(skewadam::test::external_golden_cases(), skewadam::test::external_golden_dir());
}
TEST_CASE_TEMPLATE_APPLY(external_every_arch, skewadam::test::CpuArchs);
#endif

}  // namespace test_cpu_arch_conformance
