// Every golden case in the folder (read at run time), through the rule its
// flags name, on the default SIMD backend and the scalar backend, at 1, 2 and
// 3 threads; thread counts must give identical bits.

#include <doctest/doctest.h>

#include <skewadam_tools/golden_case.hpp>

#include "test_util.hpp"

namespace test_golden {

using namespace skewadam;
using namespace skewadam::tools;

TEST_CASE("golden folder holds cases") {
  INFO("golden folder: " << testutil::golden_dir());
  CHECK(testutil::golden_cases().size() >= 1);
}

TEST_CASE("every golden case passes on every backend and thread count") {
  for (const auto& dir : testutil::golden_cases()) {
    const GoldenCase c = load_golden_case(dir);
    CAPTURE(c.name);
    const CaseRun simd1 = run_golden_case(c, 1);
    for (const auto& r : check_golden_case(c, simd1)) {
      CAPTURE(r.array);
      CHECK(r.ok);
    }
    for (int threads : {2, 3}) {
      CAPTURE(threads);
      const CaseRun simd = run_golden_case(c, threads);
      CHECK(simd.params == simd1.params);  // bit-identical across thread counts
      CHECK(simd.state == simd1.state);
    }
    const CaseRun scalar = run_golden_case<backend::CpuBackend<ScalarArch>>(c, 2);
    for (const auto& r : check_golden_case(c, scalar)) {
      CAPTURE(r.array);
      CHECK(r.ok);
    }
  }
}

TEST_CASE("golden outputs round-trip through the .npy writer") {
  const auto cases = testutil::golden_cases();
  REQUIRE(!cases.empty());
  const GoldenCase c = load_golden_case(cases.front());
  const CaseRun run = run_golden_case(c, 1);
  const auto out = std::filesystem::temp_directory_path() / "skewadam-npy-roundtrip";
  write_case_outputs(c, run, out);
  const NpyArray p = read_npy(out / "params.npy");
  CHECK(p.data == run.params);
  CHECK(p.shape.front() == c.steps);
  std::filesystem::remove_all(out);
}

TEST_CASE("a perturbed golden expectation is detected") {
  const auto cases = testutil::golden_cases();
  REQUIRE(!cases.empty());
  GoldenCase c = load_golden_case(cases.front());
  const CaseRun run = run_golden_case(c, 1);
  c.params.data[c.params.data.size() / 2] += 1e-2f;
  bool all_ok = true;
  for (const auto& r : check_golden_case(c, run)) all_ok = all_ok && r.ok;
  CHECK_FALSE(all_ok);
}

}  // namespace test_golden
