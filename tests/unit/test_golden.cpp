// Every golden case (the project's, tests/golden, and those of an external
// folder when the build was configured with one; support/golden_dirs.hpp)
// through the rule it names, on the default SIMD backend and the scalar
// backend, at 1, 2 and 3 threads; thread counts must give identical bits.

#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <skewadam_tools/golden_case.hpp>

#include "golden_dirs.hpp"

namespace test_golden {

using namespace skewadam;
using namespace skewadam::tools;
namespace fs = std::filesystem;

void check_every_case(const std::vector<fs::path>& cases, const fs::path& folder) {
  INFO("golden folder: " << folder.string());
  REQUIRE_MESSAGE(!cases.empty(), "no golden case (a folder holding case.json) in the folder");
  for (const auto& dir : cases) {
    const GoldenCase c = load_golden_case(dir);
    CAPTURE(c.name);
    const CaseRun simd1 = run_golden_case(c, 1);
    for (const auto& r : check_golden_case(c, simd1)) {
      CAPTURE(r.array);
      CAPTURE(r.detail);
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
      CAPTURE(r.detail);
      CHECK(r.ok);
    }
  }
}

TEST_CASE("golden: the folder holds cases") {
  INFO("golden folder: " << test::golden_dir().string());
  CHECK(test::golden_cases().size() >= 1);
}

TEST_CASE("golden: every case passes on every backend and thread count") {
  check_every_case(test::golden_cases(), test::golden_dir());
}

#if defined(SKEWADAM_GOLDEN_EXTERNAL_DIR)
TEST_CASE("golden-external: every case passes on every backend and thread count") {
  check_every_case(test::external_golden_cases(), test::external_golden_dir());
}
#endif

TEST_CASE("golden: outputs round-trip through the .npy writer") {
  const auto cases = test::golden_cases();
  REQUIRE(!cases.empty());
  const GoldenCase c = load_golden_case(cases.front());
  const CaseRun run = run_golden_case(c, 1);
  const auto out = fs::temp_directory_path() / "skewadam-npy-roundtrip";
  write_case_outputs(c, run, out);
  const NpyArray p = read_npy(out / "params.npy");
  CHECK(p.data == run.params);
  CHECK(p.shape.front() == c.steps);
  fs::remove_all(out);
}

TEST_CASE("golden: a perturbed expectation is detected") {
  const auto cases = test::golden_cases();
  REQUIRE(!cases.empty());
  GoldenCase c = load_golden_case(cases.front());
  const CaseRun run = run_golden_case(c, 1);
  c.params.data[c.params.data.size() / 2] += 1e-2f;
  bool all_ok = true;
  for (const auto& r : check_golden_case(c, run)) all_ok = all_ok && r.ok;
  CHECK_FALSE(all_ok);
}

/// The project's cases for which keep(case) holds.
template <class Keep>
std::vector<GoldenCase> golden_cases_where(Keep keep) {
  std::vector<GoldenCase> out;
  for (const auto& dir : test::golden_cases()) {
    GoldenCase c = load_golden_case(dir);
    if (keep(c)) out.push_back(std::move(c));
  }
  return out;
}

/// The 16-bit cases that round stochastically (there must be some).
std::vector<GoldenCase> stochastic_16bit_cases() {
  return golden_cases_where(
      [](const GoldenCase& c) { return c.param_dtype != Dtype::f32 && c.rounding == CaseRounding::stochastic; });
}

/// The case with the key of its random streams changed: another seed, and
/// another stream (the parameter's name).
std::vector<GoldenCase> with_wrong_keys(const GoldenCase& right) {
  GoldenCase seed = right;
  seed.seed += 1;
  GoldenCase stream = right;
  stream.param_name += ".other";
  return {seed, stream};
}

bool passes(const GoldenCase& c, const CaseRun& run) {
  bool ok = true;
  for (const auto& r : check_golden_case(c, run)) ok = ok && r.ok;
  return ok;
}

// The 16-bit check is sharp: the library itself with the wrong random bits,
// or rounding to nearest instead, fails it on every case (docs/conformance.md).
TEST_CASE("golden: a 16-bit case fails with the wrong rounding key or the wrong rounding rule") {
  const auto cases = stochastic_16bit_cases();
  REQUIRE(cases.size() >= 2);
  for (const GoldenCase& right : cases) {
    CAPTURE(right.name);
    REQUIRE(passes(right, run_golden_case(right, 1)));
    for (const GoldenCase& wrong : with_wrong_keys(right)) CHECK_FALSE(passes(right, run_golden_case(wrong, 1)));
    GoldenCase nearest = right;
    nearest.rounding = CaseRounding::nearest;
    if (right.momentum_storage == MomentumStorage::f32) CHECK_FALSE(passes(right, run_golden_case(nearest, 1)));
    else CHECK_THROWS_AS(run_golden_case(nearest, 1), CaseError);  // stored momentum runs with stochastic rounding
  }
}

// The stored-momentum cases are sharp too: the momentum's rounding with
// another key (seed or stream), or the momentum kept in fp32, fails them.
TEST_CASE("golden: a stored-momentum case fails with the wrong momentum key or fp32 momentum") {
  const auto cases =
      golden_cases_where([](const GoldenCase& c) { return c.momentum_storage != MomentumStorage::f32; });
  REQUIRE(cases.size() >= 2);
  auto exp_avg_passes = [](const GoldenCase& c, const CaseRun& run) {
    for (const auto& r : check_golden_case(c, run))
      if (r.array == "exp_avg") return r.ok;
    return false;
  };
  for (const GoldenCase& right : cases) {
    CAPTURE(right.name);
    REQUIRE(passes(right, run_golden_case(right, 1)));
    for (const GoldenCase& wrong : with_wrong_keys(right))
      CHECK_FALSE(exp_avg_passes(right, run_golden_case(wrong, 1)));
    GoldenCase fp32 = right;
    fp32.momentum_storage = MomentumStorage::f32;
    CHECK_FALSE(exp_avg_passes(right, run_golden_case(fp32, 1)));
  }
}

TEST_CASE("golden: a 16-bit case's values must be values of its dtype") {
  const auto cases = stochastic_16bit_cases();
  REQUIRE(!cases.empty());
  GoldenCase c = cases.front();
  c.param0.data[3] = 1.0f + 0x1p-20f;  // between two bf16 / f16 values
  try {
    (void)c.initial_param();
    FAIL("a value that is not a 16-bit value was accepted");
  } catch (const CaseError& e) {
    CHECK(std::string(e.what()).find("param0.npy: value") != std::string::npos);
    CHECK(std::string(e.what()).find("at index 3 is not a") != std::string::npos);
  }
}

TEST_CASE("golden: a global-clip case fails with the other norm or without the clip") {
  const std::vector<GoldenCase> clipped = golden_cases_where([](const GoldenCase& c) { return c.max_grad_norm > 0; });
  REQUIRE(clipped.size() >= 2);
  bool current = false, previous = false;
  for (const GoldenCase& c : clipped) {
    CAPTURE(c.name);
    (c.clip_norm == ClipNorm::current ? current : previous) = true;
    GoldenCase other = c, none = c;
    other.clip_norm = c.clip_norm == ClipNorm::current ? ClipNorm::previous : ClipNorm::current;
    none.max_grad_norm = 0;
    for (const GoldenCase* wrong : {&other, &none}) {
      bool all_ok = true;
      for (const auto& r : check_golden_case(c, run_golden_case(*wrong, 1))) all_ok = all_ok && r.ok;
      CHECK_FALSE(all_ok);
    }
  }
  CHECK(current);
  CHECK(previous);
}

}  // namespace test_golden
