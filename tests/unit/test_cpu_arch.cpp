// Choosing the CPU kernel architecture (engine/backend/cpu/arch.hpp): at run time
// (this program defines SKEWADAM_RUNTIME_DISPATCH, as the project's tests do),
// the levels it can run, the names SKEWADAM_CPU_ARCH takes, and the errors
// for names it cannot run; fixed at compile time (NativeBackend, the default
// without the macro), the widest level alone.

#include <doctest/doctest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

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

TEST_CASE("the backend of the widest compiled level runs it alone and refuses another named level") {
  static_assert(std::is_same_v<backend::DefaultBackend, backend::DispatchBackend>,
                "the project's tests choose the level at run time (SKEWADAM_RUNTIME_DISPATCH)");
  static_assert(std::is_same_v<backend::NativeBackend::arch, widest_tag_t>);
  CHECK(std::string(backend::NativeBackend::arch_name()) == tag_name(widest_compiled()));
  CHECK(widest_compiled() == available_archs().front());  // (every compiled level runs on the machines that test)

  // SKEWADAM_CPU_ARCH is read when a NativeBackend is built; the dispatching
  // backend's choice is made once per process, before this test changes it.
  (void)selected_arch();
  const char* before = std::getenv("SKEWADAM_CPU_ARCH");
  const std::string saved = before != nullptr ? before : "";
  const auto restore = [&] {
    if (before != nullptr) ::setenv("SKEWADAM_CPU_ARCH", saved.c_str(), 1);
    else ::unsetenv("SKEWADAM_CPU_ARCH");
  };
  try {
    ::setenv("SKEWADAM_CPU_ARCH", level_name(widest_compiled()), 1);
    CHECK_NOTHROW(backend::NativeBackend{});
    ::setenv("SKEWADAM_CPU_ARCH", "scalar", 1);
    CHECK_THROWS_WITH_AS(backend::NativeBackend{},
                         (std::string("SKEWADAM_CPU_ARCH=scalar: this program's CPU backend holds the ") +
                          level_name(widest_compiled()) +
                          " kernels alone (define SKEWADAM_RUNTIME_DISPATCH to choose the level at run time)")
                             .c_str(),
                         std::invalid_argument);
    // (and an optimizer on it refuses it when it is built, before anything)
    CHECK_THROWS_AS((Optimizer<SkewAdamTiers, backend::NativeBackend>(Hyperparameters{})), std::invalid_argument);
    ::setenv("SKEWADAM_CPU_ARCH", "avx9000", 1);
    CHECK_THROWS_WITH_AS(backend::NativeBackend{}, doctest::Contains("unknown CPU architecture"), std::invalid_argument);
    ::unsetenv("SKEWADAM_CPU_ARCH");
    CHECK_NOTHROW(backend::NativeBackend{});
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

}  // namespace test_cpu_arch
