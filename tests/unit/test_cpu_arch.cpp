// Choosing the CPU kernel architecture at run time (backend/cpu/arch.hpp):
// the levels this program can run, the names SKEWADAM_CPU_ARCH takes, and
// the errors for names it cannot run.

#include <doctest/doctest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include <skewadam/skewadam.hpp>

namespace test_cpu_arch {

namespace {

using namespace skewadam;
using namespace skewadam::backend::cpu;

std::string error_of(std::string_view name) {
  try {
    (void)parse_arch(name, "SKEWADAM_CPU_ARCH");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the available levels: widest first, scalar last, each runnable") {
  const auto levels = available_archs();
  REQUIRE(!levels.empty());
  CHECK(levels.back() == CpuArch::scalar);
  for (std::size_t k = 0; k < levels.size(); ++k) {
    CAPTURE(level_name(levels[k]));
    CHECK(compiled(levels[k]));
    CHECK(runs_here(levels[k]));
    if (k > 0) CHECK(static_cast<int>(levels[k - 1]) < static_cast<int>(levels[k]));  // widest first
  }
  // The default backend runs the chosen level (the widest unless
  // SKEWADAM_CPU_ARCH says otherwise).
  CHECK(std::string(backend::DefaultBackend::arch_name()) == tag_name(selected_arch()));
  if (std::getenv("SKEWADAM_CPU_ARCH") == nullptr) CHECK(selected_arch() == levels.front());
}

TEST_CASE("SKEWADAM_CPU_ARCH takes a level's name or its kernels' name") {
  for (const CpuArch a : available_archs()) {
    CAPTURE(level_name(a));
    CHECK(parse_arch(level_name(a), "SKEWADAM_CPU_ARCH") == a);
    CHECK(parse_arch(tag_name(a), "SKEWADAM_CPU_ARCH") == a);
  }
}

TEST_CASE("a name that cannot run here is an error naming the variable and the choices") {
  std::string choices;
  for (const CpuArch a : available_archs()) choices += (choices.empty() ? "" : ", ") + std::string(level_name(a));
  CHECK(error_of("avx9000") == "SKEWADAM_CPU_ARCH=avx9000: unknown CPU architecture; available: " + choices);
  CHECK(error_of("") == "SKEWADAM_CPU_ARCH=: unknown CPU architecture; available: " + choices);
  // a level of another processor family is never compiled in
  const CpuArch foreign = compiled(CpuArch::neon) ? CpuArch::avx512 : CpuArch::neon;
  REQUIRE_FALSE(compiled(foreign));
  CHECK(error_of(level_name(foreign)) == std::string("SKEWADAM_CPU_ARCH=") + level_name(foreign) +
                                             ": not compiled into this program (its compiler flags do not target "
                                             "it); available: " + choices);
  CHECK_THROWS_AS(visit_arch(foreign, []<class A>() { return 0; }), std::invalid_argument);
}

}  // namespace test_cpu_arch
