// Every golden conformance case through every code path of the CPU backend:
// the scalar fallback (CpuBackend<ScalarArch>) and each SIMD architecture
// this translation unit is compiled for, at 1 and 2 threads.
//
// The cases are read at run time from SKEWADAM_GOLDEN_DIR (a compile
// definition; the environment variable of the same name is the fallback).

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

TEST_CASE_TEMPLATE_DEFINE("golden cases pass on every CPU code path", Arch, golden_every_arch) {
  using Backend = skewadam::backend::CpuBackend<Arch>;
  const auto cases = golden_cases();
  INFO("golden folder: ", golden_dir().string(), " (SKEWADAM_GOLDEN_DIR)");
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
        CHECK(check.problem.empty());
        CHECK(check.ok);
      }
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(golden_every_arch, skewadam::test::CpuArchs);

}  // namespace test_cpu_arch_conformance
